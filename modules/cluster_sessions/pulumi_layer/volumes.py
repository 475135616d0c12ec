"""The named volumes a session makes (those the pool does not list), as Pulumi dynamic
resources: made with the session's labels if missing (agents/engine.py ``ensure_volume``), kept
when they are the session's own, refused when they are another's, and **never deleted**:
``destroy`` forgets the resource and the volume outlives the session, as a volume a mount made
did (docs/design-notes.md). One resource per volume and agent; the containers that mount it
depend on it.

The docker provider could make them from a mount's ``volume_options`` labels, but refuses any
``volume_options`` on an engine before API 1.45 (found on the real engine, issue 42).
Like the data folders, the provider holds only plain data and opens its connection inside
each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult

from ..agents.connectors import agent_props
from ..agents.engine import ensure_volume
from ..core.spec import Agent
from .engine_resource import EnsuredProvider, unknown


class SessionVolumeProvider(EnsuredProvider):
    """Makes (or adopts) one named volume on one agent; delete leaves it."""

    INPUTS = ("agent", "volume", "labels", "session", "owner_label")
    # A change to these is another volume: a new resource (the old one's delete leaves it).
    REPLACES = ("agent", "volume")
    # acts on an agent's engine: under mocks (no engine) nothing is made (tests/standin/
    # engine.py ``Engine._mocked``)
    ACTS_ON_DOCKER_OBJECTS = True

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        volume = news.get("volume")
        failures = []
        if not unknown(volume) and (not isinstance(volume, str) or not volume
                                    or "/" in volume):
            failures.append(CheckFailure("volume", "must be a volume name"))
        return CheckResult(news, failures)

    def object_id(self, props: Mapping[str, Any]) -> str:
        return f"{props['agent']['name']}:{props['volume']}"

    def ensure(self, props: Mapping[str, Any]) -> dict[str, Any]:
        with self.client(props) as client:
            outcome = ensure_volume(client, props["volume"], props["labels"], props["session"],
                                    props["owner_label"])
        return {**props, "outcome": outcome}

    # read: the state's (base); delete: nothing, a session's named volume outlives it (base)


class SessionVolume(pulumi.dynamic.Resource, module="cluster-sessions", name="SessionVolume"):
    """The named volume ``volume`` on ``agent``, labelled ``labels``, of ``session`` (its
    ``label``). Output ``outcome``: ``made`` or ``kept``. Type token
    ``pulumi-python:dynamic/cluster-sessions:SessionVolume``."""

    outcome: pulumi.Output[str]

    def __init__(self, name: str, agent: Agent, volume: str, labels: Mapping[str, str],
                 session: str, label: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(SessionVolumeProvider(), name, {
            "agent": agent_props(agent), "volume": volume, "labels": dict(labels),
            "session": session, "owner_label": label, "outcome": None}, opts)
