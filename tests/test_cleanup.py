"""What the sweep removes where, without root or an engine (the removal itself runs in the
docker and lab tests)."""

from __future__ import annotations

from cluster_sessions.agents.cleanup import Leftover, removal_plan


def item(agent: str, kind: str, object_id: str, detail: str = "") -> Leftover:
    return Leftover(agent, kind, f"{kind}-{object_id}", object_id, detail)


def test_containers_go_on_their_own_agent_and_an_overlay_once_through_the_manager():
    found = [
        item("agent2", "container", "c2", "running"),
        item("agent3", "container", "c3", "exited"),
        item("agent2", "network", "ov", "overlay, swarm"),  # every node that uses it lists it
        item("agent3", "network", "ov", "overlay, swarm"),
        item("agent3", "network", "br", "bridge, local"),
    ]
    containers, networks = removal_plan(found, manager="agent1")
    assert {a: [i.object_id for i in items] for a, items in containers.items()} == {
        "agent2": ["c2"], "agent3": ["c3"]}
    assert {a: [i.object_id for i in items] for a, items in networks.items()} == {
        "agent1": ["ov"], "agent3": ["br"]}


def test_without_a_swarm_manager_an_overlay_is_removed_where_it_was_seen():
    containers, networks = removal_plan([item("agent2", "network", "ov", "overlay, swarm")],
                                        manager=None)
    assert containers == {} and list(networks) == ["agent2"]
