"""Placement invariants, checked on generated pools (hypothesis) and on named cases."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_sessions.core.placement import Free, Placement, Request, place, take
from cluster_sessions.core.selectors import SELECTORS

requests = st.builds(
    Request,
    millicpu=st.integers(1, 8000),
    mem=st.integers(1, 64).map(lambda g: g * 1024**3 // 4),
    gpus=st.integers(0, 3),
)


@st.composite
def pools(draw):
    count = draw(st.integers(1, 12))
    agents = []
    for i in range(count):
        n_gpus = draw(st.integers(0, 8))
        first = draw(st.integers(0, 4))
        agents.append(Free(
            name=f"agent{i}",
            millicpu=draw(st.integers(0, 64_000)),
            mem=draw(st.integers(0, 256)) * 1024**3 // 4,
            gpus=tuple(range(first, first + n_gpus)),
        ))
    return agents


modes = st.sampled_from(["single-node", "multi-node"])
sizes = st.integers(1, 40)


def usage(slots, req):
    used = defaultdict(lambda: [0, 0, []])
    for slot in slots:
        used[slot.agent][0] += req.millicpu
        used[slot.agent][1] += req.mem
        used[slot.agent][2].extend(slot.gpus)
    return used


selectors = st.sampled_from(SELECTORS)
afters = st.one_of(st.none(), st.integers(0, 12).map(lambda i: f"agent{i}"))


@settings(max_examples=400, deadline=None)
@given(modes, sizes, requests, pools(), selectors, afters)
def test_placement_never_exceeds_an_agent_and_never_reuses_a_gpu(mode, size, req, agents,
                                                                 selector, after):
    result = place(mode, size, req, agents, selector, after)
    if result.pending:
        assert result.slots == ()
        return
    assert len(result.slots) == size
    by_name = {a.name: a for a in agents}
    for name, (cpu, mem, gpus) in usage(result.slots, req).items():
        agent = by_name[name]
        assert cpu <= agent.millicpu and mem <= agent.mem
        assert max(Counter(gpus).values(), default=1) == 1, "a GPU id given twice"
        assert set(gpus) <= set(agent.gpus)
    assert all(len(s.gpus) == req.gpus for s in result.slots)


@settings(max_examples=300, deadline=None)
@given(modes, sizes, requests, pools(), selectors, afters)
def test_placement_is_deterministic(mode, size, req, agents, selector, after):
    assert (place(mode, size, req, agents, selector, after)
            == place(mode, size, req, list(agents), selector, after))


@settings(max_examples=300, deadline=None)
@given(sizes, requests, pools(), st.sampled_from(SELECTORS))
def test_single_node_uses_one_agent_that_holds_it_or_is_pending_because_none_fits(
        size, req, agents, selector):
    """Which agent is the selector's (tests/test_selectors.py); any selector's is one that
    holds the whole session."""
    result = place("single-node", size, req, agents, selector)
    if result.pending:
        assert all(a.fits(req) < size for a in agents)
        assert "no single agent can hold" in result.reason
    else:
        assert len(result.agents) == 1
        by_name = {a.name: a for a in agents}
        assert by_name[result.agents[0]].fits(req) >= size


@settings(max_examples=400, deadline=None)
@given(sizes, requests, pools(), selectors, afters)
def test_multi_node_uses_the_fewest_agents_and_main1_goes_first(size, req, agents, selector,
                                                                after):
    result = place("multi-node", size, req, agents, selector, after)
    fits = sorted((a.fits(req) for a in agents), reverse=True)
    if result.pending:
        assert sum(fits) < size
        expected = f"of {size} containers" if size > 1 else "hold the container"
        assert expected in result.reason
        return
    used = len(result.agents)
    assert sum(fits[:used]) >= size
    assert sum(fits[:used - 1]) < size, "fewer agents could have held the session"
    if any(f >= size for f in fits):
        assert used == 1
    # containers of one agent are contiguous in host order, starting with main1's agent
    runs = [s.agent for i, s in enumerate(result.slots)
            if i == 0 or result.slots[i - 1].agent != s.agent]
    assert runs == list(result.agents)


def test_multi_node_collapses_to_one_agent_when_it_fits():
    req = Request(1000, 1024**3, 0)
    agents = [Free("small", 2000, 8 * 1024**3), Free("big", 8000, 16 * 1024**3)]
    result = place("multi-node", 4, req, agents)
    assert result.agents == ("big",)


def test_multi_node_spreads_biggest_agent_first():
    req = Request(1000, 1024**3, 0)
    agents = [Free("a", 1000, 8 * 1024**3), Free("b", 3000, 8 * 1024**3),
              Free("c", 2000, 8 * 1024**3)]
    result = place("multi-node", 5, req, agents)
    assert [s.agent for s in result.slots] == ["b", "b", "b", "c", "c"]


def test_gpu_ids_are_handed_out_per_container_in_order():
    req = Request(1000, 1024**3, 2)
    agents = [Free("g", 8000, 64 * 1024**3, (4, 5, 6, 7, 0, 1))]
    result = place("single-node", 3, req, agents)
    assert [s.gpus for s in result.slots] == [(4, 5), (6, 7), (0, 1)]


def test_pending_reason_names_what_each_agent_is_short_of():
    req = Request(2000, 4 * 1024**3, 1)
    agents = [Free("cpu-poor", 2000, 64 * 1024**3, (0, 1, 2, 3)),
              Free("gpu-poor", 64000, 64 * 1024**3, ())]
    reason = place("single-node", 4, req, agents).reason
    assert "cpu-poor holds 1 (short of cpu)" in reason
    assert "gpu-poor holds 0 (short of gpu)" in reason
    assert "cpu=2, mem=4g, gpu=1" in reason


def test_pending_multi_node_reason_counts_what_the_pool_holds():
    req = Request(1000, 1024**3, 0)
    agents = [Free("a", 2000, 64 * 1024**3), Free("b", 1000, 64 * 1024**3)]
    reason = place("multi-node", 4, req, agents).reason
    assert reason.startswith("the pool holds only 3 of 4 containers")
    assert reason.endswith("short of cpu")


def test_take_leaves_each_agent_what_the_placement_did_not_use():
    """count: K plans each session on what the ones before it left: CPU, memory and the GPU
    ids its containers took are gone from their agents, the other agents untouched."""
    gib = 1024**3
    req = Request(millicpu=1500, mem=2 * gib, gpus=1)
    agents = [Free("a1", 4000, 5 * gib, (0, 1, 2)), Free("a2", 8000, 16 * gib, (4, 5))]
    placement = place("multi-node", 3, req, agents)
    assert [s.agent for s in placement.slots] == ["a1", "a1", "a2"]
    assert take(agents, placement, req) == [
        Free("a1", 1000, 1 * gib, (2,)), Free("a2", 6500, 14 * gib, (5,))]
    assert take(agents, Placement(reason="pending"), req) == agents


def test_a_single_node_reason_names_every_short_resource_and_counts_the_rest():
    """At most five agents are described, each with every resource it is short of; the others
    are counted."""
    req = Request(millicpu=2000, mem=4 * 1024**3, gpus=0)
    agents = [Free(f"agent{i}", 1000, 1024**3) for i in range(1, 8)]
    reason = place("single-node", 2, req, agents).reason
    assert reason == ("no single agent can hold all 2 containers (cpu=2, mem=4g, gpu=0 each): "
                      + "; ".join(f"agent{i} holds 0 (short of cpu, mem)" for i in range(1, 6))
                      + ", and 2 more agents")
    assert place("single-node", 2, req, agents[:5]).reason.endswith("(short of cpu, mem)")
    assert place("single-node", 2, req, agents[:6]).reason.endswith(", and 1 more agents")
    assert place("single-node", 1, req, agents[:1]).reason == (
        "no single agent can hold the container (cpu=2, mem=4g, gpu=0 each): "
        "agent1 holds 0 (short of cpu, mem)")


def test_a_multi_node_reason_names_every_resource_the_pool_is_equally_short_of():
    req = Request(millicpu=1000, mem=1024**3, gpus=0)
    agents = [Free("a1", 2000, 2 * 1024**3), Free("a2", 1000, 1024**3)]
    assert place("multi-node", 4, req, agents).reason == (
        "the pool holds only 3 of 4 containers (cpu=1, mem=1g, gpu=0 each); short of cpu, mem")
