"""Live free capacity and the over-commitment checker (core/scheduling.py), on hand-built
engine reports."""

from __future__ import annotations

from cluster_sessions.core.placement import Free, Placement, Request, Slot
from cluster_sessions.core.scheduling import (
    AgentHold,
    ContainerHold,
    Reservation,
    holds_of,
    live_free,
    over_commitments,
)

GIB = 1024**3
POOL = [Free("a1", 8000, 32 * GIB, (0, 1, 2, 3)), Free("a2", 4000, 16 * GIB, (0, 1))]
NOW = 1000.0


def box(session, agent, cpu=1000, mem=GIB, gpus=(), stack="s1") -> ContainerHold:
    return ContainerHold(session, stack, agent, cpu, mem, tuple(gpus))


def reservation(session, *holds, stack="s1", until=NOW + 60, also=()) -> Reservation:
    return Reservation(session, ((stack,) if stack else ()) + tuple(also), "host:1", NOW - 5,
                       until, tuple(holds))


def test_nothing_held_leaves_the_declared_capacity():
    assert live_free(POOL, [], [], (), NOW) == POOL


def test_containers_take_their_cpu_memory_and_gpu_ids_from_their_agent():
    free = live_free(POOL, [box("x", "a1", 2000, 4 * GIB, (1,)), box("x", "a1", 1000, GIB, (3,)),
                            box("y", "a2", 500, GIB, (0,), stack="s2")], [], (), NOW)
    assert free == [Free("a1", 5000, 27 * GIB, (0, 2)), Free("a2", 3500, 15 * GIB, (1,))]


def test_a_live_reservation_of_another_session_holds_until_its_lease_runs_out():
    r = reservation("y", AgentHold("a2", 4000, 8 * GIB, (1,)), stack="s2", until=NOW + 1)
    assert live_free(POOL, [], [r], (), NOW)[1] == Free("a2", 0, 8 * GIB, (0,))
    assert live_free(POOL, [], [r], (), NOW + 1)[1] == POOL[1], "a lapsed lease holds nothing"


def test_the_stack_being_placed_does_not_count_its_own_containers_or_reservations():
    mine = [box("x-1", "a1", 8000, GIB, (0,)), box("x-2", "a1", 8000, GIB, (1,))]
    r = reservation("x", AgentHold("a2", 4000, GIB, (0, 1)))
    assert live_free(POOL, mine, [r], {"s1"}, NOW) == POOL


def test_a_same_named_session_of_another_stack_still_holds_what_it_holds():
    theirs = box("x", "a1", 8000, GIB, (0,), stack="other")
    assert live_free(POOL, [theirs], [], {"s1"}, NOW)[0] == Free("a1", 0, 31 * GIB, (1, 2, 3))


def test_a_container_without_a_stack_id_holds_on_its_own_and_is_never_excluded():
    old = [box("x", "a1", 1000, GIB, (0,), stack=""), box("y", "a1", 1000, GIB, (1,), stack="")]
    r = reservation("x", AgentHold("a1", 1000, GIB, (0,)), stack="")
    assert live_free(POOL, old, [r], {""}, NOW)[0] == Free("a1", 6000, 30 * GIB, (2, 3))


def test_a_reservation_counts_once_with_the_containers_of_every_stack_it_places():
    """A definition of count: 2 placed again: its reservation covers both sessions' stacks,
    and may give x-1 the GPU x-2's old container holds until the up removes every old
    container first; counted per stack, GPU 0 would be held twice."""
    old = [box("x-1", "a2", 500, GIB, (1,), stack="s1"),
           box("x-2", "a2", 500, GIB, (0,), stack="s2")]
    new = [reservation("x", AgentHold("a2", 4000, 8 * GIB, (0, 1)), stack="s1", also=("s2",))]
    assert over_commitments(POOL, old, new, NOW) == []
    assert live_free(POOL, old, new, (), NOW)[1] == Free("a2", 0, 8 * GIB, ())
    assert live_free(POOL, old, new, {"s1", "s2"}, NOW)[1] == POOL[1]
    assert live_free(POOL, old, new, {"s2"}, NOW)[1] == Free("a2", 3500, 15 * GIB, (0,))


def test_a_session_with_both_a_reservation_and_containers_counts_once_at_the_larger():
    """Its up is running: the containers made so far are inside its reservation, so per agent
    the larger CPU and memory of the two, and the union of GPU ids."""
    made = [box("x", "a1", 1000, 8 * GIB, (0,))]
    r = reservation("x", AgentHold("a1", 3000, 2 * GIB, (0, 1)), AgentHold("a2", 1000, GIB))
    free = live_free(POOL, made, [r], (), NOW)
    assert free == [Free("a1", 5000, 24 * GIB, (2, 3)), Free("a2", 3000, 15 * GIB, (0, 1))]
    assert over_commitments(POOL, made, [r], NOW) == []


def test_an_over_committed_agent_has_no_free_capacity_rather_than_negative():
    many = [box(f"s{i}", "a2", 3000, 12 * GIB, stack=str(i)) for i in range(2)]
    assert live_free(POOL, many, [], (), NOW)[1] == Free("a2", 0, 0, (0, 1))


def test_holds_off_the_pool_do_not_change_the_pools_free_capacity():
    assert live_free(POOL, [box("x", "gone", 8000)], [], (), NOW) == POOL


def test_holds_of_placements_sum_their_containers_per_agent():
    placement = Placement((Slot("a1", (0,)), Slot("a1", (1,)), Slot("a2", (0,))))
    other = Placement((Slot("a2", (1,)),))
    assert holds_of([(placement, Request(1500, 2 * GIB, 1)), (other, Request(500, GIB, 1))]) == (
        AgentHold("a1", 3000, 4 * GIB, (0, 1)), AgentHold("a2", 2000, 3 * GIB, (0, 1)))


def test_a_sound_pool_has_no_over_commitments():
    held = [box("x", "a1", 8000, 32 * GIB, (0, 1, 2, 3)), box("y", "a2", 4000, 16 * GIB, (0, 1),
                                                              stack="s2")]
    assert over_commitments(POOL, held, [], NOW) == []


def test_over_commitments_name_each_agent_over_cpu_or_memory_and_who_holds_it():
    held = [box("x", "a2", 3000, 10 * GIB), box("y", "a2", 2000, 7 * GIB, stack="s2")]
    assert over_commitments(POOL, held, [], NOW) == [
        "a2: cpu 5 held of 4 declared, by x, y", "a2: mem 17g held of 16g declared, by x, y"]


def test_over_commitments_name_each_gpu_held_twice_or_not_declared():
    held = [box("x", "a1", gpus=(2,)), box("y", "a1", gpus=(2, 9), stack="s2")]
    r = reservation("z", AgentHold("a1", 1000, GIB, (2,)), stack="s3")
    assert over_commitments(POOL, held, [r], NOW) == [
        "a1: GPU 2 held 3 times, by x, y, z", "a1: GPU 9 held but not declared, by y"]
    assert over_commitments(POOL, held, [r], NOW + 60) == [
        "a1: GPU 2 held 2 times, by x, y", "a1: GPU 9 held but not declared, by y"]


def test_two_containers_of_one_session_on_one_gpu_are_an_over_commitment():
    held = [box("x", "a1", gpus=(1,)), box("x", "a1", gpus=(1,))]
    assert over_commitments(POOL, held, [], NOW) == ["a1: GPU 1 held 2 times, by x"]


def test_a_reservation_beside_its_own_containers_is_not_counted_twice_by_the_checker():
    held = [box("x", "a2", 4000, 16 * GIB, (0, 1))]
    r = reservation("x", AgentHold("a2", 4000, 16 * GIB, (0, 1)))
    assert over_commitments(POOL, held, [r], NOW) == []
    other = reservation("y", AgentHold("a2", 1, 1, ()), stack="s2")
    assert over_commitments(POOL, held, [r, other], NOW) == [
        "a2: cpu 4.001 held of 4 declared, by x, y",
        "a2: mem 17179869185 held of 16g declared, by x, y"]


def test_an_agent_outside_the_pool_holding_anything_is_reported():
    assert over_commitments(POOL, [box("x", "gone")], [], NOW) == [
        "gone: not an agent of the pool, held by x"]


def test_a_legacy_reservation_does_not_absorb_a_same_named_container_of_a_stack():
    """Without stack ids a holder is its session name; a container of a stack is never that."""
    r = reservation("x", AgentHold("a1", 1000, GIB), stack="")
    assert live_free(POOL, [box("x", "a1", 1000, GIB, stack="s9")], [r], (), NOW)[0] == Free(
        "a1", 6000, 30 * GIB, (0, 1, 2, 3))


def test_over_commitments_name_the_sessions_of_a_reservation_and_its_containers():
    held = [box("x-1", "a2", 3000, GIB), box("y", "a2", 2000, GIB, stack="s2")]
    r = reservation("x", AgentHold("a2", 1000, GIB), stack="s1")
    assert over_commitments(POOL, held, [r], NOW) == ["a2: cpu 5 held of 4 declared, by x, x-1, y"]


def test_over_commitments_go_on_past_an_agent_outside_the_pool_and_show_zero_plainly():
    held = [box("x", "gone"), box("y", "a2", 5000, GIB, stack="s2")]
    empty = [Free("a2", 4000, 0)]
    assert over_commitments(POOL, held, [], NOW) == [
        "gone: not an agent of the pool, held by x", "a2: cpu 5 held of 4 declared, by y"]
    assert over_commitments(empty, held[1:], [], NOW) == [
        "a2: cpu 5 held of 4 declared, by y", "a2: mem 1g held of 0 declared, by y"]
