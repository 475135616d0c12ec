"""Preemption's decision (core/preemption.py, issue 44 part 5): which running sessions a
higher-priority session may end to fit, as plain data. The Docker test of the whole path is
tests/test_preemption_engine.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_sessions.core.capacity_types import Free, Request
from cluster_sessions.core.placement import place
from cluster_sessions.core.preemption import Hold, Running, choose_victims, eligible, freed

G = 1 << 30


def run(name, priority, *, cpu=1000, mem=G, agent="a1", gpus=(), preemptible=True,
        kind="batch", started=0.0):
    return Running(name, priority, preemptible, kind, started,
                   (Hold(agent, cpu, mem, tuple(gpus)),), key=name)


def fits_single(size, req):
    return lambda free: not place("single-node", size, req, free).pending


DECLARED = [Free("a1", 4000, 4 * G, (0, 1)), Free("a2", 4000, 4 * G)]
NOTHING_FREE = [Free("a1", 0, 0), Free("a2", 0, 0)]


def test_nobody_is_ended_when_the_session_fits_already():
    assert choose_victims(50, [run("low", 0)], DECLARED, DECLARED,
                          fits_single(1, Request(1000, G, 0))) == []


def test_only_preemptible_batch_sessions_of_a_strictly_lower_priority_are_victims():
    running = [run("equal", 10), run("higher", 20), run("keeps", 0, preemptible=False),
               run("shell", 0, kind="interactive"), run("low", 5)]
    assert [r.name for r in eligible(10, running)] == ["low"]
    need = fits_single(1, Request(1000, G, 0))
    free = [Free("a1", 0, 0), Free("a2", 0, 0)]
    assert [v.name for v in choose_victims(10, running, free, DECLARED, need)] == ["low"]
    # without the one eligible session, the others are never taken: it stays pending
    assert choose_victims(10, running[:4], free, DECLARED, need) is None


def test_the_lowest_priority_goes_first_then_the_youngest():
    running = [run("old-1", 1, started=100), run("young-1", 1, started=200),
               run("zero", 0, started=50)]
    assert [r.name for r in eligible(5, running)] == ["zero", "young-1", "old-1"]
    need = fits_single(1, Request(1000, G, 0))
    assert [v.name for v in choose_victims(5, running, NOTHING_FREE, DECLARED, need)] == [
        "zero"]
    # among equals of priority, the youngest is ended, the older keeps running
    assert [v.name for v in choose_victims(5, running[:2], NOTHING_FREE, DECLARED, need)] == [
        "young-1"]


def test_nobody_is_ended_when_ending_them_all_would_still_not_make_room():
    running = [run("low", 0, cpu=1000, mem=G)]
    need = fits_single(1, Request(3000, G, 0))  # 1 cpu freed of 3 wanted
    assert choose_victims(10, running, NOTHING_FREE, DECLARED, need) is None


def test_a_victim_that_was_not_needed_is_given_back():
    # the lowest priority is taken first, but ends up not needed: the one on a2 alone makes
    # room for a 3-cpu container on a2, and a1's cpu cannot join it there (single-node)
    running = [run("tiny", 0, cpu=500, mem=G, agent="a1"),
               run("big", 1, cpu=3000, mem=2 * G, agent="a2")]
    free = [Free("a1", 1000, 2 * G), Free("a2", 1000, 2 * G)]
    need = fits_single(1, Request(3000, G, 0))
    assert [v.name for v in choose_victims(9, running, free, DECLARED, need)] == ["big"]


def test_what_a_victim_frees_never_passes_what_its_agent_declares():
    forged = Running("forged", 0, True, "batch", 0.0, (Hold("a1", 10**9, 10**15, (0, 7)),))
    (a1, _) = freed(NOTHING_FREE, {d.name: d for d in DECLARED}, [forged])
    assert (a1.millicpu, a1.mem, a1.gpus) == (4000, 4 * G, (0,))  # GPU 7 is not declared


def test_gpus_are_freed_by_id():
    running = [run("gpu-job", 0, cpu=0, mem=0, gpus=(1,))]
    free = [Free("a1", 4000, 4 * G, (0,)), Free("a2", 0, 0)]
    need = fits_single(1, Request(1000, G, 2))
    assert [v.name for v in choose_victims(1, running, free, DECLARED, need)] == ["gpu-job"]


# --- properties --------------------------------------------------------------------------

AGENTS = ("a1", "a2", "a3")


@st.composite
def scenario(draw):
    declared = [Free(a, draw(st.integers(1, 8)) * 1000, draw(st.integers(1, 8)) * G,
                     tuple(range(draw(st.integers(0, 3))))) for a in AGENTS]
    running = []
    used = {d.name: [0, 0, set()] for d in declared}
    for i in range(draw(st.integers(0, 7))):
        d = draw(st.sampled_from(declared))
        cpu = draw(st.integers(0, 4)) * 500
        mem = draw(st.integers(0, 4)) * (G // 2)
        gpus = draw(st.sets(st.sampled_from(d.gpus), max_size=2)) if d.gpus else set()
        u = used[d.name]
        if u[0] + cpu > d.millicpu or u[1] + mem > d.mem or gpus & u[2]:
            continue
        u[0], u[1] = u[0] + cpu, u[1] + mem
        u[2] |= gpus
        running.append(Running(f"s{i}", draw(st.integers(0, 10)), draw(st.booleans()),
                               draw(st.sampled_from(("batch", "interactive"))),
                               draw(st.floats(0, 1000)),
                               (Hold(d.name, cpu, mem, tuple(sorted(gpus))),), key=f"s{i}"))
    free = [Free(d.name, d.millicpu - used[d.name][0], d.mem - used[d.name][1],
                 tuple(g for g in d.gpus if g not in used[d.name][2])) for d in declared]
    mode = draw(st.sampled_from(("single-node", "multi-node")))
    size = draw(st.integers(1, 4))
    req = Request(draw(st.integers(1, 4)) * 500, draw(st.integers(1, 4)) * (G // 2),
                  draw(st.integers(0, 1)))
    return declared, running, free, draw(st.integers(0, 11)), mode, size, req


@settings(max_examples=400)
@given(scenario())
def test_victims_are_eligible_their_ending_makes_it_fit_and_none_is_spare(case):
    declared, running, free, priority, mode, size, req = case

    def fits(f):
        return not place(mode, size, req, f).pending

    top = {d.name: d for d in declared}
    victims = choose_victims(priority, running, free, declared, fits)
    if victims is None:
        # nobody is ended only when ending every eligible session would not make room
        assert not fits(freed(free, top, eligible(priority, running)))
        return
    for v in victims:  # never of an equal or higher priority, never one that did not ask
        assert v.priority < priority and v.preemptible and v.type == "batch"
    assert len({v.key for v in victims}) == len(victims)
    assert fits(freed(free, top, victims))  # the result fits
    for v in victims:  # minimal: without any one of them it would not fit
        assert not fits(freed(free, top, [w for w in victims if w is not v]))
    if fits(free):
        assert victims == []


# --- what the driver reads as running (driver/placing.py running_sessions) ---------------


def test_the_running_sessions_are_read_by_stack_and_exclude_those_under_way_and_our_own():
    from types import SimpleNamespace

    from cluster_sessions.agents.engine import Owner
    from cluster_sessions.agents.facts import HeldContainer
    from cluster_sessions.driver.ending import Candidate
    from cluster_sessions.driver.placing import running_sessions

    def held(session, stack, cpu, started):
        return HeldContainer("id", f"{session}-main1", session, "sid", "main1", "running",
                             cpu, G, (), owner=Owner(stack_id=stack), started_at=started)

    def cand(session, stack, priority=1):
        return Candidate(session, session, f"/{session}.yaml", None, None, None, "batch",
                         None, stack, None, priority=priority, preemptible=True)

    reports = [SimpleNamespace(name="a1", held=[
        held("job", "s-job", 1000, "2026-01-02T03:04:05.123Z"),
        held("job", "s-other", 9000, None),  # another stack's session of the same name
        held("busy", "s-busy", 1000, None), held("me", "s-me", 1000, None)]),
        SimpleNamespace(name="a2", held=[held("job", "s-job", 500, "2026-01-02T03:04:09Z")])]
    found = [cand("job", "s-job"), cand("busy", "s-busy"), cand("me", "s-me"),
             cand("gone", "s-gone"), cand("old", None)]
    under_way = [SimpleNamespace(identity="s-busy")]
    got = running_sessions(reports, under_way, found, {"me": "s-me"})  # type: ignore[arg-type]
    assert list(got) == ["s-job"]  # busy: its up is under way; me: being placed; gone: none
    _, job = got["s-job"]
    assert {(h.agent, h.millicpu) for h in job.holds} == {("a1", 1000), ("a2", 500)}
    assert job.started == 1767323049.0  # the youngest container's start
    assert (job.priority, job.preemptible, job.type, job.key) == (1, True, "batch", "s-job")


def test_freed_gives_back_what_victims_hold_on_each_agent_capped_at_its_declaration():
    free = [Free("a1", 500, G, (1,)), Free("a2", 0, 0), Free("a3", 100, 10)]
    victims = [run("v1", 0, cpu=3000, mem=2 * G, gpus=(0,)),
               run("v2", 0, cpu=2000, mem=G, agent="a2")]
    declared = {d.name: d for d in DECLARED}
    assert freed(free, declared, victims) == [
        Free("a1", 3500, 3 * G, (0, 1)), Free("a2", 2000, G, ()),
        Free("a3", 100, 10, ())]  # an agent not declared: what is free, nothing more
    held = [run("big", 0, cpu=9000, mem=9 * G, gpus=(0, 1, 7))]
    assert freed([Free("a1", 500, G, (1,))], declared, held) == [Free("a1", 4000, 4 * G, (0, 1))]


def test_of_the_victims_chosen_only_those_needed_stay_chosen():
    """Victims are taken in order until it fits, then each but the last is let go again if
    it fits without it: here the small ones taken first are not needed once the large one is."""
    running = [run("a", 0, cpu=500, started=3), run("b", 0, cpu=500, started=2),
               run("c", 0, cpu=2000, started=1)]
    need = fits_single(1, Request(2000, G, 0))
    assert [v.name for v in choose_victims(5, running, NOTHING_FREE, DECLARED, need)] == ["c"]


def test_a_victims_record_says_by_whom_and_the_two_priorities():
    from cluster_sessions.core.preemption import reason

    assert reason(run("low", 3), "train-7", 50) == (
        "preempted by train-7 (priority 50 > its 3): the pool's policies.preemption ends "
        "preemptible batch sessions of a lower priority")
