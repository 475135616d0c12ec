"""Shared fixtures.

Tests that need a real Docker Engine are marked ``@pytest.mark.docker`` and take the
``docker_client`` fixture. Where no engine answers they skip, unless
``CLUSTER_SESSIONS_REQUIRE_DOCKER=1`` (set by ``.ci/run``), in which case they fail: CI must
never pass by skipping the real-engine tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings

PROJECT = Path(__file__).resolve().parent.parent
STACKS = PROJECT / "stacks"

# Subprocesses (``python -m cluster_sessions...``, dynamic providers) import this checkout too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(PROJECT / "modules"), *filter(None, [os.environ.get("PYTHONPATH")])])
# The stand-in keeps each stack's config where the CLI would, in the project's stacks/ (the
# shipped example stacks live there): every ``python -m cluster_sessions.emulation.sessionctl``
# a test starts keeps it in a directory of the run's instead, so none is left in the checkout.
os.environ.setdefault("CLUSTER_SESSIONS_EMULATION_CONFIG_DIR",
                      tempfile.mkdtemp(prefix="cs-stack-config-"))


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


@pytest.fixture(autouse=True)
def operator_pools_in_tmp_path(monkeypatch, tmp_path, tmp_path_factory):
    """The suite is the operator of its own pools: those a test writes under its ``tmp_path``
    (``tmp_path/pools`` for pools given by name), a lab's (under the session's temporary
    directory) and the fixtures' (``$CLUSTER_SESSIONS_POOLS``). A definition's pool outside
    the operator's directories is refused (tests/test_pool_trust.py sets its own)."""
    monkeypatch.setenv("CLUSTER_SESSIONS_POOLS", os.pathsep.join(map(str, [
        tmp_path, tmp_path / "pools", tmp_path_factory.getbasetemp(), *FIXTURE_POOLS])))


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
            and item.nodeid.split("[")[0] not in ALLOWED_SKIPS:
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


def pytest_sessionstart(session):
    """In CI, the host engine's state before the first test (see pytest_sessionfinish)."""
    if require_docker():
        state = engine_state()
        if state is not None:
            session.config.stash[ENGINE_BEFORE] = state


def pytest_sessionfinish(session):
    """In CI, a run that leaves the host's engine changed fails: a test uses an engine of its
    own (the lab's) or restores what it changed (docs/testing.md). Containers being removed
    get a few seconds to go."""
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


@pytest.fixture
def emulated_automation(monkeypatch, docker_client, tmp_path):
    """The engine verbs and ``ls`` run for real, with the pulumi CLI stood in for by
    :class:`cluster_sessions.emulation.automation.Backend` (the program under the engine-backed
    mocks, building on the real engine; every call bound to the SDK's signatures). Whatever a
    test leaves is removed afterwards."""
    from cluster_sessions.driver import stacks
    from cluster_sessions.emulation.automation import Backend

    backend = Backend()  # needs the engine: docker_client skips the test without one
    monkeypatch.setattr(stacks, "open_stack", backend.open_stack)
    monkeypatch.setattr(stacks, "open_workspace", backend.open_workspace)
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: Path("/emulated/bin/pulumi"))
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{state}")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "test")
    try:
        yield backend
    finally:
        left = backend.remove_all()
    assert not left, f"left on the engines after the test: {left}"
