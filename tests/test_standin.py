"""The stand-in engine drives dynamic resources as Pulumi's does (issue 34, item 11):
``check``/``create``/``diff``/``update``/``delete`` in the engine's order. The tests run a
program of their own under it with a provider that records every call it gets. (The verbs
across processes, once the stand-in's, are the real engine's: tests/test_cross_process.py,
tests/test_pool_verbs_lab.py.)
"""

from __future__ import annotations

import pulumi
import pytest
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult
from pulumi.runtime import rpc

from tests.standin import provider as docker_provider
from tests.standin.engine import Engine, run_program

# --- item 11: dynamic resources as the engine drives them ---------------------------------------

CALLS: list[str] = []


class Recorder(ResourceProvider):
    """Says what it is asked; ``diff`` answers what the inputs ``diff_*`` say."""

    def check(self, olds, news):
        CALLS.append(f"check {news['tag']} olds={sorted(k for k in olds if k != '__provider')}")
        return super().check(olds, news)

    def create(self, props):
        CALLS.append(f"create {props['tag']} v={int(props['v'])}")  # numbers arrive as floats
        return CreateResult(f"{props['tag']}-{int(props['v'])}", {"tag": props["tag"],
                                                             "v": props["v"], "made": True})

    def diff(self, id_, olds, news):
        CALLS.append(f"diff {id_} olds.made={olds.get('made')}")
        if news.get("src") == rpc.UNKNOWN:  # what it was made from is being replaced
            return DiffResult(changes=True, replaces=["src"] if news.get("follow") else [])
        if news.get("diff_unknown"):
            return DiffResult()
        changed = olds["v"] != news["v"]
        return DiffResult(changes=changed,
                          replaces=["v"] if changed and news.get("replace") else [],
                          delete_before_replace=news.get("dbr"))

    def update(self, id_, olds, news):
        CALLS.append(f"update {id_} v={int(news['v'])}")
        return UpdateResult({"tag": news["tag"], "v": news["v"], "updated": True})

    def delete(self, id_, props):
        CALLS.append(f"delete {id_} made={props.get('made')}")


class Recorded(pulumi.dynamic.Resource):
    made: pulumi.Output[bool]

    def __init__(self, tag: str, opts: pulumi.ResourceOptions | None = None, **inputs):
        super().__init__(Recorder(), tag, {"tag": tag, "made": None, **inputs}, opts)


def program(spec: dict[str, dict]):
    """``a`` and, when ``spec`` has it, ``b`` depending on ``a``."""
    def run() -> None:
        a = Recorded("a", pulumi.ResourceOptions(
            delete_before_replace=spec["a"].pop("option_dbr", None)), **spec["a"])
        if "b" in spec:
            b = dict(spec["b"])
            if b.pop("from_a", False):
                b["src"] = a.made
            Recorded("b", pulumi.ResourceOptions(depends_on=[a]), **b)
    return run


def up(engine: Engine, spec: dict[str, dict]) -> list[str]:
    """One ``pulumi up`` of the program: its steps, then the deletes the engine makes after
    them; the provider calls made, in order."""
    CALLS.clear()
    run_program(engine, "recorded", {}, program=program({k: dict(v) for k, v in spec.items()}))
    assert not engine.delete_resources(engine.unregistered())
    return list(CALLS)


def test_a_resource_is_checked_against_its_old_inputs_and_keeps_only_what_create_returned():
    engine = Engine()
    assert up(engine, {"a": {"v": 1, "extra": "x"}}) == ["check a olds=[]", "create a v=1"]
    (urn,) = engine.state
    _id, outs = engine.state[urn]
    assert "extra" not in outs and outs["made"] is True and "__provider" in outs
    calls = up(engine, {"a": {"v": 1, "extra": "x"}})
    assert calls[0] == "check a olds=['extra', 'tag', 'v']", calls  # inputs: 'extra' is one
    assert calls[1:] == ["diff a-1 olds.made=True"]


def test_a_change_without_replaces_updates_in_place_and_the_outputs_are_updates():
    engine = Engine()
    up(engine, {"a": {"v": 1}})
    assert up(engine, {"a": {"v": 2}})[-1] == "update a-1 v=2"
    (_id, outs), = engine.state.values()
    assert outs.get("updated") is True and "made" not in outs, outs


def test_a_replacement_creates_first_and_deletes_the_old_one_after_the_run():
    engine = Engine()
    up(engine, {"a": {"v": 1, "replace": True}, "b": {"v": 1}})
    calls = up(engine, {"a": {"v": 2, "replace": True}, "b": {"v": 1}})
    assert calls.index("create a v=2") < calls.index("diff b-1 olds.made=True") \
        < calls.index("delete a-1 made=True"), calls
    assert [i for i, _ in engine.state.values()][:1] == ["a-2"]


@pytest.mark.parametrize(("diff_says", "option", "first"), [
    (True, None, True), (None, None, False), (True, False, False), (None, True, True)])
def test_delete_before_replace_is_the_diffs_unless_the_resource_option_says(
        diff_says, option, first):
    engine = Engine()
    spec = {"v": 1, "replace": True, "dbr": diff_says, "option_dbr": option}
    up(engine, {"a": spec})
    calls = up(engine, {"a": {**spec, "v": 2}})
    deleted, created = calls.index("delete a-1 made=True"), calls.index("create a v=2")
    assert (deleted < created) == first, calls


@pytest.mark.parametrize("follow", [True, False])
def test_a_delete_first_replacement_deletes_first_the_dependents_it_would_replace(follow):
    """``b`` takes an input from ``a``: asked with it unknown, its diff says replace (or
    not); replaced, ``b`` is deleted before ``a`` and created again after it."""
    engine = Engine()
    a = {"v": 1, "replace": True, "dbr": True}
    b = {"v": 1, "from_a": True, "follow": follow}
    up(engine, {"a": a, "b": b})
    calls = up(engine, {"a": {**a, "v": 2}, "b": b})
    if follow:
        assert calls.index("delete b-1 made=True") < calls.index("delete a-1 made=True") \
            < calls.index("create a v=2") < calls.index("create b v=1"), calls
    else:
        assert "delete b-1 made=True" not in calls and "create b v=1" not in calls, calls


def test_an_unknown_diff_is_decided_by_comparing_the_inputs():
    engine = Engine()
    up(engine, {"a": {"v": 1, "diff_unknown": True}})
    assert "update a-1 v=1" not in up(engine, {"a": {"v": 1, "diff_unknown": True}})
    assert up(engine, {"a": {"v": 1, "diff_unknown": True, "more": 1}})[-1] == \
        "update a-1 v=1"


def test_what_the_program_no_longer_declares_is_deleted_through_its_provider():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    assert up(engine, {"a": {"v": 1}})[-1] == "delete b-1 made=True"
    assert [u.rsplit("::", 1)[-1] for u in engine.state] == ["a"]


def test_destroy_deletes_each_dynamic_resource_dependents_first():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    CALLS.clear()
    assert engine.delete_resources(list(engine.state)) == {}
    assert CALLS == ["delete b-1 made=True", "delete a-1 made=True"]
    assert engine.state == {}


def test_a_failed_delete_keeps_it_and_what_it_depends_on():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    b = next(u for u in engine.state if u.endswith("::b"))
    _id, outs = engine.state[b]
    engine.state[b] = (_id, {**outs, "__provider": "not a pickle"})
    failed = engine.delete_resources(list(engine.state), go_on=True)
    assert list(failed) == [b]
    assert b in engine.state and any(u.endswith("::a") for u in engine.state)


def test_a_preview_never_creates_updates_or_deletes():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    scratch = Engine(state=dict(engine.state), old_inputs=dict(engine.old_inputs),
                     known=dict(engine.known), dry_run=True)
    CALLS.clear()
    run_program(scratch, "recorded", {}, program=program({"a": {"v": 2, "replace": True}}))
    assert not [c for c in CALLS if c.split()[0] in ("create", "update", "delete")], CALLS
    assert scratch.actions[next(u for u in scratch.state if u.endswith("::a"))][0] == \
        docker_provider.REPLACE


def test_a_previews_update_leaves_unknown_what_the_inputs_do_not_give():
    """A provider without provider previews hands back its new inputs as the state of a
    previewed update: ``a.made`` (an output the inputs leave unset) is unknown to what reads
    it, not the value the last ``up`` gave (the stand-in kept the old outputs)."""
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1, "from_a": True}})
    scratch = Engine(state=dict(engine.state), old_inputs=dict(engine.old_inputs),
                     known=dict(engine.known), dry_run=True)
    run_program(scratch, "recorded", {}, program=program({"a": {"v": 2},
                                                          "b": {"v": 1, "from_a": True}}))
    a = next(u for u in scratch.state if u.endswith("::a"))
    b = next(u for u in scratch.state if u.endswith("::b"))
    assert scratch.actions[a][0] == docker_provider.UPDATE
    assert isinstance(scratch.old_inputs[b]["src"], pulumi.output.Unknown), \
        scratch.old_inputs[b]
