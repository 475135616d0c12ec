"""The emulated provider (cluster_sessions.emulation.provider): no perpetual diff for any
stack, and ``sessionctl diff`` (review.py) agrees with what an emulated ``up`` would do."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster_sessions.core import review
from cluster_sessions.core.loader import load_session
from cluster_sessions.core.plan import build_plan
from cluster_sessions.emulation import provider
from cluster_sessions.emulation.engine import STACKS, Engine, run_program

from .test_session import EXAMPLES, FIXTURE_STACKS, config_of

CONTAINER, NETWORK = provider.CONTAINER, provider.NETWORK


@pytest.mark.parametrize("stack", EXAMPLES + sorted(FIXTURE_STACKS))
def test_an_unchanged_definition_shows_no_change_against_the_read_back_state(stack):
    """up, then up again: every docker resource compares its inputs with what the provider
    read back after the first, and finds nothing (a perpetual diff would replace it)."""
    config = config_of(stack)
    engine = Engine()
    run_program(engine, stack, config)
    assert {a for a, _ in engine.actions.values()} == {provider.CREATE}
    run_program(engine, stack, config)
    docker = {r.urn for r in engine.registrations if r.type in (CONTAINER, NETWORK)}
    assert docker
    changed = {urn: engine.actions[urn] for urn in docker
               if engine.actions[urn][0] != provider.SAME}
    assert not changed, changed


def test_the_read_back_is_what_makes_a_diff_perpetual():
    """Without the read-back spelling the same definition would replace every container."""
    state = provider.read_back(CONTAINER, {"cpus": "1"}, {"cpus": "1"})
    assert state["cpus"] == "1.0"
    assert provider.diff(CONTAINER, state, {"cpus": "1"}, []) == (provider.REPLACE, ("cpus",))
    assert provider.diff(CONTAINER, state, {"cpus": "1.0"}, []) == (provider.SAME, ())
    overlay = {"driver": "overlay", "options": {"m": "1"}}
    net = provider.read_back(NETWORK, overlay, overlay)
    assert provider.diff(NETWORK, net, {"driver": "overlay", "options": {"m": "1"}}, []) == (
        provider.REPLACE, ("options",))
    assert provider.diff(NETWORK, net, {"driver": "overlay", "options": {"m": "1"}},
                         ["options"]) == (provider.SAME, ())


TRAIN = (STACKS / "sessions" / "train-demo.yaml").read_text()
CHANGES = {
    "restart": ("restart:", lambda d: {**d, "restart": "always"}),
    "memory": ("resources", lambda d: {**d, "resources": {**d["resources"], "mem": "3g"}}),
    "image": ("image", lambda d: {**d, "image": "cluster-sessions/debian-sshd:other"}),
    "env": ("env", lambda d: {**d, "env": {**(d.get("env") or {}), "NEW": "value"}}),
    "command": ("command", lambda d: {**d, "command": ["sleep", "123"]}),
    "size": ("cluster", lambda d: {**d, "cluster": {**d["cluster"], "size": 3}}),
    "readiness": ("readiness", lambda d: {**d, "readiness": {"timeout": 77}}),
    "nothing": ("", lambda d: d),
    "batch": ("type", lambda d: {**d, "type": "batch", "command": ["sh", "-c", "exit 0"]}),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_diff_agrees_with_what_an_emulated_up_does(tmp_path, change):
    definition = yaml.safe_load(TRAIN)
    pool = STACKS / "pools" / "local.yaml"
    old_file, new_file = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old_file.write_text(yaml.safe_dump(definition))
    new_file.write_text(yaml.safe_dump(CHANGES[change][1](definition)))
    engine = Engine()
    name = definition["name"]
    for path in (old_file, new_file):
        run_program(engine, name, {"cluster-sessions:definition": str(path),
                                   "cluster-sessions:pool": str(pool)})
    emulated = {r.name.removeprefix(f"{name}-"): engine.actions[r.urn][0]
                for r in engine.registrations if r.type == CONTAINER}
    old, new = (load_session(p, Path(pool)) for p in (old_file, new_file))
    predicted = review.diff_plans(build_plan(old.session, old.pool),
                                  build_plan(new.session, new.pool))
    said = {a.host: a.action for a in predicted.containers if a.action != review.REMOVE}
    translate = {review.ADD: provider.CREATE, review.SAME: provider.SAME,
                 review.UPDATE: provider.UPDATE, review.REPLACE: provider.REPLACE}
    assert {h: translate[a] for h, a in said.items()} == emulated
