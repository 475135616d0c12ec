"""The docker provider's read-back and diff, emulated from
:mod:`cluster_sessions.core.provider_facts`.

What :class:`.engine.Engine` stores as a resource's state is what the real provider would
*read back* after ``create`` (``cpus`` in its own spelling, Docker's own options on an overlay,
defaults filled in), and each later registration gets the action the Terraform bridge would
take against that state: ``same``, ``update`` (in place) or ``replace`` (a force-new argument
changed). So two runs of the program show a perpetual diff exactly where the real provider
would, and a definition change replaces exactly what the provider's schema says.
"""

from __future__ import annotations

from typing import Any

from ..core.provider_facts import (
    CONTAINER_FORCE_NEW,
    NETWORK_FORCE_NEW,
    cpus_read_back,
    parse_cpus,
)

CONTAINER = "docker:index/container:Container"
NETWORK = "docker:index/network:Network"
CREATE, SAME, UPDATE, REPLACE = "create", "same", "update", "replace"
# What Docker adds to an overlay's options (observed; tests/test_provider_facts.py).
OVERLAY_OPTION = ("com.docker.network.driver.overlay.vxlanid_list", "4097")
# Defaults the provider's schema fills in (resource_docker_container.go).
CONTAINER_DEFAULTS = {"restart": "no", "mustRun": True, "wait": False}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


FORCE_NEW = {
    CONTAINER: {_camel(k): v for k, v in CONTAINER_FORCE_NEW.items()},
    NETWORK: {_camel(k): v for k, v in NETWORK_FORCE_NEW.items()},
}


def read_back(type_: str, inputs: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """The state after create: ``inputs`` as serialized (secrets stay marked), with what the
    provider reads back in place of what was passed. ``plain``: the same inputs, unmarked."""
    outs = dict(inputs)
    if type_ == CONTAINER:
        for key, value in CONTAINER_DEFAULTS.items():
            outs.setdefault(key, value)
        if plain.get("cpus"):
            outs["cpus"] = cpus_read_back(parse_cpus(plain["cpus"]))
        outs["ports"] = [{**p, "external": p.get("external") or 32768 + i}
                         for i, p in enumerate(plain.get("ports") or [])]
    elif type_ == NETWORK and plain.get("driver") == "overlay":
        outs["options"] = {**(plain.get("options") or {}), OVERLAY_OPTION[0]: OVERLAY_OPTION[1]}
    return outs


def diff(type_: str, state: dict[str, Any], inputs: dict[str, Any],
         ignore_changes: list[str]) -> tuple[str, tuple[str, ...]]:
    """(action, the arguments that differ) for ``inputs`` (plain) against ``state`` (plain).

    An argument the program does not pass keeps its state value (computed or defaulted); one
    in ``ignore_changes`` is not compared; an argument missing from the schema table counts as
    force-new (the cautious reading)."""
    table = FORCE_NEW.get(type_, {})
    if type_ == CONTAINER and inputs.get("ports"):  # an unset external port is computed
        inputs = {**inputs, "ports": [
            {**p, "external": p.get("external") or _state_port(state, i).get("external")}
            for i, p in enumerate(inputs["ports"])]}
    changed = tuple(sorted(
        key for key, value in inputs.items()
        if not key.startswith("__") and key not in ignore_changes
        and value not in (None, [], {}) and state.get(key) != value))
    if not changed:
        return SAME, ()
    return (REPLACE if any(table.get(k, True) for k in changed) else UPDATE), changed


def _state_port(state: dict[str, Any], index: int) -> dict[str, Any]:
    ports = state.get("ports") or []
    return ports[index] if index < len(ports) else {}
