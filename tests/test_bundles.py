"""Bundles delivered once per agent into the pool's scratch root (issue 45).

The pool's rules (offline), the delivery's scripts on this machine (the local engine's agent
writes locally: the same script an SSH agent runs), the program under mocks (which agent gets
which delivery), and a session on the real local engine whose containers bind-mount their own
directory: another's is not visible, its own not writable, destroy leaves nothing.
"""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cluster_sessions.agents.bundles import (
    check_root,
    deliver,
    deliver_script,
    make_root,
    remove,
    remove_script,
    stacks_on,
    sweep_stack,
)
from cluster_sessions.agents.connectors import AgentError, LocalConnector
from cluster_sessions.core.bundles import SCRATCH, UPLOAD, delivery_of
from cluster_sessions.core.plan import build_plan, plan_to_dict
from cluster_sessions.core.spec import BUNDLE_DIR, Pool, Session, pool_problems

from .factories import agent, load_session, pool, session, write, write_pair

STACK = "0123456789abcdef"
CONTAINER = "docker:index/container:Container"
BUNDLES = "pulumi-python:dynamic/cluster-sessions:BundleDelivery"


def scratch_root(tmp_path: Path) -> Path:
    root = tmp_path / "scratch"
    root.mkdir(mode=0o700)
    return root


def tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``root`` with its mode (and a file's bytes)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (stat.S_IMODE(st.st_mode),
                                            path.read_bytes() if path.is_file() else None)
    return out


# --- the pool's rules ---------------------------------------------------------------------------

def problems(**over) -> list[tuple[str, str]]:
    return pool_problems(Pool.model_validate(pool("p", agent(), **over)))


def test_a_pool_whose_mount_sources_or_storage_overlap_its_scratch_root_is_refused():
    assert problems() == []
    assert problems(mount_sources=["/var/lib"]) == [
        ("mount_sources.0", "/var/lib overlaps the pool's scratch root /var/lib/cluster-sessions "
         "(every session's bundles): they must be separate directories")]
    assert problems(mount_sources=["/srv"], scratch="/srv/cs/") == [
        ("mount_sources.0", "/srv overlaps the pool's scratch root /srv/cs (every session's "
         "bundles): they must be separate directories")]
    assert problems(storage={"data": "/var/lib/cluster-sessions/data"}) == [
        ("storage.data", "/var/lib/cluster-sessions/data overlaps the pool's scratch root "
         "/var/lib/cluster-sessions (every session's bundles): they must be separate "
         "directories")]
    assert problems(scratch="relative") == [
        ("scratch", "must be an absolute host directory other than '/', without '..'")]
    assert problems(scratch="/") == [
        ("scratch", "must be an absolute host directory other than '/', without '..'")]
    assert problems(mount_sources=["/srv"], scratch="/var/cs", storage={"d": "/data"}) == []


@pytest.mark.parametrize("source", ["/var/lib/cluster-sessions", "/var/lib/cluster-sessions/",
                                    "/var/lib/cluster-sessions/0123456789abcdef/main1",
                                    "//var/lib/cluster-sessions//x/"])
def test_a_definition_never_mounts_a_path_in_the_scratch_root(tmp_path, capsys, source):
    """The rule is the pool's: whatever its mount_sources say, no definition's host path is
    in its scratch root: `validate` exits 2, naming file and field."""
    from cluster_sessions.driver.cli import main

    path = write_pair(tmp_path, session(mounts=[{"source": source, "target": "/data/x"}]),
                      pool("p", agent(), mount_sources=["/srv"]))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: mounts.0.source: " in err, err
    assert "is in the pool's scratch root /var/lib/cluster-sessions" in err, err


# --- which agent gets which delivery ------------------------------------------------------------

def test_plan_says_which_agents_use_which_delivery():
    tcp = agent("box", "tcp://10.0.0.20:2376", tls={"cert_path": "/etc/certs"})
    ssh = agent("far", ssh={"host": "10.0.0.11", "user": "ops"})
    p = Pool.model_validate(pool("p", agent("here"), tcp, ssh))
    assert [delivery_of(a, p) for a in p.agents] == [SCRATCH, UPLOAD, SCRATCH]
    no_read = Pool.model_validate(pool("p", agent("here"),
                                       privileges={"capabilities": ["SETUID", "SETGID"]}))
    assert delivery_of(no_read.agents[0], no_read) == UPLOAD
    plan = build_plan(Session.model_validate(session(pool="p")), p)
    assert plan_to_dict(plan)["delivery"] == {
        "scratch": "/var/lib/cluster-sessions",
        "agents": {"here": {"delivery": "scratch", "why": "one archive per up into the agent's "
                            "scratch root, bind-mounted read-only"}}}


def test_each_delivery_says_why_in_its_own_words():
    from cluster_sessions.core.bundles import delivery_reason

    tcp = agent("box", "tcp://10.0.0.20:2376", tls={"cert_path": "/etc/certs"})
    p = Pool.model_validate(pool("p", agent("here"), tcp))
    assert delivery_reason(p.agents[1], p) == (
        "tcp:// agent: no file access, the provider uploads each container's bundle")
    no_read = Pool.model_validate(pool("p", agent("here"),
                                       privileges={"capabilities": ["SETUID", "SETGID"]}))
    assert delivery_reason(no_read.agents[0], no_read) == (
        "the pool drops DAC_OVERRIDE: the sessions' root could not read a bundle file of the "
        "SSH user's")


def test_a_stack_and_a_host_have_their_directories_under_the_scratch_root():
    from cluster_sessions.core.bundles import host_dir, stack_dir

    assert stack_dir("/var/lib/cs", "s-1") == "/var/lib/cs/s-1"
    assert host_dir("/var/lib/cs", "s-1", "sub2") == "/var/lib/cs/s-1/sub2"


def test_the_archive_holds_each_host_s_pack_in_host_order_with_fixed_modes_owner_and_time():
    """One gzipped PAX tar: ``<host>/`` (a directory, 0700 while moved into place) then
    ``<host>/bundle.pack`` (0000), mtime 0, the same bytes for the same bundles."""
    import gzip
    import io
    import tarfile

    from cluster_sessions.core.bundles import archive

    bundles = {"main1": "pack of main1 \u00e9", "sub1": "pack of sub1"}
    data = archive(bundles)
    assert data == archive(dict(bundles)) and data[:2] == b"\x1f\x8b"
    raw = gzip.decompress(data)
    assert b"ustar" in raw[:512]
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        assert [(m.name, m.type, m.mode, m.mtime, m.uid, m.gid) for m in members] == [
            ("main1", tarfile.DIRTYPE, 0o700, 0, 0, 0),
            ("main1/bundle.pack", tarfile.REGTYPE, 0o000, 0, 0, 0),
            ("sub1", tarfile.DIRTYPE, 0o700, 0, 0, 0),
            ("sub1/bundle.pack", tarfile.REGTYPE, 0o000, 0, 0, 0)]
        assert tar.extractfile("main1/bundle.pack").read() == bundles["main1"].encode()
        assert members[1].size == len(bundles["main1"].encode())
        assert tar.extractfile("sub1/bundle.pack").read() == b"pack of sub1"


def run_mocked(tmp_path, pool_doc, size=2):
    from tests.standin.engine import Engine, run_program

    name = f"bundles-{uuid.uuid4().hex[:6]}"
    path = write_pair(tmp_path, session(name, size=size, cpu=0.5, mem="256m", shmem="16m"),
                      pool_doc)
    engine = Engine()
    run_program(engine, name, {"cluster-sessions:definition": str(path)})
    return name, engine


def test_a_tcp_only_agent_still_gets_its_upload(tmp_path):
    tcp = agent("box", "tcp://10.0.0.20:2376", tls={"cert_path": str(tmp_path)})
    name, engine = run_mocked(tmp_path, pool("p", tcp))
    assert engine.of_type(BUNDLES) == []
    for host in ("main1", "sub1"):
        reg = engine.named(CONTAINER, f"{name}-{host}")
        assert [u["file"] for u in reg.inputs["uploads"]] == [f"{BUNDLE_DIR}/bundle.pack"]
        assert BUNDLE_DIR not in [m["target"] for m in reg.plain_inputs.get("mounts", [])]


def test_a_local_agent_gets_one_delivery_and_a_read_only_bind_per_container(tmp_path):
    name, engine = run_mocked(tmp_path, pool("p", agent("here"), scratch="/srv/cs"))
    (delivery,) = engine.of_type(BUNDLES)
    assert sorted(delivery.inputs["bundles"]["value"]) == ["main1", "sub1"]
    for host in ("main1", "sub1"):
        reg = engine.named(CONTAINER, f"{name}-{host}")
        assert not reg.inputs.get("uploads")
        (mine,) = [m for m in reg.plain_inputs["mounts"] if m["target"] == BUNDLE_DIR]
        assert mine["readOnly"] is True and mine["type"] == "bind"
        assert mine["source"].startswith("/srv/cs/") and mine["source"].endswith(f"/{host}")
        assert delivery.urn in reg.dependencies


def test_the_delivery_is_registered_with_its_bundles_secret_in_and_out(tmp_path):
    from tests.standin.engine import is_secret

    name, engine = run_mocked(tmp_path, pool("p", agent("here"), scratch="/srv/cs"))
    (delivery,) = engine.of_type(BUNDLES)
    assert delivery.additional_secret_outputs == ["bundles"]
    assert "cluster-sessions:index:Session" in delivery.parent  # the program's options kept
    assert is_secret(delivery.inputs["bundles"])
    plain = delivery.plain_inputs
    assert (plain["agent"]["name"], plain["scratch"]) == ("here", "/srv/cs")
    assert len(plain["stack_id"]) == 16
    assert set(plain) >= {"agent", "scratch", "stack_id", "bundles"}


# --- the scripts, on this machine ---------------------------------------------------------------

def test_a_delivery_writes_each_hosts_directory_and_destroy_leaves_nothing(tmp_path):
    root = scratch_root(tmp_path)
    conn = LocalConnector("here")
    deliver(conn, str(root), STACK, {"main1": "one\n", "sub1": "two\n"})
    assert tree(root) == {
        STACK: (0o700, None),
        f"{STACK}/main1": (0o500, None), f"{STACK}/main1/bundle.pack": (0o000, b"one\n"),
        f"{STACK}/sub1": (0o500, None), f"{STACK}/sub1/bundle.pack": (0o000, b"two\n")}
    # a changed bundle and a host gone: replaced whole, nothing of the old left
    deliver(conn, str(root), STACK, {"main1": "three\n"}, gone=["sub1"])
    assert tree(root) == {
        STACK: (0o700, None),
        f"{STACK}/main1": (0o500, None), f"{STACK}/main1/bundle.pack": (0o000, b"three\n")}
    remove(conn, str(root), STACK, ["main1"])
    assert tree(root) == {}


def test_an_interrupted_delivery_leaves_nothing_a_later_up_would_mount(tmp_path):
    root = scratch_root(tmp_path)
    conn = LocalConnector("here")
    # what a delivery killed while extracting leaves: a partial directory beside the hosts'
    partial = root / STACK / ".new-here-999" / "main1"
    partial.mkdir(parents=True)
    (partial / "bundle.pack").write_text("half")
    assert not (root / STACK / "main1").exists()  # never where a container mounts
    deliver(conn, str(root), STACK, {"main1": "whole\n"})
    assert tree(root / STACK) == {"main1": (0o500, None), "main1/bundle.pack": (0o000, b"whole\n")}


def test_another_agent_making_the_stack_directory_first_is_no_error(tmp_path, monkeypatch):
    """Agents on one shared filesystem (the lab's, an NFS scratch root) deliver into one
    ``<stack id>/`` at once: the other agent's ``mkdir`` may land between this one's look and
    its own (CI: ``mkdir: cannot create directory ...: File exists``, the second ``up``)."""
    root = scratch_root(tmp_path)
    shim = tmp_path / "bin"
    shim.mkdir()
    # a mkdir that lets "the other agent" make the stack's directory just before it runs
    (shim / "mkdir").write_text(
        "#!/bin/sh\n"
        f'for a; do last=$a; done\n[ "$last" = {str(root / STACK)!r} ] && /bin/mkdir "$last"\n'
        'exec /bin/mkdir "$@"\n')
    (shim / "mkdir").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    deliver(LocalConnector("agent2"), str(root), STACK, {"sub1": "two\n"})
    assert tree(root)[f"{STACK}/sub1/bundle.pack"] == (0o000, b"two\n")


def test_agents_sharing_a_filesystem_deliver_into_one_stack_at_once(tmp_path):
    root = scratch_root(tmp_path)
    for round_ in range(12):
        stack = f"{round_:016x}"
        with ThreadPoolExecutor(3) as pool_:
            list(pool_.map(lambda a, s=stack: deliver(LocalConnector(a), str(root), s,
                                                      {f"{a}-main": f"{a}\n"}),
                           ["agent1", "agent2", "agent3"]))
        assert sorted(p.name for p in (root / stack).iterdir()) == [
            "agent1-main", "agent2-main", "agent3-main"]


def test_a_missing_scratch_root_is_an_error_naming_the_agent_and_the_path(tmp_path):
    conn = LocalConnector("here")
    missing = tmp_path / "nothing"
    for call in (lambda: check_root(conn, str(missing)),
                 lambda: deliver(conn, str(missing), STACK, {"main1": "x"})):
        with pytest.raises(AgentError) as err:
            call()
        assert str(err.value).startswith("agent here: ")
        assert f"scratch root {missing} is missing" in str(err.value)
    assert not missing.exists()  # a delivery never makes the root


def test_a_scratch_root_through_a_link_or_open_to_others_is_refused(tmp_path):
    conn = LocalConnector("here")
    root = scratch_root(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(root)
    with pytest.raises(AgentError, match="reached through a link"):
        deliver(conn, str(link), STACK, {"main1": "x"})
    root.chmod(0o750)
    with pytest.raises(AgentError, match="group and others must have no access"):
        deliver(conn, str(root), STACK, {"main1": "x"})
    assert tree(root) == {}
    # a stack directory that is a link someone made: refused, nothing written through it
    root.chmod(0o700)
    (tmp_path / "x").mkdir()
    elsewhere = scratch_root(tmp_path / "x")
    (root / STACK).symlink_to(elsewhere)
    with pytest.raises(AgentError) as err:
        deliver(conn, str(root), STACK, {"main1": "x"})
    assert str(err.value) == (f"agent here: command failed: cannot deliver the bundles into "
                              f"{root}/{STACK}: {root}/{STACK} is not a directory")
    assert tree(elsewhere) == {}


def test_pool_check_fix_makes_the_root_the_users_and_0700(tmp_path):
    conn = LocalConnector("here")
    root = tmp_path / "a" / "root"
    assert make_root(conn, str(root)) == "made"
    st = root.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, os.getuid())
    assert make_root(conn, str(root)) == "kept"
    check_root(conn, str(root))


def test_a_full_disk_is_an_error_naming_the_agent_and_the_path(tmp_path):
    root = tmp_path / "small"
    root.mkdir(mode=0o700)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs",
                           str(root)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        conn = LocalConnector("here")
        big = os.urandom(200_000).hex()  # does not compress: more than the disk holds
        with pytest.raises(AgentError) as err:
            deliver(conn, str(root), STACK, {"main1": big})
        assert str(err.value).startswith("agent here: ")
        assert f"{root}/{STACK}" in str(err.value)
        with pytest.raises(AgentError, match="free"):
            check_root(conn, str(root))
        # nothing half-written where a container would mount it
        assert not (root / STACK / "main1").exists()
        assert [p.name for p in (root / STACK).iterdir()] == []
    finally:
        subprocess.run(["umount", str(root)], check=False)


HINT = "`sessionctl pool check --fix POOL` makes it, or as root: install -d -m 0700 -o USER"
FAILED = "agent here: command failed: "


def shim(tmp_path: Path, monkeypatch, name: str, body: str) -> None:
    """``name`` on the scripts' PATH ahead of the real command (what a remote host may do:
    a full disk, a move cut short, sudo), a sh script ``body``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / name).write_text("#!/bin/sh\n" + body)
    (bin_ / name).chmod(0o755)
    if os.environ["PATH"].split(":")[0] != str(bin_):
        monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")


def fail_for(path: Path, command: str, message: str) -> str:
    """A shim's body: ``command`` fails saying ``message`` when its last argument is ``path``."""
    return (f'for a; do last=$a; done\nif [ "$last" = {str(path)!r} ]; then\n'
            f'  echo {message!r} >&2; exit 1\nfi\nexec /bin/{command} "$@"\n')


class Recorded(LocalConnector):
    """This machine's shell, recording the time limit each script is given."""

    def __init__(self, agent_name: str = "here"):
        super().__init__(agent_name, timeout=7)
        self.limits: list[float | None] = []

    def run_script(self, script, timeout=None):
        self.limits.append(timeout)
        return super().run_script(script, timeout)


class Answers(LocalConnector):
    """An agent whose every script ends with the given exit code, stdout and stderr."""

    def __init__(self, rc: int, out: str = "", err: str = ""):
        super().__init__("far")
        self.answer = (rc, out, err)

    def run_script(self, script, timeout=None):
        return self.answer


@pytest.mark.parametrize("call, message", [
    (lambda: deliver_script("/r", "0123", "here", {"main1": "x"}),
     "stack id '0123' is not 16 hex digits"),
    (lambda: deliver_script("/r", STACK + "\n", "here", {"main1": "x"}),
     "stack id '0123456789abcdef\\n' is not 16 hex digits"),
    (lambda: deliver_script("/r", STACK, "two words", {"main1": "x"}),
     "'two words' is not a plain name"),
    (lambda: deliver_script("/r", STACK, "here", {"main1\n": "x"}),
     "'main1\\n' is not a plain name"),
    (lambda: deliver_script("/r", STACK, "here", {"main1": "x"}, gone=["../x"]),
     "'../x' is not a plain name"),
    (lambda: remove_script("/r", STACK, "here", ["-rf"]), "'-rf' is not a plain name"),
    (lambda: remove_script("/r", "0123456789ABCDEF", "here", []),
     "stack id '0123456789ABCDEF' is not 16 hex digits"),
    (lambda: sweep_stack(Answers(0), "/r", "../etc"), "stack id '../etc' is not 16 hex digits"),
    (lambda: sweep_stack(Answers(0), "/r", STACK + "\n"),
     "stack id '0123456789abcdef\\n' is not 16 hex digits"),
])
def test_a_name_that_is_not_plain_is_refused_before_any_script_is_written(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_every_script_has_two_minutes_whatever_the_connector_s_own_limit(tmp_path):
    root = scratch_root(tmp_path)
    conn = Recorded()
    deliver(conn, str(root), STACK, {"main1": "x\n"})
    remove(conn, str(root), STACK, ["main1"])
    check_root(conn, str(root))
    make_root(conn, str(root))
    stacks_on(conn, str(root))
    sweep_stack(conn, str(root), STACK)
    assert conn.limits == [120.0] * 6


@pytest.mark.parametrize("answer, detail", [
    ((5, "", ""), "exit 5"),
    ((1, "said on stdout\n", ""), "said on stdout"),
    ((4, "stdout is not the error\n", "one\ntwo\nthree\nfour\n"), "two / three / four"),
    # the hint is for a missing root only: exit 3 with "missing" on its last line
    ((4, "", "the device is missing\n"), "the device is missing"),
    ((3, "", "scratch root /r is missing\nand then something else\n"),
     "scratch root /r is missing / and then something else"),
    ((3, "", "scratch root /r is missing\n"), f"scratch root /r is missing ({HINT})"),
])
def test_a_failed_script_is_an_agent_error_with_its_last_three_lines(answer, detail):
    with pytest.raises(AgentError) as err:
        check_root(Answers(*answer), "/r")
    assert (err.value.agent, err.value.cause) == ("far", "command failed")
    assert str(err.value) == f"agent far: command failed: scratch root not usable: {detail}"


def test_a_missing_root_says_how_to_make_it_and_is_nothing_to_remove_or_list(tmp_path):
    conn = LocalConnector("here")
    missing = tmp_path / "nothing"
    said = f"scratch root {missing} is missing ({HINT})"
    for call, what in [(lambda: check_root(conn, str(missing)), "scratch root not usable"),
                       (lambda: deliver(conn, str(missing), STACK, {"main1": "x"}),
                        f"cannot deliver the bundles into {missing}/{STACK}"),
                       (lambda: sweep_stack(conn, str(missing), STACK),
                        f"cannot remove {missing}/{STACK}")]:
        with pytest.raises(AgentError) as err:
            call()
        assert str(err.value) == f"{FAILED}{what}: {said}"
    remove(conn, str(missing), STACK, ["main1"])
    assert stacks_on(conn, str(missing)) == {}
    assert not missing.exists()


def test_a_root_of_another_user_open_to_others_or_through_a_link_is_refused_by_name(tmp_path):
    conn = LocalConnector("here")
    root = scratch_root(tmp_path)
    deliver(conn, str(root), STACK, {"main1": "x\n"})
    before = tree(root)
    link = tmp_path / "link"
    link.symlink_to(root)
    with pytest.raises(AgentError) as err:
        remove(conn, str(link), STACK, ["main1"])
    assert str(err.value) == (f"{FAILED}cannot remove the bundles from {link}/{STACK}: "
                              f"scratch root {link} is reached through a link (to {root})")
    root.chmod(0o750)
    with pytest.raises(AgentError) as err:
        remove(conn, str(root), STACK, ["main1"])
    assert str(err.value) == (f"{FAILED}cannot remove the bundles from {root}/{STACK}: "
                              f"scratch root {root} has mode drwxr-x---: group and others must "
                              "have no access (0700)")
    with pytest.raises(AgentError) as err:
        stacks_on(conn, str(root))
    assert str(err.value) == (f"{FAILED}scratch root: scratch root {root} has mode drwxr-x---: "
                              "group and others must have no access (0700)")
    root.chmod(0o700)
    if os.getuid() == 0:
        os.chown(root, 65534, 65534)
        with pytest.raises(AgentError) as err:
            check_root(conn, str(root))
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        assert str(err.value) == (f"{FAILED}scratch root not usable: scratch root {root} "
                                  f"belongs to uid 65534, not to {user} (uid 0)")
        os.chown(root, 0, 0)
    assert tree(root) == before


def test_a_stack_directory_that_is_a_link_is_never_removed_through(tmp_path):
    conn = LocalConnector("here")
    root = scratch_root(tmp_path)
    (tmp_path / "x").mkdir()
    elsewhere = scratch_root(tmp_path / "x")
    (elsewhere / "main1").mkdir()
    (elsewhere / "main1" / "bundle.pack").write_text("not ours")
    (root / STACK).symlink_to(elsewhere)
    before = tree(elsewhere)
    remove(conn, str(root), STACK, ["main1"])
    sweep_stack(conn, str(root), STACK)
    assert (root / STACK).is_symlink()
    assert tree(elsewhere) == before and "main1/bundle.pack" in before


def test_a_stack_directory_that_cannot_be_made_is_the_error_of_mkdir(tmp_path, monkeypatch):
    root = scratch_root(tmp_path)
    shim(tmp_path, monkeypatch, "mkdir",
         fail_for(root / STACK, "mkdir", "mkdir: cannot create directory: Disk quota exceeded"))
    with pytest.raises(AgentError) as err:
        deliver(LocalConnector("here"), str(root), STACK, {"main1": "x\n"})
    assert str(err.value) == (f"{FAILED}cannot deliver the bundles into {root}/{STACK}: "
                              "mkdir: cannot create directory: Disk quota exceeded")
    assert tree(root) == {}


def test_a_delivery_cut_short_leaves_only_its_own_names_and_the_next_removes_them(
        tmp_path, monkeypatch):
    """A move into place that fails (the host went down mid-delivery) leaves the new bundle in
    ``.new-<agent>-<pid>/`` and the old one in ``.old-<agent>-<pid>-<host>``; another agent's
    delivery leaves them, this agent's next delivery (or its remove) removes them."""
    import re

    root = scratch_root(tmp_path)
    conn = LocalConnector("here")
    deliver(conn, str(root), STACK, {"main1": "one\n"})
    shim(tmp_path, monkeypatch, "mv",
         'case "$2" in */.new-*) echo "mv: the host went away" >&2; exit 1;; esac\n'
         'exec /bin/mv "$@"\n')
    with pytest.raises(AgentError) as err:
        deliver(conn, str(root), STACK, {"main1": "two\n"})
    assert str(err.value) == (f"{FAILED}cannot deliver the bundles into {root}/{STACK}: "
                              "mv: the host went away")
    left = sorted(p.name for p in (root / STACK).iterdir())
    assert len(left) == 2 and re.fullmatch(r"\.new-here-(\d+)", left[0]), left
    assert left[1] == f".old-here-{left[0].split('-')[-1]}-main1", left
    assert tree(root / STACK / left[0]) == {"main1": (0o700, None),
                                            "main1/bundle.pack": (0o000, b"two\n")}
    assert tree(root / STACK / left[1]) == {"bundle.pack": (0o000, b"one\n")}
    monkeypatch.undo()
    deliver(LocalConnector("agent2"), str(root), STACK, {"sub1": "three\n"})
    assert sorted(p.name for p in (root / STACK).iterdir()) == [*left, "sub1"]
    deliver(conn, str(root), STACK, {"main1": "four\n"})
    assert tree(root / STACK) == {
        "main1": (0o500, None), "main1/bundle.pack": (0o000, b"four\n"),
        "sub1": (0o500, None), "sub1/bundle.pack": (0o000, b"three\n")}


def test_remove_takes_this_agent_s_hosts_and_leftovers_and_leaves_another_agent_s(tmp_path):
    root = scratch_root(tmp_path)
    here, other = LocalConnector("here"), LocalConnector("agent2")
    deliver(here, str(root), STACK, {"main1": "one\n"})
    deliver(other, str(root), STACK, {"sub1": "two\n"})
    stack = root / STACK
    for leftover in (".new-here-7/main1", ".old-here-7-main1", ".new-agent2-7"):
        (stack / leftover).mkdir(mode=0o700, parents=True)
    (stack / ".new-here-7/main1/bundle.pack").write_text("half")
    (stack / ".new-here-7/main1/bundle.pack").chmod(0o000)
    (stack / ".new-here-7/main1").chmod(0o500)
    (stack / ".old-here-8-sub2").symlink_to(tmp_path / "nowhere")  # a link to nothing
    remove(here, str(root), STACK, ["main1"])
    assert tree(root) == {STACK: (0o700, None), f"{STACK}/.new-agent2-7": (0o700, None),
                          f"{STACK}/sub1": (0o500, None),
                          f"{STACK}/sub1/bundle.pack": (0o000, b"two\n")}
    (stack / ".new-agent2-7").rmdir()
    remove(other, str(root), STACK, ["sub1"])
    assert tree(root) == {}


def test_pool_check_fix_keeps_whatever_is_at_the_path_and_never_follows_a_link(tmp_path):
    conn = LocalConnector("here")
    root = tmp_path / "root"
    root.symlink_to(tmp_path / "nowhere")
    with pytest.raises(AgentError) as err:
        make_root(conn, str(root))
    assert str(err.value) == f"{FAILED}scratch root: scratch root {root} is missing ({HINT})"
    assert root.is_symlink() and not (tmp_path / "nowhere").exists()
    root.unlink()
    real = scratch_root(tmp_path)
    root.symlink_to(real)
    with pytest.raises(AgentError) as err:
        make_root(conn, str(root))
    assert str(err.value) == (f"{FAILED}scratch root: scratch root {root} is reached through "
                              f"a link (to {real})")


def test_pool_check_fix_says_what_root_must_run_where_the_user_cannot_make_the_root(
        tmp_path, monkeypatch):
    import grp
    import pwd

    shim(tmp_path, monkeypatch, "sudo", "exit 1\n")  # no sudo without a password
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "root"
    user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    with pytest.raises(AgentError) as err:
        make_root(LocalConnector("here"), str(root))
    assert str(err.value) == (f"{FAILED}scratch root: cannot make {root} as {user}: as root, "
                              f"run: install -d -m 0700 -o {user} -g {group} {root}")


def test_pool_check_fix_makes_the_root_through_sudo_for_a_user_who_may_not(tmp_path,
                                                                         monkeypatch):
    """The SSH user (uid 1000 here, by a shim of ``id``) may not make the root (``mkdir``
    fails, as in ``/var/lib``) but may run ``sudo -n``: root makes it, the user's, 0700."""
    if os.getuid() != 0:
        pytest.skip("needs root to give the root to another uid")
    root = tmp_path / "root"
    log = tmp_path / "sudo.log"
    shim(tmp_path, monkeypatch, "id",
         'case "$*" in -u|-g) echo 1000;; -un|-gn) echo ops;; *) exec /usr/bin/id "$@";; esac\n')
    shim(tmp_path, monkeypatch, "mkdir", fail_for(root, "mkdir", "mkdir: Permission denied"))
    shim(tmp_path, monkeypatch, "sudo",
         f'[ "$1" = -n ] || exit 1\nshift\necho "$*" >> {str(log)!r}\nexec "$@"\n')
    assert make_root(LocalConnector("here"), str(root)) == "made"
    st = root.lstat()
    assert (stat.S_ISDIR(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (
        True, 0o700, 1000, 1000)
    assert log.read_text().splitlines() == [
        "true", f"install -d -m 0700 -o 1000 -g 1000 -- {root}"]


@pytest.mark.parametrize("out, verdict", [
    ("made\n", "made"), ("kept\n", "kept"), ("", "kept"),
    # an SSH login shell's rc file printing first: the script's word is the last
    ("Welcome to far\nmade\n", "made"), ("this box was made in 2019\nkept\n", "kept")])
def test_pool_check_fix_reads_the_script_s_last_word(out, verdict):
    assert make_root(Answers(0, out), "/r") == verdict


def test_the_stacks_on_a_root_are_its_stack_directories_with_their_ages(tmp_path):
    import time

    root = scratch_root(tmp_path)
    conn = LocalConnector("here")
    old, ahead = STACK, "fedcba9876543210"
    deliver(conn, str(root), old, {"main1": "x\n"})
    (root / ahead).mkdir()
    for name in ("notes", "0123456789abcdeF", f" {'3' * 16}", f"{'4' * 16} 5", f"{'6' * 17}"):
        (root / name).mkdir()  # not a stack id: left alone
    (root / ("1" * 16)).write_text("a file")
    (root / ("2" * 16)).symlink_to(root / old)
    now = time.time()
    os.utime(root / old, (now - 100, now - 100))
    os.utime(root / ahead, (now + 50, now + 50))  # a clock ahead of the agent's
    for name in (f" {'3' * 16}", f"{'4' * 16} 5"):
        os.utime(root / name, (now - 1000, now - 1000))
    found = stacks_on(conn, str(root))
    assert sorted(found) == [old, ahead]
    assert 100 <= found[old] <= 110 and -50 <= found[ahead] <= -40, found
    (tmp_path / "empty").mkdir()
    assert stacks_on(conn, str(scratch_root(tmp_path / "empty"))) == {}


def test_a_sweep_removes_that_stack_s_directory_whole_and_nothing_else(tmp_path):
    root = scratch_root(tmp_path)
    conn = LocalConnector("here")
    other = "fedcba9876543210"
    deliver(conn, str(root), STACK, {"main1": "x\n", "sub1": "y\n"})
    deliver(conn, str(root), other, {"main1": "z\n"})
    (root / ("1" * 16)).write_text("a file")
    (root / ("2" * 16)).symlink_to(root / other)
    before = tree(root)
    sweep_stack(conn, str(root), STACK)
    assert tree(root) == {k: v for k, v in before.items() if not k.startswith(STACK)}
    for stack_id in ("1" * 16, "2" * 16, "9" * 16):  # a file, a link, nothing: left as they are
        sweep_stack(conn, str(root), stack_id)
    assert tree(root) == {k: v for k, v in before.items() if not k.startswith(STACK)}
    assert (root / ("2" * 16)).is_symlink()


# --- the real local engine ----------------------------------------------------------------------

@pytest.mark.docker
def test_a_container_sees_only_its_own_bundle_read_only_and_destroy_leaves_nothing(
        docker_client, tmp_path):
    from cluster_sessions.lab.image import ensure_image
    from tests.standin.docker_builder import (
        DockerBuilder,
        run_in,
        sweep_session,
        wait_until_ready,
    )
    from tests.standin.engine import Engine, run_program

    image = ensure_image(docker_client)
    root = scratch_root(tmp_path)
    name = f"bundles-{uuid.uuid4().hex[:8]}"
    path = write_pair(tmp_path, {**session(name, image=image, size=3, cpu=0.25, mem="256m",
                                           shmem="16m")},
                      pool("own", agent("here", cpu=512, mem="4096g"), scratch=str(root)))
    builder = DockerBuilder()
    engine = Engine(on_create=builder, on_delete=builder.remove)
    try:
        outputs = run_program(engine, name, {"cluster-sessions:definition": str(path)})
        hosts = outputs["hosts"][0]
        containers = {h: docker_client.containers.get(f"{name}-{h}") for h in hosts}
        wait_until_ready(containers)  # ssh between every two: the bundles were unpacked
        (stack,) = [p.name for p in root.iterdir()]
        for host, c in containers.items():
            binds = [m for m in c.attrs["Mounts"] if m["Destination"] == BUNDLE_DIR]
            assert [(m["Source"], m["RW"]) for m in binds] == [(str(root / stack / host), False)]
            # only its own directory is there: no other host's bundle, no scratch root
            code, out = run_in(c, f"ls -A {BUNDLE_DIR}; grep -c {root} /proc/self/mountinfo",
                               user="root")
            assert out.split() == ["bundle.pack", "1"], (host, out)
            others = [h for h in hosts if h != host]
            code, _ = run_in(c, f"ls {root}/{stack}/{others[0]}", user="root")
            assert code != 0, host
            # not writable, even by root; not readable by the session user
            code, out = run_in(c, f"touch {BUNDLE_DIR}/x || rm -f {BUNDLE_DIR}/bundle.pack",
                               user="root")
            assert code != 0 and "Read-only file system" in out, (host, out)
            code, out = run_in(c, f"cat {BUNDLE_DIR}/bundle.pack")
            assert code != 0, f"{host}: the session user read the private keys"
        # destroy: every resource, the delivery included: nothing under the root
        failed = engine.delete_resources(list(engine.state))
        assert failed == {}
        assert list(root.iterdir()) == []
    finally:
        builder.remove_all()
        builder.close()
        sweep_session(docker_client, name)


@pytest.mark.docker
def test_a_mount_source_through_a_link_into_the_scratch_root_is_refused(docker_client,
                                                                         tmp_path):
    from cluster_sessions.agents.folders import bind_refusals
    from cluster_sessions.lab.image import ensure_image

    image = ensure_image(docker_client)
    sources = Path("/srv") / f"cs-test-{uuid.uuid4().hex[:8]}"
    sources.mkdir(mode=0o755)
    try:
        (sources / "data").symlink_to("/var/lib/cluster-sessions")
        pool_file = write(tmp_path / "pool.yaml", pool("own", agent("here"),
                                                       mount_sources=[str(sources)]))
        path = write(tmp_path / "s.yaml", session(
            image=image, pool=str(pool_file),
            mounts=[{"source": str(sources / "data"), "target": "/data/x"}]))
        loaded = load_session(path)
        plan = build_plan(loaded.session, loaded.pool)
        found = bind_refusals(loaded.pool, plan)
        assert [p for p, _ in found] == ["mounts.0.source"], found
        assert "link" in found[0][1], found
    finally:
        (sources / "data").unlink(missing_ok=True)
        sources.rmdir()


def test_the_lab_pool_names_a_scratch_root_of_its_ssh_user(tmp_path):
    from cluster_sessions.lab.pool_file import make_scratch
    from cluster_sessions.lab.pool_file import scratch_root as lab_root

    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    make_scratch(tmp_path, user)
    try:
        st = lab_root(tmp_path).stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, os.getuid())
        assert stat.S_IMODE(lab_root(tmp_path).parent.stat().st_mode) == 0o755
    finally:
        lab_root(tmp_path).rmdir()


@pytest.mark.docker
def test_pool_sweep_removes_the_directories_of_stacks_that_no_longer_exist(docker_client,
                                                                           tmp_path, capsys):
    from cluster_sessions.core.names import SESSION_LABEL, STACK_ID_LABEL
    from cluster_sessions.driver.cli import main
    from cluster_sessions.lab.image import ensure_image

    image = ensure_image(docker_client)
    root = scratch_root(tmp_path)
    pool_file = write(tmp_path / "pool.yaml", pool("own", agent("here"), scratch=str(root)))
    live, gone = uuid.uuid4().hex[:16], uuid.uuid4().hex[:16]
    conn = LocalConnector("here")
    for stack_id in (live, gone):
        deliver(conn, str(root), stack_id, {"main1": "x\n"})
    holder = docker_client.containers.create(
        image, ["true"], labels={SESSION_LABEL: "sweep-test", STACK_ID_LABEL: live})
    try:
        # too recent: an up may be about to create its containers
        assert main(["pool", "sweep", str(pool_file), "--scratch"]) == 0
        assert sorted(p.name for p in root.iterdir()) == sorted([live, gone])
        assert main(["pool", "sweep", str(pool_file), "--scratch", "--older-than", "0",
                     "--dry-run"]) == 0
        assert capsys.readouterr().out.split("\n")[-2].startswith(
            f"agent here: {root}/{gone}")
        assert sorted(p.name for p in root.iterdir()) == sorted([live, gone])
        assert main(["pool", "sweep", str(pool_file), "--scratch", "--older-than", "0"]) == 0
        assert [p.name for p in root.iterdir()] == [live]
    finally:
        holder.remove(force=True)


@pytest.mark.docker
def test_up_refuses_a_missing_root_before_anything_is_made_and_destroy_leaves_nothing(
        real_engine, docker_client, tmp_path, capsys):
    """Through `sessionctl up` (the Automation API stand-in): a missing scratch root is exit 1
    naming the agent and the path, with nothing created; `pool check --fix` makes it; `up`
    delivers; `destroy` leaves nothing under it."""
    from cluster_sessions.driver.cli import main
    from cluster_sessions.lab.image import ensure_image

    image = ensure_image(docker_client)
    root = tmp_path / "scratch"
    name = f"bundles-{uuid.uuid4().hex[:8]}"
    pool_file = write(tmp_path / "pool.yaml", pool("own", agent("here", cpu=512, mem="4096g"),
                                                   scratch=str(root)))
    path = str(write(tmp_path / f"{name}.yaml", session(
        name, image=image, pool=str(pool_file), size=2, cpu=0.25, mem="256m", shmem="16m")))

    code = main(["up", path, "--yes"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"agent here: command failed: scratch root not usable: scratch root {root} is " \
           "missing" in err, err
    assert "nothing was created" in err
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert not root.exists()

    assert main(["pool", "check", str(pool_file), "--fix"]) == 0
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    try:
        assert main(["up", path, "--yes"]) == 0, capsys.readouterr().err
        (stack,) = list(root.iterdir())
        assert sorted(p.name for p in stack.iterdir()) == ["main1", "sub1"]
    finally:
        assert main(["destroy", path, "--yes"]) == 0
    assert list(root.iterdir()) == []


class AsNobody(LocalConnector):
    """This machine's shell as ``nobody``: the pool's SSH user is not root (the lab's is not)."""

    def run_script(self, script, timeout=None):
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               "/bin/sh", "-s"], input=script.encode(), capture_output=True,
                              timeout=timeout or 60)
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_a_delivery_by_a_user_who_is_not_root_replaces_and_removes_its_bundles():
    """Renaming a directory into another needs write permission on it unless one is root: the
    host directories are moved into place writable, and only then made 0500."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    parent = Path(f"/var/tmp/cs-bundles-{uuid.uuid4().hex[:8]}")
    parent.mkdir(mode=0o755)
    root = parent / "scratch"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    try:
        conn = AsNobody("far")
        deliver(conn, str(root), STACK, {"main1": "one\n", "sub1": "two\n"})
        deliver(conn, str(root), STACK, {"main1": "three\n"}, gone=["sub1"])
        assert tree(root) == {
            STACK: (0o700, None),
            f"{STACK}/main1": (0o500, None), f"{STACK}/main1/bundle.pack": (0o000, b"three\n")}
        assert (root / STACK / "main1" / "bundle.pack").stat().st_uid == 65534
        remove(conn, str(root), STACK, ["main1"])
        assert tree(root) == {}
    finally:
        subprocess.run(["rm", "-rf", str(parent)], check=False)


def test_plan_s_table_says_each_agents_delivery(tmp_path, capsys):
    from cluster_sessions.driver.cli import main

    tcp = agent("box", "tcp://10.0.0.20:2376", tls={"cert_path": str(tmp_path)}, cpu=1)
    path = write_pair(tmp_path, session(size=2, cpu=1, mode="multi-node"),
                      pool("p", agent("here", cpu=1), tcp, swarm={"manager": "here"}))
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bundles  here: scratch into /var/lib/cluster-sessions (one archive per up" in out
    assert "bundles  box: upload (tcp:// agent: no file access, the provider uploads" in out


# --- the Pulumi layer's delivery resource (pulumi_layer/bundles.py), its provider called as the
# dynamic-provider host calls it, on this machine's local agent -------------------------------

def _delivery_props(root: Path, bundles: dict[str, str]) -> dict:
    from cluster_sessions.agents.connectors import agent_props
    from cluster_sessions.core.spec import Agent

    return {"agent": agent_props(Agent.model_validate(agent("local"))),
            "scratch": str(root), "stack_id": STACK, "bundles": bundles}


def test_the_delivery_provider_writes_rewrites_and_removes_one_agents_bundles(tmp_path):
    from cluster_sessions.pulumi_layer.bundles import BundleDeliveryProvider

    root = scratch_root(tmp_path)
    provider = BundleDeliveryProvider()
    props = _delivery_props(root, {"main1": "one\n", "sub1": "two\n"})
    made = provider.create(props)
    assert (made.id, made.outs) == (f"local:{root}/{STACK}", props)
    assert sorted(p.name for p in (root / STACK).iterdir()) == ["main1", "sub1"]
    # sub1 is gone from the session, main1's bundle changed: rewritten, sub1's removed
    news = {**props, "bundles": {"main1": "three\n"}}
    assert provider.update(made.id, props, news).outs == news
    assert [p.name for p in (root / STACK).iterdir()] == ["main1"]
    assert "three" in "".join(p.read_text() for p in (root / STACK / "main1").rglob("*")
                              if p.is_file())
    provider.delete(made.id, news)
    assert list(root.iterdir()) == []  # destroy leaves nothing under the root
    provider.delete(made.id, news)  # gone already: done


def test_the_delivery_provider_checks_its_inputs():
    from pulumi.output import Unknown

    from cluster_sessions.pulumi_layer.bundles import BundleDeliveryProvider

    good = _delivery_props(Path("/var/lib/cluster-sessions"), {"main1": "x"})
    check = BundleDeliveryProvider().check
    assert check({}, good).failures == [] and check({}, good).inputs == good
    bad = {**good, "scratch": "relative", "stack_id": "0123456789abcdef\n", "bundles": ["x"]}
    assert [(f.property, f.reason) for f in check({}, bad).failures] == [
        ("scratch", "must be an absolute host directory"),
        ("stack_id", "must be 16 hex digits"),
        ("bundles", "must map host names to packs")]
    assert [f.property for f in check({}, {**bad, "scratch": 7, "stack_id": 7}).failures] == [
        "scratch", "stack_id", "bundles"]
    later = {**good, "scratch": Unknown(), "stack_id": Unknown(), "bundles": Unknown()}
    assert check({}, later).failures == []  # a preview's unknowns are checked at up
