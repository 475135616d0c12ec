"""The suite's own rule: in CI (CLUSTER_SESSIONS_REQUIRE_DOCKER=1) a skip is a failure unless
tests/conftest.py allows it by name; elsewhere a skip stays a skip."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

from tests.conftest import ALLOWED_SKIPS, PROJECT, engine_changes

PROBE = '''
import pytest

def test_needs_a_tool():
    pytest.skip("the tool is not installed")

@pytest.mark.skipif(True, reason="not on this platform")
def test_marked():
    pass
'''


def run_probe(tmp_path, require: bool, source: str = PROBE) -> subprocess.CompletedProcess:
    probe = tmp_path / "test_probe.py"
    probe.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CLUSTER_SESSIONS_REQUIRE_DOCKER"}
    if require:
        env["CLUSTER_SESSIONS_REQUIRE_DOCKER"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(probe)],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)


def test_an_unexpected_skip_fails_ci_and_stays_a_skip_elsewhere(tmp_path):
    ci = run_probe(tmp_path, require=True)
    assert ci.returncode == 1, ci.stdout
    assert ci.stdout.count("unexpected skip in CI") >= 2, ci.stdout
    assert "1 failed, 1 error" in ci.stdout  # a skip in set-up (skipif) fails set-up
    local = run_probe(tmp_path, require=False)
    assert local.returncode == 0 and "2 skipped" in local.stdout, local.stdout


def test_every_allowed_skip_says_why():
    assert all(isinstance(why, str) and why.strip() for why in ALLOWED_SKIPS.values())


ENGINE_PROBE = '''
import docker

def test_uses_a_volume():
    client = docker.from_env()
    volume = client.volumes.create("{name}")
    if {remove}:
        volume.remove()
'''


@pytest.mark.docker
def test_a_run_that_leaves_the_engine_changed_fails_ci(tmp_path, docker_client):
    """The check after the run (conftest pytest_sessionfinish): a volume left behind fails a run
    whose every test passed; one removed again does not; outside CI nothing is checked."""
    name = f"csguard-{uuid.uuid4().hex[:8]}"
    try:
        left = run_probe(tmp_path, True, ENGINE_PROBE.format(name=name, remove=False))
        assert left.returncode == 1 and "1 passed" in left.stdout, left.stdout
        assert f"engine changed by the run: volume {name} left behind" in left.stdout, left.stdout
        docker_client.volumes.get(name).remove()
        local = run_probe(tmp_path, False, ENGINE_PROBE.format(name=name, remove=False))
        assert local.returncode == 0 and "engine changed" not in local.stdout, local.stdout
        docker_client.volumes.get(name).remove()
        tidy = run_probe(tmp_path, True, ENGINE_PROBE.format(name=name, remove=True))
        assert tidy.returncode == 0 and "engine changed" not in tidy.stdout, tidy.stdout
    finally:
        for volume in docker_client.volumes.list(filters={"name": name}):
            volume.remove(force=True)


def test_engine_changes_name_what_was_left_removed_or_replaced():
    before = {"network": {"bridge": "a1", "docker_gwbridge": "b1"}, "container": {"web": "c1"},
              "volume": {}, "swarm": {"state": "inactive", "node": ""}}
    assert engine_changes(before, before) == []
    after = {"network": {"bridge": "a2", "cs-net": "d1"}, "container": {},
             "volume": {"data": "data"}, "swarm": {"state": "active", "node": "n1"}}
    assert engine_changes(before, after) == [
        "network cs-net left behind", "network docker_gwbridge removed",
        "network bridge replaced (a1 -> a2)", "container web removed", "volume data left behind",
        "swarm inactive -> active (node - -> n1)"]


@pytest.mark.docker
def test_what_a_killed_run_left_is_removed_first_unless_another_run_is_alive(tmp_path,
                                                                             docker_client):
    """conftest clear_stale_test_objects: a test session's container, network and volume that a
    killed run left (found by name or by the session label) go before the first test, so they
    cannot hold the local agent's capacity; an object of no test stays; while another test run
    is alive nothing is touched (they may be its sessions)."""
    from cluster_sessions.agents.pool_ledger import MARKER_IMAGE, _empty_tar
    from cluster_sessions.core.names import SESSION_LABEL
    from tests.conftest import clear_stale_test_objects, is_test_object

    prefix = f"cst-sweep{uuid.uuid4().hex[:8]}-"
    own = re.compile(re.escape(prefix))
    keep = f"keep-{uuid.uuid4().hex[:8]}"
    repo, tag = MARKER_IMAGE.rsplit(":", 1)
    docker_client.api.import_image_from_data(_empty_tar(), repository=repo, tag=tag)
    runs = tmp_path / "runs"
    runs.mkdir()

    def leave() -> None:
        docker_client.containers.create(MARKER_IMAGE, ["x"], name=f"{prefix}main1",
                                        restart_policy={"Name": "unless-stopped"})
        docker_client.containers.create(MARKER_IMAGE, ["x"], name=f"{keep}-by-label",
                                        labels={SESSION_LABEL: f"{prefix}s"})
        docker_client.networks.create(f"{keep}-net", labels={SESSION_LABEL: f"{prefix}s"})
        docker_client.volumes.create(f"{prefix}data")

    left = {f"container {prefix}main1", f"container {keep}-by-label", f"network {keep}-net",
            f"volume {prefix}data"}
    try:
        docker_client.containers.create(MARKER_IMAGE, ["x"], name=keep)
        leave()
        (runs / str(os.getppid())).touch()  # another run, alive
        assert clear_stale_test_objects(own, runs) == []
        assert docker_client.containers.get(f"{prefix}main1")
        (runs / str(os.getppid())).unlink()
        (runs / "999999999").touch()  # a run that is gone: its record is cleared
        assert set(clear_stale_test_objects(own, runs)) == left
        assert not (runs / "999999999").exists()
        names = {c.name for c in docker_client.containers.list(all=True)}
        assert keep in names and not {f"{prefix}main1", f"{keep}-by-label"} & names
        assert not docker_client.networks.list(names=[f"{keep}-net"])
        assert not [v for v in docker_client.volumes.list() if v.name == f"{prefix}data"]
        # the default: only unique()'s names, never a user's session that starts "cst-"
        assert is_test_object("cst-0a1b2c3d-ssh-main1", {})
        assert not is_test_object("cst-my-own-session", {})
        assert not is_test_object(f"{prefix}main1", {})
    finally:
        for c in docker_client.containers.list(all=True):
            if c.name.startswith((prefix, keep)):
                c.remove(force=True)
        for n in docker_client.networks.list(names=[f"{keep}-net"]):
            n.remove()
        for v in docker_client.volumes.list():
            if v.name == f"{prefix}data":
                v.remove(force=True)


WORKERS_PROBE = '''
import os
import pytest

def record(tag):
    with open(os.environ["PROBE_LOG"], "a") as log:
        log.write(f"{tag} {os.environ.get('PYTEST_XDIST_WORKER', '-')}\\n")

@pytest.mark.parametrize("n", range(6))
@pytest.mark.docker
def test_engine(n):
    record("engine")

@pytest.mark.parametrize("n", range(6))
@pytest.mark.lab
def test_lab(n):
    record("lab")

@pytest.mark.parametrize("n", range(12))
def test_plain(n):
    record("plain")
'''


def test_the_engine_tests_share_one_worker_and_the_lab_tests_another(tmp_path):
    """Under ``pytest -n`` (pyproject's addopts) the host engine's tests run one after another on
    one worker and the lab's on another, as they did in one process; the plain ones anywhere."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(WORKERS_PROBE)
    log = tmp_path / "log"
    env = {**os.environ, "PROBE_LOG": str(log)}
    env.pop("CLUSTER_SESSIONS_REQUIRE_DOCKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-n", "3", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(probe)],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout
    workers: dict[str, set[str]] = {}
    for line in log.read_text().splitlines():
        tag, worker = line.split()
        workers.setdefault(tag, set()).add(worker)
    assert len(workers["engine"]) == 1 and len(workers["lab"]) == 1, workers
    assert workers["engine"] != workers["lab"], workers
    assert "-" not in workers["engine"] | workers["lab"] | workers["plain"], workers
