"""One definition, one session (issue 21, class 6): two definitions that map to the same
stack are refused together by ``validate``, and ``preview``/``up``/``destroy`` never take over
a stack whose config records another definition."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from cluster_sessions.driver import stacks
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit
from cluster_sessions.driver.stack_settings import (
    CONFIG_DEFINITION,
    CONFIG_POOL_DEFINITION,
    owner_conflict,
)

from . import factories


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


@pytest.fixture
def emulated(monkeypatch, tmp_path):
    """The Automation API stand-in with no engine behind it (nothing here reaches one)."""
    from tests.standin.automation import Backend

    backend = Backend(None)
    monkeypatch.setattr(stacks, "open_stack", backend.open_stack)
    monkeypatch.setattr(stacks, "open_workspace", backend.open_workspace)
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: Path("/emulated/bin/pulumi"))
    monkeypatch.setattr(stacks, "preflight", lambda *args, **kwargs: None)
    # no engine here: the pool's ledger and live placement stand aside (declared capacity)
    monkeypatch.setattr(stacks.Ledger, "open", lambda pool: contextlib.nullcontext(None))
    monkeypatch.setattr(stacks, "with_live_placement",
                        lambda args, verb, sel, targets, *rest: (sel, targets))
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{state}")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "test")
    return backend


@pytest.mark.parametrize("verb", [["preview"], ["up", "--yes"], ["destroy", "--yes"]])
def test_a_stack_made_from_another_definition_is_never_taken_over(emulated, tmp_path, capsys,
                                                                 verb):
    sweep, other = write_defs(tmp_path, factories.session("sweep", count=2),
                              factories.session("sweep-2"))
    made = emulated.open_stack("sweep-2", tmp_path, None, None)
    made.state.config[CONFIG_DEFINITION] = str(sweep.resolve())
    made.state.config["cluster-sessions:index"] = "2"
    emulated.calls.clear()
    assert main([*verb, str(other)]) == Exit.INVALID
    err = capsys.readouterr().err
    assert str(sweep.resolve()) in err and str(other.resolve()) in err, err
    assert "destroy" in err and "--stack" in err
    assert emulated.calls == ["list_stacks", "get_all_config sweep-2", "stack_outputs sweep-2"]
    assert made.state.config[CONFIG_DEFINITION] == str(sweep.resolve())


def test_the_definition_a_stack_was_made_from_still_runs_on_it(emulated, tmp_path, capsys):
    sweep, _ = write_defs(tmp_path, factories.session("sweep", count=2),
                          factories.session("sweep-2"))
    for index in (1, 2):
        made = emulated.open_stack(f"sweep-{index}", tmp_path, None, None)
        made.state.config[CONFIG_DEFINITION] = str(sweep.resolve())
    emulated.calls.clear()
    main(["preview", str(sweep)])
    assert "preview sweep-1" in emulated.calls and "preview sweep-2" in emulated.calls, \
        emulated.calls
