"""One definition, one session (issue 21, class 6): two definitions that map to the same
stack are refused together by ``validate``, and ``preview``/``up``/``destroy`` never take over
a stack whose config records another definition."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit
from cluster_sessions.driver.stack_settings import (
    CONFIG_DEFINITION,
    CONFIG_POOL_DEFINITION,
    owner_conflict,
)

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def write_defs(tmp_path: Path, *docs: dict) -> list[Path]:
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        "test", factories.agent(docker_host="ssh://ops@agent1.invalid")))
    return [factories.write(tmp_path / f"{d['name']}-{i}.yaml", {**d, "pool": str(pool)})
            for i, d in enumerate(docs)]


def test_two_definitions_that_make_the_same_session_are_refused_naming_both(tmp_path, capsys):
    sweep, other = write_defs(tmp_path, factories.session("sweep", count=2),
                              factories.session("sweep-2"))
    assert main(["validate", str(sweep), str(other)]) == Exit.INVALID
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{other}: name: makes session sweep-2") and str(sweep) in lines[0]


def test_the_same_file_twice_or_distinct_sessions_stay_valid(tmp_path, capsys):
    sweep, other = write_defs(tmp_path, factories.session("sweep", count=2),
                              factories.session("sweep-3"))
    assert main(["validate", str(sweep), str(other), str(sweep)]) == Exit.OK


@pytest.mark.parametrize(("recorded", "wanted", "refused"), [
    ({}, {CONFIG_DEFINITION: "sessions/a.yaml"}, False),  # a new stack
    ({CONFIG_DEFINITION: "sessions/a.yaml"}, {CONFIG_DEFINITION: "sessions/a.yaml"}, False),
    ({CONFIG_DEFINITION: "sessions/a.yaml", "cluster-sessions:index": "2"},
     {CONFIG_DEFINITION: "sessions/a.yaml", "cluster-sessions:index": None}, False),
    ({CONFIG_DEFINITION: "sessions/a.yaml"}, {CONFIG_DEFINITION: "sessions/b.yaml"}, True),
    ({CONFIG_POOL_DEFINITION: "pools/lab.yaml"}, {CONFIG_DEFINITION: "sessions/b.yaml"}, True),
    ({CONFIG_DEFINITION: "sessions/a.yaml"}, {CONFIG_POOL_DEFINITION: "pools/lab.yaml"}, True),
    # the real CLI lists Pulumi.yaml's declared keys with their default "" (issue 42)
    ({CONFIG_DEFINITION: "sessions/a.yaml", CONFIG_POOL_DEFINITION: ""},
     {CONFIG_DEFINITION: "sessions/a.yaml"}, False),
    ({CONFIG_DEFINITION: "", CONFIG_POOL_DEFINITION: "pools/lab.yaml"},
     {CONFIG_POOL_DEFINITION: "pools/lab.yaml", CONFIG_DEFINITION: None}, False),
    ({CONFIG_DEFINITION: "", CONFIG_POOL_DEFINITION: ""}, {CONFIG_DEFINITION: "a.yaml"}, False),
])
def test_a_stack_is_taken_over_only_by_the_file_it_was_made_from(recorded, wanted, refused):
    problem = owner_conflict("sweep-2", recorded, wanted)
    assert (problem is not None) == refused, problem
    if refused:
        assert "sessionctl destroy" in problem and "--stack" in problem


def made_from(engine, stack: str, definition: Path, index: str | None = None) -> None:
    """A stack on the real CLI's backend whose config records ``definition`` (as an earlier
    ``up`` of it left it)."""
    engine.cli("stack", "init", stack)
    engine.cli("config", "set", "-s", stack, CONFIG_DEFINITION, str(definition.resolve()))
    if index is not None:
        engine.cli("config", "set", "-s", stack, "cluster-sessions:index", index)


@pytest.mark.docker  # (the embedded local pool: its ledger is on this machine's engine)
@pytest.mark.parametrize("verb", [["preview"], ["up", "--yes"], ["destroy", "--yes"]])
def test_a_stack_made_from_another_definition_is_never_taken_over(real_engine, tmp_path, capsys,
                                                                 verb):
    """Refused before any run of the program: what the driver asked the backend is the list
    and the stack's config and outputs, and the stack's config is as it was."""
    sweep = factories.write(tmp_path / "sweep.yaml", factories.session("sweep", count=2))
    other = factories.write(tmp_path / "other.yaml", factories.session("sweep-2"))
    made_from(real_engine, "sweep-2", sweep, index="2")
    assert main([*verb, str(other)]) == Exit.INVALID
    err = capsys.readouterr().err
    assert str(sweep.resolve()) in err and str(other.resolve()) in err, err
    assert "destroy" in err and "--stack" in err
    assert real_engine.calls == ["list_stacks", "get_all_config sweep-2",
                                 "stack_outputs sweep-2"]
    assert real_engine.config("sweep-2")[CONFIG_DEFINITION] == str(sweep.resolve())
    assert real_engine.stack_names() == ["sweep-2"]


@pytest.mark.docker
def test_the_definition_a_stack_was_made_from_still_runs_on_it(
        real_engine, image, tmp_path, capsys):  # noqa: F811
    name = unique("sweep")
    sweep = factories.write(tmp_path / "sweep.yaml", factories.session(
        name, image=image, count=2, cpu=0.25, mem="128m"))
    for index in (1, 2):
        made_from(real_engine, f"{name}-{index}", sweep)
    assert main(["preview", str(sweep)]) == Exit.OK, capsys.readouterr().err
    assert f"preview {name}-1" in real_engine.calls, real_engine.calls
    assert f"preview {name}-2" in real_engine.calls, real_engine.calls
