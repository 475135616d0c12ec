"""Decisions kept in a stack's config (core/decisions.py): the placement's form, when it still
holds, and the decision that keeps it or places the session anew beside the kept ones."""

from __future__ import annotations

import json

import pytest

from cluster_sessions.core import decisions
from cluster_sessions.core.decisions import KeptPlacement, Shape, decide, replace_reason
from cluster_sessions.core.placement import Free, Placement, Request, Slot, holds
from cluster_sessions.core.plan import build_plans, pool_capacity
from cluster_sessions.core.spec import Pool, Session

from . import factories

GIB = 2**30


def pool_of(*agents: dict, swarm: str | None = None, **more) -> Pool:
    extra = {"swarm": {"manager": swarm}, **more} if swarm else more
    return Pool.model_validate(factories.pool("p", *agents, **extra))


def session_of(name: str = "sess", gpu: int = 0, count: int = 1, **over) -> Session:
    doc = factories.session(name, pool="p", **over)
    doc["resources"]["gpu"] = gpu
    if count > 1:
        doc["count"] = count
    return Session.model_validate(doc)


def two_agents() -> Pool:
    return pool_of(factories.agent("a1", cpu=2, mem="4g", gpus=[0, 1]),
                   factories.agent("a2", cpu=2, mem="4g", gpus=[0, 1]), swarm="a1")


def test_a_kept_placement_reads_back_what_it_wrote():
    kept = KeptPlacement(Shape("p", "multi-node", 2, 1000, GIB, 1),
                         (Slot("a1", (0,)), Slot("a2", (1,))))
    assert KeptPlacement.from_config(kept.to_config()) == kept
    assert json.loads(kept.to_config()) == {
        "shape": {"pool": "p", "mode": "multi-node", "size": 2, "millicpu": 1000,
                  "mem": GIB, "gpu": 1},
        "slots": [["a1", [0]], ["a2", [1]]]}


@pytest.mark.parametrize("text", [
    "[]", "{}", '{"shape": {}, "slots": []}',
    # a size that is not the slots' count, a GPU id that is a bool or negative, a float size
    '{"shape":{"pool":"p","mode":"single-node","size":2,"millicpu":1,"mem":1,"gpu":0},'
    '"slots":[["a1",[]]]}',
    '{"shape":{"pool":"p","mode":"single-node","size":1,"millicpu":1,"mem":1,"gpu":1},'
    '"slots":[["a1",[true]]]}',
    '{"shape":{"pool":"p","mode":"single-node","size":1,"millicpu":1,"mem":1,"gpu":1},'
    '"slots":[["a1",[-1]]]}',
    '{"shape":{"pool":"p","mode":"single-node","size":1.0,"millicpu":1,"mem":1,"gpu":0},'
    '"slots":[["a1",[]]]}',
    '{"shape":{"pool":"p","mode":"single-node","size":1,"millicpu":1,"mem":1,"gpu":0},'
    '"slots":[["a1",[]]],"extra":1}',
    "not json",
])
def test_anything_but_a_placement_is_refused(text):
    with pytest.raises(ValueError):
        KeptPlacement.from_config(text)


def kept_for(session: Session, pool: Pool, *slots: Slot) -> KeptPlacement:
    return KeptPlacement(Shape.of(session, pool), slots)


def test_a_placement_holds_while_the_shape_and_the_pool_keep_it():
    pool = two_agents()
    s = session_of(mode="multi-node", size=2, cpu=1, mem="1g", gpu=1)
    kept = kept_for(s, pool, Slot("a1", (1,)), Slot("a2", (0,)))
    assert replace_reason(kept, s, pool) is None
    assert replace_reason(None, s, pool) == "it has not been placed yet"
    bigger = session_of(mode="multi-node", size=3, cpu=1, mem="1g", gpu=1)
    assert replace_reason(kept, bigger, pool) == "its shape changed (size 2 -> 3)"
    more_mem = session_of(mode="multi-node", size=2, cpu=1, mem="2g", gpu=1)
    assert replace_reason(kept, more_mem, pool) == \
        f"its shape changed (mem {GIB} -> {2 * GIB})"
    shrunk = pool_of(factories.agent("a1", cpu=2, mem="4g", gpus=[0, 1]), swarm="a1")
    assert replace_reason(kept, s, shrunk) == "agent a2 it runs on is no longer in pool p"
    fewer_gpus = pool_of(factories.agent("a1", cpu=2, mem="4g", gpus=[0]),
                         factories.agent("a2", cpu=2, mem="4g", gpus=[0, 1]), swarm="a1")
    assert replace_reason(kept, s, fewer_gpus) == \
        "GPU 1 it holds is no longer declared on agent a1"
    no_swarm = pool_of(factories.agent("a1", cpu=2, mem="4g", gpus=[0, 1]),
                       factories.agent("a2", cpu=2, mem="4g", gpus=[0, 1]))
    assert replace_reason(kept, s, no_swarm) == \
        "it spans several agents and pool p has no swarm manager now"


def test_holds_checks_every_slot_and_the_very_gpu_ids():
    req = Request(1000, GIB, 1)
    free = [Free("a1", 2000, 2 * GIB, (1,)), Free("a2", 1000, GIB, (0, 1))]
    assert holds(free, Placement((Slot("a1", (1,)), Slot("a2", (0,)))), req)
    assert not holds(free, Placement((Slot("a1", (0,)),)), req)  # GPU 0 of a1 is taken
    assert not holds(free, Placement((Slot("a2", (0,)), Slot("a2", (1,)))), req)  # cpu
    assert not holds(free, Placement((Slot("a1", (1,)), Slot("a1", (1,)))), req)  # twice
    assert not holds(free, Placement((Slot("gone", ()),)), Request(1, 1, 0))


def test_a_running_session_keeps_its_placement_whoever_came_or_left():
    pool = two_agents()
    s = session_of(cpu=1, mem="1g")
    # placed on a2 when a1 was full; a1 is empty now: it stays on a2
    kept = kept_for(s, pool, Slot("a2", ()))
    decided = decide([s], pool, pool_capacity(pool), {s.name: kept})
    assert decided.notes == {s.name: "kept"}
    assert [c.agent for c in decided.plans[0].containers] == ["a2"]


def test_a_changed_shape_is_placed_again_and_says_why():
    pool = two_agents()
    s = session_of(cpu=2, mem="1g")
    kept = kept_for(session_of(cpu=1, mem="1g"), pool, Slot("a2", ()))
    free = [Free("a1", 2000, 4 * GIB, ()), Free("a2", 1000, 4 * GIB, ())]
    decided = decide([s], pool, free, {s.name: kept})
    assert decided.notes == {s.name: "its shape changed (millicpu 1000 -> 2000)"}
    assert [c.agent for c in decided.plans[0].containers] == ["a1"]


def test_a_stopped_session_whose_place_was_taken_is_placed_elsewhere():
    pool = two_agents()
    s = session_of(cpu=2, mem="1g")
    kept = kept_for(s, pool, Slot("a1", ()))
    free = [Free("a1", 0, 4 * GIB, ()), Free("a2", 2000, 4 * GIB, ())]
    decided = decide([s], pool, free, {s.name: kept})
    assert decided.notes == {s.name: "what it held was taken by others while it was not "
                             "running"}
    assert [c.agent for c in decided.plans[0].containers] == ["a2"]


def test_new_sessions_are_placed_beside_the_kept_ones():
    pool = pool_of(factories.agent("a1", cpu=2, mem="4g"))
    first, second = session_of("sess-1", cpu=1, mem="1g"), session_of("sess-2", cpu=1,
                                                                       mem="1g")
    kept = {first.name: kept_for(first, pool, Slot("a1", ())), second.name: None}
    # what is free besides these two sessions' own holdings: one cpu (someone else holds one)
    decided = decide([first, second], pool, [Free("a1", 1000, 4 * GIB, ())], kept)
    assert decided.plans[1].pending and "short of cpu" in decided.plans[1].reason
    decided = decide([first, second], pool, [Free("a1", 2000, 4 * GIB, ())], kept)
    assert [p.status for p in decided.plans] == ["scheduled", "scheduled"]
    assert decided.notes == {first.name: "kept", second.name: "it has not been placed yet"}


def test_build_plans_keeps_given_placements_and_counts_them_as_taken():
    pool = pool_of(factories.agent("a1", cpu=2, mem="4g", gpus=[0, 1]),
                   factories.agent("a2", cpu=2, mem="4g", gpus=[0, 1]), swarm="a1")
    s = session_of("sweep", count=2, cpu=2, mem="1g", gpu=1)
    plans = build_plans(s, pool, kept={"sweep-1": Placement((Slot("a2", (1,)),))})
    assert [(c.agent, c.gpus) for p in plans for c in p.containers] == [
        ("a2", (1,)), ("a1", (0,))]


def test_stack_ids_are_random_hex_and_checked():
    ids = {decisions.new_stack_id() for _ in range(50)}
    assert len(ids) == 50 and all(decisions.valid_stack_id(i) for i in ids)
    assert not decisions.valid_stack_id("ABCDEF0123456789")
    assert not decisions.valid_stack_id("0123456789abcde")
    assert not decisions.valid_stack_id(None)


def test_a_roundrobin_pool_places_after_the_agent_its_last_decision_chose():
    pool = pool_of(factories.agent("a1", cpu=2, mem="4g"), factories.agent("a2", cpu=2, mem="4g"),
                   factories.agent("a3", cpu=2, mem="4g"), scheduler={"selector": "roundrobin"})
    s = session_of(cpu=1, mem="1g")
    free = pool_capacity(pool)
    assert [c.agent for c in decide([s], pool, free, {}, after="a1").plans[0].containers] \
        == ["a2"]
    assert [c.agent for c in decide([s], pool, free, {}, after="a3").plans[0].containers] \
        == ["a1"]
    assert [c.agent for c in decide([s], pool, free, {}).plans[0].containers] == ["a1"]


def test_a_gpu_session_placed_again_gets_none_of_the_gpus_its_old_containers_hold():
    """Pulumi replaces containers one at a time: a new container given GPU 1 while the old
    sub1 still runs on it would share it. A re-placed session's old GPUs stay taken (its cpu
    and memory do not: each old container goes before its replacement)."""
    pool = pool_of(factories.agent("a1", cpu=8, mem="16g", gpus=[0, 1, 2, 3]))
    old = session_of(size=2, cpu=1, mem="1g", gpu=1)
    new = session_of(size=2, cpu=2, mem="1g", gpu=1)
    kept = kept_for(old, pool, Slot("a1", (0,)), Slot("a1", (1,)))
    own = {new.name: {"a1": {0, 1}}}
    decided = decide([new], pool, pool_capacity(pool), {new.name: kept}, own_gpus=own)
    assert [c.gpus for c in decided.plans[0].containers] == [(2,), (3,)]
    # kept (its shape unchanged): it keeps its very GPUs
    decided = decide([old], pool, pool_capacity(pool), {old.name: kept}, own_gpus=own)
    assert [c.gpus for c in decided.plans[0].containers] == [(0,), (1,)]
    # no GPUs besides its own: pending, not sharing
    small = pool_of(factories.agent("a1", cpu=8, mem="16g", gpus=[0, 1]))
    decided = decide([new], small, pool_capacity(small), {new.name: kept}, own_gpus=own)
    assert decided.plans[0].pending and "short of gpu" in decided.plans[0].reason


# --- the one reader of what a stack keeps (read_kept) ------------------------------------------

MALFORMED = {
    "stack-id": "0123456789ABCDEF", "made-by": "a b", "placement": "[1]",
    "service-ports": '{"jupyter": 70000}', "image": '{"ref": "a"}', "expires-at": "-5",
}


def test_every_kept_key_has_one_form_and_a_malformed_example_here():
    assert set(decisions.KEPT_FORMS) == set(decisions.KEPT_KEYS) == set(MALFORMED)


@pytest.mark.parametrize("key", sorted(MALFORMED))
def test_a_kept_value_we_did_not_write_is_refused_naming_key_value_and_remedy(key):
    assert decisions.read_kept(key, None) is None and decisions.read_kept(key, "") is None
    with pytest.raises(decisions.MalformedDecision) as raised:
        decisions.read_kept(key, MALFORMED[key])
    error = raised.value
    assert isinstance(error, ValueError) and error.key == key
    assert str(error).startswith(f"{key} is {MALFORMED[key]!r}, not ")
    assert "sessionctl up" in error.remedy


def test_what_the_driver_writes_reads_back():
    kept = KeptPlacement(Shape("p", "single-node", 1, 1000, 2**30, 0), (Slot("a1", (0,)),))
    read = decisions.read_kept
    assert read("placement", kept.to_config()) == kept
    assert read("service-ports", '{"jupyter":30000}') == {"jupyter": 30000}
    assert read("expires-at", "1764633600") == 1764633600
    assert read("stack-id", "0123456789abcdef") == "0123456789abcdef"
    assert read("made-by", "ops@ci-7") == "ops@ci-7"


def test_where_a_decision_can_be_made_again_a_malformed_one_is_said_and_taken_as_none():
    said = []
    assert decisions.read_kept_or_again("placement", "[1]", said.append) is None
    assert said == ["placement is '[1]', not a placement sessionctl wrote"]
    assert decisions.read_kept_or_again("expires-at", "12", said.append) == 12
    assert decisions.read_kept_or_again("image", None, said.append) is None and len(said) == 1
    with pytest.raises(ValueError, match="made-by is 'a b', not user@host"):
        decisions.stack_identity("train", {"stack-id": "0123456789abcdef", "made-by": "a b"})


def test_the_program_and_the_driver_read_kept_decisions_only_through_the_reader():
    """No other module parses a kept value itself (the readers that were one per key)."""
    from pathlib import Path

    package = Path(decisions.__file__).parents[1]
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        for name in ("read_placement(", "read_image(", "read_expiry(", ".from_config("):
            if path.name != "decisions.py":
                assert name not in text, f"{path.relative_to(package)} calls {name}"


def test_a_label_is_found_as_the_provider_keeps_it_and_as_our_resources_do():
    from cluster_sessions.core.decisions import labelled
    from cluster_sessions.core.names import STACK_ID_LABEL

    provider = [{"inputs": {"labels": [{"label": STACK_ID_LABEL, "value": "0" * 16}]}}]
    ours = [{"inputs": {"labels": {STACK_ID_LABEL: "0" * 16}}}]  # SessionNetwork's
    assert labelled(provider, STACK_ID_LABEL) and labelled(ours, STACK_ID_LABEL)
    assert not labelled([{"inputs": {"labels": {"other": STACK_ID_LABEL + "x"}}}],
                        STACK_ID_LABEL)
    assert not labelled([], STACK_ID_LABEL) and not labelled([{"id": 7}], STACK_ID_LABEL)


def test_an_identity_is_carried_only_by_a_string_equal_to_it_anywhere_in_the_state():
    from cluster_sessions.core.decisions import carried

    sid = "0123456789abcdef"
    state = [{"urn": "u", "inputs": {"labels": [{"label": "cluster-sessions.stack-id",
                                                 "value": sid}]}}]
    assert carried(state, sid)
    assert carried([{"outputs": {"stack_id": sid}}], sid)
    assert not carried([{"inputs": {"labels": [{"value": sid + "0"}]}}], sid)  # not a part
    assert not carried([{"inputs": {sid: "x"}}], sid)  # a key is not a value carried
    assert not carried([], sid) and not carried(None, sid) and not carried([{"id": 7}], sid)
