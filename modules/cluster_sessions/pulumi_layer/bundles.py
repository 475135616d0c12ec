"""One agent's bundles on its scratch root, as a Pulumi dynamic resource (issue 45).

``create`` writes every container's bundle of that agent in one archive, over the agent's
connector (SSH, or this machine for the local engine), into ``<scratch>/<stack id>/<host>/``
(agents/bundles.py: moved into place with one rename per host, so a container never mounts a
half-written bundle); ``update`` writes them again when a bundle changes (and removes the
directories of hosts the session no longer has); ``delete`` removes them, and the stack's
directory once it is empty: ``destroy`` leaves nothing under the scratch root. The containers
of that agent depend on it, so a missing root or a full disk fails ``up`` before any of them is
created, naming the agent and the path.

The bundles are the resource's one secret input (they hold the private keys) and a secret
output (``additional_secret_outputs``). Like the other dynamic resources, the provider holds only
plain data and opens its connection inside each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, UpdateResult

from ..agents.bundles import STACK_ID, deliver, remove
from ..agents.connectors import agent_props
from ..core.spec import Agent
from .engine_resource import EngineResourceProvider, unknown


def _hosts(props: Mapping[str, Any]) -> list[str]:
    return list((props.get("bundles") or {}).keys())


class BundleDeliveryProvider(EngineResourceProvider):
    """Writes one agent's bundles into its scratch root; delete removes them."""

    # acts on the agents: under mocks (no engine) nothing is written (tests/standin/
    # engine.py ``Engine._mocked``)
    ACTS_ON_DOCKER_OBJECTS = True
    INPUTS = ("agent", "scratch", "stack_id", "bundles")
    # another agent, root or stack is another place: written there anew, the old one removed
    REPLACES = ("agent", "scratch", "stack_id")

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        scratch = news.get("scratch")
        if not unknown(scratch) and (not isinstance(scratch, str) or not scratch.startswith("/")):
            failures.append(CheckFailure("scratch", "must be an absolute host directory"))
        stack_id = news.get("stack_id")
        if not unknown(stack_id) and (not isinstance(stack_id, str)
                                      or not STACK_ID.match(stack_id)):
            failures.append(CheckFailure("stack_id", "must be 16 hex digits"))
        bundles = news.get("bundles")
        if not unknown(bundles) and not isinstance(bundles, Mapping):
            failures.append(CheckFailure("bundles", "must map host names to packs"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        with self.connect(props) as conn:
            deliver(conn, props["scratch"], props["stack_id"], props["bundles"])
        return CreateResult(f"{props['agent']['name']}:{props['scratch']}/{props['stack_id']}",
                            {**props})

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        gone = [h for h in _hosts(olds) if h not in news["bundles"]]
        with self.connect(news) as conn:
            deliver(conn, news["scratch"], news["stack_id"], news["bundles"], gone)
        return UpdateResult({**news})

    def remove(self, _id: str, props: dict[str, Any]) -> None:
        # a missing root or stack directory: nothing to remove (agents/bundles.py)
        with self.connect(props) as conn:
            remove(conn, props["scratch"], props["stack_id"], _hosts(props))


class BundleDelivery(pulumi.dynamic.Resource, module="cluster-sessions", name="BundleDelivery"):
    """``bundles`` ({host: pack}, a secret) of ``agent`` in ``<scratch>/<stack_id>/<host>/``.
    Type token ``pulumi-python:dynamic/cluster-sessions:BundleDelivery``."""

    def __init__(self, name: str, agent: Agent, scratch: str, stack_id: str,
                 bundles: pulumi.Input[Mapping[str, str]],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        secret = pulumi.ResourceOptions(additional_secret_outputs=["bundles"])
        super().__init__(BundleDeliveryProvider(), name, {
            "agent": agent_props(agent), "scratch": scratch, "stack_id": stack_id,
            "bundles": pulumi.Output.secret(bundles)},
            pulumi.ResourceOptions.merge(opts, secret))
