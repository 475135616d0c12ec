"""Reliability under faults and load, on a real 2-agent netns lab (issue 24).

Faults are injected into live sessions built through the engine verbs on the real engine
(``cli.main`` in the test's process, the installed ``sessionctl`` in processes of their own,
one file backend that both see), and each test measures what the user sees, how long it takes
to detect and to recover, and what is left behind. The figures go to ``$RELIABILITY_FIGURES``
(JSON) when it is set; docs/reliability.md records a run. The real engine has no fault points:
a driver is stopped once the agents hold what the scenario names, as a user's Ctrl-C or a
killed CI job stops it.

The lab has its own prefix and subnet (``cslr``, 10.251.103.0/24), so it runs beside
tests/test_multinode.py's. Each agent declares cpu 2: a multi-node session of two cpu-2
containers spans both agents (main1 on agent1, sub1 on agent2, on a swarm overlay); smaller
ones stay on one agent, on a bridge.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from cluster_sessions.agents import cleanup
from cluster_sessions.core.names import LABEL_PREFIX
from cluster_sessions.core.plan import build_plan
from cluster_sessions.driver import cli
from cluster_sessions.driver.errors import Exit
from cluster_sessions.driver.stack_lock import LOCK_DIR
from cluster_sessions.lab import engines
from tests.conftest import PROJECT, SESSIONCTL, backend_env, signal_when
from tests.standin.docker_builder import run_in, wait_until_ready  # helpers, no stand-in

from . import factories
from .factories import load_session
from .lab_support import LabPool, lab_pool, pool_swarm

pytestmark = [pytest.mark.lab, pytest.mark.docker, pytest.mark.slow]

PROJECT_NAME = yaml.safe_load((PROJECT / "Pulumi.yaml").read_text())["name"]
PREFIX, SUBNET = "cslr", "10.251.103.0/24"
STRICT = "-o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=5"
DETECT_BOUND = 10.0  # seconds: status (or wait) names a dead container within this
RECOVER_BOUND = 120.0  # seconds: a restarted engine's session is whole again within this


# --- the lab ------------------------------------------------------------------------------------


class Lab(LabPool):
    def session(self, directory: Path, name: str, size: int, **extra) -> Path:
        doc = factories.session(name, str(self.pool_file), self.image, size=size,
                                mem="256m", shmem="64m", **extra)
        return factories.write(directory / f"{name}.yaml", doc)

    def listed(self, agent: str, **filters) -> list:
        """``containers.list`` on ``agent``; a pooled connection the agent closed while idle
        (``Connection reset``) is retried once on a fresh client."""
        import requests

        try:
            return self.client(agent).containers.list(all=True, filters=filters)
        except requests.exceptions.ConnectionError:
            self.forget(agent)
            return self.client(agent).containers.list(all=True, filters=filters)

    def containers(self, name: str) -> dict:
        """host -> container, of session ``name`` on every agent."""
        found = {}
        for agent in self.pool.agents:
            for c in self.listed(agent.name, label=f"{LABEL_PREFIX}.session={name}"):
                host = c.labels[f"{LABEL_PREFIX}.host"]
                assert host not in found, f"{host} twice: {found[host].name}, {c.name}"
                found[host] = c
        return found

    def leftovers(self, name: str) -> list:
        found, errors = cleanup.find_leftovers(self.pool, name)
        assert not errors, errors
        return found


MOUNTS = Path("/run") / f"cst-rlab-{uuid.uuid4().hex[:8]}"
"""What the scenarios mount (data in mounts must survive): a directory only root can write,
outside /tmp (a mount source below a directory others can write is refused, issue 32)."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # a short connect timeout: some of the scenarios stop an agent's engine
    MOUNTS.mkdir(mode=0o755)
    try:
        with lab_pool(tmp_path_factory, PREFIX, SUBNET, 2, name="rlab", kind=Lab,
                      capacity={"cpu": 2, "mem": "4g", "gpus": []}, connect_timeout=60,
                      mount_sources=[str(MOUNTS)]) as built:
            yield built
    finally:
        shutil.rmtree(MOUNTS, ignore_errors=True)


@pytest.fixture(scope="module")
def swarm(lab):
    """The pool's swarm, made by the pool program (``sessionctl pool up``); left again at the
    end (workers first)."""
    with pool_swarm(lab.pool_file, "pool-rlab") as made:
        yield made


FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def figures():
    """What the tests measured, written where ``$RELIABILITY_FIGURES`` says."""
    yield FIGURES
    target = os.environ.get("RELIABILITY_FIGURES")
    if target:
        Path(target).write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")


@dataclass
class Automation:
    state: Path
    env: dict
    names: list = field(default_factory=list)


@pytest.fixture
def automation(lab, real_cli):
    """The engine verbs through the real engine on a file backend of the test's own
    (``real_cli``: its stacks destroyed afterwards); every session a test names in ``names``
    is swept from the lab afterwards, and must be gone."""
    auto = Automation(real_cli.state, backend_env(real_cli.state))
    try:
        yield auto
    finally:
        real_cli.remove_all()
        left = {}
        for name in auto.names:
            report = cleanup.sweep(lab.pool, name, wait=10)
            if report.removed or report.remaining:
                left[name] = [str(i) for i in report.removed + report.remaining]
    assert not left, f"left on the lab after the test: {left}"


def ctl(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def driver(auto: Automation, *argv: str) -> subprocess.Popen:
    """The installed ``sessionctl ARGV`` in a process of its own, on the same backend."""
    return subprocess.Popen([SESSIONCTL, *argv], cwd=PROJECT, env=auto.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str]]:
    """Each driver's exit code and stderr once all ended, their pipes read meanwhile (the
    CLI's progress on stdout fills a pipe no one reads)."""
    with ThreadPoolExecutor(len(procs)) as ex:
        ended = list(ex.map(lambda p: p.communicate(timeout=timeout), procs))
    return [(p.returncode, err) for p, (_out, err) in zip(procs, ended, strict=True)]


def made(lab: Lab, name: str) -> bool:
    """Whether an agent of the lab holds a container or a network called ``name``."""
    for agent in lab.pool.agents:
        client = lab.client(agent.name)
        with contextlib.suppress(Exception):
            if (client.containers.list(all=True, filters={"name": f"^{name}$"})
                    or [n for n in client.networks.list(names=[name]) if n.name == name]):
                return True
    return False


def stop_when(proc: subprocess.Popen, ready, sig: signal.Signals, timeout: float = 180):
    """``sig`` to the driver once ``ready()`` holds; its stdout and stderr once it ended."""
    out, err, running = signal_when(proc, ready, sig, timeout)
    assert running, f"the driver ended first: {err}"
    return out, err


def children(pid: int) -> set[int]:
    """The pids of the processes ``pid`` started."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.update(int(child) for child in (task / "children").read_text().split())
    return found


def descendants(pid: int) -> set[int]:
    """``pid``'s children, theirs, and so on (the CLI's plugins run in groups of their own)."""
    found, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()) - found:
            found.add(child)
            todo.append(child)
    return found


def mesh_whole(containers: dict) -> bool:
    main1 = containers["main1"]
    return all(run_in(main1, f"ssh {STRICT} {host} hostname") == (0, host)
               for host in containers if host != "main1")


def poll(what, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# --- 1. an agent's dockerd restarts mid-session -------------------------------------------------


def test_a_restarted_dockerd_brings_its_containers_back_and_the_mesh_whole(
        lab, swarm, automation, tmp_path, capsys):
    """main1 on agent1, sub1 on agent2 (overlay); agent2's dockerd stops and starts again.
    Meanwhile ``status`` names agent2; afterwards sub1 (restart ``unless-stopped``) is back,
    the same container, ``ssh sub1`` works from main1 and the file sub1 wrote in its mount is
    still there."""
    name = f"rel-restart-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    data = MOUNTS / name
    data.mkdir(mode=0o755)
    os.chown(data, 9001, 9001)  # the session user's (the default uid), closed to others
    path = str(lab.session(tmp_path, name, 2, mode="multi-node", cpu=2,
                           mounts=[{"source": str(data), "target": "/home/work/data"}]))
    code, _, err = ctl(capsys, "up", path, "--yes")
    assert code == 0, err
    before = lab.containers(name)
    on_agent2 = lab.client("agent2").containers.list(
        all=True, filters={"label": f"{LABEL_PREFIX}.session={name}"})
    assert [c.labels[f"{LABEL_PREFIX}.host"] for c in on_agent2] == ["sub1"]
    wait_until_ready(before)
    assert run_in(before["sub1"], "echo kept > ~/data/sub1.txt")[0] == 0

    t0 = time.monotonic()
    engines.stop_dockerd(lab.info.state_dir, "agent2")
    lab.forget("agent2")
    try:
        code, _out, err = ctl(capsys, "status", path)
        detected = time.monotonic() - t0
        assert code == Exit.ENGINE and "agent agent2 did not answer" in err, err
    finally:
        engines.start_dockerd(lab.info.state_dir, "agent2")
    started = time.monotonic()

    def whole() -> bool:
        with contextlib.suppress(Exception):
            now = lab.containers(name)
            return all(c.status == "running" for c in now.values()) and mesh_whole(now)
        return False

    assert poll(whole, RECOVER_BOUND, 1.0), "the session did not come back whole"
    recovered = time.monotonic() - started
    code, _out, err = ctl(capsys, "status", path)
    assert code == 0, err
    after = lab.containers(name)
    assert {h: c.id for h, c in after.items()} == {h: c.id for h, c in before.items()}
    assert (data / "sub1.txt").read_text() == "kept\n"
    assert ctl(capsys, "destroy", path, "--yes")[0] == 0
    assert lab.leftovers(name) == []
    FIGURES["dockerd_restart"] = {"detect_s": round(detected, 1),
                                  "recover_s": round(recovered, 1), "leaked": 0,
                                  "mount_data_lost": 0}


# --- 2. a sub container killed ------------------------------------------------------------------


def test_a_killed_sub_is_reported_and_up_restores_only_it(lab, automation, tmp_path, capsys):
    """``docker kill`` (SIGKILL) of sub1 of an interactive session: ``status`` names it at
    once; ``up`` starts it again (the stack is read back first) and touches nothing else."""
    name = f"rel-kill-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 3, cpu=0.5))
    code, _, err = ctl(capsys, "up", path, "--yes")
    assert code == 0, err
    before = lab.containers(name)
    wait_until_ready(before)
    started = {h: c.attrs["State"]["StartedAt"] for h, c in before.items()}

    t0 = time.monotonic()
    before["sub1"].kill()
    code, _out, err = ctl(capsys, "status", path)
    detected = time.monotonic() - t0
    assert code == Exit.ENGINE and "sub1" in err and "137" in err, err
    assert detected < DETECT_BOUND

    t0 = time.monotonic()
    code, _out, err = ctl(capsys, "up", path, "--yes")
    assert code == 0, err
    after = lab.containers(name)
    wait_until_ready(after)
    restored = time.monotonic() - t0
    assert {h: c.id for h, c in after.items()} == {h: c.id for h, c in before.items()}
    assert {h: c.attrs["State"]["StartedAt"] for h, c in after.items()
            if h != "sub1"} == {h: s for h, s in started.items() if h != "sub1"}
    assert after["sub1"].attrs["State"]["StartedAt"] != started["sub1"]
    assert mesh_whole(after)
    assert ctl(capsys, "status", path)[0] == 0
    assert ctl(capsys, "destroy", path, "--yes")[0] == 0
    FIGURES["sub_killed_interactive"] = {"detect_s": round(detected, 1),
                                         "restore_s": round(restored, 1), "leaked": 0}


def test_a_batch_session_whose_sub_dies_is_lost_within_the_bound(
        lab, automation, tmp_path, capsys):
    name = f"rel-batch-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 2, cpu=0.5, type="batch",
                           command=["sh", "-c", "sleep 600"]))
    code, _, err = ctl(capsys, "up", path, "--yes")
    assert code == 0, err
    wait_until_ready(lab.containers(name))
    t0 = time.monotonic()
    lab.containers(name)["sub1"].kill()
    code, out, err = ctl(capsys, "wait", path, "--timeout", "60")
    detected = time.monotonic() - t0
    assert code == Exit.JOB_LOST, out + err
    assert "sub1" in out + err
    assert detected < DETECT_BOUND
    assert ctl(capsys, "destroy", path, "--yes")[0] == 0
    FIGURES["sub_killed_batch"] = {"detect_s": round(detected, 1), "exit": int(code)}


# --- 3. `up` interrupted -----------------------------------------------------------------------


POINTS = [  # (what an agent holds, signal): the driver is stopped once it does
    ("lock", "KILL"),  # the driver holds the stack's lock: nothing may exist yet
    ("network", "INT"),
    ("sub1", "KILL"),
    ("sub2", "INT"),
]


@pytest.mark.parametrize("point", POINTS, ids=["-".join(p) for p in POINTS])
def test_an_interrupted_up_converges_on_the_next_up(lab, automation, tmp_path, capsys, point):
    """The driver is killed (or interrupted) once an agent holds one object of ``up``'s (the
    CLI, told of its driver's death, cancels: it finishes what is under way and releases the
    stack); the next ``up`` makes the session whole, with no duplicate and nothing left over,
    and ``destroy`` removes it all."""
    what, sig = point
    name = f"rel-int-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 3, cpu=0.5))
    plan = build_plan(*_loaded(path))
    proc = driver(automation, "up", path, "--yes")
    if what == "lock":
        holding(automation, name, proc)
        ready = lambda: True  # noqa: E731
    else:
        target = plan.network.name if what == "network" else f"{name}-{what}"
        assert target in [plan.network.name, *(c.container_name for c in plan.containers)]
        ready = lambda: made(lab, target)  # noqa: E731
    out, err = stop_when(proc, ready, getattr(signal, f"SIG{sig}"))
    assert proc.returncode in (130, -signal.SIGKILL), (proc.returncode, out, err)
    if sig == "INT":  # Ctrl-C: the driver says what the agents hold, read by label, and next
        left = {i.name for i in lab.leftovers(name)}  # parallel creates may add more later
        assert f"sessionctl up: session {name}: interrupted; its agents hold:" in err, err
        assert any(f" {n} (" in err for n in left), (left, err)
        assert f"Run `sessionctl up {path}` again" in err

    t0 = time.monotonic()
    code, _out, err = ctl(capsys, "up", path, "--yes")
    converged = time.monotonic() - t0
    assert code == 0, err
    now = lab.containers(name)  # raises on a host seen twice
    assert sorted(now) == ["main1", "sub1", "sub2"]
    wait_until_ready(now)
    kinds = sorted(i.kind for i in lab.leftovers(name))
    assert kinds == ["container"] * 3 + ["network"], kinds
    assert ctl(capsys, "destroy", path, "--yes")[0] == 0
    assert lab.leftovers(name) == []
    FIGURES.setdefault("interrupted_up", {})["-".join(point)] = {
        "driver_exit": proc.returncode, "next_up_s": round(converged, 1), "leaked": 0,
        "removed_by_next_up": err.count("which the stack does not hold")}


def test_destroy_after_an_interrupted_up_removes_everything(lab, automation, tmp_path, capsys):
    name = f"rel-intd-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 3, cpu=0.5))
    proc = driver(automation, "up", path, "--yes")
    stop_when(proc, lambda: made(lab, f"{name}-sub2"), signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    # sub1 may not be made yet (parallel creates): the network and sub2 are
    left = {i.name for i in lab.leftovers(name)}
    assert f"{name}-sub2" in left and len(left) >= 2, left
    code, _out, err = ctl(capsys, "destroy", path, "--yes")
    assert code == 0, err
    assert lab.leftovers(name) == []


def _loaded(path: str):
    loaded = load_session(Path(path))
    return loaded.session, loaded.pool


# --- 4. an agent unreachable during `up` --------------------------------------------------------


def test_an_agent_unreachable_during_up_is_named_and_nothing_is_created(
        lab, swarm, automation, tmp_path, capsys):
    name = f"rel-down-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 2, mode="multi-node", cpu=2))
    engines.stop_dockerd(lab.info.state_dir, "agent2")
    lab.forget("agent2")
    try:
        t0 = time.monotonic()
        code, _out, err = ctl(capsys, "up", path, "--yes")
        refused = time.monotonic() - t0
        assert code == Exit.MISSING, err
        assert "agent agent2: docker not answering" in err and "nothing was created" in err
        assert lab.client("agent1").containers.list(
            all=True, filters={"label": f"{LABEL_PREFIX}.session={name}"}) == []
    finally:
        engines.start_dockerd(lab.info.state_dir, "agent2")
    code, _out, err = poll(lambda: (r := ctl(capsys, "up", path, "--yes"))[0] == 0 and r,
                           180, 2) or (1, "", "up never succeeded: "
                                       + ctl(capsys, "up", path, "--yes")[2])
    assert code == 0, err
    wait_until_ready(lab.containers(name))
    assert ctl(capsys, "destroy", path, "--yes")[0] == 0
    assert lab.leftovers(name) == []
    FIGURES["agent_down_during_up"] = {"refused_s": round(refused, 1), "exit": Exit.MISSING,
                                       "created": 0}


# --- 5. two changes of one stack at once --------------------------------------------------------


def holding(auto: Automation, stack: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``proc`` holds the stack's lock (it holds it to its end): a wait on what the lock
    file says, not a guess at how long a loaded machine takes to start a driver."""
    lock = auto.state / LOCK_DIR / f"{stack}.lock"
    assert poll(lambda: lock.is_file() and f"(pid {proc.pid}," in lock.read_text(), timeout), \
        f"{proc.args[1]} (pid {proc.pid}) did not take the lock on {stack} in {timeout} s"


@contextlib.contextmanager
def stopped(proc: subprocess.Popen):
    """``proc`` stopped (SIGSTOP) while the block runs: a driver that holds the stack's lock
    holds it until it goes on, however quickly its CLI finishes."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_two_ups_or_an_up_during_destroy_of_one_stack_never_interleave(
        lab, automation, tmp_path, capsys):
    name = f"rel-lock-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 2, cpu=0.5))
    first = driver(automation, "up", path, "--yes")
    holding(automation, name, first)
    with stopped(first):
        code, _out, err = ctl(capsys, "up", path, "--yes")
    assert code == Exit.ENGINE, err
    assert f"stack {name} is being changed by sessionctl up (pid {first.pid}" in err, err
    assert "nothing was done" in err
    out, ferr = first.communicate(timeout=300)
    assert first.returncode == 0, ferr
    kinds = sorted(i.kind for i in lab.leftovers(name))
    assert kinds == ["container", "container", "network"], kinds

    # an `up` while a destroy runs: refused the same way; the destroy finishes
    gone = driver(automation, "destroy", path, "--yes")
    holding(automation, name, gone)
    with stopped(gone):
        code, _out, err = ctl(capsys, "up", path, "--yes")
    assert code == Exit.ENGINE, err
    assert f"stack {name} is being changed by sessionctl destroy (pid {gone.pid}" in err, err
    _out, gerr = gone.communicate(timeout=300)
    assert gone.returncode == 0, gerr
    assert lab.leftovers(name) == []
    FIGURES["concurrent_up"] = {"second_up_exit": int(Exit.ENGINE), "networks": 1,
                                "containers": 2}


def test_a_stale_pulumi_lock_left_by_a_killed_run_is_cleared(lab, automation, tmp_path,
                                                            capsys):
    """A ``kill -9`` of the driver and of its CLI (the CLI's process group: its plugins too,
    as a lost machine loses them) leaves the DIY backend's lock file; alone it would refuse
    every later update ("the stack is currently locked") until ``pulumi cancel``."""
    name = f"rel-stale-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 2, cpu=0.5))
    proc = driver(automation, "up", path, "--yes")
    locks = automation.state / ".pulumi" / "locks"
    held = poll(lambda: list(locks.glob(f"**/{name}/*.json")), 120, 0.1)  # the CLI's lock
    assert held, "".join(proc.stderr or [])
    # once the checkpoint holds a container: the stack is this one (an up killed before its
    # backend recorded anything is taken as new, and its reservation holds the name until
    # its lease runs out: stacks.recovered, agents/pool_ledger.py)
    checkpoint = automation.state / ".pulumi" / "stacks" / PROJECT_NAME / f"{name}.json"
    assert poll(lambda: checkpoint.is_file() and "docker:index/container:Container"
                in checkpoint.read_text(), 120, 0.1), "".join(proc.stderr or [])
    pulumi = json.loads(held[0].read_text())["pid"]  # the CLI that holds it
    assert pulumi in children(proc.pid)
    for pid in [pulumi, *descendants(pulumi)]:  # the CLI and its plugins, as a lost machine
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.communicate(timeout=60)
    assert list(locks.glob(f"**/{name}/*.json"))  # left behind
    code, _out, err = ctl(capsys, "up", path, "--yes")
    assert code == 0, err
    assert f"removed a stale Pulumi lock of stack {name} (pid {pulumi}" in err
    assert ctl(capsys, "destroy", path, "--yes")[0] == 0


# --- 7. bad engines -----------------------------------------------------------------------------


def test_a_frozen_engine_times_out_with_a_clear_message(lab, automation, tmp_path, capsys):
    """agent2's dockerd stopped with SIGSTOP: it accepts connections and never answers.
    ``status`` and ``up`` end within their timeouts naming agent2; nothing hangs."""
    name = f"rel-stop-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, 1, cpu=0.5))
    doc = yaml.safe_load(Path(path).read_text())
    pool = yaml.safe_load(lab.pool_file.read_text())
    pool["agents"] = [a for a in pool["agents"] if a["name"] == "agent2"]
    pool.pop("swarm", None)
    pool_file = factories.write(tmp_path / "agent2.yaml", pool)
    path = str(factories.write(Path(path), {**doc, "pool": str(pool_file)}))
    rec = json.loads((lab.info.state_dir / "lab.json").read_text())
    pid = rec["pids"]["agent2"]["dockerd"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        code, _out, err = ctl(capsys, "up", path, "--yes")
        up_s = time.monotonic() - t0
        assert code == Exit.MISSING, err
        assert "agent agent2:" in err and "nothing was created" in err, err
        t0 = time.monotonic()
        code, _out, err = ctl(capsys, "status", path)
        status_s = time.monotonic() - t0
        assert code == Exit.ENGINE and "agent agent2 did not answer" in err, err
    finally:
        os.kill(pid, signal.SIGCONT)
    FIGURES["frozen_engine"] = {"up_refused_s": round(up_s, 1),
                                "status_s": round(status_s, 1)}


# --- 6. load ------------------------------------------------------------------------------------


def engine_objects(lab: Lab) -> dict[str, int]:
    """What the lab's engines hold beyond their defaults: containers, networks, volumes,
    network namespaces of containers, processes in the agents' cgroups besides the daemons."""
    from cluster_sessions.lab import processes

    counts = {"containers": 0, "networks": 0, "volumes": 0, "netns": 0, "processes": 0}
    for a in lab.info.agents:
        lab.listed(a.name)  # a connection the agent closed while idle: a fresh client
        client = lab.client(a.name)
        counts["containers"] += len(client.containers.list(all=True))
        counts["networks"] += len([n for n in client.networks.list()
                                   if n.name not in ("bridge", "host", "none",
                                                     "docker_gwbridge", "ingress")])
        counts["volumes"] += len(client.volumes.list())
        sandboxes = Path(f"/run/csl-lab/{PREFIX}") / f"x{a.index}" / "netns"
        counts["netns"] += len([p for p in sandboxes.glob("*") if not p.name.startswith(
            ("ingress_sbox", "lb_", "1-"))]) if sandboxes.is_dir() else 0
        counts["processes"] += len(processes.pids_in_cgroups(a.netns))
    return counts


def dockerd_rss_kib(lab: Lab) -> int:
    rec = json.loads((lab.info.state_dir / "lab.json").read_text())
    total = 0
    for agent in rec["pids"].values():
        status = Path(f"/proc/{agent['dockerd']}/status").read_text()
        total += int(next(line.split()[1] for line in status.splitlines()
                          if line.startswith("VmRSS:")))
    return total


def test_concurrent_sessions_then_a_soak_of_up_destroy_cycles(lab, automation, tmp_path,
                                                               capsys):
    """CI size: 4 sessions of 2 containers brought up at once (4 driver processes) and torn
    down at once; then 5 up/destroy cycles of one session. ``benchmarks/soak.py`` runs the
    documented sizes."""
    sessions, size, cycles = 4, 2, 5
    baseline = engine_objects(lab)
    rss_before = dockerd_rss_kib(lab)
    names = [f"rel-load{i}-{uuid.uuid4().hex[:4]}" for i in range(sessions)]
    automation.names.extend(names)
    paths = [str(lab.session(tmp_path, n, size, cpu=0.5)) for n in names]
    t0 = time.monotonic()
    results = finished([driver(automation, "up", p, "--yes") for p in paths])
    up_s = time.monotonic() - t0
    assert [r[0] for r in results] == [0] * sessions, results
    for n in names:
        wait_until_ready(lab.containers(n))
    t0 = time.monotonic()
    results = finished([driver(automation, "destroy", p, "--yes") for p in paths])
    down_s = time.monotonic() - t0
    assert [r[0] for r in results] == [0] * sessions, results
    assert engine_objects(lab) == baseline

    name = f"rel-soak-{uuid.uuid4().hex[:4]}"
    automation.names.append(name)
    path = str(lab.session(tmp_path, name, size, cpu=0.5))
    times, failures, leaks = [], 0, []
    for _ in range(cycles):
        t0 = time.monotonic()
        ok = ctl(capsys, "up", path, "--yes")[0] == 0
        with contextlib.suppress(AssertionError):
            wait_until_ready(lab.containers(name))
        ok = ctl(capsys, "destroy", path, "--yes")[0] == 0 and ok
        times.append(time.monotonic() - t0)
        failures += not ok
        leaks.append({k: v - baseline[k] for k, v in engine_objects(lab).items()
                      if v != baseline[k]})
    rss_after = dockerd_rss_kib(lab)
    assert failures == 0
    assert leaks == [{}] * cycles, leaks
    assert times[-1] < 2 * times[0] + 5, times  # no growth from cycle to cycle
    FIGURES["load"] = {"sessions": sessions, "containers_each": size,
                       "up_all_s": round(up_s, 1), "destroy_all_s": round(down_s, 1)}
    FIGURES["soak"] = {"cycles": cycles, "failures": failures,
                       "first_cycle_s": round(times[0], 1), "last_cycle_s": round(times[-1], 1),
                       "leaked_after_each": 0, "dockerd_rss_kib_before": rss_before,
                       "dockerd_rss_kib_after": rss_after}


def test_parallel_sessions_do_not_share_a_lock(lab, automation, tmp_path, capsys):
    """The per-stack lock is per stack: two sessions' ``up``s in parallel both succeed."""
    names = [f"rel-par{i}-{uuid.uuid4().hex[:4]}" for i in range(2)]
    automation.names.extend(names)
    paths = [str(lab.session(tmp_path, n, 1, cpu=0.5)) for n in names]
    with ThreadPoolExecutor(2) as ex:
        procs = list(ex.map(lambda p: driver(automation, "up", p, "--yes"), paths))
    assert [r[0] for r in finished(procs)] == [0, 0]
    assert [r[0] for r in finished([driver(automation, "destroy", p, "--yes")
                                     for p in paths])] == [0, 0]
