"""The pool's selectors (core/selectors.py), each over hand-built agents, and through place()
and build_plans() the way a pool's ``scheduler.selector`` reaches them."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_sessions.core.placement import Free, Request, place
from cluster_sessions.core.plan import build_plans
from cluster_sessions.core.selectors import (
    DEFAULT_SELECTOR,
    SELECTORS,
    Candidate,
    Criteria,
    concentrated,
    dispersed,
    roundrobin,
    select,
)
from cluster_sessions.core.spec import Pool, Session
from cluster_sessions.driver.cli import main

from . import factories

GIB = 1024**3
CPU_ONLY = Request(1000, GIB, 0)
ONE_GPU = Request(1000, GIB, 1)


def candidates(*frees: Free) -> list[Candidate]:
    return [Candidate(i, f) for i, f in enumerate(frees)]


def chosen(strategy, frees, req=CPU_ONLY, count=1, after=None) -> str:
    return strategy(candidates(*frees), Criteria(req, count, after)).free.name


# concentrated: the fullest that fits

def test_concentrated_takes_the_agent_with_the_least_cpu_left():
    frees = [Free("roomy", 8000, 16 * GIB), Free("full", 2000, 16 * GIB),
             Free("middle", 4000, 16 * GIB)]
    assert chosen(concentrated, frees) == "full"


def test_concentrated_compares_free_gpus_before_cpu_and_memory():
    frees = [Free("two-gpus", 1000, GIB, (0, 1)), Free("one-gpu", 64000, 64 * GIB, (3,))]
    assert chosen(concentrated, frees, ONE_GPU) == "one-gpu"


def test_concentrated_compares_memory_when_gpus_and_cpu_are_equal():
    frees = [Free("a", 4000, 32 * GIB), Free("b", 4000, 8 * GIB)]
    assert chosen(concentrated, frees) == "b"


def test_concentrated_keeps_a_cpu_session_off_an_agent_with_a_free_gpu():
    frees = [Free("gpu-host", 1000, GIB, (0,)), Free("cpu-host", 64000, 64 * GIB)]
    assert chosen(concentrated, frees) == "cpu-host"


def test_concentrated_breaks_ties_by_pool_order():
    frees = [Free("first", 4000, 8 * GIB), Free("second", 4000, 8 * GIB)]
    assert chosen(concentrated, frees) == "first"
    assert chosen(concentrated, frees[::-1]) == "second"


# dispersed: the emptiest

def test_dispersed_takes_the_agent_with_the_most_cpu_left():
    frees = [Free("middle", 4000, 16 * GIB), Free("roomy", 8000, 16 * GIB),
             Free("full", 2000, 16 * GIB)]
    assert chosen(dispersed, frees) == "roomy"


def test_dispersed_compares_free_gpus_before_cpu_and_memory():
    frees = [Free("one-gpu", 64000, 64 * GIB, (3,)), Free("two-gpus", 1000, GIB, (0, 1))]
    assert chosen(dispersed, frees, ONE_GPU) == "two-gpus"


def test_dispersed_keeps_a_cpu_session_off_an_agent_with_a_free_gpu():
    frees = [Free("gpu-host", 64000, 64 * GIB, (0,)), Free("cpu-host", 1000, GIB)]
    assert chosen(dispersed, frees) == "cpu-host"


def test_dispersed_breaks_ties_by_pool_order():
    frees = [Free("first", 4000, 8 * GIB), Free("second", 4000, 8 * GIB)]
    assert chosen(dispersed, frees) == "first"


# roundrobin: the next agent in pool order after the one chosen last

def test_roundrobin_without_a_last_choice_takes_the_first_candidate():
    frees = [Free("a", 1000, GIB), Free("b", 8000, GIB)]
    assert chosen(roundrobin, frees) == "a"


def test_roundrobin_takes_the_next_candidate_after_the_last_choice_and_wraps_around():
    cs = [Candidate(0, Free("a", 1000, GIB)), Candidate(2, Free("c", 1000, GIB)),
          Candidate(3, Free("d", 1000, GIB))]
    pick = [roundrobin(cs, Criteria(CPU_ONLY, 1, after)).free.name for after in (0, 1, 2, 3)]
    assert pick == ["c", "c", "d", "a"]  # after b (1, not a candidate now): c; after d: a


def test_roundrobin_ignores_how_full_the_agents_are():
    frees = [Free("full", 1000, GIB), Free("roomy", 64000, 64 * GIB, (0, 1))]
    assert chosen(roundrobin, frees, after=1) == "full"


def test_select_dispatches_by_the_selectors_name():
    frees = candidates(Free("roomy", 8000, 16 * GIB), Free("full", 2000, 16 * GIB))
    criteria = Criteria(CPU_ONLY, 1, 0)
    assert [select(s, frees, criteria).free.name for s in SELECTORS] == ["full", "roomy",
                                                                         "full"]


# what place() hands a selector, and properties over generated agents

free_agents = st.lists(
    st.builds(lambda c, m, g: (c * 500, m * GIB, tuple(range(g))),
              st.integers(0, 16), st.integers(0, 16), st.integers(0, 3)),
    min_size=1, max_size=8,
).map(lambda rows: [Free(f"agent{i}", *row) for i, row in enumerate(rows)])
requests = st.builds(Request, st.integers(1, 4).map(lambda c: c * 500),
                     st.integers(1, 4).map(lambda g: g * GIB), st.integers(0, 2))


def _dominates(a: Free, b: Free, sign: int) -> bool:
    """``a`` is at least as full (sign 1) or as empty (sign -1) as ``b`` in every resource and
    strictly more in one."""
    pairs = [(len(a.gpus), len(b.gpus)), (a.millicpu, b.millicpu), (a.mem, b.mem)]
    return (all(sign * x <= sign * y for x, y in pairs)
            and any(sign * x < sign * y for x, y in pairs))


@settings(max_examples=300, deadline=None)
@given(free_agents, requests, st.integers(1, 4), st.sampled_from([1, -1]))
def test_no_agent_that_fits_is_fuller_or_emptier_in_every_resource_than_the_one_chosen(
        agents, req, size, sign):
    """concentrated (sign 1) never passes over an agent fuller in every resource, dispersed
    (-1) never one emptier, among agents alike in offering an unwanted GPU."""
    selector = "concentrated" if sign == 1 else "dispersed"
    result = place("single-node", size, req, agents, selector)
    fitting = [a for a in agents if a.fits(req) >= size]
    if not fitting:
        assert result.pending
        return
    [name] = result.agents
    pick = next(a for a in agents if a.name == name)
    alike = [a for a in fitting if (req.gpus == 0 and bool(a.gpus)) == (
        req.gpus == 0 and bool(pick.gpus))]
    assert not any(_dominates(a, pick, sign) for a in alike)
    if req.gpus == 0 and pick.gpus:
        assert all(a.gpus for a in fitting), "a GPU host chosen while a host without one fits"


@settings(max_examples=300, deadline=None)
@given(free_agents, requests, st.integers(1, 4), st.integers(-1, 9))
def test_roundrobin_chooses_the_first_fitting_agent_after_the_last_one_in_pool_order(
        agents, req, size, last):
    after = f"agent{last}" if last >= 0 else None
    result = place("single-node", size, req, agents, "roundrobin", after)
    fitting = [i for i, a in enumerate(agents) if a.fits(req) >= size]
    if not fitting:
        assert result.pending
        return
    expected = next((i for i in fitting if after is not None and i > last), fitting[0])
    assert result.agents == (f"agent{expected}",)


def test_multi_node_that_fits_one_agent_goes_to_the_selectors_agent():
    agents = [Free("roomy", 16000, 64 * GIB), Free("snug", 4000, 64 * GIB)]
    assert place("multi-node", 4, CPU_ONLY, agents, "concentrated").agents == ("snug",)
    assert place("multi-node", 4, CPU_ONLY, agents, "dispersed").agents == ("roomy",)


def test_multi_node_spread_keeps_fewest_agents_biggest_first_whatever_the_selector():
    agents = [Free("a", 1000, 8 * GIB), Free("b", 3000, 8 * GIB), Free("c", 2000, 8 * GIB)]
    for selector in SELECTORS:
        result = place("multi-node", 5, CPU_ONLY, agents, selector, "c")
        assert [s.agent for s in result.slots] == ["b", "b", "b", "c", "c"]


# the pool's field, through build_plans

def pool(selector: str | None, *cpus: int) -> Pool:
    agents = [factories.agent(f"agent{i + 1}", cpu=c, mem="64g") for i, c in enumerate(cpus)]
    doc = factories.pool("lab", *agents)
    if selector is not None:
        doc["scheduler"] = {"selector": selector}
    return Pool.model_validate(doc)


def session(**over) -> Session:
    return Session.model_validate({**factories.session("train-demo", "lab", "img", size=1,
                                                       cpu=2, mem="4g"), **over})


def test_a_pool_without_a_scheduler_uses_the_default_selector_concentrated():
    assert DEFAULT_SELECTOR == "concentrated"
    assert pool(None, 8).scheduler.selector == "concentrated"
    (plan,) = build_plans(session(), pool(None, 16, 4, 8))
    assert plan.agents == ("agent2",)


def test_build_plans_places_with_the_pools_selector():
    plans = {s: build_plans(session(), pool(s, 16, 4, 8))[0].agents for s in SELECTORS}
    assert plans == {"concentrated": ("agent2",), "dispersed": ("agent1",),
                     "roundrobin": ("agent1",)}


def test_roundrobin_count_sessions_take_turns_from_after_the_last_choice():
    plans = build_plans(session(count=4), pool("roundrobin", 8, 8, 8), after="agent1")
    assert [p.agents for p in plans] == [("agent2",), ("agent3",), ("agent1",), ("agent2",)]


def test_count_sessions_fill_the_fullest_agent_first_when_concentrated():
    plans = build_plans(session(count=3), pool("concentrated", 8, 4, 8))
    assert [p.agents for p in plans] == [("agent2",), ("agent2",), ("agent1",)]


def test_count_sessions_spread_over_the_emptiest_agents_when_dispersed():
    plans = build_plans(session(count=3), pool("dispersed", 8, 4, 8))
    assert [p.agents for p in plans] == [("agent1",), ("agent3",), ("agent1",)]


def test_a_misspelt_selector_exits_2_naming_the_pool_file_and_field(tmp_path, capsys):
    doc = factories.pool("lab", factories.agent("agent1"), scheduler={"selector": "disperse"})
    pool_file = factories.write(tmp_path / "pool.yaml", doc)
    definition = factories.write(tmp_path / "s.yaml",
                                 factories.session("train-demo", str(pool_file)))
    for verb in ("validate", "plan"):
        assert main([verb, str(pool_file if verb == "validate" else definition)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and "Traceback" not in err
        assert (f"{pool_file}: scheduler.selector: must be 'concentrated', 'dispersed' or "
                f"'roundrobin', got 'disperse'; did you mean 'dispersed'?") in err


def test_plan_json_shows_the_agent_the_pools_selector_chose(tmp_path, capsys):
    agents = [factories.agent("big", cpu=16), factories.agent("small", cpu=4)]
    for selector, agent in (("concentrated", "small"), ("dispersed", "big")):
        doc = factories.pool("lab", *agents, scheduler={"selector": selector})
        definition = factories.write_pair(tmp_path, factories.session("train-demo", cpu=2),
                                          doc)
        assert main(["plan", "--json", str(definition)]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert [c["agent"] for c in plan["containers"]] == [agent]
