"""The rendered files in real containers on a real Docker Engine (issue 3).

Sessions are started from the rendered files only, the way the Pulumi component does it: one
bridge network per session; per container the plan's static env, hostname and network alias
``<host>``, the bundle bind-mounted read-only at BUNDLE_DIR, ``entrypoint_argv()`` as the
entrypoint and the definition's command. Each session is shared by the tests of one topic
(module-scoped fixtures) and always removed afterwards.

Needs the test image (``cluster_sessions.lab.image``); the torch test also needs the torch
directory (``cluster_sessions.lab.pydirs``). In CI (CLUSTER_SESSIONS_REQUIRE_DOCKER=1) a
missing engine is a failure, never a skip.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import re
import tarfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from cluster_sessions.core.container_args import container_args
from cluster_sessions.core.keys import SessionKeys, generate_session_keys
from cluster_sessions.core.plan import (
    ClusterPlan,
    build_plan,
    container_command,
    container_labels,
    network_labels,
)
from cluster_sessions.core.render import BUNDLE_DIR, entrypoint_argv, render_session
from cluster_sessions.core.spec import RUN_DIR, SSH_PORT, Pool, Session
from cluster_sessions.driver.render_verb import write_bundle

from . import factories

pytestmark = pytest.mark.docker

POOL = Pool.model_validate({"kind": "AgentPool", "name": "local", "agents": [
    {"name": "local", "docker_host": "unix:///var/run/docker.sock",
     "capacity": {"cpu": 256, "mem": "512g"}}]})
READY = re.compile(rb"cluster-session\[[^]]*\]: ready:")
FAILED = re.compile(rb"cluster-session\[[^]]*\]: error:")
DERIVED = ("MASTER_ADDR", "MASTER_PORT", "TF_CONFIG",
           "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
HOSTILE = {
    "QUOTES": "it's \"quoted\" \\ back\\slash '\\''",
    "SUBST": "$(touch /tmp/pwned) `touch /tmp/pwned` ${HOME} $1",
    "LINES": "first\nsecond\n\n",
    "SPACES": "  leading and trailing  ",
    "UNICODE": "ünï©ødé ✓ 日本語 😀",
    "EMPTY": "",
    "GLOB": "* ? [a] ~",
    "CONTROL": "\t\r\x1b[0m",
    "SEMI": "a; exit 1 && b || c | d",
}
# Dumps the environment as {name: hex(value)}: exact bytes through ssh and docker exec.
DUMP = ("import json, os, sys; json.dump({k.decode(): v.hex() for k, v in "
        "os.environb.items()}, sys.stdout)")


def session_def(name: str, size: int, **over) -> Session:
    data = factories.session(name, image="set-later", size=size, readiness={"timeout": 60})
    return Session.model_validate({**data, **over})


@dataclass
class Running:
    """A session started from rendered files, and what it took."""

    plan: ClusterPlan
    keys: SessionKeys
    bundles: Path
    containers: dict = field(default_factory=dict)  # host -> docker Container
    network: object = None
    timings: dict = field(default_factory=dict)

    @property
    def hosts(self) -> list[str]:
        return list(self.plan.hosts)

    def run(self, host: str, script: str, user: str = "work") -> tuple[int, bytes, bytes]:
        """Run ``sh -c script`` in a container; return (exit code, stdout, stderr)."""
        result = self.containers[host].exec_run(["sh", "-c", script], user=user, demux=True)
        out, err = result.output
        return result.exit_code, out or b"", err or b""

    def ok(self, host: str, script: str, user: str = "work") -> str:
        code, out, err = self.run(host, script, user)
        assert code == 0, f"{host}: {script!r} exited {code}: {err.decode(errors='replace')}"
        return out.decode()

    def logs(self, host: str) -> bytes:
        return self.containers[host].logs(stdout=True, stderr=True)


def render_to(directory: Path, session: Session) -> tuple[ClusterPlan, SessionKeys]:
    """``sessionctl render``, in process: DIR/<host>/ for every container, fresh keys."""
    plan = build_plan(session, POOL)
    assert not plan.pending, plan.reason
    keys = generate_session_keys(plan.hosts)
    for host, files in render_session(plan, keys).items():
        write_bundle(files, directory / host)
    return plan, keys


def upload_archive(directory: Path) -> bytes:
    """The bundle as the Pulumi docker provider uploads it: one entry per file, owned by root,
    mode 0744 if executable else 0644 (private keys included), directories made on the way."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            data = path.read_bytes()
            info = tarfile.TarInfo(posixpath.join(BUNDLE_DIR, *path.relative_to(directory).parts))
            info.size = len(data)
            info.mode = 0o744 if path.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def start(client, image: str, session: Session, directory: Path, *, init: bool = True,
          only: list[str] | None = None, upload: bool = False, wait: bool = True,
          before: str | None = None, bundle_dir: str = BUNDLE_DIR,
          pids_limit: bool = True) -> Running:
    """Create the network and containers of ``session`` from its rendered files (``only``
    some of them, if given), start them all at once as Pulumi would, and wait for every
    entrypoint's ``ready:`` line. The bundle is bind-mounted read-only (at ``bundle_dir``), or
    ``upload``ed. ``before``: a shell command run as root just before the entrypoint (to take
    things out of the image). ``pids_limit``: created with the pool's (as up leaves it),
    or without one (the set-up then waits for it)."""
    from docker.types import Mount

    session = session.model_copy(update={"image": image})
    plan, keys = render_to(directory, session)
    running = Running(plan, keys, directory)
    running.network = client.networks.create(plan.network.name, driver="bridge",
                                             labels=network_labels(plan))
    res = plan.resources
    for c in plan.containers:
        if only is not None and c.host not in only:
            continue
        mounts = [] if upload else [
            Mount(bundle_dir, str(directory / c.host), type="bind", read_only=True)]
        entrypoint = entrypoint_argv() if bundle_dir == BUNDLE_DIR else [
            "/bin/sh", f"{bundle_dir}/entrypoint.sh"]
        mounts += [Mount(m.target, m.source, type="bind", read_only=m.read_only)
                   for m in plan.mounts]
        networking = client.api.create_networking_config({
            plan.network.name: client.api.create_endpoint_config(aliases=[c.host])})
        args = container_args(plan, c)
        created = client.api.create_container(
            image, command=list(container_command(plan, c)), name=c.container_name,
            hostname=c.host,
            entrypoint=entrypoint if before is None else [
                "/bin/sh", "-c", f'{before} && exec /bin/sh "$0" "$@"', entrypoint[1]],
            environment=[f"{k}={v}" for k, v in c.env.items()],
            labels=container_labels(plan, c), networking_config=networking,
            host_config=client.api.create_host_config(
                init=init, mounts=mounts, mem_limit=res.mem, shm_size=res.shmem,
                nano_cpus=int(res.cpu * 1e9),
                # what the Session gives every container: the pool's capabilities only
                cap_add=list(args.capabilities_add), cap_drop=list(args.capabilities_drop),
                security_opt=list(args.security_opts) or None,
                # what up sets once the container exists (pulumi_layer/limits.py)
                pids_limit=plan.limits.pids_limit if pids_limit else None),
        )
        running.containers[c.host] = client.containers.get(created["Id"])
        if upload:
            client.api.put_archive(created["Id"], "/", upload_archive(directory / c.host))
    started = time.monotonic()
    threads = [threading.Thread(target=c.start) for c in running.containers.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    running.timings["start_calls_s"] = time.monotonic() - started
    if wait:
        wait_ready(running, timeout=session.readiness.timeout + 30)
        running.timings.update(ready_times(running))
    return running


def wait_ready(running: Running, timeout: float, count: int = 1) -> None:
    deadline = time.monotonic() + timeout
    pending = set(running.containers)
    while pending:
        for host in sorted(pending):
            logs = running.logs(host)
            if len(READY.findall(logs)) >= count:
                pending.discard(host)
            elif FAILED.search(logs):
                pytest.fail(f"{host} failed to start:\n{logs.decode(errors='replace')}")
        if pending and time.monotonic() > deadline:
            details = {h: running.logs(h).decode(errors="replace")[-2000:] for h in pending}
            pytest.fail(f"not ready after {timeout}s: {details}")
        time.sleep(0.02)


def _docker_time(text: str) -> datetime:
    text = text.rstrip("Z")
    head, _, fraction = text.partition(".")
    return datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}")


def ready_times(running: Running) -> dict:
    """Docker's own clock: from the first container start to the last ``ready:`` line."""
    started, ready = [], []
    for container in running.containers.values():
        container.reload()
        started.append(_docker_time(container.attrs["State"]["StartedAt"]))
        for line in container.logs(timestamps=True).splitlines():
            if READY.search(line):
                ready.append(_docker_time(line.split(b" ", 1)[0].decode()))
                break
    return {
        "first_start_to_all_ready_s": (max(ready) - min(started)).total_seconds(),
        "last_start_to_all_ready_s": (max(ready) - max(started)).total_seconds(),
    }


def remove(client, running: Running) -> None:
    import docker.errors

    for container in running.containers.values():
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
    if running.network is not None:
        with contextlib.suppress(docker.errors.NotFound):
            running.network.remove()


def unique(stem: str) -> str:
    return f"cst-{uuid.uuid4().hex[:8]}-{stem}"


@pytest.fixture(scope="module")
def image(docker_client) -> str:
    from cluster_sessions.lab.image import ensure_image

    return ensure_image(docker_client)


@pytest.fixture(scope="module")
def session_factory(docker_client, image, tmp_path_factory):
    """Start sessions for this module; every one is removed at the end, whatever happens."""
    started: list[Running] = []

    def make(session: Session, **kwargs) -> Running:
        directory = tmp_path_factory.mktemp(session.name)
        holder = Running(build_plan(session, POOL), None, directory)  # type: ignore[arg-type]
        started.append(holder)
        try:
            running = start(docker_client, image, session, directory, **kwargs)
        except BaseException:
            _remove_by_name(docker_client, holder.plan)
            raise
        started[-1] = running
        return running

    yield make
    for running in started:
        remove(docker_client, running)
        _remove_by_name(docker_client, running.plan)


def _remove_by_name(client, plan: ClusterPlan) -> None:
    """Also what a failed ``start`` may have left half made."""
    import docker.errors

    for c in plan.containers:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(c.container_name).remove(force=True)
    for network in client.networks.list(names=[plan.network.name]):
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()


@pytest.fixture(scope="module")
def mesh(session_factory) -> Running:
    """Four containers, hostile user env, distributed.master_port 29400."""
    running = session_factory(session_def(unique("mesh"), 4, env=HOSTILE,
                                          distributed={"master_port": 29400}))
    print(f"\nmesh of 4 ready: {running.timings}")
    return running


def env_of(raw: bytes) -> dict[str, bytes]:
    """/proc/PID/environ as {name: value bytes}."""
    pairs = [item.split(b"=", 1) for item in raw.split(b"\0") if item]
    return {k.decode(): v for k, v in pairs}


def dump_env(output: str) -> dict[str, bytes]:
    return {k: bytes.fromhex(v) for k, v in json.loads(output).items()}


def command_env(running: Running, host: str) -> dict[str, bytes]:
    """The environment of the session command (sleep), read as its owner."""
    code, out, err = running.run(host, "cat /proc/$(pgrep -o -x sleep)/environ")
    assert code == 0, err
    return env_of(out)


# --- the mesh ---------------------------------------------------------------------------------

def test_the_mesh_is_ready_soon_after_the_last_container_starts(mesh):
    # The readiness wait polls every 0.1 s; allow a slow CI machine plenty of room.
    assert mesh.timings["last_start_to_all_ready_s"] < 5, mesh.timings


def test_every_container_reaches_every_peer_by_name_with_strict_host_keys(mesh):
    script = ("for p in " + " ".join(mesh.hosts) + "; do "
              "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes \"$p\" hostname "
              "|| echo \"FAILED $p\"; done")
    with ThreadPoolExecutor(len(mesh.hosts)) as pool:
        outputs = dict(zip(mesh.hosts, pool.map(lambda h: mesh.ok(h, script), mesh.hosts),
                           strict=True))
    for host, output in outputs.items():
        assert output.split() == mesh.hosts, f"from {host}: {output}"


def test_connections_inside_the_session_use_the_cheap_key_exchange(mesh):
    code, _, err = mesh.run("main1", "ssh -v -o BatchMode=yes sub1 true")
    assert code == 0, err
    assert b"kex: algorithm: curve25519-sha256" in err, err


def test_an_unknown_host_key_is_refused(mesh):
    code, _, err = mesh.run("main1", "ssh -o BatchMode=yes -o UserKnownHostsFile=/dev/null "
                                     "sub1 true")
    assert code != 0 and b"Host key verification failed" in err


def test_ssh_sessions_see_the_derived_variables(mesh):
    out = mesh.ok("main1", "ssh -o BatchMode=yes sub2 'echo $MASTER_ADDR $TF_CONFIG'")
    addr, tf_config = out.strip().split(" ", 1)
    assert addr == "main1"
    assert json.loads(tf_config) == {
        "cluster": {"worker": ["main1:29400", "sub1:29401", "sub2:29402", "sub3:29403"]},
        "task": {"type": "worker", "index": 2}}
    out = mesh.ok("sub3", "ssh -o BatchMode=yes main1 'env'")
    env = dict(line.split("=", 1) for line in out.splitlines() if re.match(r"^\w+=", line))
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29400"
    assert env["PET_NNODES"] == "4" and env["PET_NODE_RANK"] == "0"
    assert env["BACKENDAI_CLUSTER_HOST"] == "main1"
    assert not {"WORLD_SIZE", "RANK", "LOCAL_RANK"} & set(env)


def test_login_shells_see_the_derived_variables_and_the_container_path(mesh):
    # No command and no tty: sshd runs a login shell reading its commands from stdin.
    out = mesh.ok("main1", "printf '%s\\n' 'echo \"$MASTER_ADDR|$PET_NODE_RANK|$PATH\"' "
                           "| ssh -T -o BatchMode=yes sub1")
    assert out.strip().splitlines()[-1] == (
        "main1|1|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def test_the_command_runs_as_the_user_with_the_static_and_derived_env(mesh):
    env = command_env(mesh, "sub1")
    plan_env = mesh.plan.containers[1].env
    for name, value in plan_env.items():
        assert env[name] == value.encode(), name
    assert env["MASTER_ADDR"] == b"main1" and env["PET_NODE_RANK"] == b"1"
    assert env["USER"] == b"work" and env["HOME"] == b"/home/work"
    status = mesh.ok("sub1", "grep -E '^(Uid|Gid):' /proc/$(pgrep -o -x sleep)/status")
    assert status.split() == ["Uid:"] + ["9001"] * 4 + ["Gid:"] + ["9001"] * 4


def test_hostile_env_values_reach_the_command_and_ssh_sessions_unchanged(mesh):
    command = command_env(mesh, "sub2")
    code, out, err = mesh.run("main1", f"ssh -o BatchMode=yes sub2 \"python3 -c '{DUMP}'\"")
    assert code == 0, err
    over_ssh = dump_env(out.decode())
    for name, value in HOSTILE.items():
        assert command[name] == value.encode(), name
        assert over_ssh[name] == value.encode(), name
    code, _, _ = mesh.run("sub2", "test -e /tmp/pwned")
    assert code != 0


def test_scp_and_sftp_work_between_containers(mesh):
    out = mesh.ok("sub1", "echo payload > /tmp/p && scp -q /tmp/p sub3:/tmp/p2 && "
                          "ssh sub3 cat /tmp/p2 && echo 'ls /tmp/p2' | sftp -q -b - sub3")
    assert out.splitlines()[0] == "payload" and "/tmp/p2" in out


def test_root_login_is_refused_even_with_the_session_key(mesh):
    mesh.ok("sub1", "mkdir -p /root/.ssh && cp /home/work/.ssh/authorized_keys /root/.ssh/ "
                    "&& chmod 700 /root/.ssh", user="root")
    code, _, err = mesh.run("main1", "ssh -o BatchMode=yes -l root sub1 true")
    assert code != 0 and b"Permission denied" in err


def test_only_public_key_authentication_is_offered_even_with_a_password_set(mesh):
    import paramiko

    mesh.ok("sub3", "python3 -c \"import crypt; print('work:' + crypt.crypt('hunter2'))\" "
                    "2>/dev/null | chpasswd -e", user="root")
    mesh.containers["sub3"].reload()
    address = mesh.containers["sub3"].attrs["NetworkSettings"]["Networks"][
        mesh.plan.network.name]["IPAddress"]
    key = paramiko.Ed25519Key.from_private_key_file(
        str(mesh.bundles / "sub3" / "ssh" / "id_cluster"))
    pinned = mesh.keys.hosts["sub3"].public_openssh.split()[1]

    def attempt(user: str, method: str) -> None:
        # one connection per attempt: sshd drops a client that changes the user name
        transport = paramiko.Transport((address, SSH_PORT))
        try:
            transport.start_client(timeout=10)
            assert transport.get_remote_server_key().get_base64() == pinned
            if method == "password":
                transport.auth_password(user, "hunter2")
            else:
                transport.auth_publickey(user, key)
        finally:
            transport.close()

    for user in ("work", "root"):
        with pytest.raises(paramiko.BadAuthenticationType) as exc:
            attempt(user, "password")
        assert exc.value.allowed_types == ["publickey"]
    with pytest.raises(paramiko.AuthenticationException):
        attempt("root", "publickey")
    attempt("work", "publickey")  # and the session key does work for the user


def test_a_restarted_sub_rejoins_the_mesh(mesh):
    mesh.containers["sub2"].restart(timeout=2)
    wait_ready(Running(mesh.plan, mesh.keys, mesh.bundles, {"sub2": mesh.containers["sub2"]}),
               timeout=60, count=2)
    out = mesh.ok("sub2", "for p in main1 sub1 sub2 sub3; do ssh -o BatchMode=yes $p "
                          "hostname; done")
    assert out.split() == mesh.hosts
    assert mesh.ok("main1", "ssh -o BatchMode=yes sub2 'echo $MASTER_ADDR $PET_NODE_RANK'"
                   ).split() == ["main1", "2"]
    assert command_env(mesh, "sub2")["QUOTES"] == HOSTILE["QUOTES"].encode()
    # adjusted in place, not added again
    assert mesh.ok("sub2", "grep -c ^work: /etc/passwd /etc/group /etc/shadow", user="root"
                   ).split() == ["/etc/passwd:1", "/etc/group:1", "/etc/shadow:1"]


def test_an_uploaded_bundle_works_and_its_private_keys_are_locked_up(session_factory):
    running = session_factory(session_def(unique("upload"), 2), upload=True)
    assert running.ok("sub1", "ssh -o BatchMode=yes main1 hostname").strip() == "main1"
    for path in (f"{BUNDLE_DIR}/ssh/id_cluster", f"{BUNDLE_DIR}/ssh/ssh_host_ed25519_key",
                 f"{RUN_DIR}/ssh/ssh_host_ed25519_key"):
        code, _, _ = running.run("main1", f"cat {path}")
        assert code != 0, f"{path} is readable by the user"


def container_cpu_seconds(cid: str) -> float:
    """CPU seconds the container's cgroup has used (cgroup v1 or v2, as the engine made it)."""
    for path, parse in (
            (Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage"),
             lambda text: int(text) / 1e9),
            (Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
             lambda text: int(text.split("usage_usec ")[1].split()[0]) / 1e6),
            (Path(f"/sys/fs/cgroup/docker/{cid}/cpu.stat"),
             lambda text: int(text.split("usage_usec ")[1].split()[0]) / 1e6)):
        if path.exists():
            return parse(path.read_text())
    pytest.fail(f"no cgroup CPU accounting found for container {cid}")


def _processes(container) -> list[tuple[str, str]]:
    """(uid, command) of every process in the container, read by root from /proc."""
    code, out = container.exec_run(["sh", "-c", 'for p in /proc/[0-9]*; do '
                                    'read -r c < "$p/comm" && '
                                    'u=$(stat -c %u "$p") && echo "$u $c"; done'], user="root")
    return [tuple(line.split(" ", 1)) for line in out.decode().splitlines() if " " in line]


def test_nothing_runs_as_the_user_before_the_pids_limit_holds(docker_client, session_factory):
    """up sets the pool's pids limit once the container exists (the provider has no argument
    for it: pulumi_layer/limits.py); until it holds, the set-up waits: no sshd, no process of
    the user's. Once set it goes on at once, and a fork past the limit fails."""
    running = session_factory(session_def(unique("pidsgate"), 1), pids_limit=False,
                              wait=False)
    container = running.containers["main1"]
    time.sleep(1.5)
    seen = _processes(container)
    uid = str(running.plan.session.user.uid)
    assert not [p for p in seen if p[1] == "sshd" or p[0] == uid], seen
    assert not READY.search(running.logs("main1"))
    # the wait starts no program per look (a sleep every 10 ms took ~0.1 s of CPU a second
    # from the engine starting the other containers)
    before = container_cpu_seconds(container.id)
    time.sleep(1)
    used = container_cpu_seconds(container.id) - before
    print(f"CPU used waiting 1 s: {used:.4f}")
    assert used < 0.015, used
    docker_client.api._post_json(docker_client.api._url("/containers/{0}/update", container.id),
                                 data={"PidsLimit": 100}).raise_for_status()
    wait_ready(running, 10)
    # 150 processes of the user's in a container bounded to 100 tasks: a fork fails (dash:
    # "Cannot fork", bash: "fork: ... Resource temporarily unavailable")
    code, out = container.exec_run(
        ["sh", "-c", "n=0; while [ $n -lt 150 ]; do sleep 3 & n=$((n+1)); done"], user="work")
    assert re.search(rb"fork", out, re.IGNORECASE), out


def test_without_a_pids_limit_the_set_up_stops_after_the_readiness_timeout(session_factory):
    """The wait for the limit is bounded by readiness.timeout, not a fixed minute: the limit
    comes once every container of the agent exists, as long as a large session takes."""
    running = session_factory(session_def(unique("nopids"), 1, readiness={"timeout": 2}),
                              pids_limit=False, wait=False)
    container = running.containers["main1"]
    result = container.wait(timeout=30)
    logs = running.logs("main1").decode(errors="replace")
    assert result["StatusCode"] == 70, logs
    assert "no pids limit after 2s (readiness.timeout" in logs, logs
    assert not READY.search(running.logs("main1"))


@pytest.mark.parametrize("probe, before", [
    ("busybox nc", "ln -s /bin/busybox /usr/local/bin/nc"),
    ("ssh-keyscan", ":"),
])
def test_images_without_bash_wait_for_their_peers_with_nc_or_ssh_keyscan(
        session_factory, probe, before):
    running = session_factory(session_def(unique("nobash"), 3),
                              before=f"rm -f /bin/bash /usr/bin/bash && {before}")
    assert running.ok("sub2", "ssh -o BatchMode=yes main1 'echo $0 $MASTER_ADDR'"
                      ).split() == ["/bin/sh", "main1"]
    assert running.timings["last_start_to_all_ready_s"] < 10, running.timings
    if probe == "busybox nc":
        assert_no_probe_noise(running)


def assert_no_probe_noise(running: Running) -> None:
    """sshd logs nothing that reads as an error for the readiness probes."""
    for host in running.hosts:
        logs = running.logs(host).decode(errors="replace")
        assert "kex_exchange_identification" not in logs, f"{host}:\n{logs}"
        assert "Connection closed by" not in logs, f"{host}:\n{logs}"


def test_the_readiness_probe_leaves_no_error_in_sshd_s_log(session_factory):
    running = session_factory(session_def(unique("quiet"), 2))
    time.sleep(0.5)  # sshd logs a connection's end after the probe has gone
    assert_no_probe_noise(running)
    # main1 probes the subs and says go on the probe's connection (issue 35): sshd logs it
    # politely, once, and nobody logs in to main1 for readiness
    sub1 = running.logs("sub1").decode(errors="replace")
    assert sub1.count("Received disconnect from ") == 1, sub1
    assert ":11: cluster-session-go" in sub1, sub1
    assert "Accepted publickey" not in running.logs("main1").decode(errors="replace")


def test_the_job_example_asks_every_host_its_name_and_succeeds(session_factory):
    from cluster_sessions.core.loader import load_file

    from .conftest import STACKS

    job = load_file(STACKS / "sessions" / "job.yaml")
    running = session_factory(job.model_copy(update={"name": unique("job")}))
    main1 = running.containers["main1"]
    assert main1.wait(timeout=60)["StatusCode"] == 0, running.logs("main1")
    out = main1.logs(stdout=True, stderr=False).decode().split()
    assert out == ["main1", "sub1"], running.logs("main1")


# --- other shapes -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def solo(session_factory) -> Running:
    """One container, without an init: the command itself is PID 1."""
    return session_factory(session_def(unique("solo"), 1, env=HOSTILE), init=False)


def test_a_single_container_session_has_none_of_the_distributed_variables(solo):
    pid1 = env_of(solo.run("main1", "cat /proc/1/environ")[1])
    assert pid1["BACKENDAI_CLUSTER_SIZE"] == b"1"
    assert not set(DERIVED) & set(pid1)
    out = solo.ok("main1", "ssh -o BatchMode=yes main1 'env'")
    assert "BACKENDAI_CLUSTER_SIZE=1" in out.splitlines()
    assert not [line for line in out.splitlines() if line.split("=")[0] in DERIVED]


def test_the_command_is_exec_d_as_pid_1_with_the_env_unchanged(solo):
    assert solo.ok("main1", "tr '\\0' ' ' < /proc/1/cmdline").strip() == "sleep infinity"
    pid1 = env_of(solo.run("main1", "cat /proc/1/environ")[1])
    for name, value in HOSTILE.items():
        assert pid1[name] == value.encode(), name
    assert b"without an init" in solo.logs("main1")


def test_without_a_command_the_default_command_runs(docker_client, solo):
    from docker.types import Mount

    container = docker_client.containers.run(
        solo.containers["main1"].image.id, ["-c", f"exec /bin/sh {BUNDLE_DIR}/entrypoint.sh"],
        entrypoint=["/bin/sh"], name=f"{solo.plan.name}-nocmd", detach=True, init=True,
        pids_limit=solo.plan.limits.pids_limit,
        environment=dict(solo.plan.containers[0].env),
        mounts=[Mount(BUNDLE_DIR, str(solo.bundles / "main1"), type="bind", read_only=True)])
    try:
        wait_ready(Running(solo.plan, solo.keys, solo.bundles, {"main1": container}), 60)
        result = container.exec_run(["ps", "-o", "user=,args=", "-C", "sleep"])
        assert result.output.decode().split() == ["work", "sleep", "infinity"]
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def pair_with_master_port(session_factory, tmp_path_factory) -> Running:
    """Two containers; the user's own MASTER_PORT; another user; a mount inside its home."""
    data = tmp_path_factory.mktemp("data")
    (data / "hello.txt").write_text("hello\n")
    data.chmod(0o755)  # pytest makes it 0700
    return session_factory(session_def(
        unique("pair"), 2, env={"MASTER_PORT": "23456"}, distributed={"master_port": 29400},
        user={"name": "alice", "uid": 1234, "gid": 2345},
        mounts=[{"source": str(data), "target": "/home/alice/data", "read_only": True}]))


def test_a_user_set_master_port_wins(pair_with_master_port):
    running = pair_with_master_port
    code, out, err = running.run("sub1", "cat /proc/$(pgrep -o -x sleep)/environ", user="alice")
    assert code == 0, err
    env = env_of(out)
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == b"23456"
    assert json.loads(env["TF_CONFIG"])["cluster"]["worker"] == ["main1:23456", "sub1:23457"]
    out = running.ok("sub1", "ssh -o BatchMode=yes main1 'echo $MASTER_PORT $PET_MASTER_PORT'",
                     user="alice")
    assert out.split() == ["23456", "23456"]


def test_the_user_comes_from_the_definition_and_owns_a_home_that_a_mount_created(
        pair_with_master_port):
    running = pair_with_master_port
    out = running.ok("main1", "ssh -o BatchMode=yes sub1 'id; stat -c %U:%a $HOME; "
                              "cat ~/data/hello.txt'", user="alice")
    assert out.splitlines() == ["uid=1234(alice) gid=2345(alice) groups=2345(alice)",
                                "alice:755", "hello"]
    # no password, but not locked either (sshd without PAM refuses a locked "!" account)
    assert running.ok("sub1", "grep ^alice: /etc/shadow | cut -d: -f2", user="root") == "*\n"


def test_peers_that_never_come_fail_the_wait_naming_them(docker_client, image, tmp_path):
    session = session_def(unique("lonely"), 3, readiness={"timeout": 2})
    running = start(docker_client, image, session, tmp_path, only=["main1"], wait=False)
    try:
        result = running.containers["main1"].wait(timeout=60)
        logs = running.logs("main1").decode()
        assert result["StatusCode"] == 75, logs
        assert re.search(r"peers not ready after 2s.*sub1 \(does not resolve\).*sub2", logs)
    finally:
        remove(docker_client, running)


def run_alone(docker_client, image: str, tmp_path: Path, name: str, size: int,
              before: str) -> tuple[int, str]:
    """main1 of a ``size``-container session, alone, ``before`` run as root just before its
    entrypoint: (its exit status, its log)."""
    from docker.types import Mount

    session = session_def(unique(name), size, image=image)
    plan, _ = render_to(tmp_path, session)
    container = docker_client.containers.run(
        image, ["-c", f'{before} && exec /bin/sh "$0" "$@"',
                f"{BUNDLE_DIR}/entrypoint.sh", "sleep", "infinity"],
        entrypoint=["/bin/sh"], name=plan.containers[0].container_name, detach=True,
        environment=dict(plan.containers[0].env), pids_limit=plan.limits.pids_limit,
        mounts=[Mount(BUNDLE_DIR, str(tmp_path / "main1"), type="bind", read_only=True)])
    try:
        result = container.wait(timeout=30)
        return result["StatusCode"], container.logs().decode()
    finally:
        container.remove(force=True)


def test_an_image_without_sshd_fails_with_a_clear_message(docker_client, image, tmp_path):
    # the test image minus sshd: removed just before the entrypoint looks for it
    status, logs = run_alone(docker_client, image, tmp_path, "nosshd", 1, "rm -f /usr/sbin/sshd")
    assert status == 69, logs
    assert "this image has no sshd: install the OpenSSH server" in logs


@pytest.mark.parametrize("size", [1, 2])
def test_an_sshd_that_does_not_start_fails_the_container_at_once(docker_client, image, tmp_path,
                                                                  size):
    """Not a peer wait until readiness.timeout (60 s here) with no sshd to wait for."""
    broken = "printf '#!/bin/sh\\necho sshd: broken >&2; exit 1\\n' > /usr/sbin/sshd"
    status, logs = run_alone(docker_client, image, tmp_path, "badsshd", size, broken)
    assert status == 70, logs
    assert logs.endswith("sshd: broken\ncluster-session[main1]: error: sshd did not start"
                         " (its messages are above)\n"), logs


# --- a real client: torch.distributed over the session's variables ---------------------------

ALLREDUCE = """\
import os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
assert value.item() == world * (world + 1) / 2, value
assert rank == int(os.environ["BACKENDAI_CLUSTER_LOCAL_RANK"]), (rank, os.environ)
print(f"allreduce ok host={socket.gethostname()} rank={rank} world={world} "
      f"sum={value.item():g}", flush=True)
dist.destroy_process_group()
"""


def script_dir(tmp_path_factory, name: str, text: str) -> Path:
    """A directory holding one script, readable by the container's user: mounted at /opt/test."""
    scripts = tmp_path_factory.mktemp("script")
    (scripts / name).write_text(text)
    (scripts / name).chmod(0o644)
    scripts.chmod(0o755)
    return scripts


@pytest.mark.slow
def test_torchrun_all_reduce_across_the_containers_with_no_rendezvous_flags(
        session_factory, tmp_path_factory):
    from cluster_sessions.lab.pydirs import ensure_torch_dir

    torch_dir = ensure_torch_dir()
    scripts = script_dir(tmp_path_factory, "allreduce.py", ALLREDUCE)
    session = session_def(
        unique("torch"), 4,
        resources={"cpu": 1, "mem": "2g", "shmem": "256m"},
        env={"PYTHONPATH": "/opt/torch", "OMP_NUM_THREADS": "1"},
        mounts=[{"source": str(torch_dir), "target": "/opt/torch", "read_only": True},
                {"source": str(scripts), "target": "/opt/test", "read_only": True}],
        command=["python3", "-m", "torch.distributed.run", "--nproc-per-node=1",
                 "/opt/test/allreduce.py"],
    )
    running = session_factory(session, wait=False)
    results = {h: c.wait(timeout=300) for h, c in running.containers.items()}
    logs = {h: running.logs(h).decode(errors="replace") for h in running.hosts}
    for host in running.hosts:
        assert results[host]["StatusCode"] == 0, f"{host}:\n{logs[host]}"
    ranks = {}
    for host, text in logs.items():
        match = re.search(r"allreduce ok host=(\S+) rank=(\d+) world=4 sum=10", text)
        assert match, f"{host}:\n{text}"
        ranks[match[1]] = int(match[2])
    assert ranks == {"main1": 0, "sub1": 1, "sub2": 2, "sub3": 3}


# --- nothing the definition says runs as root (issue 9) ---------------------------------------

PRELOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/preload.%d", (int)geteuid());
    FILE *f = fopen(path, "a");
    if (f) fclose(f);
}
"""
# Each leaves /tmp/<what>.<euid> in the container when a process honours it.
STARTUP_HOOKS = {
    "BASH_ENV": "$(touch /tmp/bash_env.$(id -u))",
    "ENV": "$(touch /tmp/env.$(id -u))",
    "SHELLOPTS": "xtrace",
    "PS4": "$(touch /tmp/ps4.$(id -u)) ",
    "LD_PRELOAD": "/opt/preload/mark.so",
}
# Programs that shadow the real ones on the definition's PATH and leave /tmp/path.<euid>: the
# root entrypoint must find nothing on it (built-ins and absolute paths only).
PATH_TRAPS = ["printf", "env", "id", "sed", "cat", "grep", "cut", "head", "tr", "mkdir", "install",
              "chown", "chmod", "stat", "rm", "mv", "ln", "cp", "date", "sleep", "kill", "setpriv",
              "runuser", "su", "sshd", "ssh-keygen", "useradd", "usermod", "groupadd", "getent"]
PATH_TRAP = """#!/bin/sh
: > "/tmp/path.$(/usr/bin/id -u)"
for d in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
    [ -x "$d/${0##*/}" ] && exec "$d/${0##*/}" "$@"
done
exit 127
"""
TRAPPED_PATH = "/opt/preload/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def preload_dir(tmp_path_factory) -> Path:
    """A shared object whose constructor leaves /tmp/preload.<euid> in the container."""
    import shutil
    import subprocess

    from tests.conftest import skip_or_fail

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        skip_or_fail("no C compiler to build the LD_PRELOAD probe")
    directory = tmp_path_factory.mktemp("preload")
    (directory / "mark.c").write_text(PRELOAD_C)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(directory / "mark.so"),
                    str(directory / "mark.c")], check=True)
    (directory / "bin").mkdir()
    for name in PATH_TRAPS:
        (directory / "bin" / name).write_text(PATH_TRAP)
        (directory / "bin" / name).chmod(0o755)
    (directory / "bin").chmod(0o755)
    directory.chmod(0o755)
    (directory / "mark.so").chmod(0o755)
    return directory


@pytest.fixture(scope="module")
def hooked(session_factory, preload_dir) -> Running:
    """Two containers whose definition sets every start-up hook a root process could honour, and
    a PATH whose first directory shadows the programs the set-up uses."""
    return session_factory(session_def(
        unique("hooked"), 2, env={**STARTUP_HOOKS, "PATH": TRAPPED_PATH},
        mounts=[{"source": str(preload_dir), "target": "/opt/preload", "read_only": True}]))


def marks(running: Running, host: str) -> set[str]:
    return set(running.ok(host, "ls /tmp", user="root").split())


def test_start_up_hooks_in_the_definition_never_run_as_root(hooked):
    for host in hooked.hosts:
        root_marks = {m for m in marks(hooked, host) if m.endswith(".0")}
        assert not root_marks, f"{host}: ran as root: {root_marks}\n{hooked.logs(host)!r}"


def test_start_up_hooks_are_kept_out_of_the_containers_env(hooked):
    for c in hooked.plan.containers:
        assert not set(STARTUP_HOOKS) & set(c.env)
        assert dict(c.exec_env) == STARTUP_HOOKS
        created = hooked.containers[c.host].attrs["Config"]["Env"]
        assert not [e for e in created if e.split("=", 1)[0] in STARTUP_HOOKS], created


def test_start_up_hooks_reach_the_command_and_ssh_sessions_byte_for_byte(hooked):
    command = command_env(hooked, "sub1")
    code, out, err = hooked.run("main1", f"ssh -o BatchMode=yes sub1 \"python3 -c '{DUMP}'\"")
    assert code == 0, err
    over_ssh = dump_env(out.decode())
    for name, value in STARTUP_HOOKS.items():
        assert command[name] == value.encode(), name
        if name == "SHELLOPTS":  # the user's bash honours it, and lists every option it has on
            assert b"xtrace" in over_ssh[name].split(b":"), over_ssh[name]
        else:
            assert over_ssh[name] == value.encode(), name
    assert command["PATH"] == TRAPPED_PATH.encode()
    # the user's own processes honour them: the command (sleep) loaded the preload as the user,
    # and the user's bash over ssh traced with the user's PS4 (bash run by sshd reads ~/.bashrc
    # instead of BASH_ENV: that is bash's rule, not ours)
    assert {"preload.9001", "ps4.9001"} <= marks(hooked, "sub1")


@pytest.mark.parametrize("account, user, message", [
    ("useradd -u 999 -M -d /home/work work", {}, "is a system account (uid 999 < 1000)"),
    ("useradd -u 5000 -M -d /usr/sbin svc", {"name": "svc", "uid": 5000, "gid": 5000},
     "has the system directory /usr/sbin as its home"),
])
def test_an_image_account_that_is_a_system_one_is_never_taken_over(
        docker_client, image, tmp_path, account, user, message):
    session = session_def(unique("sysuser"), 1, **({"user": user} if user else {}))
    running = start(docker_client, image, session, tmp_path, wait=False,
                    before=f"{account} && stat -c %u:%a /usr/sbin > /tmp/before")
    try:
        result = running.containers["main1"].wait(timeout=60)
        logs = running.logs("main1").decode()
        assert result["StatusCode"] == 70, logs
        assert message in logs, logs
        assert "refusing to take it over" in logs
    finally:
        remove(docker_client, running)


@pytest.mark.parametrize("target, home_exists", [
    ("/home/work", True), ("/home/work/.ssh", True), ("/home", True), ("/home", False)])
def test_a_mounted_home_or_ssh_directory_is_never_changed(docker_client, image, tmp_path,
                                                          target, home_exists):
    """Validation refuses such mounts; the entrypoint holds the line on its own too: not the
    home, not a directory above it (where it would create the home), not its .ssh."""
    from docker.types import Mount

    homes = tmp_path / "homes"
    host_dir = homes / "work"
    homes.mkdir()
    if home_exists:
        (host_dir / ".ssh").mkdir(parents=True)
        (host_dir / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA victim\n")
        for path in (host_dir, host_dir / ".ssh", host_dir / ".ssh" / "authorized_keys"):
            os_chown(path, 4242, 4242)
        host_dir.chmod(0o750)
    mounted = {"/home": homes, "/home/work": host_dir, "/home/work/.ssh": host_dir / ".ssh"}
    before = snapshot(homes)
    session = session_def(unique("homemount"), 1)
    plan, _ = render_to(tmp_path / "bundle", session.model_copy(update={"image": image}))
    container = docker_client.containers.run(
        image, [f"{BUNDLE_DIR}/entrypoint.sh", "sleep", "infinity"], entrypoint=["/bin/sh"],
        name=plan.containers[0].container_name, detach=True, init=True,
        environment=dict(plan.containers[0].env), pids_limit=plan.limits.pids_limit,
        mounts=[Mount(BUNDLE_DIR, str(tmp_path / "bundle" / "main1"), type="bind",
                      read_only=True),
                Mount(target, str(mounted[target]), type="bind")])
    try:
        result = container.wait(timeout=60)
        logs = container.logs().decode()
        assert result["StatusCode"] == 70, logs
        assert f"{target} is a mount point" in logs, logs
        assert snapshot(homes) == before
    finally:
        container.remove(force=True)


def os_chown(path: Path, uid: int, gid: int) -> None:
    import os

    os.chown(path, uid, gid)


def snapshot(directory: Path) -> list[tuple[str, int, int, int, bytes]]:
    """Owner, group, mode and contents of everything under ``directory``."""
    rows = []
    for path in sorted([directory, *directory.rglob("*")]):
        st = path.lstat()
        data = path.read_bytes() if path.is_file() else b""
        rows.append((str(path.relative_to(directory)), st.st_uid, st.st_gid, st.st_mode, data))
    return rows


# --- the definition's env never reaches a root process, at start or later (issue 21) ---------

ROOT_PATH_BYTES = b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/opt/hooks/bin:/usr/local/bin:/usr/bin:/bin"
# Language runtimes' start-up hooks: each leaves /tmp/<runtime>.<euid> when a process honours it.
RUNTIME_HOOKS = {
    "PYTHONPATH": "/opt/hooks",  # sitecustomize.py there
    "PYTHONSTARTUP": "/opt/hooks/startup.py",  # interactive python only; must not reach root
    "PERL5LIB": "/opt/hooks",
    "PERL5OPT": "-Mmark",  # mark.pm there
}
GUARDED_ENV = {
    "FOO": "it's \"quoted\" $(touch /tmp/pwned) `id` ${HOME}\nsecond line\n  spaced  ",
    "PATH": USER_PATH,
    **RUNTIME_HOOKS,
}
SITECUSTOMIZE = "import os\nopen('/tmp/python.%d' % os.geteuid(), 'a').close()\n"
MARK_PM = "package mark;\nopen(my $f, '>>', \"/tmp/perl.$>\"); close($f);\n1;\n"


@pytest.fixture(scope="module")
def hooks_dir(tmp_path_factory) -> Path:
    """Python and Perl start-up hooks, and an ``ls`` on the user's PATH, each leaving a mark."""
    directory = tmp_path_factory.mktemp("hooks")
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (directory / "startup.py").write_text(SITECUSTOMIZE)
    (directory / "mark.pm").write_text(MARK_PM)
    (directory / "bin").mkdir()
    (directory / "bin" / "ls").write_text(PATH_TRAP)
    (directory / "bin" / "ls").chmod(0o755)
    for path in [directory, directory / "bin", *directory.iterdir()]:
        path.chmod(path.stat().st_mode | 0o755)
    return directory


@pytest.fixture(scope="module")
def guarded(session_factory, hooks_dir) -> Running:
    """Two containers whose definition sets a hostile value, its own PATH (whose first
    directory shadows ls) and the Python and Perl start-up hooks."""
    return session_factory(session_def(
        unique("guarded"), 2, env=GUARDED_ENV,
        mounts=[{"source": str(hooks_dir), "target": "/opt/hooks", "read_only": True}]))


def exec_env(running: Running, host: str, argv: list[str], user: str = "root") -> dict:
    """The environment a ``docker exec`` process ends up with, read from /proc by a child."""
    result = running.containers[host].exec_run(argv, user=user, demux=True)
    out, err = result.output
    assert result.exit_code == 0, f"{argv}: {(err or b'').decode(errors='replace')}"
    return env_of(out or b"")


def without_definition_values(env: dict[str, bytes]) -> list[str]:
    """The names of ``env`` that carry a value of the definition's (PATH: any but root's)."""
    found = [name for name in GUARDED_ENV if name != "PATH" and name in env]
    if env.get("PATH") != ROOT_PATH_BYTES:
        found.append(f"PATH={env.get('PATH')!r}")
    return found


# (what an operator or the image runs as root, argv): each prints its own environment
ROOT_PROCESSES = {
    "docker exec": ["cat", "/proc/self/environ"],
    "docker exec sh -c": ["sh", "-c", "cat /proc/self/environ"],
    "docker exec bash -l": ["bash", "-l", "-c", "cat /proc/self/environ"],
    "docker exec sh -l": ["sh", "-l", "-c", "cat /proc/self/environ"],
    "su - (root login)": ["su", "-", "-c", "cat /proc/self/environ"],
    "pid 1 (the init)": ["cat", "/proc/1/environ"],
}


@pytest.mark.parametrize("what", list(ROOT_PROCESSES))
def test_no_root_process_sees_a_definition_value_at_start_or_later(guarded, what):
    for host in guarded.hosts:
        env = exec_env(guarded, host, ROOT_PROCESSES[what])
        assert not without_definition_values(env), (
            f"{host}, {what}: {without_definition_values(env)}")
    created = set(guarded.containers["sub1"].attrs["Config"]["Env"])
    assert not created & {f"{k}={v}" for k, v in GUARDED_ENV.items()}, created


def test_sshd_runs_without_any_definition_value(guarded):
    """sshd's own environment (it rewrites that memory for its process title, so the bytes are
    searched rather than parsed) and that of the per-connection sshd of a live session."""
    script = ("for pid in $(pgrep -x sshd) $(pgrep -f '^sshd: work'); do "
              "cat /proc/$pid/environ; printf '\\0--\\0'; done")
    for host in guarded.hosts:
        guarded.containers["main1"].exec_run(["ssh", "-o", "BatchMode=yes", host, "sleep 5"],
                                             user="work", detach=True)
        time.sleep(1)
        raw = guarded.ok(host, script, user="root").encode()
        assert raw.count(b"--") >= 2, raw  # the listener and the session's
        for name, value in GUARDED_ENV.items():
            assert f"{name}={value}".encode() not in raw, (host, name)
        assert b"/opt/hooks" not in raw, host


def test_root_finds_programs_on_its_own_path_not_the_users(guarded):
    guarded.ok("sub1", "rm -f /tmp/path.*", user="root")
    for argv in (["ls", "/"], ["sh", "-c", "ls /"], ["bash", "-l", "-c", "ls /"],
                 ["su", "-", "-c", "ls /"]):
        code = guarded.containers["sub1"].exec_run(argv, user="root").exit_code
        assert code == 0, argv
    assert not {m for m in marks(guarded, "sub1") if m.startswith("path.")}



def test_language_runtime_hooks_in_the_definition_are_inert_for_root(guarded):
    """PYTHONPATH/PYTHONSTARTUP, PERL5LIB/PERL5OPT (and the like: NODE_OPTIONS, RUBYOPT,
    JAVA_TOOL_OPTIONS) are the user's to set: they take effect in the user's processes only."""
    guarded.ok("main1", "rm -f /tmp/python.* /tmp/perl.*", user="root")
    for argv in (["python3", "-c", "pass"], ["perl", "-e", "1"],
                 ["bash", "-l", "-c", "python3 -c pass; perl -e 1"],
                 ["su", "-", "-c", "python3 -c pass; perl -e 1"]):
        exec_env(guarded, "main1", argv)
    assert not {m for m in marks(guarded, "main1") if m.endswith(".0")}
    # the user's own: an ssh session, and a login shell of the user's from docker exec
    guarded.ok("sub1", "ssh -o BatchMode=yes main1 'python3 -c pass; perl -e 1'")
    assert {"python.9001", "perl.9001"} <= marks(guarded, "main1")


def test_the_users_processes_still_get_the_definitions_values_byte_for_byte(guarded):
    seen = {
        "the command": command_env(guarded, "sub1"),
        "ssh": dump_env(guarded.ok("main1", f"ssh -o BatchMode=yes sub1 \"python3 -c '{DUMP}'\"")),
        "docker exec -u work bash -l": exec_env(
            guarded, "sub1", ["bash", "-l", "-c", "cat /proc/self/environ"], user="work"),
        "docker exec -u work sh -l": exec_env(
            guarded, "sub1", ["sh", "-l", "-c", "cat /proc/self/environ"], user="work"),
        "su - work": exec_env(guarded, "sub1", ["su", "-", "work", "-c",
                                                "cat /proc/self/environ"]),
    }
    for where, env in seen.items():
        for name, value in GUARDED_ENV.items():
            assert env.get(name) == value.encode(), f"{where}: {name}={env.get(name)!r}"
        assert env["MASTER_ADDR"] == b"main1", where
    assert guarded.run("sub1", "test -e /tmp/pwned", user="root")[0] != 0


# --- the bundle works wherever it is mounted (issue 21) ---------------------------------------

ELSEWHERE = "/srv/elsewhere/bundle"
HOSTFILE_VARIABLES = {
    "CLUSTER_SESSION_DIR": ELSEWHERE,
    "CLUSTER_SESSION_HOSTFILE": f"{ELSEWHERE}/hostfile",
    "OMPI_MCA_orte_default_hostfile": f"{ELSEWHERE}/hostfile",
    "PRTE_MCA_prte_default_hostfile": f"{ELSEWHERE}/hostfile",
    "HYDRA_HOST_FILE": f"{ELSEWHERE}/hostfile.hydra",
}


def test_the_bundle_works_wherever_it_is_mounted(session_factory):
    running = session_factory(session_def(unique("elsewhere"), 2), bundle_dir=ELSEWHERE)
    assert running.ok("sub1", "ssh -o BatchMode=yes main1 hostname").strip() == "main1"
    over_ssh = dump_env(running.ok("main1", f"ssh -o BatchMode=yes sub1 \"python3 -c '{DUMP}'\""))
    for where, env in {"the command": command_env(running, "main1"), "ssh": over_ssh}.items():
        for name, value in HOSTFILE_VARIABLES.items():
            assert env.get(name) == value.encode(), f"{where}: {name}={env.get(name)!r}"
    for name in ("hostfile", "hostfile.hydra"):
        assert running.ok("main1", f"cat {ELSEWHERE}/{name}").split("\n")[0].startswith("main1")
    assert running.run("main1", f"test -e {BUNDLE_DIR}")[0] != 0  # nothing looked there
