"""The SDK's bare cost per resource: a program registering as many resources of each kind as
the session's program did, each with a name and a plain input or two (``plan_scale.py``'s
table 3, issue 35).

A module of its own, not ``plan_scale.py`` run as ``__main__``: dill pickles a dynamic
provider's class by reference only when it lives in an importable module, as the session's
providers do (``pulumi_layer/limits.py``); one defined in ``__main__`` would be pickled by
value, a heavier floor than the program's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider

STACK = "pulumi:pulumi:Stack"
PROVIDER_PREFIX = "pulumi:providers:"
DYNAMIC_PREFIX = "pulumi-python:dynamic/"
KINDS = ("component", "provider", "dynamic", "custom")


def kinds(registrations) -> Counter:
    """How many resources of each kind a run registered (``Engine.registrations``), the stack
    left out (the SDK registers one in every run, the floor's too): components, providers,
    dynamic resources, and the other custom resources (containers, the network)."""
    counted: Counter = Counter({kind: 0 for kind in KINDS})
    for reg in registrations:
        if reg.type == STACK:
            continue
        if reg.type.startswith(PROVIDER_PREFIX):
            counted["provider"] += 1
        elif reg.type.startswith(DYNAMIC_PREFIX):
            counted["dynamic"] += 1
        elif not reg.custom:
            counted["component"] += 1
        else:
            counted["custom"] += 1
    return counted


class BareProvider(ResourceProvider):
    """A dynamic provider that makes nothing: ``create`` hands the inputs back."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"bare-{props['index']}", dict(props))


class BareResource(pulumi.dynamic.Resource, module="bench", name="Bare"):
    def __init__(self, name: str, index: int) -> None:
        super().__init__(BareProvider(), name, {"index": index})


def program(counts: Counter) -> None:
    """``counts`` (as :func:`kinds` returns them) of bare resources: components with no inputs,
    docker providers with a host, dynamic resources with one number, containers with a name
    and an image."""
    import pulumi_docker as docker

    for i in range(counts["component"]):
        pulumi.ComponentResource("bench:index:Bare", f"component{i}")
    for i in range(counts["provider"]):
        docker.Provider(f"agent{i}", host=f"ssh://ops@10.0.{i // 250}.{i % 250}")
    for i in range(counts["dynamic"]):
        BareResource(f"dynamic{i}", i)
    for i in range(counts["custom"]):
        docker.Container(f"c{i}", name=f"c{i}", image="img:1")
