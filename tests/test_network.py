"""The session network's own resource (pulumi_layer/network.py) on the real local engine: one
``NetworkCreate`` with the session's arguments, outputs as given, read-back that sees it gone,
a delete that waits for the last endpoint and takes "already gone" as done."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import docker.errors
import pytest

from cluster_sessions.agents.connectors import agent_props
from cluster_sessions.core.spec import Agent
from cluster_sessions.pulumi_layer.network import SessionNetworkProvider

pytestmark = pytest.mark.docker

LABEL = "cluster-sessions.test"


def inputs(**over) -> dict:
    return {"agent": agent_props(Agent(name="local", capacity={"cpu": 1, "mem": "1g"})),
            "name": f"csnet-{uuid.uuid4().hex[:8]}", "driver": "bridge", "attachable": False,
            "options": {"com.docker.network.driver.mtu": "1400"},
            "labels": {LABEL: "network", "with space": "a 'quoted' $(value)"}, **over}


def test_create_makes_the_network_as_given_and_delete_removes_it(docker_client):
    given = inputs()
    provider = SessionNetworkProvider()
    made = provider.create(dict(given))
    try:
        found = docker_client.api.inspect_network(made.id)
        assert found["Name"] == given["name"] and found["Driver"] == "bridge"
        assert found["Labels"] == given["labels"]
        assert found["Options"]["com.docker.network.driver.mtu"] == "1400"
        assert made.outs == given
        assert provider.read(made.id, made.outs).id == made.id
    finally:
        provider.delete(made.id, made.outs)
    assert not docker_client.networks.list(names=[given["name"]])
    gone = provider.read(made.id, made.outs)
    assert gone.id is None  # the next up makes it again
    provider.delete(made.id, made.outs)  # already gone: deleted, no error


def test_a_taken_name_is_an_error_naming_the_network(docker_client):
    given = inputs()
    other = docker_client.networks.create(given["name"], labels={LABEL: "someone else's"})
    try:
        with pytest.raises(ValueError, match=f"network {given['name']}: the engine did not"):
            SessionNetworkProvider().create(dict(given))
        assert len(docker_client.networks.list(names=[given["name"]])) == 1
    finally:
        other.remove()


def test_delete_waits_while_a_container_still_leaves_the_network(docker_client):
    """The engine refuses to remove a network with an endpoint ("has active endpoints"): an
    overlay's worker leaves a moment after its container is gone; the delete waits for it."""
    from cluster_sessions.lab.image import ensure_image

    given = inputs()
    provider = SessionNetworkProvider()
    made = provider.create(dict(given))
    image = ensure_image(docker_client)
    container = docker_client.containers.run(image, ["sleep", "30"], detach=True,
                                             network=given["name"],
                                             labels={LABEL: "network"})
    done = threading.Event()
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            provider.delete(made.id, made.outs)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
        done.set()

    try:
        threading.Thread(target=delete, daemon=True).start()
        time.sleep(1.0)
        assert not done.is_set()  # still attached: waiting, not failed
        container.remove(force=True)
        assert done.wait(10) and not errors, errors
        assert not docker_client.networks.list(names=[given["name"]])
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
        for n in docker_client.networks.list(names=[given["name"]]):
            n.remove()


def test_check_refuses_what_is_not_a_network_argument():
    provider = SessionNetworkProvider()
    failures = provider.check({}, {**inputs(), "labels": {"a": 1}, "name": ""}).failures
    assert sorted(f.property for f in failures) == ["labels", "name"]
    assert provider.check({}, inputs()).failures == []


def test_every_argument_replaces_the_network_the_old_one_first():
    provider = SessionNetworkProvider()
    old = inputs()
    for key, value in [("name", "other"), ("driver", "overlay"), ("attachable", True),
                       ("options", {}), ("labels", {LABEL: "x"})]:
        diff = provider.diff("id", dict(old), {**old, key: value})
        assert diff.changes and diff.replaces == [key] and diff.delete_before_replace, key
    assert not provider.diff("id", dict(old), dict(old)).changes


def test_another_way_to_reach_the_same_agent_updates_the_network_in_place():
    """A new key file or known_hosts for the agent is the same engine's network: replacing it
    would replace every container on it (delete-before-replace); another engine is another
    endpoint label, which replaces."""
    provider = SessionNetworkProvider()
    old = inputs()
    news = {**old, "agent": {**old["agent"], "name": "renamed"}}
    diff = provider.diff("id", dict(old), news)
    assert diff.changes and diff.replaces == []
    assert provider.update("id", dict(old), dict(news)).outs == news


def test_an_agent_that_cannot_be_asked_is_no_network_already_gone(monkeypatch):
    """Only the engine's own "no such network" is "gone"; a connector's error that merely
    says "not found" (no docker on the agent) fails the delete, so the state keeps it."""
    import contextlib as ctx

    from cluster_sessions.agents.connectors import COMMAND_FAILED, AgentError
    from cluster_sessions.pulumi_layer import engine_resource

    @ctx.contextmanager
    def unreachable(_agent, _timeout):
        raise AgentError("local", COMMAND_FAILED, "sh: 1: docker: command not found")
        yield

    monkeypatch.setattr(engine_resource, "engine_client", unreachable)
    with pytest.raises(AgentError, match="command not found"):
        SessionNetworkProvider().delete("id", inputs())
