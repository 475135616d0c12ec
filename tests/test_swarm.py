"""The swarm resources' check and diff, without root, an engine or a lab: what a pool change
makes Pulumi do to the swarm (nothing, update in place, or replace: leave and join again)."""

from __future__ import annotations

import pytest

from cluster_sessions.agents.connectors import agent_props
from cluster_sessions.core.spec import Agent
from cluster_sessions.pulumi_layer.swarm import SwarmManagerProvider, SwarmWorkerProvider


def agent(name: str = "agent1", **over) -> dict:
    return agent_props(Agent.model_validate({
        "name": name, "docker_host": "ssh://root@10.0.0.11", "capacity": {"cpu": 1, "mem": "1g"},
        **over}))


MANAGER = {"agent": agent(), "advertise_addr": "10.0.0.11"}
WORKER = {"agent": agent("agent2", docker_host="ssh://root@10.0.0.12"), "manager": agent(),
          "manager_addr": "10.0.0.11:2377", "join_token": "SWMTKN-1-x",
          "advertise_addr": "10.0.0.12"}


def test_good_inputs_pass_the_checks():
    assert SwarmManagerProvider().check({}, dict(MANAGER)).failures == []
    assert SwarmWorkerProvider().check({}, dict(WORKER)).failures == []


@pytest.mark.parametrize(("provider", "inputs", "field"), [
    (SwarmManagerProvider, {**MANAGER, "advertise_addr": "10.0.0.11 --force"}, "advertise_addr"),
    (SwarmManagerProvider, {**MANAGER, "advertise_addr": ""}, "advertise_addr"),
    (SwarmWorkerProvider, {**WORKER, "manager_addr": "10.0.0.11"}, "manager_addr"),
    (SwarmWorkerProvider, {**WORKER, "join_token": ""}, "join_token"),
    (SwarmManagerProvider, {**MANAGER, "agent": {}}, "agent"),
])
def test_bad_inputs_fail_the_check_naming_the_field(provider, inputs, field):
    failures = provider().check({}, inputs).failures
    assert field in [f.property for f in failures], failures


def test_an_unchanged_manager_is_no_change_whatever_pickled_it():
    old = {**MANAGER, "__provider": "pickled by an older dill", "cluster_id": "c1"}
    diff = SwarmManagerProvider().diff("c1", old, {**MANAGER, "__provider": "new"})
    assert (diff.changes, diff.replaces) == (False, [])


def test_a_new_advertise_address_or_another_agent_replaces_the_manager():
    diff = SwarmManagerProvider().diff("c1", MANAGER, {**MANAGER, "advertise_addr": "10.0.0.99"})
    assert (diff.changes, diff.replaces) == (True, ["advertise_addr"])
    other = {**MANAGER, "agent": agent("agent9")}
    diff = SwarmManagerProvider().diff("c1", MANAGER, other)
    assert diff.changes and "agent" in diff.replaces and diff.delete_before_replace


def test_reaching_the_manager_another_way_updates_in_place():
    moved = {**MANAGER, "agent": agent(ssh={"host": "10.0.0.11", "port": 2222})}
    diff = SwarmManagerProvider().diff("c1", MANAGER, moved)
    assert (diff.changes, diff.replaces) == (True, [])


def test_a_rotated_join_token_changes_nothing_for_a_joined_worker():
    diff = SwarmWorkerProvider().diff("n1", WORKER, {**WORKER, "join_token": "SWMTKN-1-y"})
    assert (diff.changes, diff.replaces) == (False, [])
    diff = SwarmWorkerProvider().diff("n1", WORKER, {**WORKER, "manager_addr": "10.0.0.5:2377"})
    assert (diff.changes, diff.replaces) == (True, ["manager_addr"])


def test_a_preview_s_unknown_manager_address_and_token_pass_the_check():
    """In a preview the manager does not exist yet: the dynamic provider host hands ``check``
    and ``diff`` ``Unknown()`` objects (pulumi/dynamic/__main__.py, keep_unknowns) for its
    address and token; a failed check would fail the whole preview."""
    from pulumi.output import Unknown
    from pulumi.runtime import rpc

    for value in (Unknown(), rpc.UNKNOWN):
        news = {**WORKER, "manager_addr": value, "join_token": value}
        assert SwarmWorkerProvider().check({}, news).failures == []
        diff = SwarmWorkerProvider().diff("n1", WORKER, news)
        assert diff.changes and "manager_addr" in diff.replaces  # it may change: say so
        unknown_agent = {**MANAGER, "advertise_addr": value}
        assert SwarmManagerProvider().check({}, unknown_agent).failures == []
