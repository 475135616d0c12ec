"""The suite's own rule: in CI (CLUSTER_SESSIONS_REQUIRE_DOCKER=1) a skip is a failure unless
tests/conftest.py allows it by name; elsewhere a skip stays a skip."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ALLOWED_SKIPS, PROJECT

PROBE = '''
import pytest

def test_needs_a_tool():
    pytest.skip("the tool is not installed")

@pytest.mark.skipif(True, reason="not on this platform")
def test_marked():
    pass
'''


def run_probe(tmp_path, require: bool) -> subprocess.CompletedProcess:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
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
