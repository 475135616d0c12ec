"""Time to a ready multi-node session on a 3-agent netns lab, against the engines' own floor.

Issue 35's "Done when" on the lab: for N = 8, 32, 128, ready time minus the engines' own floor
grows at most linearly in N per agent, and a session's sshd start-ups during readiness are at
most 2N. Brings up its own lab (prefix ``csrl``, 10.251.110.0/24; root): 3 Docker Engines in
network namespaces, each reached as a remote host is (SSH as the pool's non-root user,
``docker system dial-stdio`` there), and the pool's swarm made by the pool program under the
mock engine (as ``sessionctl pool up`` makes it). Then, per size N and per run:

(a) floor: an attachable swarm overlay created on the manager, then N plain containers of the
    session image (``sleep infinity``) on it, spread over the agents as the session is placed,
    created and started in parallel (``--parallel`` at once) through the same SSH-reached
    clients the session's build uses, until every start call has returned (it runs);
(b) session: the real ``__main__.py`` under the mock engine for a multi-node definition of N
    containers (cpu ``--cpu``, mem ``--mem`` each) on a pool whose capacities hold
    ceil(N/3) containers per agent, so the plan spreads them over all three; then the
    emulation's ``DockerBuilder`` creates what it declares on each agent (the provider's
    create by hand: create, uploads, start), ``--parallel`` containers at once, as
    ``pulumi up --parallel P`` would, with ``sessionctl up``'s watch beside it (each
    container's pids limit as soon as its agent reports it created, over SSH:
    agents/early_limits.py), and each agent's ``ContainerLimits`` sets the pool's pids limit
    again once that agent's containers exist (``--limits agent``: only that, as a plain
    ``pulumi up``; the set-up waits for the limit). The clock runs
    from the network's creation until every container has logged its entrypoint's ``ready:``
    line (Docker's timestamp of the line).

``--parallel`` is 8, as ``sessionctl up`` runs a stack whose pool has an agent over SSH
(``driver/stack_settings.py`` ``SSH_PARALLEL``), not Pulumi's unbounded default: every
concurrent Docker call over an
``ssh://`` provider is one more SSH connection to the agent (docker/cli's connection helper
runs one ``ssh`` per HTTP connection), and a stock sshd drops connections beyond
``MaxStartups`` 10 that are still in their handshake; unbounded, N = 32 already fails (11
creates at once on one agent: "kex_exchange_identification: Connection closed by remote
host"). ``--parallel 0`` runs it unbounded.

``--mem`` is 512 MiB, not less: while the subs wait at main1's gate, main1 holds each one's
login (sshd's two processes, the session's shells): its cgroup's memory peaked at 18 MiB at
N = 8 and 74 MiB at N = 32, about 2.3 MiB per waiting sub. With 64 MiB at N = 32 the kernel
killed sshd's children in main1 (21 OOM kills), the subs logged in again and main1 accepted
326 connections instead of 31.

``--readiness-timeout 600`` is what N = 128 needs here: the entrypoint's readiness timeout
(120 s) counts from each container's start, and main1 starts first, minutes before the last
sub; with ``--limits agent`` the set-up also waits for the pids limit, which ``ContainerLimits``
sets once all of the agent's containers exist (43 at N = 128, more than 60 s of creates
here).

The connections to the agents are opened (and pinged) before either clock starts, for both.
The containers are watched through the lab's local engine sockets (log streams, one
``docker exec`` each for the count), so the watching adds no SSH traffic to the measurement.

sshd start-ups during readiness: right after the last ``ready:`` line, each container's
``PassiveOpens`` (``/proc/net/snmp`` in its own network namespace: until the session is ready
only sshd listens there, and sshd forks once per accepted connection; tests/test_readiness.py
counts them the same way). The design gives N-1: each sub accepts one probe from main1, which
holds it and says the go on it (bash in the image; 2(N-1) with nc only); main1 accepts none
(a sub that asks main1's gate costs main1 one login).

Prints one line per run and a table per size: N, containers per agent, floor s, session s,
session - floor, (session - floor) / (N per agent), sshd start-ups against 2N, and how busy
the machine was (the machine is shared: a busy figure says the timings are not the product's alone).

    python3 benchmarks/ready_lab.py --sizes 8,32 --runs 2      # the product as it is
    python3 benchmarks/ready_lab.py --sizes 128 --readiness-timeout 600

Everything is removed at the end, also on errors and Ctrl-C (the lab is taken down).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

PROJECT = Path(__file__).resolve().parent.parent
for _path in (PROJECT / "modules", PROJECT, Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import yaml  # noqa: E402
from quiet import busy_fraction, describe, machine_cpu, settle  # noqa: E402
from ready_time import LogWatch, docker_time, tail, wait_ready  # noqa: E402

from cluster_sessions.agents.engine import set_pids_limit  # noqa: E402
from cluster_sessions.core.names import LABEL_PREFIX, STACK_ID_LABEL  # noqa: E402
from cluster_sessions.lab import netns  # noqa: E402
from cluster_sessions.lab.layout import RUN_BASE, LabInfo, read_json  # noqa: E402

PREFIX, SUBNET = "csrl", "10.251.110.0/24"
AGENTS = 3
CONTAINER = "docker:index/container:Container"
NETWORK = "pulumi-python:dynamic/cluster-sessions:SessionNetwork"
PROVIDER = "pulumi:providers:docker"
# creates at once (module doc): one agent's SSH handshakes stay under sshd's MaxStartups 10
# (the creates go in host order, agent by agent)
PARALLEL_DEFAULT = 8
RUN_TIMEOUT = 600.0  # s per session run (the entrypoint itself gives up after readiness.timeout)


# --- the lab and its pool ---------------------------------------------------------------------

def clear_stale_lab() -> None:
    """Take down a lab with our prefix that a killed earlier run left."""
    from cluster_sessions.lab import processes

    rec = read_json(RUN_BASE / PREFIX / "lab.json")
    if rec is None:
        return
    pid = rec.get("creator_pid")
    if pid and pid != os.getpid() and processes.alive(pid):
        raise SystemExit(f"another run (pid {pid}) uses the {PREFIX!r} lab right now")
    netns.lab_down(Path(rec["state_dir"]))


def per_agent(size: int) -> int:
    return math.ceil(size / AGENTS)


def write_pool(info: LabInfo, directory: Path, size: int, cpu: float, mem_mib: int) -> Path:
    """The lab's pool with capacities for ceil(N/3) containers per agent: the plan fills the
    agents largest first, so N containers spread over all three."""
    doc = yaml.safe_load(info.pool_file.read_text())
    k = per_agent(size)
    for a in doc["agents"]:
        a["capacity"] = {"cpu": round(k * cpu, 3), "mem": f"{k * mem_mib}m", "gpus": []}
    path = directory / f"pool-{size}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_definition(directory: Path, pool: Path, name: str, size: int, image: str,
                     cpu: float, mem_mib: int, readiness_timeout: int | None) -> Path:
    doc = {"kind": "ClusterSession", "name": name, "pool": str(pool), "image": image,
           "cluster": {"mode": "multi-node", "size": size},
           "resources": {"cpu": cpu, "mem": f"{mem_mib}m", "shmem": f"{mem_mib // 4}m"},
           "command": ["sleep", "infinity"]}
    if readiness_timeout:
        doc["readiness"] = {"timeout": readiness_timeout}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@contextlib.contextmanager
def pool_swarm(pool_file: Path):
    """The pool's swarm, made by the pool program under the mock engine (its dynamic
    resources run for real against the lab); left again at the end."""
    from cluster_sessions.pulumi_layer import pool_program
    from tests.standin.engine import Engine, run_program

    engine = Engine()
    name = yaml.safe_load(pool_file.read_text())["name"]
    try:
        run_program(engine, f"pool-{name}",
                    {"cluster-sessions:pool-definition": str(pool_file)},
                    program=lambda: pool_program.run(PROJECT))
        yield engine
    finally:
        with contextlib.suppress(Exception):
            engine.delete_resources(list(engine.state), go_on=True)


# --- what the program declares ----------------------------------------------------------------

@dataclass
class Declared:
    program_s: float
    providers: list  # (registration, inputs)
    network: tuple
    containers: list  # (registration, inputs), host order
    agent_of: dict  # container name -> agent
    manager: str
    agents: list = field(default_factory=list)  # the pool's Agents the plan uses
    stack_id: str = ""
    pids_limit: int = 0


def declare(definition: Path) -> Declared:
    """The real ``__main__.py`` under the mock engine, after the engine verbs' preflight."""
    from cluster_sessions.agents import capacity
    from cluster_sessions.core import loader
    from cluster_sessions.core.plan import build_plan
    from cluster_sessions.driver.session_args import pool_dirs
    from tests.standin.engine import Engine, run_program

    loaded = loader.load_session(definition, None, pool_dirs=pool_dirs())
    plan = build_plan(loaded.session, loaded.pool)
    if plan.pending:
        raise SystemExit(f"{plan.name}: pending: {plan.reason}")
    capacity.preflight(loaded.pool, plan.agents)
    engine = Engine()
    p0 = time.perf_counter()
    run_program(engine, plan.name, {"cluster-sessions:definition": str(definition)})
    program_s = time.perf_counter() - p0
    (network,) = [(r, r.plain_inputs) for r in engine.of_type(NETWORK)]
    containers = [(r, r.plain_inputs) for r in engine.of_type(CONTAINER)]
    assert len(containers) == len(plan.containers)
    # the stack's id as the program labelled its containers (the stack's, not this plan's)
    (stack_id,) = {label["value"] for _, inputs in containers for label in inputs["labels"]
                   if label["label"] == STACK_ID_LABEL}
    # the bundles' deliveries (issue 45), not run under mocks: session_run runs them
    DELIVERIES[stack_id] = [r.plain_inputs for r in engine.of_type(
        "pulumi-python:dynamic/cluster-sessions:BundleDelivery")]
    return Declared(program_s, [(r, r.plain_inputs) for r in engine.of_type(PROVIDER)],
                    network, containers,
                    {c.container_name: c.agent for c in plan.containers},
                    plan.network.agent, [loaded.pool.agent(a) for a in plan.agents],
                    stack_id, plan.limits.pids_limit)


DELIVERIES: dict[str, list[dict]] = {}


def run_deliveries(stack_id: str) -> dict[str, float]:
    """What the program's BundleDelivery resources do (pulumi_layer/bundles.py): each agent's
    bundles in one script over its SSH, the agents in parallel; seconds per agent."""
    from cluster_sessions.agents.bundles import deliver
    from cluster_sessions.agents.connectors import connector_from_props

    def one(inputs: dict) -> tuple[str, float]:
        d0 = time.time()
        with connector_from_props(inputs["agent"]) as conn:
            deliver(conn, inputs["scratch"], inputs["stack_id"], inputs["bundles"])
        return inputs["agent"]["name"], time.time() - d0

    items = DELIVERIES.get(stack_id, [])
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        return dict(pool.map(one, items))


def remove_deliveries(stack_id: str) -> None:
    from cluster_sessions.agents.bundles import remove
    from cluster_sessions.agents.connectors import connector_from_props

    for inputs in DELIVERIES.pop(stack_id, []):
        with contextlib.suppress(Exception), connector_from_props(inputs["agent"]) as conn:
            remove(conn, inputs["scratch"], inputs["stack_id"], list(inputs["bundles"]))


def warm_builder(declared: Declared):
    """A ``DockerBuilder`` given the program's providers, its connection to every agent opened
    and pinged now (before the clock; also: the builder opens them lazily and unlocked, so N
    threads' first calls would race to open N connections)."""
    from tests.standin.docker_builder import DockerBuilder

    builder = DockerBuilder()
    for provider in declared.providers:
        builder(*provider)
    clients = {}
    for reg, inputs in declared.containers:
        agent = declared.agent_of[inputs["name"]]
        if agent not in clients:
            clients[agent] = builder.client_for(reg)[0]
    if declared.manager not in clients:
        # the network is the program's own resource (no docker provider of its own): the
        # manager's provider, named <session>-<agent>-<8 hex> (pulumi_layer/session.py)
        (provider,) = [r for r, _ in declared.providers
                       if r.name.rsplit("-", 1)[0].endswith(f"-{declared.manager}")]
        clients[declared.manager] = builder.client_for(
            SimpleNamespace(provider_urn=provider.urn))[0]
    return builder, clients


# --- the floor --------------------------------------------------------------------------------

@dataclass
class FloorResult:
    total: float
    network: float
    busy: float


def floor_run(clients: dict, manager: str, placement: list[str], image: str,
              options: dict, tag: str, parallel: int) -> FloorResult:
    net_name = f"{tag}-floor"
    created: list[tuple[str, str]] = []
    lock = threading.Lock()
    network_id = None
    try:
        cpu0 = machine_cpu()
        t0 = time.time()
        network_id = clients[manager].api.create_network(
            net_name, driver="overlay", attachable=True, options=options or None)["Id"]
        t_net = time.time()

        def one(i: int) -> float:
            api = clients[placement[i]].api
            c = api.create_container(
                image, command=["sleep", "infinity"], name=f"{tag}-f{i}",
                host_config=api.create_host_config(),
                networking_config=api.create_networking_config(
                    {net_name: api.create_endpoint_config()}))
            with lock:
                created.append((placement[i], c["Id"]))
            api.start(c["Id"])
            return time.time()

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            t_end = max(pool.map(one, range(len(placement))))
        busy = busy_fraction(cpu0, machine_cpu())
        for agent, cid in created:
            state = clients[agent].api.inspect_container(cid)["State"]
            assert state["Running"], f"floor container exited: {state}"
        return FloorResult(t_end - t0, t_net - t0, busy)
    finally:
        remove_floor(clients, manager, created, network_id)


def remove_floor(clients: dict, manager: str, created: list, network_id: str | None) -> None:
    import docker.errors

    def remove(item: tuple[str, str]) -> None:
        agent, cid = item
        with contextlib.suppress(docker.errors.NotFound):
            clients[agent].api.remove_container(cid, force=True)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(remove, created))
    if network_id:
        remove_network(clients[manager], network_id)


def remove_network(client, network_id: str, timeout: float = 60) -> None:
    """The overlay, once the workers have let go of it (that takes them a moment)."""
    import docker.errors

    deadline = time.monotonic() + timeout
    while True:
        try:
            client.api.remove_network(network_id)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# --- the session ------------------------------------------------------------------------------

@dataclass
class SessionResult:
    total: float  # network creation -> last ready line
    program: float  # __main__.py under mocks (not in total)
    network: float
    engine_done: float  # t0 -> every container's create/upload/start returned
    limits_done: float  # t0 -> the pids limit set on every agent
    all_running: float  # t0 -> last container's StartedAt
    wait_after_running: float  # last StartedAt -> last ready line
    sshd_starts: int  # PassiveOpens summed over the session's containers
    sshd_main1: int
    sshd_sub_max: int
    busy: float
    main1_sshd: dict  # main1's sshd log lines by kind (numbers and addresses left out)
    built: dict  # agent -> t0 -> its last container made
    restarts: int  # the engines' RestartCount, summed
    oom_kills: int  # the machine's OOM kills during the run (/proc/vmstat)
    main1_mem_peak_mib: float | None  # main1's cgroup memory peak
    early_limited: int = 0  # containers whose limit the watch of `sessionctl up` set
    early_errors: list = field(default_factory=list)  # agents whose watch gave up, and why


def snmp_passive_opens(api, cid: str) -> int:
    for _ in range(3):  # an exec that said nothing (seen once at N = 32): again
        exec_id = api.exec_create(cid, ["cat", "/proc/net/snmp"], user="root")["Id"]
        out = api.exec_start(exec_id).decode()
        rows = [line.split() for line in out.splitlines() if line.startswith("Tcp:")]
        if len(rows) == 2:
            header, values = rows
            return int(values[header.index("PassiveOpens")])
        time.sleep(0.5)
    state = api.inspect_container(cid)["State"]
    raise RuntimeError(f"{cid[:12]}: /proc/net/snmp said: {out[:500]!r} (exec "
                       f"{api.exec_inspect(exec_id).get('ExitCode')}, container {state})")


def diagnose(local: dict, agent_of_host: dict, watches: dict) -> None:
    """What main1 and the first hosts not ready were doing (stderr): processes, the CPU their
    cgroup used and was throttled for, the log's end."""
    late = [h for h, w in watches.items() if w.ready_at is None and w.cid]
    for host in dict.fromkeys(["main1", *late[:2]]):
        watch = watches[host]
        if not watch.cid:
            continue
        api = local[agent_of_host[host]].api
        out = []
        with contextlib.suppress(Exception):
            st = api.inspect_container(watch.cid)["State"]
            out.append(f"state {st['Status']} exit {st['ExitCode']} oom-killed "
                       f"{st['OOMKilled']}; restarts "
                       f"{api.inspect_container(watch.cid)['RestartCount']}")
        for cmd in ("ps -eo pid,ppid,stat,etime,time,args | head -25",
                    "cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes "
                    "/sys/fs/cgroup/memory/memory.failcnt",
                    "cat /sys/fs/cgroup/cpu/cpu.stat /sys/fs/cgroup/cpuacct/cpuacct.usage",
                    "grep -E 'Tcp:' /proc/net/snmp"):
            with contextlib.suppress(Exception):
                exec_id = api.exec_create(watch.cid, ["sh", "-c", cmd], user="root")["Id"]
                out.append(api.exec_start(exec_id).decode(errors="replace"))
        print(f"--- {host} ({agent_of_host[host]}):\n" + "\n".join(out) + tail(watch, 8),
              file=sys.stderr)


def oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def cgroup_file(api, cid: str, name: str) -> int | None:
    """A number from the container's own cgroup (v1: /sys/fs/cgroup/NAME)."""
    with contextlib.suppress(Exception):
        exec_id = api.exec_create(cid, ["cat", f"/sys/fs/cgroup/{name}"], user="root")["Id"]
        return int(api.exec_start(exec_id).decode().split()[0])
    return None


def sshd_lines(api, cid: str) -> dict[str, int]:
    """main1's own log lines that are not its entrypoint's (sshd's, on stderr), counted by
    their text with the numbers, addresses and names taken out: what the accepted
    connections were."""
    kinds: dict[str, int] = {}
    for line in api.logs(cid, stdout=True, stderr=True).decode(errors="replace").splitlines():
        if line.startswith("cluster-session[") or not line.strip():
            continue
        kind = re.sub(r"\d+(\.\d+){3}|\bport \d+|\b(main|sub)\d+\b|SHA256:\S+|\d+", "#",
                      line.strip())
        kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def session_run(declared: Declared, local: dict, tag: str, parallel: int,
                limits_mode: str = "up", explain: bool = False) -> SessionResult:
    from cluster_sessions.core.spec import SessionLimits
    from cluster_sessions.pulumi_layer.limits import PARALLEL

    builder, clients = warm_builder(declared)
    hosts = [inputs["hostname"] for _, inputs in declared.containers]
    agent_of_host = {inputs["hostname"]: declared.agent_of[inputs["name"]]
                     for _, inputs in declared.containers}
    watches = {h: LogWatch(local[agent_of_host[h]].api, h) for h in hosts}
    futures: dict[str, list] = {}
    executor = ThreadPoolExecutor(max_workers=AGENTS)  # the limits, waiting for the creates
    creating = ThreadPoolExecutor(max_workers=parallel)
    during = contextlib.ExitStack()
    try:
        early: list = []
        if limits_mode == "up":  # `sessionctl up`'s watch of each agent, beside the engine;
            # following before the clock starts, as it is while the CLI starts up
            from cluster_sessions.agents.early_limits import early_pids_limits, wait_following

            early = during.enter_context(early_pids_limits(
                declared.agents, declared.stack_id, declared.pids_limit))
            wait_following(early, 120)
        oom0 = oom_kills()
        cpu0 = machine_cpu()
        t0 = time.time()
        # each agent's delivery of its bundles, in parallel and beside the network (the
        # containers depend on both): its seconds per agent are printed
        delivering = executor.submit(run_deliveries, declared.stack_id)
        builder(*declared.network)
        per_agent = delivering.result()
        print(f"{tag}: delivery per agent (s): " + ", ".join(
            f"{a} {v:.3f}" for a, v in per_agent.items()), file=sys.stderr)
        t_net = time.time()

        def one(reg, inputs: dict) -> float:
            builder(reg, inputs)
            cid = builder.made[reg.urn][2]
            if limits_mode == "container":  # as if the provider set it at create
                set_pids_limit(clients[declared.agent_of[inputs["name"]]], cid,
                               SessionLimits().pids_limit)
            watches[inputs["hostname"]].start(cid)
            return time.time()

        def limits(agent: str, made: list) -> float:
            """``ContainerLimits`` of one agent: once its containers exist, the pool's pids
            limit on each, ``PARALLEL`` calls at once over the agent's connection."""
            for f in made:
                f.result()
            ids = [builder.made[reg.urn][2] for reg, inputs in declared.containers
                   if declared.agent_of[inputs["name"]] == agent]
            with ThreadPoolExecutor(max_workers=min(PARALLEL, len(ids))) as pool:
                list(pool.map(lambda cid: set_pids_limit(clients[agent], cid,
                                                         SessionLimits().pids_limit,
                                                         unless_held=True), ids))
            return time.time()

        # `parallel` workers create; the limits wait in their own threads
        for reg, inputs in declared.containers:
            futures.setdefault(declared.agent_of[inputs["name"]], []).append(
                creating.submit(one, reg, inputs))
        limit_futures = [executor.submit(limits, agent, made)
                         for agent, made in futures.items() if limits_mode != "container"]
        everything = [f for made in futures.values() for f in made] + limit_futures
        deadline = time.monotonic() + RUN_TIMEOUT
        try:
            wait_ready(watches, everything, deadline, tag)
        except Exception:
            diagnose(local, agent_of_host, watches)
            raise
        busy = busy_fraction(cpu0, machine_cpu())
        ids = {h: w.cid for h, w in watches.items()}
        # the count first, before anything else could connect to a container
        with ThreadPoolExecutor(max_workers=8) as pool:
            opens = dict(zip(hosts, pool.map(
                lambda h: snmp_passive_opens(local[agent_of_host[h]].api, ids[h]), hosts),
                strict=True))
        main1_sshd = sshd_lines(local[agent_of_host["main1"]].api, ids["main1"])
        engine_done = max(f.result() for made in futures.values() for f in made)
        limits_done = max((f.result() for f in limit_futures), default=engine_done)
        built = {agent: round(max(f.result() for f in made) - t0, 1)
                 for agent, made in futures.items()}
        states = {h: local[agent_of_host[h]].api.inspect_container(ids[h]) for h in hosts}
        started = {h: docker_time(states[h]["State"]["StartedAt"]) for h in hosts}
        main1_peak = cgroup_file(local[agent_of_host["main1"]].api, ids["main1"],
                                 "memory/memory.max_usage_in_bytes")
        last_ready = max(w.ready_at for w in watches.values())
        last_running = max(started.values())
        if explain:  # main1's log and the two subs ready last, against the clock
            last = sorted((h for h in hosts if h != "main1"),
                          key=lambda h: watches[h].ready_at or 0)[-2:]
            for h in ["main1", *last]:
                print(f"  {h} on {agent_of_host[h]}: running at {started[h] - t0:.3f}")
                for when, message in watches[h].lines:
                    print(f"    {when - t0:8.3f} {message[:150]}")
        return SessionResult(
            total=last_ready - t0, program=declared.program_s, network=t_net - t0,
            engine_done=engine_done - t0, limits_done=limits_done - t0,
            all_running=last_running - t0, wait_after_running=last_ready - last_running,
            sshd_starts=sum(opens.values()), sshd_main1=opens["main1"],
            sshd_sub_max=max((v for h, v in opens.items() if h != "main1"), default=0),
            busy=busy, main1_sshd=main1_sshd, built=built,
            restarts=sum(st["RestartCount"] for st in states.values()),
            oom_kills=oom_kills() - oom0,
            main1_mem_peak_mib=round(main1_peak / 2**20, 1) if main1_peak else None,
            early_limited=sum(len(w.limited) for w in early),
            early_errors=[f"{w.agent.name}: {w.error}" for w in early if w.error])
    finally:
        during.close()
        for watch in watches.values():
            watch.close()
        creating.shutdown(wait=False, cancel_futures=True)  # after a failure: no more
        for made in futures.values():
            for f in made:  # let running creates finish before removing
                with contextlib.suppress(Exception):
                    f.exception(timeout=RUN_TIMEOUT)
        executor.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            builder.remove_all()
        builder.close()
        sweep(local, declared.manager, tag)
        remove_deliveries(declared.stack_id)


def relay_errors(builder) -> list[str]:
    """What the ``ssh`` processes behind a builder's connections printed when they failed."""
    return sorted({e for conn in builder.connections.values() if conn.relay
                   for e in conn.relay.errors})


def sweep(local: dict, manager: str, session: str) -> None:
    """Whatever of the session is left, through the local sockets: containers on every agent,
    then the overlay on the manager."""
    from cluster_sessions.agents import engine as engine_room

    label = f"{LABEL_PREFIX}.session={session}"
    for client in local.values():
        for c in client.containers.list(all=True, filters={"label": label}):
            with contextlib.suppress(Exception):
                c.remove(force=True)
        for c in client.containers.list(all=True, filters={"name": f"{session}-f"}):
            with contextlib.suppress(Exception):
                c.remove(force=True)
    for n in engine_room.session_network_attrs(local[manager], session):
        with contextlib.suppress(Exception):
            remove_network(local[manager], n["Id"])


# --- report -----------------------------------------------------------------------------------

def fmt_row(cells: list) -> str:
    widths = (5, 7, 8, 9, 9, 14, 16, 13, 6)
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True))


HEADER = ["N", "N/agent", "floor s", "session s", "sess-flr", "(s-f)/(N/agt)",
          "sshd starts/2N", "<=2N", "busy"]


def table(rows: list[dict]) -> str:
    lines = [fmt_row(HEADER)]
    for r in rows:
        over = r["session"] - r["floor"]
        lines.append(fmt_row([
            r["size"], r["per_agent"], f"{r['floor']:.2f}", f"{r['session']:.2f}",
            f"{over:.2f}", f"{over / r['per_agent']:.3f}",
            f"{r['sshd']}/{2 * r['size']}", "met" if r["sshd"] <= 2 * r["size"] else "MISSED",
            f"{max(r['floor_busy'], r['session_busy']):.0%}"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from cluster_sessions.driver.cli import quiet_libraries

    quiet_libraries()  # as sessionctl: paramiko's own lines about channels it was refused
    import docker

    from cluster_sessions.core.loader import POOLS_ENV
    from cluster_sessions.lab.image import ensure_images

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,32,128")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--cpu", type=float, default=0.25, help="per container (default 0.25)")
    ap.add_argument("--mem", type=int, default=512,
                    help="MiB per container (default 512: main1 holds every waiting sub's "
                    "login, about 2.3 MiB each; module doc)")
    ap.add_argument("--parallel", type=int, default=PARALLEL_DEFAULT,
                    help=f"creates at once, as `pulumi up --parallel P` (default "
                    f"{PARALLEL_DEFAULT}; 0: N, Pulumi's unbounded default, which fails from "
                    "N = 32: see the module's doc)")
    ap.add_argument("--readiness-timeout", type=int, default=None,
                    help="the definition's readiness.timeout (default: the product's)")
    ap.add_argument("--limits", choices=("up", "agent", "container"), default="up",
                    help="up: as `sessionctl up` sets the pids limit, each container's as "
                    "soon as its agent reports it created (agents/early_limits.py, over SSH), "
                    "and again by ContainerLimits (default); agent: by ContainerLimits only, "
                    "on every container of an agent once all of them exist (a plain `pulumi "
                    "up`); container: on each right after its create, as a provider taking "
                    "pids_limit would")
    ap.add_argument("--explain", action="store_true",
                    help="print the log of main1 and of the two subs ready last, against the "
                    "session's clock")
    ap.add_argument("--settle", type=float, default=30.0,
                    help="wait up to this many s for a quiet machine before each measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    say = (lambda _m: None) if args.json else (lambda m: print(m, flush=True))
    if os.geteuid() != 0:
        raise SystemExit("the netns lab needs root")

    def interrupted(_sig, _frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupted)

    clear_stale_lab()
    work = Path(tempfile.mkdtemp(prefix="ready-lab-"))
    local: dict = {}
    rows: list[dict] = []
    say(f"# ready_lab: {describe()}; uptime: {uptime()}")
    t_lab = time.monotonic()
    info = netns.lab_up(AGENTS, work / "lab", work / "lab.yaml", prefix=PREFIX, subnet=SUBNET)
    try:
        local = {a.name: docker.DockerClient(base_url=f"unix://{a.socket}", timeout=600,
                                             max_pool_size=200) for a in info.agents}
        image = ensure_images(list(local.values()), progress=lambda _m: None, flavour="sshd")
        # the benchmark is the operator: its pools' directory is one the program may read
        known = [d for d in os.environ.get(POOLS_ENV, "").split(os.pathsep) if d]
        os.environ[POOLS_ENV] = os.pathsep.join([str(work), *known])
        say(f"# lab up with image {image} in {time.monotonic() - t_lab:.0f} s")
        with pool_swarm(info.pool_file):
            say(f"# swarm formed ({time.monotonic() - t_lab:.0f} s since start)")
            for size in sizes:
                pool = write_pool(info, work, size, args.cpu, args.mem)
                parallel = args.parallel or size
                for run in range(args.runs):
                    t_size = time.monotonic()
                    tag = f"rl{size}-{uuid.uuid4().hex[:6]}"
                    definition = write_definition(work, pool, tag, size, image, args.cpu,
                                                  args.mem, args.readiness_timeout)
                    declared = declare(definition)
                    placement = [declared.agent_of[i["name"]] for _, i in declared.containers]
                    spread = {a: placement.count(a) for a in dict.fromkeys(placement)}
                    net_inputs = declared.network[1]
                    options = dict(net_inputs.get("options") or {})
                    floor_builder, clients = warm_builder(declared)
                    try:
                        floor_settle = settle(args.settle)
                        floor = floor_run(clients, declared.manager, placement,
                                          declared.containers[0][1]["image"], options, tag,
                                          parallel)
                    except Exception:
                        print(f"floor failed; the ssh connections said: "
                              f"{relay_errors(floor_builder)}", file=sys.stderr)
                        raise
                    finally:
                        floor_builder.close()
                        sweep(local, declared.manager, tag)
                    session_settle = settle(args.settle)
                    load_before = uptime()
                    session = session_run(declared, local, tag, parallel, args.limits,
                                          args.explain)
                    row = {"size": size, "per_agent": max(spread.values()), "run": run + 1,
                           "spread": spread, "floor": floor.total,
                           "session": session.total, "sshd": session.sshd_starts,
                           "floor_busy": floor.busy, "session_busy": session.busy,
                           "settle_busy": max(floor_settle, session_settle),
                           "load": load_before, "wall_s": time.monotonic() - t_size,
                           "floor_detail": asdict(floor), "session_detail": asdict(session)}
                    rows.append(row)
                    say(f"N={size} run {run + 1}: spread {spread}; floor {floor.total:.2f} s "
                        f"(network {floor.network:.2f}); session {session.total:.2f} s "
                        f"(network {session.network:.2f}, built {session.engine_done:.2f} "
                        f"{session.built}, "
                        f"pids limits {session.limits_done:.2f} (by up's watch first: "
                        f"{session.early_limited}"
                        f"{'; ' + ', '.join(session.early_errors) if session.early_errors else ''}"
                        f"), last running "
                        f"{session.all_running:.2f}, ready {session.wait_after_running:.2f} "
                        f"after it; program {session.program:.2f} s not counted); "
                        f"restarts {session.restarts}, OOM kills {session.oom_kills}, main1's "
                        f"memory peak {session.main1_mem_peak_mib} MiB; sshd "
                        f"start-ups {session.sshd_starts} (main1 {session.sshd_main1}, a sub "
                        f"at most {session.sshd_sub_max}; N-1 = {size - 1}); busy "
                        f"floor {floor.busy:.0%} session {session.busy:.0%} (before: "
                        f"{row['settle_busy']:.0%}); load {load_before}; this run took "
                        f"{row['wall_s']:.0f} s")
                    if session.sshd_starts > 2 * size:
                        say(f"  main1's sshd log, by kind: {json.dumps(session.main1_sshd)}")
        by_size = []
        for size in sizes:
            mine = [r for r in rows if r["size"] == size]
            by_size.append({**mine[0], "floor": statistics.median(r["floor"] for r in mine),
                            "session": statistics.median(r["session"] for r in mine),
                            "sshd": max(r["sshd"] for r in mine),
                            "floor_busy": max(r["floor_busy"] for r in mine),
                            "session_busy": max(r["session_busy"] for r in mine)})
        if args.json:
            print(json.dumps({"runs": rows, "uptime": uptime()}, indent=2))
        else:
            say(f"\n# medians over {args.runs} run(s) per size; sshd start-ups: the most of any "
                "run; busy: the machine's CPU busy during the run (the larger of floor and "
                f"session). {describe()}; uptime: {uptime()}")
            say(table(by_size))
        return 0 if all(r["sshd"] <= 2 * r["size"] for r in rows) else 1
    finally:
        for client in local.values():
            with contextlib.suppress(Exception):
                client.close()
        netns.lab_down(work / "lab")
        shutil.rmtree(work, ignore_errors=True)


def uptime() -> str:
    """The load averages (1, 5, 15 min), as ``uptime`` shows them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    sys.exit(main())
