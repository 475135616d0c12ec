"""The pool's pids limit on a session's containers, as a Pulumi dynamic resource per agent.

The docker provider has no argument for a container's pids limit (kreuzwerker v4.5.0:
``resource_docker_container.go`` has no ``pids_limit``; docs/provider-fidelity.md), so the
limit is set right after the provider made the containers, through the engine's
ContainerUpdate (``HostConfig.PidsLimit``, kept by the engine across restarts:
agents/engine.py ``set_pids_limit``). Until it holds, nothing of the user's runs: the set-up
waits for it before its first step as the user (templates/setup.sh.j2). One resource per
agent the session uses (not one per container: a dynamic resource is a pickled provider to
register), depending on that agent's containers; a replaced container changes its input, so
the limit is set on the new one. Delete does nothing: the limit goes with its container.

Like the other dynamic resources, the provider holds only plain data and opens its connection
inside each call, from the agent's properties the program gives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult

from ..agents.connectors import agent_props
from ..agents.engine import set_pids_limit
from ..core.spec import MAX_PIDS_LIMIT, MIN_PIDS_LIMIT, Agent
from .engine_resource import EnsuredProvider, unknown

PARALLEL = 8  # update calls at once over the agent's one connection (a channel each by SSH)


class ContainerLimitsProvider(EnsuredProvider):
    """Sets the pids limit on every listed container of one agent; delete leaves them. An
    update (a replaced container's new id, another limit) sets it on every container again."""

    COMMAND_TIMEOUT = 60.0

    # acts on the containers the docker provider made: under mocks there are none
    # (tests/standin/engine.py ``Engine._mocked``)
    ACTS_ON_DOCKER_OBJECTS = True
    INPUTS = ("agent", "containers", "pids_limit")
    # another agent is another engine: a new resource there (delete here does nothing)
    REPLACES = ("agent",)

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        limit = news.get("pids_limit")
        if not unknown(limit) and (isinstance(limit, bool) or not isinstance(limit, int | float)
                                   or limit != int(limit)
                                   or not MIN_PIDS_LIMIT <= limit <= MAX_PIDS_LIMIT):
            failures.append(CheckFailure(
                "pids_limit", f"must be a whole number from {MIN_PIDS_LIMIT} to {MAX_PIDS_LIMIT}"))
        containers = news.get("containers")
        if not unknown(containers) and not isinstance(containers, Mapping):
            failures.append(CheckFailure("containers", "must map host names to container ids"))
        return CheckResult(news, failures)

    def object_id(self, props: Mapping[str, Any]) -> str:
        return f"{props['agent']['name']}:pids"

    def ensure(self, props: Mapping[str, Any]) -> dict[str, Any]:
        """The limit on every listed container, the calls in parallel: every container's
        set-up is waiting for its own (templates/setup.sh.j2), so none waits for the others'
        turn."""
        limit = int(props["pids_limit"])
        ids = list(props["containers"].values())
        with self.client(props) as client, ThreadPoolExecutor(
                max_workers=max(1, min(PARALLEL, len(ids)))) as pool:
            for _ in pool.map(lambda cid: set_pids_limit(client, cid, limit, unless_held=True),
                              ids):
                pass
        return {**props}

    # read: the state's (base); delete: nothing, the limit goes with its container (base)


class ContainerLimits(pulumi.dynamic.Resource, module="cluster-sessions", name="ContainerLimits"):
    """The pool's ``limits.pids_limit`` on ``containers`` ({host: container id}) of ``agent``.
    Type token ``pulumi-python:dynamic/cluster-sessions:ContainerLimits``."""

    def __init__(self, name: str, agent: Agent, containers: Mapping[str, pulumi.Input[str]],
                 pids_limit: int, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(ContainerLimitsProvider(), name, {
            "agent": agent_props(agent), "containers": dict(containers),
            "pids_limit": pids_limit}, opts)
