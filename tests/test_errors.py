"""One error tree (core/errors.py): every error class of the package derives from
``ClusterSessionsError`` through the class that means its exit code, and the command line
turns any of them into that code and its lines in one place (driver.errors.outcome)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import cluster_sessions
from cluster_sessions.core import errors
from cluster_sessions.core.errors import ClusterSessionsError, Exit
from cluster_sessions.core.problems import DefinitionError, Problem
from cluster_sessions.driver.errors import CommandError, outcome

# where the package is imported from (the checkout's modules/, or a mutation run's copy)
PACKAGE = Path(cluster_sessions.__file__).resolve().parent
# (the stand-ins of the Pulumi CLI and the docker provider live under tests/standin/)
NOT_OURS: tuple[str, ...] = ()
DOCUMENTED = {"EngineFailure": 1, "InvalidInput": 2, "Pending": 3, "MissingPrerequisite": 4,
              "JobFailed": 5, "JobLost": 6}


def package_modules() -> list[str]:
    return sorted("cluster_sessions." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
                  for p in PACKAGE.rglob("*.py")
                  if p.stem != "__init__" and p.relative_to(PACKAGE).parts[0] not in NOT_OURS
                  and p.name != "__main__.py")


def error_classes() -> list[type[BaseException]]:
    found = []
    for name in package_modules():
        module = importlib.import_module(name)
        found += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, BaseException) and obj.__module__ == name]
    return found


def test_each_exit_code_meaning_has_one_class_with_the_documented_code():
    assert {cls.__name__: int(cls.code) for cls in errors.BY_CODE.values()} == DOCUMENTED
    assert {code: cls.__name__ for code, cls in errors.BY_CODE.items()} == {
        v: k for k, v in DOCUMENTED.items()}


def test_every_error_class_of_the_package_derives_from_the_base_through_a_meaning():
    classes = error_classes()
    assert len(classes) >= 15  # the walk found them (guards against a vacuous pass)
    meanings = tuple(errors.BY_CODE.values())
    stray = [f"{c.__module__}.{c.__name__}" for c in classes
             if not issubclass(c, ClusterSessionsError)
             or (c is not ClusterSessionsError and c not in meanings
                 and not issubclass(c, (*meanings, CommandError)))]
    assert stray == []


@pytest.mark.parametrize(("where", "name", "code"), [
    ("core.problems", "DefinitionError", 2), ("core.loader", "PoolNotFound", 2),
    ("agents.errors", "AgentsUnusable", 4), ("agents.capacity", "PreflightError", 4),
    ("agents.connectors", "AgentError", 1), ("agents.connectors", "KnownHostsError", 2),
    ("agents.gathering", "FactError", 1), ("driver.stack_lock", "StackBusy", 1),
    ("lab.processes", "LabError", 1), ("lab.image", "ImageBuildError", 1),
    ("pulumi_layer.session", "SessionPending", 3),
    ("pulumi_layer.program", "InvalidDefinition", 2)])
def test_each_existing_error_keeps_its_name_and_means_its_exit_code(where, name, code):
    cls = getattr(importlib.import_module(f"cluster_sessions.{where}"), name)
    assert issubclass(cls, ClusterSessionsError) and cls.code == code


def test_outcome_is_the_code_and_printable_lines():
    problems = [Problem("a.yaml", "name", "bad"), Problem("a.yaml", "count", "worse")]
    assert outcome("plan", DefinitionError(problems)) == (
        Exit.INVALID, ["a.yaml: name: bad", "a.yaml: count: worse"])
    code, lines = outcome("up", CommandError("no pulumi\ninstall it\x1b[2J", Exit.MISSING))
    assert code == 4 and lines == ["sessionctl up: no pulumi", "install it\\x1b[2J"]
    from cluster_sessions.agents.connectors import AgentError

    assert outcome("status", AgentError("a1", "unreachable", "refused")) == (
        Exit.ENGINE, ["sessionctl status: agent a1: unreachable: refused"])


def test_an_error_of_ours_escaping_a_verb_is_its_code_and_a_line_not_an_internal_error(
        monkeypatch, capsys):
    """Before the tree, an agent error escaping a verb was an "internal error"; a pool that
    cannot be found was re-mapped by hand. Now each says what it is, with its own code."""
    from cluster_sessions.agents.connectors import AgentError
    from cluster_sessions.driver import cli

    def boom(_args):
        raise AgentError("a9", "docker not answering", "connection refused")

    monkeypatch.setattr(cli, "cmd_schema", boom)
    assert cli.main(["schema"]) == Exit.ENGINE
    err = capsys.readouterr().err
    assert err == "sessionctl schema: agent a9: docker not answering: connection refused\n"
    assert cli.main(["pool", "check", "no-such-pool-here"]) == Exit.INVALID
    assert "no-such-pool-here" in capsys.readouterr().err


def test_a_failing_plan_piped_into_head_fails_under_pipefail(tmp_path):
    """``set -o pipefail; sessionctl plan ... | head -1``: a plan that fails (here: pending,
    exit 3) must not pass because head went away first."""
    from tests import factories

    factories.write(tmp_path / "pool.yaml", factories.pool("p", factories.agent(cpu=1)))
    path = factories.write(tmp_path / "s.yaml", factories.session(
        "too-big", str(tmp_path / "pool.yaml"), size=300, cpu=1))
    run = subprocess.run(
        ["bash", "-o", "pipefail", "-c",
         f'"{sys.executable}" -m cluster_sessions.driver.cli plan "{path}" --json | head -1'],
        capture_output=True, text=True, timeout=120)
    assert run.returncode in (3, 141), (run.returncode, run.stderr)
    assert run.stdout.strip() == "{"
