"""How operators run ``pool reap`` periodically (issue 44, part 4): the systemd units pass
``systemd-analyze verify`` (a warning counts as a failure), and the CI schedule's commands
parse."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster_sessions.driver.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
SERVICE, TIMER = "cluster-sessions-reap@.service", "cluster-sessions-reap@.timer"
INSTALLED = "/opt/cluster-sessions"  # where the units expect the checkout (docs/scheduling.md)


def _analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:  # not a skip: the units would go unchecked
        pytest.fail("systemd-analyze is not installed: `scripts/setup.sh --dev` installs the "
                    "Debian package systemd (apt-get install systemd)")
    return found


def _verify(directory: Path, texts: dict[str, str]) -> subprocess.CompletedProcess:
    """``systemd-analyze verify`` of the units as instance ``lab``, with this checkout in
    place of /opt/cluster-sessions (verify checks that ExecStart's program exists)."""
    paths = []
    for name, text in texts.items():
        path = directory / name.replace("@.", "@lab.")
        path.write_text(text.replace(INSTALLED, str(ROOT)))
        paths.append(str(path))
    return subprocess.run([_analyze(), "verify", "--man=no", *paths], capture_output=True,
                          text=True, timeout=120)


def _units() -> dict[str, str]:
    return {n: (UNITS / n).read_text() for n in (SERVICE, TIMER)}


def test_the_reap_units_pass_systemd_analyze_verify_without_a_warning(tmp_path):
    assert (ROOT / ".venv/bin/sessionctl").exists() or shutil.which("sessionctl"), \
        "sessionctl is not installed in .venv (scripts/setup.sh)"
    units = _units()
    if not (ROOT / ".venv/bin/sessionctl").exists():
        units[SERVICE] = units[SERVICE].replace(f"{INSTALLED}/.venv/bin/sessionctl",
                                                shutil.which("sessionctl"))
    done = _verify(tmp_path, units)
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr


def test_verify_does_catch_a_mistake_in_the_units(tmp_path):
    """The check above can fail: a misspelt key is a warning, a missing program an error."""
    units = _units()
    units[TIMER] = units[TIMER].replace("OnUnitActiveSec=", "OnUnitActivSec=")
    assert "OnUnitActivSec" in _verify(tmp_path, units).stderr
    units = _units()
    units[SERVICE] = units[SERVICE].replace("/.venv/bin/sessionctl", "/.venv/bin/no-such")
    assert _verify(tmp_path, units).returncode != 0


def test_the_service_runs_one_reap_pass_of_its_instance_as_an_unprivileged_user():
    service = (UNITS / SERVICE).read_text()
    start = re.search(r"^ExecStart=(.*)$", service, re.M)[1].split()
    assert start[1:] == ["pool", "reap", "%I"], start
    build_parser().parse_args(["pool", "reap", "lab"])  # the verb the unit runs exists
    assert re.search(r"^Type=oneshot$", service, re.M)
    user = re.search(r"^User=(.*)$", service, re.M)[1]
    assert user and user != "root"
    timer = (UNITS / TIMER).read_text()
    assert re.search(r"^OnUnitActiveSec=\d+min$", timer, re.M)
    assert re.search(r"^WantedBy=timers.target$", timer, re.M)


def test_the_ci_schedule_runs_pool_reap_on_a_cron():
    text = (ROOT / "examples/ci/reap-schedule.yml").read_text()
    doc = yaml.safe_load(text)
    assert doc[True]["schedule"][0]["cron"]  # YAML 1.1 reads the key `on` as True
    commands = re.findall(r"sessionctl (pool reap [^>|;\n]*)", text)
    assert len(commands) >= 2  # the workflow's and the GitLab snippet's
    for command in commands:
        argv = [re.sub(r'"?\$\w+"?', "x", w) for w in command.split()]
        args = build_parser().parse_args(argv)
        assert args.pool_verb == "reap" and args.json
