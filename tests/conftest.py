"""Shared fixtures.

Tests that need a real Docker Engine are marked ``@pytest.mark.docker`` and take the
``docker_client`` fixture. Where no engine answers they skip, unless
``CLUSTER_SESSIONS_REQUIRE_DOCKER=1`` (set by ``.ci/run``), in which case they fail: CI must
never pass by skipping the real-engine tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

PROJECT = Path(__file__).resolve().parent.parent
STACKS = PROJECT / "stacks"

# Subprocesses (``python -m cluster_sessions...``, dynamic providers) import this checkout too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(PROJECT / "modules"), str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])])


# Hypothesis's per-example deadline (200 ms) measures the machine's load, not the code: on a
# busy two-core CI machine it fails examples that pass alone. Speed is benchmarked instead.
settings.register_profile("cluster-sessions", deadline=None)
settings.load_profile("cluster-sessions")


FIXTURE_POOLS = (PROJECT / "tests" / "fixtures" / "pools",
                 PROJECT / "tests" / "fixtures" / "diff" / "pools")
# The fixtures' pools are the operator's for module-scoped fixtures too (each test adds its own).
os.environ["CLUSTER_SESSIONS_POOLS"] = os.pathsep.join(map(str, FIXTURE_POOLS))


@pytest.fixture(scope="session", autouse=True)
def operator_pools_in_the_run(tmp_path_factory):
    """Module-scoped fixtures (a lab's pool, a module's sessions) write their pools under the
    run's temporary directory before any test's own fixture runs: it is the operator's for the
    whole run (each test adds its ``tmp_path`` below)."""
    os.environ["CLUSTER_SESSIONS_POOLS"] = os.pathsep.join(map(str, [
        tmp_path_factory.getbasetemp(), *FIXTURE_POOLS]))


@pytest.fixture(scope="session")
def _cli_hidden_env(tmp_path_factory) -> dict[str, str]:
    """``PATH`` and ``PULUMI_HOME`` under which no ``pulumi`` CLI is found: a directory of
    ``PATH`` holding one is replaced by links to the rest of it (its ``sessionctl`` stays)."""
    base = tmp_path_factory.mktemp("pulumi-cli-hidden")
    path = []
    for i, d in enumerate(filter(None, os.environ.get("PATH", "").split(os.pathsep))):
        if (Path(d) / "pulumi").exists():
            shadow = base / f"path{i}"
            shadow.mkdir()
            for entry in Path(d).iterdir():
                if entry.name != "pulumi":
                    (shadow / entry.name).symlink_to(entry)
            d = str(shadow)
        path.append(d)
    return {"PATH": os.pathsep.join(path), "PULUMI_HOME": str(base / "home")}


@pytest.fixture(autouse=True)
def pulumi_cli_hidden(request, monkeypatch, _cli_hidden_env):
    """The ``pulumi`` CLI is hidden (for the processes a test starts too) but from the tests
    of the real engine (``real_engine``): set-up installs it (CI's too), and the others test
    the driver without one, through the stand-in, or against containers no stack made (with
    the CLI, the backend would say there is no such stack)."""
    if "real_cli" in request.fixturenames:  # (real_engine asks for it too)
        return
    for key, value in _cli_hidden_env.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(autouse=True)
def operator_pools_in_tmp_path(monkeypatch, tmp_path, tmp_path_factory):
    """The suite is the operator of its own pools: those a test writes under its ``tmp_path``
    (``tmp_path/pools`` for pools given by name), a lab's (under the session's temporary
    directory) and the fixtures' (``$CLUSTER_SESSIONS_POOLS``). A definition's pool outside
    the operator's directories is refused (tests/test_pool_trust.py sets its own)."""
    monkeypatch.setenv("CLUSTER_SESSIONS_POOLS", os.pathsep.join(map(str, [
        tmp_path, tmp_path / "pools", tmp_path_factory.getbasetemp(), *FIXTURE_POOLS])))


@pytest.fixture(scope="session", autouse=True)
def scratch_root_of_this_machine():
    """The default scratch root on this machine (the local engine's agent), as the operator's
    `sessionctl pool check --fix` makes it: this user's, 0700 (issue 45). The pools the
    tests write name no other, unless a test gives its own (under its tmp_path)."""
    from cluster_sessions.agents.bundles import make_root
    from cluster_sessions.agents.connectors import LocalConnector
    from cluster_sessions.core.spec import DEFAULT_SCRATCH

    try:
        make_root(LocalConnector("local"), DEFAULT_SCRATCH)
    except Exception as exc:  # said by the tests that deliver there
        print(f"conftest: the scratch root {DEFAULT_SCRATCH}: {exc}")


def require_docker() -> bool:
    return os.environ.get("CLUSTER_SESSIONS_REQUIRE_DOCKER") == "1"


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail where the environment promises the prerequisite (CI)."""
    if require_docker():
        pytest.fail(f"{reason} (CLUSTER_SESSIONS_REQUIRE_DOCKER=1, so this is a failure)")
    pytest.skip(reason)


# The only skips CI accepts: test id -> why it may skip there (docs/testing.md). Every other
# skip under CLUSTER_SESSIONS_REQUIRE_DOCKER=1 fails the run: a test that silently stops
# running (a tool missing from .ci/run, a changed platform) must be seen.
ALLOWED_SKIPS: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CLUSTER_SESSIONS_REQUIRE_DOCKER=1 (CI), a skip not in ALLOWED_SKIPS is a failure,
    whatever raised it (``pytest.skip``, ``skipif``, ``importorskip``)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and require_docker() and not hasattr(report, "wasxfail") \
            and item.nodeid.split("[")[0].split("@")[0] not in ALLOWED_SKIPS:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"unexpected skip in CI: {reason} (CLUSTER_SESSIONS_REQUIRE_DOCKER=1; "
                           "install what it needs in .ci/run, or list it in "
                           "tests/conftest.py ALLOWED_SKIPS with the reason)")


def engine_state() -> dict[str, dict[str, str]] | None:
    """What a test run must leave on the host's engine as it found it: networks, containers,
    volumes (name -> id) and the swarm state; ``None`` where no engine answers. Images are left
    out: tests build and cache theirs (the demo image, the lab's), as set-up does."""
    import docker

    try:
        client = docker.from_env(timeout=60)
        try:
            swarm = client.info()["Swarm"]
            return {
                "network": {n["Name"]: n["Id"][:12] for n in client.api.networks()},
                "container": {c["Names"][0].lstrip("/") if c.get("Names") else c["Id"][:12]:
                              c["Id"][:12] for c in client.api.containers(all=True)},
                "volume": {v["Name"]: v["Name"]
                           for v in client.api.volumes().get("Volumes") or []},
                "swarm": {"state": swarm.get("LocalNodeState", ""),
                          "node": swarm.get("NodeID", "")},
            }
        finally:
            client.close()
    except Exception:  # no engine: the docker tests say so themselves
        return None


def engine_changes(before: dict, after: dict) -> list[str]:
    """Each difference, in words: what was left behind, removed or replaced."""
    changes = []
    for kind in ("network", "container", "volume"):
        old, new = before[kind], after[kind]
        changes += [f"{kind} {name} left behind" for name in sorted(new.keys() - old.keys())]
        changes += [f"{kind} {name} removed" for name in sorted(old.keys() - new.keys())]
        changes += [f"{kind} {name} replaced ({old[name]} -> {new[name]})"
                    for name in sorted(old.keys() & new.keys()) if old[name] != new[name]]
    if before["swarm"] != after["swarm"]:
        changes.append(f"swarm {before['swarm']['state'] or '?'} -> "
                       f"{after['swarm']['state'] or '?'} (node {before['swarm']['node'] or '-'}"
                       f" -> {after['swarm']['node'] or '-'})")
    return changes


ENGINE_BEFORE = pytest.StashKey[dict]()
ENGINE_CHANGES = pytest.StashKey[list]()


TEST_RUNS = Path(tempfile.gettempdir()) / "cluster-sessions-test-runs"
# tests/test_runtime.py unique(): every test session, pool and stack is cst-<8 hex>-<stem>; a
# user's own session merely starting "cst-" is not a test's
TEST_NAME = re.compile(r"cst-[0-9a-f]{8}-")


def other_test_runs(runs: Path = TEST_RUNS) -> list[int]:
    """Pids of other test runs of this project alive now (each records its pid in ``runs``)."""
    from cluster_sessions.lab import processes

    pids = []
    for record in runs.glob("*") if runs.is_dir() else ():
        if record.name.isdigit() and int(record.name) != os.getpid():
            if processes.alive(int(record.name)):
                pids.append(int(record.name))
            else:
                record.unlink(missing_ok=True)
    return pids


def is_test_object(name: str, labels: Mapping[str, str] | None,
                   pattern: re.Pattern[str] = TEST_NAME) -> bool:
    """A container, service, network or volume a test made: its name, or the session, pool or
    ledger entry it is labelled with, starts as a test's name (``pattern``)."""
    from cluster_sessions.core.names import LEDGER_POOL_LABEL, LEDGER_SESSION_LABEL, SESSION_LABEL

    labels = labels or {}
    return any(pattern.match(value) for value in (
        name, labels.get(SESSION_LABEL, ""), labels.get(LEDGER_SESSION_LABEL, ""),
        labels.get(LEDGER_POOL_LABEL, "")))


def clear_stale_test_objects(pattern: re.Pattern[str] = TEST_NAME,
                             runs: Path = TEST_RUNS) -> list[str]:
    """Remove what a killed earlier test run left on the host's engine (a container with a
    restart policy even comes back with the engine), when no other test run is alive: its
    sessions would hold the local agent's capacity and every later ``up`` would be pending.
    Returns what was removed, in words."""
    import docker
    import docker.errors

    if other_test_runs(runs):
        return []
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception:  # no engine: the docker tests say so themselves
        return []
    removed = []
    try:
        groups = [("service", lambda: client.services.list() if client.info()["Swarm"].get(
                      "ControlAvailable") else [], lambda o: o.name, lambda o: o.attrs.get(
                      "Spec", {}).get("Labels"), lambda o: o.remove()),
                  ("container", lambda: client.containers.list(all=True), lambda o: o.name,
                   lambda o: o.labels, lambda o: o.remove(force=True, v=False)),
                  ("network", client.networks.list, lambda o: o.name,
                   lambda o: o.attrs.get("Labels"), lambda o: o.remove()),
                  ("volume", client.volumes.list, lambda o: o.name,
                   lambda o: o.attrs.get("Labels"), lambda o: o.remove(force=True))]
        for kind, listing, name_of, labels_of, remove in groups:
            for obj in listing():
                if is_test_object(name_of(obj), labels_of(obj), pattern):
                    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                        remove(obj)
                        removed.append(f"{kind} {name_of(obj)}")
    finally:
        client.close()
    return removed


STALE_REMOVED = pytest.StashKey[list]()
STACK_CONFIGS_BEFORE = pytest.StashKey[set]()  # stacks/Pulumi.*.yaml before the run


def is_xdist_worker(config) -> bool:
    """A worker of ``pytest -n`` (pytest-xdist): the run as a whole is its controller's."""
    return hasattr(config, "workerinput")


# What runs one after another on one worker of ``pytest -n`` (pyproject: ``--dist loadgroup``):
# the tests that use a netns lab (one lab at a time, each module's own) and the other tests
# that use the host's Docker Engine; everything else is spread over the workers as they free.
LAB_GROUP, ENGINE_GROUP = "lab", "engine"


def xdist_group_of(item) -> str | None:
    if "lab" in item.fixturenames or item.get_closest_marker("lab"):
        return LAB_GROUP
    if item.get_closest_marker("docker"):
        return ENGINE_GROUP
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups off the marks
def pytest_collection_modifyitems(config, items):
    """Each engine test in its xdist group (:func:`xdist_group_of`); the two groups first, so
    that each is a worker's first unit and the plain tests fill in around them."""
    groups = {item: xdist_group_of(item) for item in items}
    for item, group in groups.items():
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    rank = {LAB_GROUP: 0, ENGINE_GROUP: 1, None: 2}
    items.sort(key=lambda item: rank[groups[item]])  # stable: each group in its own order


def pytest_sessionstart(session):
    """This run's pid in TEST_RUNS; what a killed earlier run left removed; in CI, the host
    engine's state before the first test (see pytest_sessionfinish). Under ``pytest -n`` the
    controller does the last two, before any worker starts, and the check after all ended."""
    TEST_RUNS.mkdir(exist_ok=True)
    (TEST_RUNS / str(os.getpid())).touch()
    if is_xdist_worker(session.config):
        return
    session.config.stash[STALE_REMOVED] = clear_stale_test_objects()
    session.config.stash[STACK_CONFIGS_BEFORE] = set(STACKS.glob("Pulumi.*.yaml"))
    if require_docker():
        state = engine_state()
        if state is not None:
            session.config.stash[ENGINE_BEFORE] = state


def pytest_sessionfinish(session):
    """In CI, a run that leaves the host's engine changed fails: a test uses an engine of its
    own (the lab's) or restores what it changed (docs/testing.md). Containers being removed
    get a few seconds to go."""
    (TEST_RUNS / str(os.getpid())).unlink(missing_ok=True)
    configs = session.config.stash.get(STACK_CONFIGS_BEFORE, None)
    if configs is not None:  # the real CLI writes each stack's config beside the project's
        for made in set(STACKS.glob("Pulumi.*.yaml")) - configs:
            made.unlink(missing_ok=True)
    before = session.config.stash.get(ENGINE_BEFORE, None)
    if before is None:
        return
    changes: list[str] = []
    for _ in range(10):
        after = engine_state()
        changes = engine_changes(before, after) if after is not None else ["engine gone"]
        if not changes:
            return
        time.sleep(1)
    session.config.stash[ENGINE_CHANGES] = changes
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    stale = config.stash.get(STALE_REMOVED, None)
    if stale:
        terminalreporter.section("left by an earlier, killed test run: removed before the first "
                                 "test")
        for line in stale:
            terminalreporter.line(line)
    changes = config.stash.get(ENGINE_CHANGES, None)
    if changes:
        terminalreporter.section("the host's Docker Engine was left changed", red=True)
        for change in changes:
            terminalreporter.line(f"engine changed by the run: {change}")
        terminalreporter.line("(CLUSTER_SESSIONS_REQUIRE_DOCKER=1: tests use an engine of their "
                              "own or restore what they changed, docs/testing.md)")


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # any failure to reach the engine means "no engine"
        skip_or_fail(f"no Docker Engine answers: {exc}")
    yield client
    client.close()


@pytest.fixture
def project_dir() -> Path:
    return PROJECT


@pytest.fixture
def stacks_dir() -> Path:
    return STACKS


def require_lab() -> None:
    """Root and the programs the netns lab runs, or skip (fail in CI)."""
    from cluster_sessions.lab.requirements import REQUIRED_TOOLS, SSHD

    if os.geteuid() != 0:
        skip_or_fail("the netns lab needs root")
    missing = [t for t in REQUIRED_TOOLS if not shutil.which(t)]
    if not os.access(SSHD, os.X_OK):
        missing.append(str(SSHD))
    if missing:
        skip_or_fail(f"the netns lab needs {', '.join(missing)}")


def clear_stale_lab(prefix: str) -> None:
    """Tear down a lab with ``prefix`` left by an earlier (killed) test run."""
    from cluster_sessions.lab import layout, netns, processes

    rec = layout.read_json(layout.RUN_BASE / prefix / "lab.json")
    if rec is None:
        return
    pid = rec.get("creator_pid")
    if pid and pid != os.getpid() and processes.alive(pid):
        skip_or_fail(f"another test run (pid {pid}) uses the {prefix!r} lab right now")
    netns.lab_down(Path(rec["state_dir"]))


SESSIONCTL = str(Path(sys.executable).with_name("sessionctl"))  # the installed entry point
# where the real engine is found, as the run began (pulumi_cli_hidden hides it from the
# processes of the tests that do not ask for it)
ENGINE_PATH = {"PATH": os.environ.get("PATH", os.defpath),
               "PULUMI_HOME": os.environ.get("PULUMI_HOME", str(Path.home() / ".pulumi"))}


def backend_env(state: Path, passphrase: str = "test", **extra: str) -> dict[str, str]:
    """The environment of a ``sessionctl`` or ``pulumi`` process on the file backend ``state``
    through the real engine: the CLI on its ``PATH`` and its installed plugins, whatever
    ``HOME`` a test gives in ``extra``."""
    return {**os.environ, **ENGINE_PATH, "PULUMI_BACKEND_URL": f"file://{state}",
            "PULUMI_CONFIG_PASSPHRASE": passphrase, "PULUMI_SKIP_UPDATE_CHECK": "true",
            **extra}


def signal_when(proc: Any, ready: Any, signum: int,
                timeout: float = 180) -> tuple[str, str, bool]:
    """``signum`` to the driver process ``proc`` (its pipes read meanwhile) once ``ready()``
    holds: the real engine has no fault points, so a test stops a driver at what the engine
    was seen to hold. Its stdout, its stderr once it ended, and whether it was still running
    when signalled."""
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
               for f, into in ((proc.stdout, out), (proc.stderr, err))]
    for r in readers:
        r.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not ready():
        assert time.monotonic() < deadline, "".join(err)
        time.sleep(0.05)
    running = proc.poll() is None
    proc.send_signal(signum)
    proc.wait(timeout=300)
    for r in readers:
        r.join(30)
    return "".join(out), "".join(err), running


class RealEngine:
    """The real ``pulumi`` CLI (scripts/install-pulumi.sh: built from Go modules), its language
    host, dynamic-provider host and docker provider plugin, on a file backend of one test's
    own. The engine verbs reach it as a user's ``sessionctl`` does: nothing is patched."""

    def __init__(self, pulumi: Path, state: Path):
        self.pulumi = pulumi
        self.state = state
        self.env = backend_env(state)

        self.calls: list[str] = []  # "up NAME", "list_stacks": what the driver asked, in order
        # ``sessionctl`` as a process of its own (the installed entry point), on this backend
        # (the fixture sets its variables in the environment processes inherit)
        self.sessionctl = [SESSIONCTL]

    @property
    def stacks(self) -> Mapping[str, Any]:
        """``{stack: view}`` whose ``config`` is the stack's config with its secrets shown,
        read from the CLI only for the stack asked for."""
        return _StackViews(self)

    def record(self, target, name: str | None = None):
        """``target`` (an Automation API stack or workspace), each public call recorded."""
        return _Recorded(target, self.calls, name)

    def cli(self, *args: str, check: bool = True) -> str:
        import subprocess

        done = subprocess.run([str(self.pulumi), "--non-interactive", *args], cwd=PROJECT,
                              env=self.env, capture_output=True, text=True, timeout=300)
        if check and done.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)}: {done.returncode}\n{done.stderr}")
        return done.stdout

    def stack_names(self) -> list[str]:
        import json

        return [s["name"] for s in json.loads(self.cli("stack", "ls", "--json") or "[]")]

    def config(self, stack: str) -> dict[str, str]:
        """The stack's config as the CLI reads it (secrets as ``[secret]``)."""
        import json

        return {k: v.get("value") for k, v in
                json.loads(self.cli("config", "--json", "-s", stack)).items()}

    def remove_all(self) -> list[str]:
        """Destroy and remove every stack the backend still holds (a test may leave its
        sessions up); the stacks whose destroy failed."""
        import json

        left = []
        for row in json.loads(self.cli("stack", "ls", "--json") or "[]"):
            stack = row["name"]
            # a stack the test destroyed holds nothing: `stack rm` alone (a destroy is a run
            # of the program, seconds each, for every stack of every test)
            if row.get("resourceCount", 1):  # (not said: destroyed to be sure)
                try:
                    self.cli("destroy", "--yes", "--skip-preview", "-s", stack)
                except AssertionError:
                    left.append(stack)
                    continue
            self.cli("stack", "rm", "--yes", "--force", "-s", stack, check=False)
            (STACKS / f"Pulumi.{stack}.yaml").unlink(missing_ok=True)
        return left


class _StackViews(Mapping):
    """The backend's stacks by name, as the stand-in's ``stacks`` gives them."""

    def __init__(self, engine: RealEngine):
        self._engine = engine

    def __getitem__(self, name: str) -> Any:
        import json
        import types

        if name not in self._engine.stack_names():
            raise KeyError(name)
        return types.SimpleNamespace(config={
            k: v.get("value") for k, v in json.loads(self._engine.cli(
                "config", "--json", "--show-secrets", "-s", name)).items()})

    def __iter__(self) -> Iterator[str]:
        return iter(self._engine.stack_names())

    def __len__(self) -> int:
        return len(self._engine.stack_names())


class _Recorded:
    """Calls on an Automation API object, recorded as ``"METHOD SUBJECT"`` (the stack's name,
    or a workspace call's first argument); the object is the real one."""

    def __init__(self, target, calls: list[str], name: str | None):
        self._target, self._calls, self._name = target, calls, name

    def __getattr__(self, attr: str):
        value = getattr(self._target, attr)
        if attr.startswith("_") or not callable(value):
            return value

        def call(*args, **kwargs):
            subject = self._name if self._name is not None else (
                args[0] if args and isinstance(args[0], str) else "")
            self._calls.append(f"{attr} {subject}".rstrip())
            return value(*args, **kwargs)
        return call


@pytest.fixture
def real_cli(monkeypatch, tmp_path):
    """The engine verbs through the real engine (:class:`RealEngine`), each call the driver
    makes on a stack or the workspace recorded in ``calls``; whatever stack a test leaves is
    destroyed afterwards, and the test fails if that fails. For a test whose stacks never
    reach a Docker engine (config, outputs, refusals); ``real_engine`` for one that does."""
    import subprocess

    from cluster_sessions.driver import stacks

    pulumi = stacks.find_pulumi(os.environ)
    if pulumi is None:
        skip_or_fail("the pulumi CLI is not installed: bash scripts/setup.sh --install-pulumi")
    plugins = subprocess.run([str(pulumi), "plugin", "ls"], capture_output=True, text=True,
                             env={**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"})
    if not any(line.split()[:2] == ["docker", "resource"] for line in
               plugins.stdout.splitlines()):
        skip_or_fail("the docker provider plugin is not installed: bash scripts/setup.sh "
                     f"--install-pulumi (pulumi plugin ls: {plugins.stdout or plugins.stderr})")
    state = tmp_path / "state"
    state.mkdir()
    engine = RealEngine(pulumi, state)
    for key in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE"):
        monkeypatch.setenv(key, engine.env[key])
    open_stack, open_workspace = stacks.open_stack, stacks.open_workspace
    monkeypatch.setattr(stacks, "open_stack", lambda stack, *a, **kw: engine.record(
        open_stack(stack, *a, **kw), stack))
    monkeypatch.setattr(stacks, "open_workspace", lambda *a, **kw: engine.record(
        open_workspace(*a, **kw)))
    try:
        yield engine
    finally:
        left = engine.remove_all()
    assert not left, f"stacks whose destroy failed after the test: {left}"


@pytest.fixture
def real_engine(real_cli, docker_client):
    """:func:`real_cli` for a test whose stacks make containers on this machine's engine."""
    return real_cli
