"""The session network as a Pulumi dynamic resource of our own, not ``docker.Network``.

The docker provider's network waits a fixed 2 s before it first reads a network back, after
its create and before every read and delete (kreuzwerker ``resource_docker_network_funcs.go``
l. 18-23: ``networkReadRefreshDelay``, ``networkRemoveRefreshDelay``; then 5 s between
tries): every container of a session waits for its network, so each ``up`` from nothing spent
2.3 s of its time to ready there, and each ``destroy`` 2 s more (measured through the real
engine, docs/benchmarks.md). This resource makes the same network with one ``NetworkCreate``
(agents/engine.py ``create_network``), through the same agent (the network agent's connector:
the manager for an overlay), with the same arguments: name, driver, ``attachable`` on an
overlay, options (MTU, encryption) and labels. Every one of them replaces it (Docker cannot
change a network in place; the name is fixed, so the old one goes first), as every one forced
a new ``docker.Network``; how the agent is reached (its ``agent_props``) is updated in
place. ``read`` asks the engine whether the network is still there; ``delete`` removes it,
waiting while the engine still counts endpoints (an overlay's workers leave it a moment after
their containers are gone, as the provider waits on "has active endpoints"), and one already
gone is deleted.

The resource's ID is the engine's network ID, as ``docker.Network``'s was (the sweep of what
an interrupted ``up`` left keeps what the stack holds by ID: driver/stacks.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, UpdateResult

from ..agents.connectors import agent_props
from ..agents.engine import create_network, network_exists
from ..core.provider_facts import NETWORK_FORCE_NEW
from ..core.spec import Agent
from .engine_resource import EngineResourceProvider, unknown

REMOVE_WAIT = 30.0  # s a delete waits for the engine's last endpoints to leave (the provider's)
BUSY = "has active endpoints"
DOCKER_NETWORK_TYPE = "docker:index/network:Network"  # what a stack made before holds


class SessionNetworkProvider(EngineResourceProvider):
    """Makes the session's network on one agent's engine; delete removes it."""

    # acts on an agent's engine: under mocks (no engine) nothing is made (tests/standin/
    # engine.py ``Engine._mocked``)
    ACTS_ON_DOCKER_OBJECTS = True
    COMMAND_TIMEOUT = 60.0
    INPUTS = ("agent", "name", "driver", "attachable", "options", "labels")
    # Docker changes no network in place: a change to any of these is another network. Not
    # how the agent is reached (another key file, known_hosts): the same engine's network,
    # updated in place, as a docker.Provider's new settings replaced nothing (another engine
    # is another endpoint, which is in the labels). Decided once, with diff's review.
    REPLACES = tuple(k for k, forces in NETWORK_FORCE_NEW.items() if forces)
    # the name is fixed: the old network must go before the new one is made
    DELETE_BEFORE_REPLACE = True
    # no GONE words: remove() takes the engine's NotFound itself, and a connector's error
    # ("docker: command not found" over SSH) is never "already gone"

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        for key in ("name", "driver"):
            value = news.get(key)
            if not unknown(value) and (not isinstance(value, str) or not value):
                failures.append(CheckFailure(key, "must be a non-empty string"))
        for key in ("options", "labels"):
            value = news.get(key)
            if not unknown(value) and not (isinstance(value, Mapping) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items())):
                failures.append(CheckFailure(key, "must map strings to strings"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        with self.client(props) as client:
            network_id = create_network(client, props["name"], props["driver"],
                                        bool(props.get("attachable")), props["options"],
                                        props["labels"])
        return CreateResult(network_id, {**props})

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # only how the agent is reached changed (REPLACES): nothing to do on the engine
        return UpdateResult({**news})

    def look(self, id_: str, props: dict[str, Any]) -> dict[str, Any] | None:
        with self.client(props) as client:
            return props if network_exists(client, id_) else None

    def remove(self, id_: str, props: dict[str, Any]) -> None:
        import docker

        deadline = time.monotonic() + REMOVE_WAIT
        with self.client(props) as client:
            while True:
                try:
                    client.api.remove_network(id_)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError as exc:
                    if BUSY not in str(exc) or time.monotonic() > deadline:
                        raise ValueError(f"network {props['name']}: the engine did not remove "
                                         f"it: {exc.explanation or exc}") from None
                time.sleep(0.2)


class SessionNetwork(pulumi.dynamic.Resource, module="cluster-sessions", name="SessionNetwork"):
    """The session's network ``name`` on ``agent``'s engine. Outputs ``name`` and ``id`` (the
    engine's network ID). Type token ``pulumi-python:dynamic/cluster-sessions:SessionNetwork``."""

    name: pulumi.Output[str]

    def __init__(self, resource_name: str, agent: Agent, name: str, driver: str,
                 attachable: bool, options: Mapping[str, str], labels: Mapping[str, str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(SessionNetworkProvider(), resource_name, {
            "agent": agent_props(agent), "name": name, "driver": driver,
            "attachable": bool(attachable), "options": dict(options),
            "labels": dict(labels)}, opts)
