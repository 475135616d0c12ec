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

from cluster_sessions.agents.bundles import check_root, deliver, make_root, remove
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
    with pytest.raises(AgentError, match="is not a directory"):
        deliver(conn, str(root), STACK, {"main1": "x"})
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
