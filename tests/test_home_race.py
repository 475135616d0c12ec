"""Issue 47 item 7: no root step of the set-up follows a link the session user can plant.

The user can be logged in while the set-up runs (sshd listens before the home is made ready)
and can restart the container (kill their command; the restart policy brings it back), so a
process of theirs can swap ``~/.ssh`` between a directory and a link to a root directory at any
moment of the set-up. Here that process is started as the user just before the entrypoint, on
every start of one container that is restarted again and again, and swaps with
``renameat2(RENAME_EXCHANGE)`` (atomic: there is always an ``~/.ssh``, a directory or the
link) as fast as it can. The root directory it points at must never change owner or mode, nor
gain a file.
"""

from __future__ import annotations

import io
import tarfile
import textwrap

import pytest
from docker.types import Mount

from cluster_sessions.core.render import BUNDLE_DIR

from .test_runtime import image, render_to, session_def, unique  # noqa: F401

pytestmark = pytest.mark.docker

VICTIM = "/etc/cs-victim"
RESTARTS = 12

RACER = textwrap.dedent("""
    import ctypes, os, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    home, victim = sys.argv[1], sys.argv[2]
    while not os.path.isdir(home) or os.stat(home).st_uid != os.getuid():
        time.sleep(0.001)  # a new home: the user's once root handed it over
    os.chdir(home)
    link = f".l{time.time_ns()}".encode()
    os.symlink(victim, link)
    try:  # swaps of the runs before this restart: the count proves the race was run at all
        before = int(open("/tmp/racer-swaps").read() or 0)
    except (OSError, ValueError):
        before = 0
    swaps = 0
    end = time.monotonic() + 20
    while time.monotonic() < end:
        # ~/.ssh <-> the link, atomically (AT_FDCWD = -100, RENAME_EXCHANGE = 2)
        if libc.renameat2(-100, b".ssh", -100, link, 2) == 0:
            swaps += 1
            if swaps == 1 or swaps % 50 == 0:  # whole files: a reader never sees half
                with open("/tmp/racer-swaps.new", "w") as out:
                    out.write(str(before + swaps))
                os.replace("/tmp/racer-swaps.new", "/tmp/racer-swaps")
        elif not os.path.lexists(".ssh"):  # removed by the set-up: plant the link there
            os.rename(link, b".ssh")
            os.symlink(victim, link)
""")


def test_a_link_swapped_in_under_the_set_up_across_restarts_never_wins(
        docker_client, image, tmp_path):  # noqa: F811
    session = session_def(unique("homerace"), 1, image=image)
    plan, _ = render_to(tmp_path, session)
    home, uid, gid = f"/home/{session.user.name}", session.user.uid, session.user.gid
    before = (f"mkdir -p {VICTIM} && chmod 755 {VICTIM} && "
              f"setpriv --reuid={uid} --regid={gid} --clear-groups "
              f"python3 /racer.py {home} {VICTIM} </dev/null >/tmp/racer.log 2>&1 &")
    container = docker_client.containers.create(
        image, ["-c", f'{before} exec /bin/sh "$0" "$@"', f"{BUNDLE_DIR}/entrypoint.sh",
                "sh", "-c", "sleep 1"],
        entrypoint=["/bin/sh"], name=plan.containers[0].container_name,
        environment=dict(plan.containers[0].env), pids_limit=plan.limits.pids_limit,
        mounts=[Mount(BUNDLE_DIR, str(tmp_path / "main1"), type="bind", read_only=True)])
    racer = io.BytesIO()
    with tarfile.open(fileobj=racer, mode="w") as tar:
        info = tarfile.TarInfo("racer.py")
        info.size, info.mode = len(RACER.encode()), 0o644
        tar.addfile(info, io.BytesIO(RACER.encode()))
    container.put_archive("/", racer.getvalue())
    try:
        seen = []
        for _ in range(RESTARTS):
            container.start()
            container.wait(timeout=60)
            logs = container.logs().decode(errors="replace")
            assert "ready:" in logs, logs
            # the container's file system, as it is now (it stopped: nothing races any more)
            bits, _ = container.get_archive(VICTIM)
            with tarfile.open(fileobj=io.BytesIO(b"".join(bits))) as tar:
                members = tar.getmembers()
            top = members[0]
            seen.append((top.uid, top.gid, oct(top.mode & 0o7777), len(members)))
            assert (top.uid, top.gid, top.mode & 0o7777, len(members)) == (0, 0, 0o755, 1), \
                f"the set-up followed the user's link into {VICTIM}: {seen}"
        try:
            swaps, _ = container.get_archive("/tmp/racer-swaps")
        except Exception:
            raise AssertionError("no swaps file") from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(swaps))) as tar:
            count = int(tar.extractfile(tar.getmembers()[0]).read() or 0)
        assert count > 0, "the racer never swapped: the test proves nothing"
    except AssertionError:
        bits, _ = container.get_archive("/tmp/racer.log")
        with tarfile.open(fileobj=io.BytesIO(b"".join(bits))) as tar:
            print(tar.extractfile(tar.getmembers()[0]).read().decode())
        raise
    finally:
        container.remove(force=True)
