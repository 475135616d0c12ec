"""Multi-node sessions on several real Docker Engines: a 3-agent netns lab.

One lab for the module (prefix ``cslm``, 10.251.102.0/24, so a developer's ``sessionctl lab
up`` and the lab's own tests are never touched), always torn down. The test pool declares
small capacities (agent1 cpu 2, agent2 and agent3 cpu 1) so that a 4-container session of
cpu 1 each must span all three agents: main1 and sub1 on agent1, sub2 on agent2, sub3 on
agent3 (a manager-worker and a worker-worker path).

What runs for real: the agents module over SSH with strict host keys (pool check, probes,
preflight), the pool stack (``sessionctl pool up`` through the real engine; its swarm
resources also called directly), the sessions (``sessionctl up``/``destroy`` through the real
engine and docker provider, one file backend with the pool stack) and the containers' own
entrypoints, sshd and ssh. Order matters: the last tests take the swarm down and stop agents.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from cluster_sessions.agents import capacity, cleanup, facts, gathering
from cluster_sessions.agents.connectors import agent_props, connector_for
from cluster_sessions.core.loader import load_file
from cluster_sessions.core.names import LABEL_PREFIX
from cluster_sessions.core.plan import build_plan
from cluster_sessions.driver import cli
from cluster_sessions.driver.errors import Exit
from cluster_sessions.lab import engines, processes
from cluster_sessions.pulumi_layer import swarm as swarm_resources
from tests.standin.docker_builder import run_in, ssh_mesh, wait_until_ready

from . import factories
from .factories import load_session
from .lab_support import LabPool, PoolStack, lab_pool, leave_swarm, pool_swarm

pytestmark = [pytest.mark.lab, pytest.mark.docker, pytest.mark.slow]

PREFIX, SUBNET = "cslm", "10.251.102.0/24"
CAPACITY = {"agent1": 2, "agent2": 1, "agent3": 1}  # CPUs declared per agent
STRICT = "-o BatchMode=yes -o StrictHostKeyChecking=yes"


# --- the lab ------------------------------------------------------------------------------------


class Lab(LabPool):
    def write_session(self, directory: Path, name: str, size: int, **extra) -> Path:
        definition = factories.session(name, str(self.pool_file), self.image, size=size,
                                       mode="multi-node", mem="512m",
                                       env={"EXPERIMENT": "multi node"})
        return factories.write(directory / f"{name}.yaml", {**definition, **extra})


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # the demo image plus Open MPI and mpi4py, for the launcher test across agents
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 3, name="mnlab", kind=Lab, flavour="mpi",
                  capacity=lambda agent: {"cpu": CAPACITY[agent], "mem": "4g", "gpus": []}
                  ) as built:
        for a in built.info.agents:
            built.client(a.name)
        yield built


def _nodes(lab: Lab) -> list[facts.SwarmNode]:
    with connector_for(lab.pool.agent("agent1")) as conn:
        return list(gathering.gather(conn, facts.SwarmNodes()))


def _swarm_states(lab: Lab) -> dict[str, str]:
    out = {}
    for a in lab.pool.agents:
        with connector_for(a) as conn:
            out[a.name] = gathering.gather(conn, facts.SwarmInfo()).role
    return out


@pytest.fixture(scope="module")
def swarm(lab):
    """The pool's swarm, built by ``sessionctl pool up`` through the real engine (its dynamic
    resources run by the real dynamic-provider host against the lab)."""
    with pool_swarm(lab.pool_file, "pool-mnlab") as made:
        yield made


# --- pool check -----------------------------------------------------------------------------------


def test_pool_check_reports_every_agent_of_the_lab(lab, capsys):
    code = cli.main(["pool", "check", str(lab.pool_file)])
    out, err = capsys.readouterr()
    # every agent works, but the pool's swarm is not formed yet: exit 1, saying so (issue 12)
    assert code == 1, err
    assert err.strip().splitlines()[-1].startswith("pool mnlab: the swarm is not formed"), err
    assert "failed the check" not in err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:4]}
    assert list(rows) == ["agent1", "agent2", "agent3"]
    for name, row in rows.items():
        assert row[1] == "yes" and row[2].startswith("20.10"), row  # reachable, engine version
        assert row[4] == f"{CAPACITY[name]}/{CAPACITY[name]}"  # cpu free/total
    assert "overcommitted" not in err

    code = cli.main(["pool", "check", str(lab.pool_file), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and not doc["ok"] and doc["swarm_formed"] is False
    assert all(a["ok"] for a in doc["agents"])
    ids = {a["engine_id"] for a in doc["agents"]}
    assert len(ids) == 3  # three engines, not one seen three times
    assert {a["via"] for a in doc["agents"]} == {
        f"ssh csl-ops@{a.address}:22" for a in lab.info.agents}


def test_pool_check_names_the_agent_and_the_cause_of_each_failure(lab, tmp_path, capsys):
    doc = yaml.safe_load(lab.pool_file.read_text())
    a1, a2, a3 = doc["agents"]
    other_key = tmp_path / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)],
                   check=True, capture_output=True)
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    a1["ssh"]["known_hosts"] = str(empty)
    a2["ssh"]["key_file"] = str(other_key)
    a3["docker_host"] = "unix:///nonexistent/docker.sock"
    doc["agents"].append({**a1, "name": "agent9", "address": "10.251.102.99",
                          "ssh": {**a1["ssh"], "host": "10.251.102.99",
                                  "known_hosts": str(lab.info.known_hosts)}})
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(json.loads(json.dumps(doc))))  # no shared nodes: no aliases
    code = cli.main(["pool", "check", str(broken), "--timeout", "2"])
    _out, err = capsys.readouterr()
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.startswith("agent ")]
    assert any(line.startswith("agent agent1: host key unknown: ") for line in lines), err
    assert any(line.startswith("agent agent2: auth failed: ") for line in lines), err
    assert any(line.startswith("agent agent3: docker not answering: ") for line in lines), err
    assert any(line.startswith("agent agent9: unreachable: ") for line in lines), err
    assert "4 of 4 agent(s) failed" in err


# --- swarm ----------------------------------------------------------------------------------------


def test_the_pool_program_forms_the_swarm(lab, swarm):
    nodes = _nodes(lab)
    assert sorted((n.hostname, n.ready, n.manager_status) for n in nodes) == [
        ("agent1", True, "Leader"), ("agent2", True, ""), ("agent3", True, "")]
    outputs = swarm.outputs
    info = outputs["swarm"]
    assert info["manager"] == "agent1" and info["manager_addr"] == "10.251.102.11:2377"
    assert set(info["nodes"]) == {"agent1", "agent2", "agent3"}
    assert {n.node_id for n in nodes} == set(info["nodes"].values())
    assert "worker_token" not in json.dumps(outputs)
    # the token stays in the state, encrypted with the stack's secrets provider
    (manager,) = [r for r in swarm.resources() if r["urn"].endswith("::mnlab-swarm-agent1")]
    assert manager["additionalSecretOutputs"] == ["worker_token"]
    token = manager["outputs"]["worker_token"]
    assert isinstance(token, dict) and "ciphertext" in token, token
    assert "SWMTKN" not in json.dumps(swarm.resources())
    assert _swarm_states(lab) == {"agent1": "manager", "agent2": "worker", "agent3": "worker"}


def test_swarm_resources_are_idempotent(lab, swarm):
    # a second `pool up`: the real engine diffs each resource, nothing changes
    swarm.cli("preview", "--expect-no-changes")
    assert swarm.up().returncode == 0
    # create called again on agents that are already in place adopts them as they are
    pool = lab.pool
    mgr = swarm_resources.SwarmManagerProvider().create(
        {"agent": agent_props(pool.agent("agent1")), "advertise_addr": "10.251.102.11"})
    (state,) = [r for r in swarm.resources() if r["urn"].endswith("::mnlab-swarm-agent1")]
    assert mgr.id == state["id"] and mgr.outs["initialized"] is False
    worker = swarm_resources.SwarmWorkerProvider().create({
        "agent": agent_props(pool.agent("agent2")), "manager": agent_props(pool.agent("agent1")),
        "manager_addr": mgr.outs["manager_addr"], "join_token": mgr.outs["worker_token"],
        "advertise_addr": "10.251.102.12"})
    assert worker.outs["joined"] is False
    assert len(_nodes(lab)) == 3


def test_encrypted_overlays_are_refused_where_the_kernel_cannot_carry_them(lab, swarm,
                                                                         tmp_path, capsys):
    doc = yaml.safe_load(lab.pool_file.read_text())
    doc["network"]["encrypted"] = True
    pool_file = tmp_path / "encrypted.yaml"
    pool_file.write_text(yaml.safe_dump(doc))
    pool = load_file(pool_file, expect="AgentPool")
    with connector_for(pool.agent("agent1")) as conn:
        support = gathering.gather(conn, facts.EncryptedOverlaySupport())
    if support.supported:  # a kernel with ESP and GCM: nothing to refuse
        capacity.preflight(pool, ["agent1", "agent2", "agent3"])
        return
    with pytest.raises(capacity.PreflightError) as caught:
        capacity.preflight(pool, ["agent1", "agent2", "agent3"])
    lines = str(caught.value).splitlines()[1:]
    assert len(lines) == 3 and all(
        "encrypted overlay networks cannot carry traffic between agents here" in line
        and "network.encrypted: false" in line for line in lines), lines
    # a session that fits one agent builds a bridge and is not refused
    assert capacity.preflight(pool, ["agent1"])[0].ok
    assert cli.main(["pool", "check", str(pool_file)]) == 1
    assert "asks for encrypted overlays" in capsys.readouterr().err


# --- a session across agents ----------------------------------------------------------------------


@dataclass
class Live:
    name: str
    plan: object
    backend: PoolStack  # the pool stack's backend: the session's stack is there too
    containers: dict
    path: Path  # the definition
    destroyed: bool = False

    def destroy(self) -> None:
        """``sessionctl destroy``, through the real engine and the same agents."""
        done = self.backend.sessionctl("destroy", str(self.path), "--yes", "--remove")
        assert done.returncode == 0, done.stderr
        self.destroyed = True


def _build(lab: Lab, swarm: PoolStack, path: Path) -> Live:
    """``sessionctl up`` of the definition through the real engine, until main1 is ready."""
    loaded = load_session(path)
    plan = build_plan(loaded.session, loaded.pool)
    live = Live(plan.name, plan, swarm, {}, path)
    try:
        done = swarm.sessionctl("up", str(path), "--yes")
        assert done.returncode == 0, done.stderr
        live.containers = {c.host: lab.client(c.agent).containers.get(c.container_name)
                           for c in plan.containers}
        wait_until_ready(live.containers)
    except BaseException:
        _destroy(lab, live)
        raise
    return live


def _destroy(lab: Lab, live: Live) -> None:
    """Teardown: tolerant of engines the last test stopped (the lab goes down anyway)."""
    if not live.destroyed:
        with contextlib.suppress(Exception):
            live.destroy()
    cleanup.sweep(lab.pool, live.name, wait=5)


@pytest.fixture(scope="module")
def spread(lab, swarm, tmp_path_factory):
    name = f"mn-{uuid.uuid4().hex[:6]}"
    path = lab.write_session(tmp_path_factory.mktemp("spread"), name, 4)
    live = _build(lab, swarm, path)
    try:
        yield live
    finally:
        _destroy(lab, live)


def test_resources_force_the_session_across_three_agents(lab, spread):
    plan = spread.plan
    assert plan.network.driver == "overlay" and plan.network.agent == "agent1"
    assert [(c.host, c.agent) for c in plan.containers] == [
        ("main1", "agent1"), ("sub1", "agent1"), ("sub2", "agent2"), ("sub3", "agent3")]
    placed = spread.backend.docker_hosts(spread.name)
    for c in plan.containers:
        agent = lab.pool.agent(c.agent)  # reached over SSH as the pool's user: the real path
        assert placed[c.container_name] == (
            f"ssh://{agent.ssh.user}@{agent.ssh.host}:22"
            f"{agent.docker_host.removeprefix('unix://')}")
        on_engine = lab.client(c.agent).containers.get(c.container_name)
        assert on_engine.labels[f"{LABEL_PREFIX}.host"] == c.host
    net = lab.client("agent1").networks.get(plan.network.name)
    assert net.attrs["Driver"] == "overlay" and net.attrs["Attachable"]
    assert net.attrs["Scope"] == "swarm"
    assert net.attrs["Options"].get("com.docker.network.driver.mtu") == "1450"


def test_overlay_dns_resolves_every_host_from_every_agent(spread):
    addresses = {}
    for host, c in spread.containers.items():
        for peer in spread.containers:
            code, out = run_in(c, f"getent hosts {peer}")
            assert code == 0, f"{host} cannot resolve {peer}: {out}"
            addresses.setdefault(peer, set()).add(out.split()[0])
    assert all(len(seen) == 1 for seen in addresses.values()), addresses  # one address each
    assert len({next(iter(a)) for a in addresses.values()}) == 4


def test_status_reaches_every_agent_with_the_pools_ssh_key_and_known_hosts(
        lab, spread, capsys):
    """The lab pool is remote: status talks to each engine through the agent's connector (SSH
    as the pool's non-root user with its key and known_hosts, ``docker system dial-stdio``
    there). Neither the socket path taken as a local socket nor the Docker SDK's own ssh://
    transport, which knows nothing of the pool's key or known_hosts, reaches it."""
    import docker
    import paramiko

    assert cli.main(["status", str(spread.path), "--json"]) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert [(c["host"], c["agent"], c["state"]) for c in report["containers"]] == [
        ("main1", "agent1", "running"), ("sub1", "agent1", "running"),
        ("sub2", "agent2", "running"), ("sub3", "agent3", "running")]
    agent = lab.pool.agent("agent2")
    assert agent.ssh.user != "root"
    with pytest.raises(docker.errors.DockerException):  # the socket is on the agent only
        docker.DockerClient(base_url=agent.docker_host, timeout=10).ping()
    with pytest.raises(paramiko.SSHException):  # no lab key, no known host key
        docker.DockerClient(base_url=f"ssh://{agent.ssh.user}@{agent.ssh.host}",
                            timeout=10).ping()


def test_a_pools_ssh_connection_carries_more_streams_than_sshd_allows_per_connection(
        lab, spread):
    """sshd allows 10 channels per connection (MaxSessions); a Docker client in 16 threads
    needs more: the connector opens further connections instead of resetting requests."""
    main1 = lab.client("agent1").containers.get(spread.plan.containers[0].container_name)

    def one(i: int) -> str:
        return main1.exec_run(["sh", "-c", f"sleep 1; echo {i}"])[1].decode().strip()

    with ThreadPoolExecutor(max_workers=16) as ex:
        assert sorted(ex.map(one, range(32)), key=int) == [str(i) for i in range(32)]


def test_full_ssh_mesh_with_strict_host_keys_across_agents(spread):
    results = ssh_mesh(spread.containers, "hostname", STRICT)
    assert len(results) == 12
    bad = {pair: r for pair, r in results.items() if r != (0, pair[1])}
    assert not bad, bad
    # the host keys really are checked: against another CA, sub2's certificate is refused
    main1 = spread.containers["main1"]
    code, out = run_in(main1, "ssh-keygen -q -t ed25519 -N '' -f /tmp/other-ca && "
                       "printf '@cert-authority * %s\\n' \"$(cat /tmp/other-ca.pub)\" >/tmp/kh "
                       f"&& ssh {STRICT} -o UserKnownHostsFile=/tmp/kh sub2 hostname")
    assert code != 0 and "Host key verification failed" in out, out


def test_mpirun_across_three_agents_with_no_hostfile_or_host_flags(spread):
    """Open MPI's launcher over the overlay: ranks on main1 and sub1 (agent1), sub2 (agent2)
    and sub3 (agent3), started through the session's ssh mesh with strict host-key checking."""
    main1 = spread.containers["main1"]
    # (timeout: a launcher that tries an address another agent cannot reach hangs, not fails)
    code, out = run_in(main1, f"timeout 120 ssh {STRICT} main1 'mpirun -np 4 hostname'")
    assert code == 0, out
    assert sorted(out.split()) == ["main1", "sub1", "sub2", "sub3"], out
    program = ("from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.allreduce(c.rank + 1))")
    code, out = run_in(main1, f"timeout 120 ssh {STRICT} main1 "
                              f"'mpirun -np 4 python3 -c \"{program}\"'")
    assert code == 0, out
    assert out.split() == ["10"] * 4, out


def test_cluster_variables_as_specified_on_every_agent(spread):
    main1 = spread.containers["main1"]
    hosts = ["main1", "sub1", "sub2", "sub3"]
    for rank, host in enumerate(hosts):
        code, out = run_in(main1, f"ssh {STRICT} {host} 'printf \"%s|\" \"$MASTER_ADDR\" "
                           "\"$MASTER_PORT\" \"$BACKENDAI_CLUSTER_HOST\" "
                           "\"$BACKENDAI_CLUSTER_ROLE\" "
                           "\"$BACKENDAI_CLUSTER_IDX\" \"$BACKENDAI_CLUSTER_LOCAL_RANK\" "
                           "\"$BACKENDAI_CLUSTER_HOSTS\" \"$BACKENDAI_CLUSTER_SIZE\" "
                           "\"$BACKENDAI_CLUSTER_MODE\" \"$PET_NNODES\" \"$PET_NODE_RANK\" "
                           "\"${WORLD_SIZE-unset}\" \"$EXPERIMENT\"; echo \"$TF_CONFIG\"'")
        assert code == 0, out
        fields, tf = out.rsplit("|", 1)
        role, idx = ("main", "1") if host == "main1" else ("sub", host[3:])
        assert fields.split("|") == [
            "main1", "29500", host, role, idx, str(rank), ",".join(hosts), "4", "multi-node",
            "4", str(rank), "unset", "multi node"], host
        assert json.loads(tf) == {
            "cluster": {"worker": [f"{h}:{29500 + i}" for i, h in enumerate(hosts)]},
            "task": {"type": "worker", "index": rank}}


def test_live_capacity_counts_the_running_session(lab, spread, tmp_path):
    free = {f.name: f for f in capacity.probe_free(lab.pool)}
    assert {n: f.millicpu for n, f in free.items()} == {"agent1": 0, "agent2": 0, "agent3": 0}
    mine = {f.name: f.millicpu for f in capacity.probe_free(lab.pool, exclude_session=spread.name)}
    assert mine == {n: c * 1000 for n, c in CAPACITY.items()}
    # another session planned against live capacity is pending, with the reason
    other = load_session(lab.write_session(tmp_path, "mn-other", 2))
    plan = build_plan(other.session, other.pool, capacity.probe_free(lab.pool))
    assert plan.pending and "short of cpu" in plan.reason
    reports = capacity.probe_pool(lab.pool)
    assert all(r.sessions == [spread.name] for r in reports)


def test_destroy_leaves_no_container_or_network_on_any_agent(lab, spread):
    found, errors = cleanup.find_leftovers(lab.pool, spread.name)
    assert not errors
    kinds = sorted((i.agent, i.kind) for i in found)
    assert kinds.count(("agent1", "container")) == 2
    assert ("agent1", "network") in kinds  # the overlay, on the manager
    assert {("agent2", "container"), ("agent3", "container")} <= set(kinds)
    spread.destroy()  # `sessionctl destroy`: the real engine deletes it through the same agents
    report = cleanup.sweep(lab.pool, spread.name)
    assert report.clean, report.summary()
    assert cleanup.find_leftovers(lab.pool, spread.name) == ([], [])
    for name, client in lab.clients.items():
        label = f"{LABEL_PREFIX}.session={spread.name}"
        assert client.containers.list(all=True, filters={"label": label}) == [], name
        assert client.networks.list(filters={"label": label}) == [], name
        assert spread.plan.network.name not in [n.name for n in client.networks.list()], name


def test_sweep_removes_a_leaked_overlay_and_containers(lab, swarm):
    name = f"leak-{uuid.uuid4().hex[:6]}"
    labels = {f"{LABEL_PREFIX}.session": name, f"{LABEL_PREFIX}.session-id": "x"}
    lab.client("agent1").networks.create(f"{name}-net", driver="overlay", attachable=True,
                                         labels=labels)
    lab.client("agent3").containers.run(lab.image, ["sleep", "infinity"], detach=True,
                                        name=f"{name}-sub1", network=f"{name}-net",
                                        labels=labels)
    found, _ = cleanup.find_leftovers(lab.pool, name)
    assert {(i.agent, i.kind) for i in found} == {
        ("agent1", "network"), ("agent3", "container"), ("agent3", "network")}
    report = cleanup.sweep(lab.pool, name)
    assert report.clean, report.summary()
    assert cleanup.find_leftovers(lab.pool, name) == ([], [])


@pytest.fixture
def packed(lab, swarm, tmp_path):
    name = f"mn1-{uuid.uuid4().hex[:6]}"
    live = _build(lab, swarm, lab.write_session(tmp_path, name, 2))
    try:
        yield live
    finally:
        _destroy(lab, live)


def test_multi_node_session_that_fits_one_agent_lands_there_on_a_bridge(lab, packed):
    plan = packed.plan
    assert plan.mode == "multi-node"
    assert plan.network.driver == "bridge" and plan.network.agent == "agent1"
    assert {c.agent for c in plan.containers} == {"agent1"}
    net = lab.client("agent1").networks.get(plan.network.name)
    assert net.attrs["Driver"] == "bridge" and net.attrs["Scope"] == "local"
    for other in ("agent2", "agent3"):
        label = f"{LABEL_PREFIX}.session={packed.name}"
        assert lab.client(other).containers.list(all=True, filters={"label": label}) == []
        assert lab.client(other).networks.list(filters={"label": label}) == []
    results = ssh_mesh(packed.containers, "hostname", STRICT)
    assert all(r == (0, peer) for (_h, peer), r in results.items()), results
    code, out = run_in(packed.containers["main1"], f"ssh {STRICT} sub1 'echo $MASTER_ADDR "
                       "$BACKENDAI_CLUSTER_MODE'")
    assert (code, out) == (0, "main1 multi-node")
    packed.destroy()
    assert cleanup.sweep(lab.pool, packed.name).clean
    assert cleanup.find_leftovers(lab.pool, packed.name) == ([], [])


# --- an agent whose engine stops ----------------------------------------------------------------


def test_an_agent_whose_dockerd_stops_is_named_and_destroy_finishes_once_it_is_back(
        lab, real_engine, tmp_path, capsys):
    """count: 4 single-container batch sessions (cpu 1 each: two on agent1, one on agent2, one
    on agent3, as the pool's selector places them) through the real engine verbs; then
    agent3's dockerd is stopped, and the session there is the one that cannot be reached."""
    name = f"mnc-{uuid.uuid4().hex[:6]}"
    path = str(lab.write_session(tmp_path, name, 1, count=4, type="batch",
                                 command=["sh", "-c", "echo started; sleep 600"],
                                 cluster={"mode": "single-node", "size": 1}))
    assert cli.main(["up", path, "--yes"]) == 0, capsys.readouterr().err
    where = {}
    for i in range(1, 5):
        label = f"{LABEL_PREFIX}.session={name}-{i}"
        where[i] = [(agent, c.name) for agent in ("agent1", "agent2", "agent3")
                    for c in lab.client(agent).containers.list(all=True,
                                                               filters={"label": label})]
    assert sorted(a for held in where.values() for a, _ in held) == [
        "agent1", "agent1", "agent2", "agent3"], where  # no agent over its cpu
    k = next(i for i, held in where.items() if held[0][0] == "agent3")
    others = [i for i in (1, 2, 3, 4) if i != k]
    assert where[k] == [("agent3", f"{name}-{k}-main1")]
    capsys.readouterr()
    engines.stop_dockerd(lab.info.state_dir, "agent3")
    try:
        assert cli.main(["status", path]) == Exit.ENGINE
        err = capsys.readouterr().err
        agent3 = lab.pool.agent("agent3")
        assert (f"{name}-{k}: agent agent3 did not answer: docker not answering at "
                f"ssh://{agent3.ssh.user}@{agent3.ssh.host}:22 {agent3.docker_host}") in err
        assert not [i for i in others if f"{name}-{i}: " in err]  # the others answer
        assert cli.main(["wait", path, "--index", str(k), "--timeout", "5"]) == Exit.ENGINE
        assert "agent agent3 did not answer" in capsys.readouterr().err
        assert cli.main(["ls", "--json"]) == 0
        listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sessions"]}
        assert [listed[f"{name}-{i}"]["state"] for i in (1, 2, 3, 4)] == [
            "unreachable" if i == k else "running" for i in (1, 2, 3, 4)]
        assert listed[f"{name}-{k}"]["agents"] == ["agent3"]

        assert cli.main(["destroy", path, "--yes"]) == Exit.ENGINE
        err = capsys.readouterr().err
        assert f"destroy of stack {name}-{k} did not finish; it removed what it could." in err
        could_not = err.split("The engine could not delete:", 1)[-1]
        assert f"{name}-{k}-main1" in could_not, err  # the real engine's words name its urn
        assert "agent agent3: docker not answering" in err
        assert f"destroy done for: {', '.join(f'{name}-{i}' for i in others)}" in err
        for i in others:
            label = f"{LABEL_PREFIX}.session={name}-{i}"
            agent = where[i][0][0]
            assert lab.client(agent).containers.list(all=True, filters={"label": label}) == []
    finally:
        engines.start_dockerd(lab.info.state_dir, "agent3")
    # back: the stack kept what it could not delete, and the next destroy finishes the job
    assert cli.main(["destroy", path, "--yes", "--index", str(k)]) == 0
    assert cleanup.find_leftovers(lab.pool, f"{name}-{k}") == ([], [])


# --- taking it down ---------------------------------------------------------------------------


def test_swarm_delete_leaves_and_preflight_then_refuses_a_spread(lab, swarm, tmp_path):
    leave_swarm(swarm)
    assert _swarm_states(lab) == {"agent1": "inactive", "agent2": "inactive",
                                  "agent3": "inactive"}
    path = lab.write_session(tmp_path, "mn-noswarm", 4)
    loaded = load_session(path)
    plan = build_plan(loaded.session, loaded.pool)
    with pytest.raises(capacity.PreflightError) as caught:
        capacity.preflight(loaded.pool, plan.agents)
    assert "agent agent1: swarm not ready: is the pool's swarm manager but its swarm state is " \
           "inactive; run `sessionctl pool up mnlab`" in str(caught.value)


def _stop(lab: Lab, agent: str, daemon: str) -> None:
    rec = json.loads((lab.info.state_dir / "lab.json").read_text())
    pid = rec["pids"][agent][daemon]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while processes.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes.alive(pid), f"{daemon} of {agent} did not stop"


def test_an_agent_stopped_mid_plan_is_named_and_nothing_is_created(lab, tmp_path, capsys):
    path = lab.write_session(tmp_path, "mn-stopped", 4)
    loaded = load_session(path)
    plan = build_plan(loaded.session, loaded.pool)  # planned while every agent is up
    assert plan.agents == ("agent1", "agent2", "agent3")
    _stop(lab, "agent2", "sshd")
    _stop(lab, "agent3", "dockerd")
    with pytest.raises(capacity.PreflightError) as caught:
        # overlay=False: the swarm is gone (previous test); only the stopped agents are asked about
        capacity.preflight(loaded.pool, plan.agents, overlay=False)
    lines = str(caught.value).splitlines()
    assert lines[0] == "pool mnlab: 2 of 3 agent(s) cannot be used; nothing was created:"
    assert lines[1].startswith("  agent agent2: unreachable: ssh csl-ops@10.251.102.12:22: ")
    assert lines[2].startswith("  agent agent3: docker not answering: ssh csl-ops@10.251.102.13:22")
    # the exit code is the driver's: through the CLI, plan --probe names both agents, exit 4
    code = cli.main(["plan", str(path), "--probe"])
    err = capsys.readouterr().err
    assert code == 4 and "agent agent2: unreachable" in err and "agent agent3: docker" in err
    # nothing of the session anywhere that can still be asked
    for name in ("agent1", "agent2"):
        label = f"{LABEL_PREFIX}.session=mn-stopped"
        assert lab.client(name).containers.list(all=True, filters={"label": label}) == []
