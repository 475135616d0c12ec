"""The netns lab: several Docker Engines on one machine, each in its own network namespace
with its own containerd and sshd (``cluster_sessions.lab.netns``).

The lab tests use their own prefixes and /24s (not the default ``csl`` / 10.251.0.0/24), so a
developer's ``sessionctl lab up`` on the same machine is never touched. A lab left behind by a
killed test run is torn down at the next run.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from cluster_sessions.lab import engines, layout, netns, pool_file, processes, ssh_access
from cluster_sessions.lab.processes import LabError
from tests.conftest import clear_stale_lab, require_lab

PREFIX, SUBNET = "cslt", "10.251.100.0/24"  # the module's 2-agent lab
PREFIX2, SUBNET2 = "cslu", "10.251.101.0/24"  # short-lived labs of single tests
USER = "csl-ops"  # the non-root docker-group login every lab agent takes

LAB = [pytest.mark.lab, pytest.mark.docker]


# --------------------------------------------------------------------------- helpers


def _ssh(info: layout.LabInfo, agent: layout.LabAgent, *cmd: str, known_hosts: Path | None = None,
         user: str = "root", timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={known_hosts or info.known_hosts}",
         "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", "-i", str(info.key_file),
         "-p", "22", f"{user}@{agent.address}", *cmd],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )


def _leftovers(prefix: str, state_dir: Path) -> list[str]:
    """Everything of a lab still present on the machine."""
    left = []
    netns_dir = layout.NETNS_DIR
    if netns_dir.is_dir():
        left += [f"netns {p.name}" for p in netns_dir.iterdir()
                 if p.name.startswith(prefix + "-")]
    left += [f"link {p.name}" for p in Path("/sys/class/net").iterdir()
             if p.name.startswith(prefix + "-")]
    markers = (str(state_dir), str(layout.RUN_BASE / prefix))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            args = processes.cmdline(int(entry.name))
            if processes.alive(int(entry.name)) and any(m in a for a in args for m in markers):
                left.append(f"process {entry.name} {' '.join(args)[:120]}")
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
    left += [f"iptables {r}" for r in rules.splitlines() if f"{prefix}-br0" in r]
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [f"mount {m}" for m in re.findall(r"^\S+ \S+ \S+ \S+ (\S+)", mounts, re.M)
             if m.startswith(markers)]
    left += [f"cgroup {p}" for p in processes.cgroup_dirs(f"{prefix}-agent1")]
    if (layout.RUN_BASE / prefix).exists():
        left.append(f"run dir {layout.RUN_BASE / prefix}")
    return left


def _mini_image_tar(*binaries: str) -> bytes:
    """A root filesystem holding ``binaries`` and the shared libraries they load."""
    paths: set[str] = set()
    for b in binaries:
        exe = shutil.which(b)
        assert exe, b
        paths.add(exe)
        out = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
        paths.update(re.findall(r"(/\S+) \(0x", out))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(paths):
            tar.add(os.path.realpath(p), arcname=p.lstrip("/"))
    return buf.getvalue()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_lab()
    clear_stale_lab(PREFIX)
    state = tmp_path_factory.mktemp("lab")
    t0 = time.monotonic()
    try:
        info = netns.lab_up(2, state, state / "pool.yaml", prefix=PREFIX, subnet=SUBNET)
    except LabError as exc:  # lab_up has already removed what it created
        pytest.fail(f"lab_up failed: {exc}")
    print(f"lab_up(2): {time.monotonic() - t0:.2f}s")
    try:
        yield info
    finally:
        netns.lab_down(state)
        assert _leftovers(PREFIX, state) == []


# --------------------------------------------------------------------------- without root


def test_lab_needs_root(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        netns.lab_up(2, tmp_path, tmp_path / "pool.yaml")
    with pytest.raises(LabError, match="needs root"):
        netns.lab_down(tmp_path)


@pytest.mark.parametrize(
    "prefix,subnet,message",
    [("CSL", SUBNET, "prefix"), ("verylongprefix", SUBNET, "prefix"),
     ("csl", "8.8.8.0/24", "private /24"), ("csl", "10.251.0.0/16", "private /24")],
)
def test_layout_rejects_bad_names(prefix, subnet, message, tmp_path):
    with pytest.raises(LabError, match=message):
        layout.layout_for(tmp_path, prefix, subnet)


def test_layout_names(tmp_path):
    lay = layout.layout_for(tmp_path, "csl", "10.251.0.0/24")
    assert (lay.bridge, lay.bridge_address, lay.netns(3), lay.address(3)) == (
        "csl-br0", "10.251.0.1", "csl-agent3", "10.251.0.13")
    assert lay.socket(2) == tmp_path / "agent2" / "engine" / "docker.sock"
    assert lay.agent(2).agent_socket == Path("/run/csl-lab/csl/engine/docker.sock")
    assert lay.agent(2).docker_host == "unix:///run/csl-lab/csl/engine/docker.sock"
    # libnetwork puts "<exec-root>/libnetwork/<64 hex>.sock" there: must fit in sun_path
    assert len(f"{lay.exec_root(32)}/libnetwork/{'f' * 64}.sock") < 108


def test_lab_status_without_a_lab(tmp_path):
    assert netns.lab_status(tmp_path).state == "down"


def test_pool_document_is_a_valid_pool(tmp_path):
    from cluster_sessions.core.loader import load_file

    lay = layout.layout_for(tmp_path, "csl", "10.251.0.0/24")
    info = netns._info(lay, 3, tmp_path / "lab.yaml", {})
    pool_file.write_pool(info)
    pool = load_file(tmp_path / "lab.yaml", expect="AgentPool")
    assert [a.name for a in pool.agents] == ["agent1", "agent2", "agent3"]
    assert [a.address for a in pool.agents] == ["10.251.0.11", "10.251.0.12", "10.251.0.13"]
    assert pool.swarm.manager == "agent1"
    assert pool.network.mtu == 1450 and pool.network.encrypted is False
    # data folders' root: one host directory every agent's engine sees, root's and closed
    assert pool.storage == {"data": str(tmp_path / "storage")}
    assert (tmp_path / "storage").stat().st_mode & 0o777 == 0o755
    a2 = pool.agents[1]
    # a remote pool: the socket's path on the agent, and a non-root login
    assert a2.docker_host == "unix:///run/csl-lab/csl/engine/docker.sock"
    assert (a2.ssh.host, a2.ssh.port, a2.ssh.user) == ("10.251.0.12", 22, USER)
    assert a2.ssh.key_file == str(tmp_path / "id_lab")
    assert a2.ssh.known_hosts == str(tmp_path / "known_hosts")
    assert a2.capacity.cpu == len(os.sched_getaffinity(0)) and a2.capacity.gpus == ()
    assert "&" not in (tmp_path / "lab.yaml").read_text()  # no YAML anchors/aliases


# --------------------------------------------------------------------------- the lab


@pytest.mark.lab
@pytest.mark.docker
class TestLab:
    def test_engines_answer_with_distinct_ids(self, lab):
        import docker

        ids = []
        for agent in lab.agents:
            client = docker.DockerClient(base_url=f"unix://{agent.socket}", timeout=30)
            try:
                info = client.info()
            finally:
                client.close()
            assert info["ID"] == agent.engine_id == engines.engine_id(agent.socket)
            assert info["Name"] == agent.name  # each engine has its own UTS name
            ids.append(info["ID"])
        assert len(set(ids)) == len(lab.agents) == 2

    def test_engines_run_in_their_namespaces(self, lab):
        rec = json.loads((lab.state_dir / "lab.json").read_text())
        for agent in lab.agents:
            ns_ino = agent.netns_path.stat().st_ino
            for kind in ("dockerd", "containerd", "sshd"):
                pid = rec["pids"][agent.name][kind]
                assert os.readlink(f"/proc/{pid}/ns/net") == f"net:[{ns_ino}]", kind
        # and each agent has its own containerd
        sockets = set()
        for agent in lab.agents:
            args = processes.cmdline(rec["pids"][agent.name]["dockerd"])
            sockets.add(args[args.index("--containerd") + 1])
        assert len(sockets) == 2

    def test_agents_reach_each_other(self, lab):
        probe = ("import socket,sys; s=socket.create_connection((sys.argv[1],22),timeout=5);"
                 "print(s.recv(7).decode())")
        a1, a2 = lab.agents
        for src, dst in ((a1, a2), (a2, a1)):
            out = subprocess.run(
                ["nsenter", f"--net={src.netns_path}", sys.executable, "-c", probe, dst.address],
                capture_output=True, text=True, timeout=30,
            )
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith("SSH-2.0"), out.stdout

    def test_ssh_key_login_reaches_that_agents_engine(self, lab):
        for agent in lab.agents:
            out = _ssh(lab, agent, "hostname; docker info --format '{{.ID}}'")
            assert out.returncode == 0, out.stderr
            assert out.stdout.split() == [agent.name, agent.engine_id]

    def test_the_lab_user_reaches_its_agents_engine_only_over_ssh(self, lab):
        """A remote pool, as real agents are: a non-root docker-group login, and a socket path
        that names each agent's own engine there and answers nothing on this machine."""
        import docker

        ids = []
        for agent in lab.agents:
            out = _ssh(lab, agent, "id -u; id -Gn; docker info --format '{{.ID}}'; "
                       f"docker --host {agent.docker_host} info --format '{{{{.ID}}}}'",
                       user=USER)
            assert out.returncode == 0, out.stderr
            uid, groups, via_env, via_host = out.stdout.splitlines()
            assert int(uid) != 0 and "docker" in groups.split()
            assert via_env == via_host == agent.engine_id
            ids.append(via_env)
        assert len(set(ids)) == len(lab.agents)
        # the same path from this machine: the directory is there, empty; no engine answers
        for agent in lab.agents:
            assert agent.agent_socket.parent.is_dir()
            assert not agent.agent_socket.exists()
            with pytest.raises(docker.errors.DockerException):  # the client asks at once
                docker.DockerClient(base_url=agent.docker_host, timeout=5).ping()

    def test_the_agent_side_socket_follows_a_restarted_engine(self, lab):
        agent = lab.agents[1]
        engines.stop_dockerd(lab.state_dir, agent.name)
        try:
            out = _ssh(lab, agent, "docker info --format '{{.ID}}'", user=USER)
            assert out.returncode != 0
        finally:
            engines.start_dockerd(lab.state_dir, agent.name)
        out = _ssh(lab, agent, "docker info --format '{{.ID}}'", user=USER)
        assert (out.returncode, out.stdout.strip()) == (0, agent.engine_id), out.stderr

    def test_ssh_host_key_checking_is_strict(self, lab, tmp_path):
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        out = _ssh(lab, lab.agents[0], "true", known_hosts=empty)
        assert out.returncode == 255
        assert "Host key verification failed" in out.stderr

    def test_paramiko_connects_with_the_pool_settings(self, lab):
        paramiko = pytest.importorskip("paramiko")
        agent = lab.agents[1]
        client = paramiko.SSHClient()
        client.load_host_keys(str(lab.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(agent.address, port=22, username=USER, key_filename=str(
                lab.key_file), look_for_keys=False, allow_agent=False, timeout=10)
            _, stdout, _ = client.exec_command("echo $DOCKER_HOST", timeout=10)
            assert stdout.read().decode().strip() == agent.docker_host
        finally:
            client.close()

    def test_pool_file_describes_the_lab(self, lab):
        from cluster_sessions.core.loader import load_file

        pool = load_file(lab.pool_file, expect="AgentPool")
        assert [(a.name, a.address, a.docker_host) for a in pool.agents] == [
            (a.name, a.address, a.docker_host) for a in lab.agents]
        assert {a.ssh.user for a in pool.agents} == {USER} and lab.user == USER
        assert [a.address for a in lab.agents] == ["10.251.100.11", "10.251.100.12"]
        hosts = [line.split()[0] for line in lab.known_hosts.read_text().splitlines()]
        assert hosts == ["10.251.100.11", "10.251.100.12"]

    def test_the_walkthroughs_multi_node_demo_fits_the_labs_own_pool(self, lab, capsys):
        """README's lab walkthrough, one pool: `plan multi-demo --pool <lab's pool> --probe`
        plans against what the lab's agents really have, says so, and fits (issue 12); until
        `pool up` forms the lab's swarm it is pending, as `pool check` says (issue 23)."""
        from cluster_sessions.driver.cli import main
        from tests.conftest import STACKS

        code = main(["plan", str(STACKS / "sessions" / "multi-demo.yaml"), "--pool",
                     str(lab.pool_file), "--probe", "--json"])
        out, err = capsys.readouterr()
        assert code == 3, err
        lines = err.splitlines()
        assert lines[0] == f"probed pool {lab.pool_file.stem} ({lab.pool_file}), free now:"
        assert [line.split(":")[0].strip() for line in lines[1:3]] == ["agent1", "agent2"]
        assert all(", mem " in line and "cpu " in line for line in lines[1:3])
        assert lines[3].endswith(": pending: the swarm is not formed: multi-agent sessions "
                                 f"cannot be placed until `sessionctl pool up {lab.pool_file}`")
        assert main(["pool", "check", str(lab.pool_file)]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"pool {lab.pool_file.stem}: the swarm is not formed: multi-agent sessions cannot "
            f"be placed until `sessionctl pool up {lab.pool_file}`")
        plan = json.loads(out)
        # one verdict: the plan itself is pending for the swarm, its containers still placed
        assert plan["status"] == "pending" and len(plan["containers"]) == 8
        assert plan["reason"] == lines[3].split(": pending: ", 1)[1]
        per_agent = [c["agent"] for c in plan["containers"]]
        print(err, {a: per_agent.count(a) for a in set(per_agent)})
        assert set(per_agent) <= {"agent1", "agent2"}

    def test_status_and_idempotent_up(self, lab, tmp_path):
        assert netns.lab_status(lab.state_dir).state == "up"
        t0 = time.monotonic()
        again = netns.lab_up(2, lab.state_dir, lab.pool_file, prefix=PREFIX, subnet=SUBNET)
        assert time.monotonic() - t0 < 10
        assert [a.engine_id for a in again.agents] == [a.engine_id for a in lab.agents]
        with pytest.raises(LabError, match="take it down first"):
            netns.lab_up(3, lab.state_dir, lab.pool_file, prefix=PREFIX, subnet=SUBNET)
        with pytest.raises(LabError, match="already up from state dir"):
            netns.lab_up(2, tmp_path, None, prefix=PREFIX, subnet=SUBNET)
        assert netns.lab_status(lab.state_dir).state == "up"

    def test_status_says_when_the_demo_image_is_missing(self, lab, capsys):
        """An interrupted `lab up` leaves the engines up without the demo tag: `lab status`
        says so per agent and how to get it (issue 23), and stops saying it once it is there."""
        import docker

        from cluster_sessions.core.names import DEMO_IMAGE
        from cluster_sessions.driver.cli import main

        def has(sock) -> bool:
            client = docker.DockerClient(base_url=f"unix://{sock}")
            try:
                return any(DEMO_IMAGE in i.tags for i in client.images.list())
            finally:
                client.close()

        present = {a.name: has(sock) for a, sock in zip(lab.agents, lab.sockets, strict=True)}
        status = netns.lab_status(lab.state_dir)
        assert {a.name: a.image for a in status.agents} == present
        assert main(["lab", "status", "--state-dir", str(lab.state_dir)]) == 0
        out, err = capsys.readouterr()
        for name, there in present.items():
            row = next(line for line in out.splitlines() if line.strip().startswith(name))
            assert row.endswith("image yes" if there else "image missing"), row
        lacking = [n for n, there in present.items() if not there]
        assert (f"is missing on {', '.join(lacking)}" in err) == bool(lacking), err


@pytest.mark.lab
@pytest.mark.docker
def test_lab_down_leaves_nothing_behind(tmp_path):
    """Down with a running container and a swarm: no namespace, link, process, rule, mount."""
    import docker

    require_lab()
    clear_stale_lab(PREFIX2)
    state = tmp_path / "lab"
    pool_file = tmp_path / "pools" / "lab2.yaml"
    try:
        t0 = time.monotonic()
        info = netns.lab_up(2, state, pool_file, prefix=PREFIX2, subnet=SUBNET2)
        up = time.monotonic() - t0
        a1, a2 = info.agents
        c1 = docker.DockerClient(base_url=f"unix://{a1.socket}", timeout=60)
        c2 = docker.DockerClient(base_url=f"unix://{a2.socket}", timeout=60)
        c1.swarm.init(advertise_addr=a1.address)
        c2.swarm.join([f"{a1.address}:2377"], c1.swarm.attrs["JoinTokens"]["Worker"])
        c1.api.import_image_from_data(_mini_image_tar("sleep"), repository="mini", tag="1")
        c1.containers.run("mini:1", ["sleep", "1000"], detach=True, restart_policy={
            "Name": "always"})
        c1.close()
        c2.close()
        assert netns.lab_status(state).state == "up"
        t0 = time.monotonic()
        netns.lab_down(state)
        print(f"lab_up(2) {up:.2f}s, lab_down(2) with swarm and a container "
              f"{time.monotonic() - t0:.2f}s")
        assert _leftovers(PREFIX2, state) == []
        assert netns.lab_status(state).state == "down"
        # its key, host keys, known_hosts, logs and pool file go too (issue 12)
        assert not state.exists() and not pool_file.exists()
        netns.lab_down(state)  # idempotent
    finally:
        netns.lab_down(state)
    assert _leftovers(PREFIX2, state) == []


@pytest.mark.lab
@pytest.mark.docker
def test_lab_down_keeps_data_folders_and_removes_an_empty_storage_root(tmp_path):
    """The lab's storage root holds data folders, which outlive sessions: `lab down` removes
    the root when it is empty and keeps it (saying so) when a folder is in it."""
    from cluster_sessions.lab.pool_file import storage_root

    require_lab()
    clear_stale_lab(PREFIX2)
    state = tmp_path / "lab"
    said: list[str] = []
    try:
        netns.lab_up(1, state, tmp_path / "pool.yaml", prefix=PREFIX2, subnet=SUBNET2)
        (storage_root(state) / "mydata").mkdir()
        (storage_root(state) / "mydata" / "result.txt").write_text("42\n")
        netns.lab_down(state, said.append)
        assert (storage_root(state) / "mydata" / "result.txt").read_text() == "42\n"
        assert any("kept the lab's data folders" in line for line in said), said
        assert sorted(p.name for p in state.iterdir()) == ["storage"]
    finally:
        netns.lab_down(state)
    assert _leftovers(PREFIX2, state) == []


@pytest.mark.lab
@pytest.mark.docker
def test_failed_lab_up_removes_what_it_created(tmp_path, monkeypatch):
    require_lab()
    clear_stale_lab(PREFIX2)
    state = tmp_path / "lab"
    # sshd refuses this configuration, after namespaces, containerd and dockerd exist
    monkeypatch.setattr(ssh_access, "sshd_config", lambda lay, k: "NoSuchOption yes\n")
    try:
        with pytest.raises(LabError, match="sshd"):
            netns.lab_up(2, state, None, prefix=PREFIX2, subnet=SUBNET2)
        assert _leftovers(PREFIX2, state) == []
        assert netns.lab_status(state).state == "down"
    finally:
        netns.lab_down(state)


@pytest.mark.lab
@pytest.mark.docker
def test_lab_down_keep_keys_keeps_the_key_but_not_the_pool_file(tmp_path):
    require_lab()
    clear_stale_lab(PREFIX2)
    state = tmp_path / "lab"
    pool_file = tmp_path / "lab2.yaml"
    try:
        netns.lab_up(1, state, pool_file, prefix=PREFIX2, subnet=SUBNET2)
        key = (state / "id_lab").read_bytes()
        netns.lab_down(state, keep_keys=True)
        assert (state / "id_lab").read_bytes() == key and (state / "known_hosts").exists()
        assert not pool_file.exists()
    finally:
        netns.lab_down(state)
        shutil.rmtree(state, ignore_errors=True)  # what --keep-keys kept
