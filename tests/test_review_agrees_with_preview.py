"""``diff`` and ``preview`` agree (issue 32, class 4): for several kinds of change, the action
``sessionctl diff OLD NEW`` predicts for each container and the network is the one the engine
takes in ``sessionctl preview NEW`` on a stack ``up`` built from OLD (the emulated pulumi CLI
and docker provider, on the real engine: ``emulated_automation``)."""

from __future__ import annotations

import json
import shutil

import pytest

from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit
from cluster_sessions.emulation.provider import CONTAINER, NETWORK

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

# diff's words for the engine's steps
ACTION = {"create": "add", "same": "same", "update": "update", "replace": "replace"}
JOB = ["sh", "-c", "sleep 600"]

CHANGES = {  # name: what the new definition changes
    "slots": {"distributed": {"master_port": 29500, "slots": 7}},  # the example
    "type": {"type": "batch"},  # the example
    "user-env": {"env": {"MODE": "slow"}},
    "memory": {"resources": {"cpu": 0.5, "mem": "640m", "shmem": "64m"}},
    "restart": {"restart": "on-failure"},
    "port": {"ports": [{"container": 8000}]},
    "readiness": {"readiness": {"timeout": 90}},
    "uid": {"user": {"name": "work", "uid": 4242, "gid": 4242}},
    "grow": {"cluster": {"mode": "single-node", "size": 3}},
    "command": {"command": ["sh", "-c", "sleep 700"]},
    "master-port": {"distributed": {"master_port": 29600, "slots": 1}},
    "cpu": {"resources": {"cpu": 1, "mem": "512m", "shmem": "64m"}},
    "nothing": {},
}


def preview_actions(backend, name: str) -> dict[str, str]:
    out = {}
    for urn, (action, _) in backend.stacks[name].previewed.items():
        kind, _, resource = urn.rpartition("::")
        if kind.endswith(CONTAINER):
            out[resource.removeprefix(f"{name}-")] = ACTION[action]
        elif kind.endswith(NETWORK):
            out["network"] = ACTION[action]
    return out


def diff_actions(old, new, capsys) -> dict[str, str]:
    assert main(["diff", str(old), str(new), "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    return {**{c["host"]: c["action"] for c in doc["containers"]},
            "network": {"created": "add", "kept": "same", "replaced": "replace"}.get(
                doc["network"]["action"], doc["network"]["action"])}


@pytest.mark.docker
def test_diff_predicts_what_preview_does_for_every_kind_of_change(
        emulated_automation, image, tmp_path, capsys):  # noqa: F811
    name = unique("agree")
    base = factories.session(name, pool="local", image=image, size=2, cpu=0.5, mem="512m",
                             command=JOB, env={"MODE": "fast"},
                             distributed={"master_port": 29500, "slots": 1})
    live = factories.write(tmp_path / f"{name}.yaml", base)  # the stack's definition
    old = tmp_path / "old" / f"{name}.yaml"
    old.parent.mkdir()
    shutil.copy(live, old)
    assert main(["up", str(live), "--yes"]) == Exit.OK, capsys.readouterr().err
    capsys.readouterr()
    seen, disagree = {}, {}
    for change, over in CHANGES.items():
        factories.write(live, {**base, **over})
        assert main(["preview", str(live)]) == Exit.OK, capsys.readouterr().err
        capsys.readouterr()
        engine = preview_actions(emulated_automation, name)
        seen[change] = predicted = diff_actions(old, live, capsys)
        if predicted != engine:
            disagree[change] = {"diff": predicted, "preview": engine}
    assert not disagree
    # the examples of the issue, as the engine takes them
    assert seen["slots"] == seen["type"] == {"main1": "replace", "sub1": "replace",
                                             "network": "same"}
    assert seen["restart"] == {"main1": "update", "sub1": "update", "network": "same"}
    assert seen["port"] == {"main1": "replace", "sub1": "same", "network": "same"}
    assert seen["grow"] == {"main1": "replace", "sub1": "replace", "sub2": "add",
                            "network": "same"}
    assert seen["nothing"] == {"main1": "same", "sub1": "same", "network": "same"}
