"""``diff`` and ``preview`` agree (issue 32, class 4): for several kinds of change, the action
``sessionctl diff OLD NEW`` predicts for each container and the network is the one the engine
takes in ``sessionctl preview NEW`` on a stack ``up`` built from OLD (the real pulumi CLI and
docker provider: ``real_engine``; the engine's steps as ``preview --json`` reports them)."""

from __future__ import annotations

import json
import shutil

import pytest

from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

CONTAINER = "docker:index/container:Container"
NETWORK = "pulumi-python:dynamic/cluster-sessions:SessionNetwork"

# diff's words for the engine's steps (a replacement's steps are one "replace": step_lines)
ACTION = {"create": "add", "update": "update", "replace": "replace",
          "create-replacement": "replace", "delete-replaced": "replace"}
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


def preview_actions(steps: list[dict], name: str, hosts) -> dict[str, str]:
    """What the engine's preview does to each container and the network: its steps (the
    engine reports no step for what stays the same)."""
    out = {**{host: "same" for host in hosts}, "network": "same"}
    for step in steps:
        if step["type"] == CONTAINER:
            out[step["name"].removeprefix(f"{name}-")] = ACTION[step["op"]]
        elif step["type"] == NETWORK:
            out["network"] = ACTION[step["op"]]
    return out


def diff_actions(old, new, capsys) -> dict[str, str]:
    assert main(["diff", str(old), str(new), "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    return {**{c["host"]: c["action"] for c in doc["containers"]},
            "network": {"created": "add", "kept": "same", "replaced": "replace"}.get(
                doc["network"]["action"], doc["network"]["action"])}


@pytest.mark.docker
def test_diff_predicts_what_preview_does_for_every_kind_of_change(
        real_engine, image, tmp_path, capsys):  # noqa: F811
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
        assert main(["preview", str(live), "--json"]) == Exit.OK, capsys.readouterr().err
        steps = json.loads(capsys.readouterr().out)["steps"]
        seen[change] = predicted = diff_actions(old, live, capsys)
        engine = preview_actions(steps, name, [h for h in predicted if h != "network"])
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
