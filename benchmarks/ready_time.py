"""Time to a ready cluster on the local Docker Engine, against the physical floor.

For each size N (default 2, 4, 8) and each run (default 5), three measurements, interleaved:

(a) floor: a fresh bridge network, then N plain containers of the session image
    (``sleep infinity``) created and started in parallel, one thread each (what ``docker run -d``
    does), until every start call has returned (the container is running);
(b) session: the real ``__main__.py`` runs under the mock engine (``tests.standin.
    engine``) with a generated N-container definition; then what it declared is built by the
    emulation's ``DockerBuilder`` (``tests.standin.docker_builder``, what the end-to-
    end tests use: the provider's create by hand, one ``put_archive`` per declared upload, start),
    the containers in parallel as the Pulumi engine would (its default parallelism is unbounded,
    and they depend only on the network), with ``sessionctl up``'s watch beside it (each
    container's pids limit once the engine reports it created: agents/early_limits.py) and
    the pool's pids limit set again once every container exists (``ContainerLimits``, the
    guarantee); the clock runs from the network's creation until every
    container has logged its entrypoint's ``ready:`` line (the contract's moment: every sshd
    accepts and every container knows it). (b+) adds one ``ssh -o BatchMode=yes PEER true``
    round from main1 to every peer (``docker exec``, as the session user), which must succeed
    at its first try: the check that ``ready:`` told the truth, reported beside (b);
(c) by hand, as the README's path: ``sessionctl render --out DIR``, each container with its
    ``DIR/<host>`` mounted read-only, the rendered entrypoint, the pids limit given at create
    (``docker run --pids-limit``), no tmpfs, no upload; all started at once; until the last
    ``ready:`` line (``--no-manual`` leaves it out).

The program's own time (keys, render, registration under mocks) is reported beside (b), not in
it: a real ``pulumi up`` spends it before the engine creates anything, plus the CLI's and the
provider plugin's start-up, which cannot be measured here (no CLI).

Where the session's time goes comes from host-side timestamps of each Docker API call, the
containers' ``State.StartedAt`` and Docker's own timestamps on the entrypoint's log lines (sshd's
``Server listening`` line, the entrypoint's ``ready:`` line). ``--trace`` adds one more session
per size whose entrypoint runs under ``sh -x``: every traced command gets a Docker timestamp,
which splits the container's set-up into env, user creation, key copies, sshd start and the
peer wait (tracing costs time itself; that run is not in the medians).

Before sshd listens (issue 22): one more session per size runs its entrypoint under the
machine's ``strace -f -e execve`` (bind-mounted into the containers) and lists the programs
main1 starts until sshd; the CPU a container used by then is its cgroup's, which also counts
runc's init and docker-init, so the floor's plain containers' CPU is shown beside it and the
difference is the entrypoint's own.

    python3 benchmarks/ready_time.py                       # N = 2, 4, 8; 5 runs each
    python3 benchmarks/ready_time.py --sizes 8 --runs 3 --trace

Targets: (issue 22) session/floor <= 1.3 at N = 2, 4 and 8, at most 8 programs and 40 ms of CPU
per container before sshd listens; (issue 6) the readiness wait adds under 1 s once the last
container is running. Everything created has a unique ``rtb-<hex>`` prefix and is removed
afterwards, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
for _path in (PROJECT / "modules", PROJECT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import yaml  # noqa: E402
from quiet import busy_fraction, machine_cpu, settle  # noqa: E402

from cluster_sessions.agents.engine import set_pids_limit  # noqa: E402
from tests.standin.docker_builder import run_in, sweep_session  # noqa: E402

CONTAINER = "docker:index/container:Container"
NETWORK = "pulumi-python:dynamic/cluster-sessions:SessionNetwork"
PREFIX = "rtb-"  # every network and container this script creates starts with it
READY = re.compile(r"cluster-session\[[^]]*\]: ready:")
FAILED = re.compile(r"cluster-session\[[^]]*\]: error:")
SSHD_UP = re.compile(r"Server listening on ")
RUN_TIMEOUT = 150.0  # s per session run: the entrypoint itself gives up after 120 s


def ssh_round(peers: Sequence[str]) -> str:
    """``ssh PEER true`` to every peer in parallel (as ``work`` would); fails if one fails."""
    return (f"rc=0; pids=; for p in {' '.join(peers)}; do "
            'ssh -o BatchMode=yes -o ConnectTimeout=5 "$p" true & pids="$pids $!"; done; '
            'for pid in $pids; do wait "$pid" || rc=1; done; exit $rc')


# --- time -------------------------------------------------------------------------------------

def docker_time(stamp: str) -> float:
    """Epoch seconds of a Docker RFC 3339 time with up to nanoseconds (``...45.123456789Z``)."""
    stamp = stamp.strip()
    base, _, rest = stamp.partition(".")
    if rest:
        digits = re.match(r"\d*", rest).group(0)
        frac = float("0." + digits) if digits else 0.0
    else:
        base, frac = stamp.rstrip("Z"), 0.0
    whole = datetime.strptime(base.rstrip("Z"), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return whole.timestamp() + frac


def summary(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


# --- CPU ----------------------------------------------------------------------------------------

def cgroup_cpu(cid: str) -> tuple[float, float] | None:
    """(CPU seconds used, seconds throttled by the CPU limit) of a container, if readable."""
    v1 = Path("/sys/fs/cgroup/cpuacct/docker") / cid / "cpuacct.usage"
    try:
        if v1.exists():
            used = int(v1.read_text()) / 1e9
            stat = (Path("/sys/fs/cgroup/cpu/docker") / cid / "cpu.stat").read_text()
            throttled = int(re.search(r"throttled_time (\d+)", stat).group(1)) / 1e9
            return used, throttled
        for v2 in (Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
                   Path("/sys/fs/cgroup/docker") / cid / "cpu.stat"):
            if v2.exists():
                stat = dict(line.split() for line in v2.read_text().splitlines())
                return int(stat["usage_usec"]) / 1e6, int(stat.get("throttled_usec", 0)) / 1e6
    except (OSError, AttributeError, ValueError):
        pass
    return None


# --- the docker API, timed --------------------------------------------------------------------

TIMED = ("create_container", "put_archive", "start", "inspect_container", "create_network")


@dataclass
class Call:
    host: str
    method: str
    start: float
    end: float


class TimedAPI:
    """``client.api`` with a wall-clock record of the calls that build a session."""

    def __init__(self, api, calls: list[Call], local: threading.local,
                 on_start: Callable[[str, str], None] | None = None) -> None:
        self._api, self._calls, self._local, self._on_start = api, calls, local, on_start

    def __getattr__(self, name: str):
        attr = getattr(self._api, name)
        if name not in TIMED:
            return attr

        def timed(*args, **kwargs):
            start = time.time()
            host = getattr(self._local, "host", "-")
            try:
                result = attr(*args, **kwargs)
            finally:
                self._calls.append(Call(host, name, start, time.time()))
            if name == "start" and self._on_start:
                self._on_start(host, args[0])
            return result
        return timed


class TimedClient:
    """What ``DockerBuilder`` needs of a client (``api``, ``networks``), with the API timed."""

    def __init__(self, client, calls: list[Call], local: threading.local,
                 on_start: Callable[[str, str], None] | None = None) -> None:
        self.api = TimedAPI(client.api, calls, local, on_start)
        self.networks = client.networks


# --- log following ----------------------------------------------------------------------------

@dataclass
class LogWatch:
    """Follows one container's log with Docker's timestamps; notes the lines that matter."""

    api: object
    host: str
    cid: str | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    ready_at: float | None = None  # Docker's timestamp of the ready line
    seen_at: float | None = None  # when this process read it
    error: str | None = None
    cpu_sshd: tuple[float, float] | None = None  # cgroup CPU when sshd's line was read
    cpu_ready: tuple[float, float] | None = None  # ... and when the ready line was read

    def start(self, cid: str) -> None:
        self.cid = cid
        self._stream = self.api.logs(self.cid, stdout=True, stderr=True, stream=True,
                                     follow=True, timestamps=True)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        buf = b""
        try:
            for chunk in self._stream:
                buf += chunk
                *complete, buf = buf.split(b"\n")
                for raw in complete:
                    self._line(raw.decode(errors="replace"))
        except Exception:  # the stream ends when the container is removed
            pass
        finally:
            if buf:
                self._line(buf.decode(errors="replace"))
            self.ready.set()  # wake the waiter; it checks ready_at/error

    def _line(self, text: str) -> None:
        stamp, _, message = text.partition(" ")
        try:
            when = docker_time(stamp)
        except ValueError:
            when, message = time.time(), text
        self.lines.append((when, message))
        if self.cpu_sshd is None and SSHD_UP.search(message):
            self.cpu_sshd = cgroup_cpu(self.cid)
        if self.ready_at is None and READY.search(message):
            self.ready_at, self.seen_at = when, time.time()
            self.cpu_ready = cgroup_cpu(self.cid)
            self.ready.set()
        elif FAILED.search(message):
            self.error = message
            self.ready.set()

    def first(self, pattern: re.Pattern) -> float | None:
        return next((t for t, m in self.lines if pattern.search(m)), None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.close()


# --- definitions ------------------------------------------------------------------------------

def write_definition(directory: Path, name: str, size: int, image: str, cpu: float) -> Path:
    """The train-demo example at size N under a unique name, on a pool that can hold it."""
    pool = directory / "pool.yaml"
    if not pool.exists():
        pool.write_text(yaml.safe_dump({
            "kind": "AgentPool", "name": "bench-local",
            "agents": [{"name": "local", "docker_host": "unix:///var/run/docker.sock",
                        "capacity": {"cpu": 256, "mem": "1024g", "gpus": []}}],
        }, sort_keys=False))
    # the benchmark is the operator here: its pool's directory is one the program may read
    # (issue 32: pools only from the operator's directories)
    from cluster_sessions.core.loader import POOLS_ENV
    known = [d for d in os.environ.get(POOLS_ENV, "").split(os.pathsep) if d]
    if str(directory) not in known:
        os.environ[POOLS_ENV] = os.pathsep.join([str(directory), *known])
    definition = yaml.safe_load((PROJECT / "stacks/sessions/train-demo.yaml").read_text())
    definition.update(name=name, image=image, pool=str(pool))
    definition["cluster"] = {"mode": "single-node", "size": size}
    definition["resources"] = {**definition["resources"], "cpu": cpu}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False))
    return path


# --- one floor run ----------------------------------------------------------------------------

@dataclass
class FloorResult:
    total: float
    network: float
    last_running: float
    create: float  # median create call
    start: float  # median start call
    busy: float = 0.0  # fraction of the machine's CPU busy during the run
    settle_busy: float = 0.0
    cpu_plain: float | None = None  # median container's cgroup CPU s (runc init + sleep)


def floor_run(client, image: str, size: int, tag: str, host_config: dict | None = None,
              upload: bytes | None = None) -> FloorResult:
    """N plain containers created and started at once; with ``host_config`` (more of the
    session's settings) and ``upload`` (one ``put_archive`` between create and start, as the
    provider sends the bundle): the engine's part of each, for ``--parts``."""
    api = client.api
    net_name = f"{tag}-net"
    created: list[str] = []
    network_id = None
    try:
        cpu0 = machine_cpu()
        t0 = time.time()
        network_id = api.create_network(net_name, driver="bridge")["Id"]
        t_net = time.time()

        def one(i: int) -> tuple[float, float, float]:
            c0 = time.time()
            c = api.create_container(
                image, command=["sleep", "infinity"], name=f"{tag}-c{i}",
                host_config=api.create_host_config(**(host_config or {})),
                networking_config=api.create_networking_config(
                    {net_name: api.create_endpoint_config()}),
            )
            created.append(c["Id"])
            if upload is not None:
                api.put_archive(c["Id"], "/", upload)
            s0 = time.time()
            api.start(c["Id"])
            s1 = time.time()
            return s1, s0 - c0, s1 - s0

        with ThreadPoolExecutor(max_workers=size) as pool:
            done = list(pool.map(one, range(size)))
        t_end = max(d[0] for d in done)
        busy = busy_fraction(cpu0, machine_cpu())
        for cid in created:
            state = api.inspect_container(cid)["State"]
            assert state["Running"], f"floor container exited: {state}"
        plain = median_or_none(c[0] if (c := cgroup_cpu(cid)) else None for cid in created)
        return FloorResult(t_end - t0, t_net - t0, t_end - t_net,
                           statistics.median(d[1] for d in done),
                           statistics.median(d[2] for d in done), busy, cpu_plain=plain)
    finally:
        remove(client, created, [network_id] if network_id else [])


def engine_parts(client, directory: Path, image: str, size: int, tag: Callable[[], str],
                 cpu: float, runs: int, wait: Callable[[], float]) -> dict[str, float]:
    """Item 2 of issue 35: what the engine spends per container on each of the session's
    settings, as floor runs with one setting more each (median of ``runs``): the container's
    own tmpfs, the bundle's upload (the session's real pack, one ``put_archive``), an init,
    the cpu and memory limits, the pool's pids limit at create, the capabilities and security
    options, then all of them at once. Each next to a plain floor run of the same round."""
    from cluster_sessions.core.spec import RUN_DIR, RUN_TMPFS, SessionLimits
    from tests.standin.docker_builder import tar_upload

    _, _, _, containers = declared(directory, image, size, tag(), cpu)
    inputs = containers[0][1]
    # an agent that delivers into its scratch root (issue 45) has no upload
    uploads = inputs.get("uploads") or []
    archive = tar_upload(uploads[0]) if uploads else None
    caps = inputs.get("capabilities") or {}
    settings = {
        "tmpfs": {"tmpfs": {RUN_DIR: RUN_TMPFS}},
        "init": {"init": True},
        "cpu + memory limits": {"nano_cpus": round(float(inputs["cpus"]) * 1e9),
                                "mem_limit": int(inputs["memory"]) * 2**20,
                                "shm_size": int(inputs["shmSize"]) * 2**20},
        "pids limit at create": {"pids_limit": SessionLimits().pids_limit},
        "capabilities, security options": {
            "cap_add": list(caps.get("adds") or []) or None,
            "cap_drop": list(caps.get("drops") or []) or None,
            "security_opt": list(inputs.get("securityOpts") or []) or None},
    }
    every: dict = {k: v for setting in settings.values() for k, v in setting.items()}
    cases: list[tuple[str, dict, bytes | None]] = [
        *([("upload (put_archive of the bundle)", {}, archive)] if archive else []),
        *((name, config, None) for name, config in settings.items()),
        ("all of the session's" + (", with the upload" if archive else ""), every, archive),
    ]
    out: dict[str, float] = {}
    plain: list[float] = []
    for name, config, data in cases:
        extra = []
        for _ in range(runs):
            wait()
            plain.append(floor_run(client, image, size, tag()).total)
            wait()
            extra.append(floor_run(client, image, size, tag(), config, data).total)
        out[name] = statistics.median(extra)
    out["plain"] = statistics.median(plain)
    return out


# --- one session run --------------------------------------------------------------------------

@dataclass
class SessionResult:
    total: float  # network creation start -> ready everywhere + one ssh round
    program: float  # __main__.py under mocks (keys, render, registration)
    network: float
    create: float  # median create_container call
    delivery: float  # the bundles' delivery into the scratch root, per container (issue 45)
    uploads: float  # median sum of put_archive calls per container
    upload_calls: int
    start: float  # median start call
    all_running: float  # t0 -> last container running (max StartedAt)
    setup: float  # median StartedAt -> sshd listening, in-container
    setup_max: float
    last_sshd: float  # t0 -> last sshd listening
    ready_all: float  # t0 -> last ready line (Docker timestamp)
    wait_after_running: float  # last container running -> last ready line
    wait_after_sshd: float  # last sshd listening -> last ready line
    ssh_round: float  # last ready line seen -> ssh round done
    ssh_attempts: int
    exec_cost: float  # one `docker exec true` as the user, after the run
    busy: float  # fraction of the machine's CPU busy from t0 to the end
    cpu_setup: float | None  # median container: CPU s from its start to sshd listening
    cpu_wait: float | None  # median container: CPU s from sshd listening to ready
    throttled: float | None  # median container: s throttled by its CPU limit, until ready
    engine_done: float  # t0 -> every create call returned (the provider's view of "created")
    settle_busy: float = 0.0  # the machine's busy fraction just before the run
    trace: dict[str, float] | None = None


def limit_when_made(client, started: queue.Queue[str], count: int) -> float:
    """The pids limit on every container once all are made, as ``ContainerLimits`` sets it;
    returns when it was set everywhere (the engine's last step).

    The real provider's create returns once the start call has returned and one read of the
    container is done (rcf.go ``resourceDockerContainerCreate``: start, then
    ``resourceDockerContainerRead``); ``ContainerLimits`` depends on every container of the
    agent. So: the ``count`` start calls, one inspect each, then the updates. (The emulation's
    builder also waits 0.2 s to see a must-run container still running: not the provider's,
    and not on this path.)"""
    from cluster_sessions.core.spec import SessionLimits
    from cluster_sessions.pulumi_layer.limits import PARALLEL

    ids = []
    deadline = time.monotonic() + RUN_TIMEOUT
    while len(ids) < count:
        ids.append(started.get(timeout=max(0.1, deadline - time.monotonic())))
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(ids)))) as pool:
        list(pool.map(client.api.inspect_container, ids))  # the provider's read
        list(pool.map(lambda cid: set_pids_limit(client, cid, SessionLimits().pids_limit,
                                                 unless_held=True), ids))
    return time.time()


def early_limits(containers: Sequence[tuple]) -> contextlib.AbstractContextManager:
    """``sessionctl up``'s watch of the local engine for the declared containers' stack
    (agents/early_limits.py): each gets the pool's pids limit once created, before its start."""
    from cluster_sessions.agents.early_limits import early_pids_limits
    from cluster_sessions.core.names import STACK_ID_LABEL
    from cluster_sessions.core.spec import Agent, SessionLimits

    (stack_id,) = {label["value"] for _, inputs in containers for label in inputs["labels"]
                   if label["label"] == STACK_ID_LABEL}
    local = Agent.model_validate({"name": "local", "capacity": {"cpu": 1, "mem": "1g",
                                                                "gpus": []}})
    return early_pids_limits([local], stack_id, SessionLimits().pids_limit)


def timed_builder(calls: list[Call], local: threading.local,
                  on_start: Callable[[str, str], None]):
    """The emulation's ``DockerBuilder`` (what the provider does, by hand), its Docker API
    calls timed."""
    from tests.standin.docker_builder import DockerBuilder

    class TimedBuilder(DockerBuilder):
        def client_for(self, reg):
            client, host = super().client_for(reg)
            return TimedClient(client, calls, local, on_start), host

    return TimedBuilder()


def declared(directory: Path, image: str, size: int, tag: str, cpu: float
             ) -> tuple[float, list, tuple, list]:
    """(program s, providers, network, containers): the real ``__main__.py`` under the mock
    engine; each resource as ``(registration, plain inputs)``."""
    from tests.standin.docker_builder import PROVIDER_TYPE
    from tests.standin.engine import Engine, run_program

    definition = write_definition(directory, tag, size, image, cpu)
    engine = Engine()
    p0 = time.perf_counter()
    run_program(engine, tag, {"cluster-sessions:definition": str(definition)})
    program = time.perf_counter() - p0
    providers = [(r, r.plain_inputs) for r in engine.of_type(PROVIDER_TYPE)]
    (network,) = [(r, r.plain_inputs) for r in engine.of_type(NETWORK)]
    containers = [(r, r.plain_inputs) for r in engine.of_type(CONTAINER)]
    assert len(containers) == size
    # the bundles' deliveries (issue 45): not run under mocks; session_run runs them
    DELIVERIES[tag] = [r.plain_inputs for r in engine.of_type(BUNDLES)]
    return program, providers, network, containers


BUNDLES = "pulumi-python:dynamic/cluster-sessions:BundleDelivery"
DELIVERIES: dict[str, list[dict]] = {}


def run_deliveries(tag: str) -> float:
    """What the program's BundleDelivery resources do at ``up`` (pulumi_layer/bundles.py):
    each agent's bundles in one script, the agents in parallel; seconds taken."""
    from cluster_sessions.agents.bundles import deliver
    from cluster_sessions.agents.connectors import connector_from_props

    d0 = time.time()
    for inputs in DELIVERIES.get(tag, []):
        with connector_from_props(inputs["agent"]) as conn:
            deliver(conn, inputs["scratch"], inputs["stack_id"], inputs["bundles"])
    return time.time() - d0


def remove_deliveries(tag: str) -> None:
    from cluster_sessions.agents.bundles import remove
    from cluster_sessions.agents.connectors import connector_from_props

    for inputs in DELIVERIES.pop(tag, []):
        with connector_from_props(inputs["agent"]) as conn:
            remove(conn, inputs["scratch"], inputs["stack_id"], list(inputs["bundles"]))


def session_run(client, directory: Path, image: str, size: int, tag: str, cpu: float,
                traced: bool = False) -> SessionResult:
    program, providers, network, containers = declared(directory, image, size, tag, cpu)
    hosts = [c["hostname"] for _, c in containers]
    if traced:
        for _, c in containers:
            argv = list(c["entrypoints"])
            if argv[1] == "-c":  # the pack entrypoint: trace setup.sh, not the unpacking
                source_line = '. "$bundle/setup.sh"'
                if source_line not in argv[2]:
                    raise SystemExit("--trace: the entrypoint no longer sources setup.sh")
                argv[2] = argv[2].replace(source_line, "set -x; " + source_line)
                c["entrypoints"] = argv
            else:
                c["entrypoints"] = [argv[0], "-x", *argv[1:]]

    calls: list[Call] = []
    local = threading.local()
    api = client.api
    watches = {h: LogWatch(api, h) for h in hosts}
    futures: list = []
    # Each container's log is followed from the moment its start call returns, so readiness is
    # seen when it happens, not when the builder's own must-run check is over.
    started: queue.Queue[str] = queue.Queue()

    def on_start(host: str, cid: str) -> None:
        watches[host].start(cid)
        started.put(cid)

    builder = timed_builder(calls, local, on_start=on_start)
    for provider in providers:
        builder(*provider)
    during = contextlib.ExitStack()
    try:
        # what `sessionctl up` runs beside the engine: each container's pids limit as soon as
        # the engine reports it created (agents/early_limits.py); ContainerLimits stays. It
        # follows the engine before the clock starts, as it does while the CLI starts up.
        from cluster_sessions.agents.early_limits import wait_following

        wait_following(during.enter_context(early_limits(containers)), 60)
        cpu0 = machine_cpu()
        t0 = time.time()
        # the deliveries beside the network (the containers depend on both)
        delivering = ThreadPoolExecutor(max_workers=1).submit(run_deliveries, tag)
        builder(*network)
        delivery = delivering.result()
        t_net = time.time()

        def one(declared: tuple) -> float:
            reg, inputs = declared
            local.host = inputs["hostname"]
            builder(reg, inputs)
            return time.time()

        pool = ThreadPoolExecutor(max_workers=size)
        futures = [pool.submit(one, declared) for declared in containers]
        # what up's ContainerLimits does once the agent's containers exist: the pool's pids
        # limit, for which every set-up waits (pulumi_layer/limits.py)
        futures.append(pool.submit(limit_when_made, client, started, len(containers)))
        pool.shutdown(wait=False)
        deadline = time.monotonic() + RUN_TIMEOUT
        wait_ready(watches, futures, deadline, tag)
        seen = max(w.seen_at for w in watches.values())
        ids = {h: w.cid for h, w in watches.items()}
        main1 = client.containers.get(ids["main1"])
        attempts = 0
        while True:
            attempts += 1
            code, out = run_in(main1, ssh_round(hosts[1:]))
            if code == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: ssh round fails: {out}")
            time.sleep(0.1)
        t_end = time.time()
        busy = busy_fraction(cpu0, machine_cpu())
        engine_done = max(f.result() for f in futures)  # every create call has returned
        e0 = time.time()
        run_in(main1, "true")
        exec_cost = time.time() - e0

        started = {h: docker_time(api.inspect_container(cid)["State"]["StartedAt"])
                   for h, cid in ids.items()}
        sshd = {h: w.first(SSHD_UP) for h, w in watches.items()}
        if any(v is None for v in sshd.values()):
            sshd = {h: v or started[h] for h, v in sshd.items()}
        ready = {h: w.ready_at for h, w in watches.items()}
        per_host: dict[str, dict[str, float]] = {}
        for call in calls:
            per = per_host.setdefault(call.host, {})
            per[call.method] = per.get(call.method, 0.0) + call.end - call.start
            if call.method == "put_archive":
                per["n"] = per.get("n", 0) + 1
        hosts_calls = [per_host[h] for h in hosts]
        last_running, last_sshd, last_ready = (max(started.values()), max(sshd.values()),
                                               max(ready.values()))
        setups = [sshd[h] - started[h] for h in hosts]
        return SessionResult(
            total=t_end - t0,
            program=program,
            network=t_net - t0,
            create=statistics.median(p.get("create_container", 0.0) for p in hosts_calls),
            delivery=delivery / len(hosts),
            uploads=statistics.median(p.get("put_archive", 0.0) for p in hosts_calls),
            upload_calls=int(statistics.median(p.get("n", 0) for p in hosts_calls)),
            start=statistics.median(p.get("start", 0.0) for p in hosts_calls),
            all_running=last_running - t0,
            setup=statistics.median(setups),
            setup_max=max(setups),
            last_sshd=last_sshd - t0,
            ready_all=last_ready - t0,
            wait_after_running=last_ready - last_running,
            wait_after_sshd=last_ready - last_sshd,
            ssh_round=t_end - seen,
            ssh_attempts=attempts,
            exec_cost=exec_cost,
            busy=busy,
            cpu_setup=median_or_none(w.cpu_sshd[0] if w.cpu_sshd else None
                                     for w in watches.values()),
            cpu_wait=median_or_none(w.cpu_ready[0] - w.cpu_sshd[0]
                                    if w.cpu_ready and w.cpu_sshd else None
                                    for w in watches.values()),
            throttled=median_or_none(w.cpu_ready[1] if w.cpu_ready else None
                                     for w in watches.values()),
            engine_done=engine_done - t0,
            trace=trace_phases(watches, started) if traced else None,
        )
    finally:
        during.close()
        for watch in watches.values():
            watch.close()
        with contextlib.suppress(Exception):
            for f in futures:  # let running creates finish before removing
                f.exception(timeout=RUN_TIMEOUT)
        builder.remove_all()
        builder.close()
        sweep_session(client, tag)
        remove_deliveries(tag)


def median_or_none(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def tail(watch: LogWatch, lines: int = 15) -> str:
    return "\n".join(f"  {watch.host}: {m}" for _, m in watch.lines[-lines:])


# Where a traced (sh -x) entrypoint is, by the first trace line that matches, in order.
PHASES: tuple[tuple[str, re.Pattern], ...] = (
    ("set-up (user, environment) until sshd starts", re.compile(r"^\+ \. .*/setup\.sh")),
    ("sftp link, profile.d, ~/.ssh, hostfiles", re.compile(r"^\+ \S*/sshd -D ")),
    ("peer wait (own sshd starting meanwhile)", re.compile(r"^\+ /bin/sh .*/wait-peers\.sh ")),
    ("(ready)", READY),
)


def wait_ready(watches: dict, futures: Sequence, deadline: float, tag: str) -> None:
    """Until every watched container logged its ``ready:`` line; raises on a failed future
    (a create), a container's ``error:`` line, or ``deadline`` (``time.monotonic``). The one
    wait of this script's runs and of ``ready_lab.py``'s."""
    for host, watch in watches.items():
        while not watch.ready.wait(0.2):
            failed = [f for f in futures if f.done() and f.exception()]
            if failed:
                raise failed[0].exception()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: {host} not ready in time\n" + tail(watch))
        if watch.ready_at is None:
            raise RuntimeError(f"{tag}: {host} failed: {watch.error or 'log ended'}\n"
                               + tail(watch))


def trace_phases(watches: dict[str, LogWatch], started: dict[str, float]) -> dict[str, float]:
    """Median seconds per phase over the containers of a traced run."""
    per_phase: dict[str, list[float]] = {name: [] for name, _ in PHASES[:-1]}
    per_phase["start -> first line"] = []
    for host, watch in watches.items():
        # in the declared order: sshd may print "Server listening" after the last container
        # has already found all its peers, so times need not increase; a phase never counts
        # less than nothing
        marks = [(name, watch.first(pattern)) for name, pattern in PHASES]
        marks = [(name, when) for name, when in marks if when is not None]
        if marks:
            per_phase["start -> first line"].append(marks[0][1] - started[host])
        for (name, when), (_, nxt) in zip(marks, marks[1:], strict=False):
            per_phase[name].append(max(0.0, nxt - when))
    return {name: statistics.median(v) for name, v in per_phase.items() if v}


# --- the manual path: rendered files mounted read-only --------------------------------------

@dataclass
class ManualResult:
    total: float  # network creation start -> last ready line (Docker timestamp)
    all_running: float  # t0 -> last container running (StartedAt)
    wait_after_running: float  # last running -> last ready line
    settle_busy: float = 0.0


def manual_run(client, directory: Path, image: str, size: int, tag: str, cpu: float
               ) -> ManualResult:
    """The README's path by hand: ``sessionctl render FILE --out DIR`` (the real verb, in
    process), then per container what ``docker run`` would do: the bundle ``DIR/<host>``
    mounted read-only at the bundle directory, the rendered ``entrypoint.sh``, the container's
    env, name, alias, limits and the pool's pids limit given at create (``--pids-limit``: the
    set-up does not wait), no tmpfs and no upload; all started at once. Until the last ready
    line."""
    from docker.types import Mount

    from cluster_sessions.core.render import BUNDLE_DIR, entrypoint_argv
    from cluster_sessions.core.spec import SessionLimits
    from cluster_sessions.driver import cli

    _, _, network, containers = declared(directory, image, size, tag, cpu)
    out = directory / f"{tag}-bundles"
    definition = directory / f"{tag}.yaml"
    with contextlib.redirect_stdout(sys.stderr):
        code = cli.main(["render", str(definition), "--out", str(out)])
    if code != 0:
        raise RuntimeError(f"sessionctl render --out failed with {code}")
    api = client.api
    net_name = network[1]["name"]
    hosts = [c["hostname"] for _, c in containers]
    watches = {h: LogWatch(api, h) for h in hosts}
    created: list[str] = []
    network_id = None
    try:
        t0 = time.time()
        network_id = api.create_network(net_name, driver="bridge")["Id"]

        def one(inputs: dict) -> None:
            host = inputs["hostname"]
            c = api.create_container(
                image, name=inputs["name"], hostname=host, entrypoint=entrypoint_argv(),
                command=inputs["command"], environment=inputs["envs"],
                labels={x["label"]: x["value"] for x in inputs["labels"]},
                host_config=api.create_host_config(
                    mounts=[Mount(BUNDLE_DIR, str(out / host), type="bind", read_only=True)],
                    mem_limit=int(inputs["memory"]) * 2**20,
                    shm_size=int(inputs["shmSize"]) * 2**20,
                    nano_cpus=round(float(inputs["cpus"]) * 1e9), init=True,
                    pids_limit=SessionLimits().pids_limit,
                    cap_add=list((inputs.get("capabilities") or {}).get("adds") or []) or None,
                    cap_drop=list((inputs.get("capabilities") or {}).get("drops") or [])
                    or None,
                    security_opt=list(inputs.get("securityOpts") or []) or None),
                networking_config=api.create_networking_config({
                    net_name: api.create_endpoint_config(
                        aliases=inputs["networksAdvanced"][0]["aliases"])}),
            )
            created.append(c["Id"])
            api.start(c["Id"])
            watches[host].start(c["Id"])

        with ThreadPoolExecutor(max_workers=size) as pool:
            list(pool.map(one, [c for _, c in containers]))
        wait_ready(watches, [], time.monotonic() + RUN_TIMEOUT, tag)
        started = [docker_time(api.inspect_container(cid)["State"]["StartedAt"])
                   for cid in created]
        last_ready = max(w.ready_at for w in watches.values())
        return ManualResult(last_ready - t0, max(started) - t0, last_ready - max(started))
    finally:
        for watch in watches.values():
            watch.close()
        remove(client, created, [network_id] if network_id else [])


# --- programs a container starts before sshd ----------------------------------------------------

STRACE = "/usr/bin/strace"
STRACE_OUT = "/run/ready-time-strace"  # inside the container


def strace_mounts() -> list[dict]:
    """This machine's strace and the libraries it needs, bind-mounted read-only at the same
    paths (the session image is Debian too; it has no strace of its own)."""
    import subprocess

    libs = re.findall(r"=> (/\S+)", subprocess.run(["ldd", STRACE], capture_output=True,
                                                    text=True, check=True).stdout)
    return [{"target": p, "source": p, "type": "bind", "readOnly": True}
            for p in [STRACE, *libs] if not p.startswith(("/lib/x86_64-linux-gnu/libc.",
                                                           "/lib64/"))]


def programs_run(client, directory: Path, image: str, size: int, tag: str, cpu: float
                 ) -> list[str] | None:
    """The programs main1's container execs from its entrypoint until sshd (``strace -f -e
    execve`` around the declared entrypoint; ``docker-init`` and strace itself not counted),
    sshd included, from one extra session."""
    from tests.standin.docker_builder import DockerBuilder

    if not Path(STRACE).exists():
        print(f"no {STRACE} on this machine: programs before sshd not counted", file=sys.stderr)
        return None
    _, providers, network, containers = declared(directory, image, size, tag, cpu)
    builder = DockerBuilder()
    try:
        for resource in (*providers, network):
            builder(*resource)
        mounts = strace_mounts()
        for _, inputs in containers:
            inputs["entrypoints"] = [STRACE, "-f", "-qq", "-e", "trace=execve,clone,fork,vfork",
                                     "-e", "signal=none", "-o", STRACE_OUT,
                                     *inputs["entrypoints"]]
            inputs["mounts"] = [*(inputs.get("mounts") or []), *mounts]
        with ThreadPoolExecutor(max_workers=size) as pool:
            list(pool.map(lambda c: builder(*c), containers))
            # the pool's pids limit, as ContainerLimits sets it: the set-up waits for it
            from cluster_sessions.core.spec import SessionLimits
            list(pool.map(lambda cid: set_pids_limit(client, cid, SessionLimits().pids_limit),
                          [cid for kind, _, cid in builder.made.values() if kind == "container"]))
        main1 = client.containers.get(f"{tag}-main1")
        deadline = time.monotonic() + RUN_TIMEOUT
        while not READY.search(main1.logs().decode(errors="replace")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: main1 not ready under strace")
            time.sleep(0.2)
        _, trace = run_in(main1, f"cat {STRACE_OUT}", user="root")
    finally:
        builder.remove_all()
        builder.close()
        sweep_session(client, tag)
    return before_sshd(trace)


def before_sshd(trace: str) -> list[str]:
    """The programs ``strace -f`` saw started before the process that becomes sshd was forked
    (sshd runs as a background job: what its parent starts meanwhile runs beside it), sshd
    last. The first is the declared entrypoint itself (strace's own exec of it)."""
    events: list[tuple[str, str]] = []  # ("exec", path) | ("fork", child pid), in order
    pending: dict[str, tuple[str, str]] = {}  # pid -> the call that has not returned yet
    lines = [line.split(None, 1) for line in trace.splitlines() if " " in line.strip()]
    for pid, rest in lines:
        call = re.match(r'(execve|clone3?|v?fork)\("?([^",]*)', rest)
        if call and "<unfinished" in rest:
            pending[pid] = (call.group(1), call.group(2))
            continue
        if rest.startswith("<... "):
            call_name, arg = pending.pop(pid, ("", ""))
        elif call:
            call_name, arg = call.group(1), call.group(2)
        else:
            continue
        result = re.search(r"= (-?\d+)", rest)
        if not result or int(result.group(1)) < 0:
            continue
        if call_name == "execve":  # a path strace cannot read (after a uid change): "?"
            events.append(("exec", arg if arg.startswith("/") else "?"))
        elif call_name:
            events.append(("fork", result.group(1)))
    sshd_pid = next(pid for pid, rest in lines if re.match(r'execve\("[^"]*/sshd"', rest))
    forked = next(i for i, (kind, value) in enumerate(events)
                  if kind == "fork" and value == sshd_pid)
    return [path for kind, path in events[:forked] if kind == "exec"] + ["sshd"]


# --- clean-up ---------------------------------------------------------------------------------

def remove(client, containers: Iterable[str], networks: Iterable[str]) -> None:
    import docker.errors

    for cid in containers:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(cid, force=True)
    for nid in networks:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_network(nid)


def sweep_prefix(client, prefix: str) -> None:
    """Whatever this run left (an interrupted run): every container and network named
    ``prefix...``."""
    remove(client, [c.id for c in client.containers.list(all=True, filters={"name": prefix})
                    if c.name.startswith(prefix)],
           [n.id for n in client.networks.list() if n.name.startswith(prefix)])


# --- main -------------------------------------------------------------------------------------

def fmt(values: Sequence[float]) -> str:
    med, lo, hi = summary(values)
    return f"{med:6.2f} [{lo:.2f}-{hi:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,8", help="comma list of N (default 2,4,8)")
    parser.add_argument("--runs", type=int, default=5, help="runs per size and kind (5)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="unmeasured runs of each kind before the first size (1)")
    parser.add_argument("--cpu", type=float, default=0.5,
                        help="the session's per-container cpu limit (train-demo: 0.5)")
    parser.add_argument("--trace", action="store_true",
                        help="one more session per size under sh -x, for the set-up breakdown")
    parser.add_argument("--no-manual", action="store_true",
                        help="leave out (c), the rendered files mounted read-only by hand")
    parser.add_argument("--parts", action="store_true",
                        help="also the engine's cost of each of the session's settings (tmpfs, "
                             "upload, init, limits, ...): floor runs with one setting more each")
    parser.add_argument("--no-programs", action="store_true",
                        help="leave out the extra session per size that counts, with strace, "
                             "the programs main1 starts before sshd")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="before each run, wait up to this many seconds for the machine "
                             "to be under 25%% busy (other work would land in the figures)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.runs < 1 or not sizes or min(sizes) < 2:
        parser.error("need --runs >= 1 and sizes >= 2")

    import docker

    from cluster_sessions.lab.image import ensure_image

    client = docker.from_env(timeout=300)
    client.ping()
    image = ensure_image(client)
    run_id = uuid.uuid4().hex[:6]
    prefix = f"{PREFIX}{run_id}"
    t_script = time.perf_counter()
    info = client.info()
    print(f"# checkout {checkout()}")
    print(f"# engine {info.get('ServerVersion')}, {info.get('NCPU')} CPUs, "
          f"{info.get('MemTotal', 0) / 2**30:.1f} GiB; image {image}; load average "
          f"{os.getloadavg()[0]:.2f}; other running containers: {info.get('ContainersRunning')}")
    print(f"# session: train-demo at size N, cpu limit {args.cpu:g} per container"
          )
    results: dict[int, dict[str, list]] = {}
    counter = iter(range(10**6))

    def tag() -> str:
        return f"{prefix}-{next(counter)}"

    def floor(size: int) -> FloorResult:
        before = settle(args.settle)
        result = floor_run(client, image, size, tag())
        result.settle_busy = before
        return result

    def session(directory: Path, size: int, traced: bool = False) -> SessionResult:
        before = settle(args.settle)
        result = session_run(client, directory, image, size, tag(), args.cpu, traced=traced)
        result.settle_busy = before
        return result
    def manual(directory: Path, size: int) -> ManualResult:
        before = settle(args.settle)
        result = manual_run(client, directory, image, size, tag(), args.cpu)
        result.settle_busy = before
        return result
    try:
        with tempfile.TemporaryDirectory(prefix="ready-time-") as tmp:
            # the benchmark's pool is in its own directory: the operator's, for this run
            os.environ["CLUSTER_SESSIONS_POOLS"] = os.pathsep.join(
                filter(None, [tmp, os.environ.get("CLUSTER_SESSIONS_POOLS")]))
            directory = Path(tmp)
            for _ in range(args.warmup):
                floor(sizes[0])
                session(directory, sizes[0])
            for size in sizes:
                floors: list[FloorResult] = []
                sessions: list[SessionResult] = []
                manuals: list[ManualResult] = []
                for run in range(args.runs):
                    floors.append(floor(size))
                    sessions.append(session(directory, size))
                    if not args.no_manual:
                        manuals.append(manual(directory, size))
                    f, b = floors[-1], sessions[-1]
                    by_hand = f", by hand {manuals[-1].total:.2f} s" if manuals else ""
                    print(f"  N={size} run {run + 1}: floor {f.total:.2f} s, session "
                          f"{b.ready_all:.2f} s to ready ({b.total:.2f} s with the ssh round)"
                          f"{by_hand} (machine busy before {f.settle_busy:.0%}/"
                          f"{b.settle_busy:.0%}, during {f.busy:.0%}/{b.busy:.0%})",
                          file=sys.stderr, flush=True)
                traced = session(directory, size, traced=True) if args.trace else None
                programs = (None if args.no_programs else
                            programs_run(client, directory, image, size, tag(), args.cpu))
                parts = (engine_parts(client, directory, image, size, tag, args.cpu,
                                      args.runs, lambda: settle(args.settle))
                         if args.parts else None)
                results[size] = {"floor": floors, "session": sessions, "traced": traced,
                                 "programs": programs, "manual": manuals, "parts": parts}
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        sweep_prefix(client, prefix)
        client.close()

    report(results, args.runs)
    print(f"\n# script time {time.perf_counter() - t_script:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({
            str(n): {"floor": [f.__dict__ for f in r["floor"]],
                     "session": [s.__dict__ for s in r["session"]],
                     "manual": [m.__dict__ for m in r["manual"]],
                     "traced": r["traced"].__dict__ if r["traced"] else None,
                     "programs": r["programs"], "parts": r["parts"]}
            for n, r in results.items()}, indent=1))
    return 0


def checkout() -> str:
    """The commit measured, and whether the runtime's files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(PROJECT), *args], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "templates", "modules/cluster_sessions")
    return f"{head}" + (" with uncommitted changes to the runtime/program" if dirty else "")


def report(results: dict[int, dict], runs: int) -> None:
    print(f"\n## Time to ready, seconds: median [min-max] of {runs} runs\n")
    busy = [x.settle_busy for r in results.values() for x in (*r["floor"], *r["session"])]
    print(f"Machine busy (others) just before the runs: median {med(busy):.0%}, "
          f"max {max(busy):.0%}\n")
    print("(b) is until the last container's `ready:` line: main1 has seen every sshd accept "
          "and every container knows it (the contract's moment); (b+) adds the check after it, "
          "one `docker exec` into main1 running `ssh PEER true` to every peer at once, which "
          "must succeed at its first try. (c): the rendered files by hand (mounted read-only, "
          "no tmpfs, pids limit at create), until the last `ready:` line.\n")
    print("| N | floor (a) | session (b) | b/a (medians) | b/a per run | target <= 1.3 | "
          "(b+) with the ssh round | b+/a | by hand (c) | c/a | "
          "readiness wait after last running (b) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in results.items():
        a = [f.total for f in r["floor"]]
        b = [s.ready_all for s in r["session"]]
        bplus = [s.total for s in r["session"]]
        ratio = statistics.median(b) / statistics.median(a)
        pairs = [s / f for s, f in zip(b, a, strict=True)]
        wait = [s.wait_after_running for s in r["session"]]
        c = [m.total for m in r["manual"]]
        by_hand = (f"{fmt(c)} | {statistics.median(c) / statistics.median(a):.2f}" if c
                   else "n/a | n/a")
        print(f"| {n} | {fmt(a)} | {fmt(b)} | {ratio:.2f} | {fmt(pairs)} | "
              f"{'met' if ratio <= 1.3 else 'MISSED'} | {fmt(bplus)} | "
              f"{statistics.median(bplus) / statistics.median(a):.2f} | {by_hand} | "
              f"{fmt(wait)} |")
    attempts = [s.ssh_attempts for r in results.values() for s in r["session"]]
    print(f"\nssh rounds that needed more than one try after `ready:`: "
          f"{sum(1 for x in attempts if x > 1)} of {len(attempts)}")

    print("\n## Before sshd listens, per container (target: <= 8 programs, <= 40 ms CPU)\n")
    print("| N | programs main1 starts, sshd included (strace) | cgroup CPU s at sshd "
          "listening (median) | plain container's cgroup CPU s (floor) | difference: the "
          "entrypoint's own |")
    print("|---|---|---|---|---|")
    for n, r in results.items():
        cpu = med_opt(s.cpu_setup for s in r["session"])
        plain = med_opt(f.cpu_plain for f in r["floor"])
        own = cpu - plain if cpu is not None and plain is not None else None
        count = "n/a" if r["programs"] is None else str(len(r["programs"]))
        print(f"| {n} | {count} | {opt(cpu)} | {opt(plain)} | {opt(own)} |")
    listed = next((r["programs"] for r in results.values() if r["programs"]), None)
    if listed:
        print(f"\nPrograms (N = {next(n for n, r in results.items() if r['programs'])}): "
              + ", ".join(p.rsplit("/", 1)[-1] for p in listed))

    print("\n## Where the session's time goes, seconds (medians of the runs)\n")
    cols = list(results)
    rows: list[tuple[str, Callable[[dict], str]]] = [
        ("program under mocks (keys, render, registration) - not in (b)",
         lambda r: f"{med(s.program for s in r['session']):.3f}"),
        ("floor: network create", lambda r: f"{med(f.network for f in r['floor']):.3f}"),
        ("floor: network -> last container running",
         lambda r: f"{med(f.last_running for f in r['floor']):.3f}"),
        ("floor: create call / start call (per container)",
         lambda r: f"{med(f.create for f in r['floor']):.3f} / "
                   f"{med(f.start for f in r['floor']):.3f}"),
        ("session: network create", lambda r: f"{med(s.network for s in r['session']):.3f}"),
        ("create_container call (per container)",
         lambda r: f"{med(s.create for s in r['session']):.3f}"),
        ("delivery into the scratch root (per container; beside the network)",
         lambda r: f"{med(s.delivery for s in r['session']):.3f}"),
        ("uploads: put_archive calls (per container, sum)",
         lambda r: f"{med(s.uploads for s in r['session']):.3f} "
                   f"({r['session'][0].upload_calls})"),
        ("start call (per container)", lambda r: f"{med(s.start for s in r['session']):.3f}"),
        ("t0 -> last container running (StartedAt)",
         lambda r: f"{med(s.all_running for s in r['session']):.3f}"),
        ("entrypoint set-up: StartedAt -> sshd listening (median container)",
         lambda r: f"{med(s.setup for s in r['session']):.3f}"),
        ("entrypoint set-up, slowest container",
         lambda r: f"{med(s.setup_max for s in r['session']):.3f}"),
        ("t0 -> last sshd listening", lambda r: f"{med(s.last_sshd for s in r['session']):.3f}"),
        ("t0 -> last ready line", lambda r: f"{med(s.ready_all for s in r['session']):.3f}"),
        ("readiness: last running -> last ready",
         lambda r: f"{med(s.wait_after_running for s in r['session']):.3f}"),
        ("readiness: last sshd listening -> last ready",
         lambda r: f"{med(s.wait_after_sshd for s in r['session']):.3f}"),
        ("CPU s used by a container's entrypoint until sshd listens (median)",
         lambda r: opt(med_opt(s.cpu_setup for s in r["session"]))),
        ("CPU s used by a container's peer wait (median)",
         lambda r: opt(med_opt(s.cpu_wait for s in r["session"]))),
        ("s a container was throttled by its cpu limit until ready (median)",
         lambda r: opt(med_opt(s.throttled for s in r["session"]))),
        ("machine CPU busy during (a) / (b)",
         lambda r: f"{med(f.busy for f in r['floor']):.0%} / "
                   f"{med(s.busy for s in r['session']):.0%}"),
        ("ssh round from main1 (docker exec + N-1 ssh in parallel)",
         lambda r: f"{med(s.ssh_round for s in r['session']):.3f}"),
        ("  of which docker exec itself (exec of `true`, measured after)",
         lambda r: f"{med(s.exec_cost for s in r['session']):.3f}"),
        ("t0 -> every create call returned (incl. the builder's 0.2 s must-run check)",
         lambda r: f"{med(s.engine_done for s in r['session']):.3f}"),
    ]
    print("| step | " + " | ".join(f"N={n}" for n in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for label, get in rows:
        print(f"| {label} | " + " | ".join(get(results[n]) for n in cols) + " |")

    parts = {n: r["parts"] for n, r in results.items() if r.get("parts")}
    if parts:
        print("\n## The engine's part, per setting: N containers created and started at once "
              "(s, medians; + is over plain floor runs of the same rounds)\n")
        print("| setting | " + " | ".join(f"N={n}" for n in parts) + " |")
        print("|---|" + "---|" * len(parts))
        names = list(next(iter(parts.values())))
        for name in [n for n in names if n != "plain"]:
            print(f"| {name} | " + " | ".join(
                f"{p[name]:.3f} (+{p[name] - p['plain']:.3f})" for p in parts.values()) + " |")
        print("| plain floor | " + " | ".join(f"{p['plain']:.3f}" for p in parts.values())
              + " |")

    traced = {n: r["traced"] for n, r in results.items() if r["traced"]}
    if traced:
        print("\n## Inside the entrypoint (one run under sh -x; median container), seconds\n")
        names = ["start -> first line", *(name for name, _ in PHASES[:-1])]
        print("| phase | " + " | ".join(f"N={n}" for n in traced) + " |")
        print("|---|" + "---|" * len(traced))
        for name in names:
            print(f"| {name} | " + " | ".join(
                f"{t.trace.get(name, float('nan')):.3f}" for t in traced.values()) + " |")
        print("| (traced session total) | " + " | ".join(
            f"{t.total:.2f}" for t in traced.values()) + " |")


def med(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def med_opt(values: Iterable[float | None]) -> float | None:
    return median_or_none(values)


def opt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
