"""``sessionctl pool up`` and ``pool destroy`` on the lab, each verb a process of its own (the
installed ``sessionctl`` through the real engine, on one file backend): the swarm is formed,
left again when the pool stack is destroyed, and an agent dropped from the pool file leaves it
at the next ``pool up`` (its dynamic resource deleted through its provider)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from cluster_sessions.agents import facts, gathering
from cluster_sessions.agents.connectors import connector_for
from cluster_sessions.driver.stacks import find_pulumi

from .conftest import ENGINE_PATH, STACKS, skip_or_fail
from .lab_support import PoolStack, lab_pool

PREFIX, SUBNET = "cssd", "10.251.113.0/24"
ALL_LEFT = {"agent1": "inactive", "agent2": "inactive", "agent3": "inactive"}


def swarm_roles(pool) -> dict[str, str]:
    roles = {}
    for agent in pool.agents:
        with connector_for(agent) as conn:
            roles[agent.name] = gathering.gather(conn, facts.SwarmInfo()).role
    return roles


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 3, name="sdlab",
                  capacity={"cpu": 1, "mem": "1g", "gpus": []}) as built:
        yield built


@pytest.fixture
def pool_stack(lab):
    """The pool's stack on a file backend of the test's own; whatever a failure left, no swarm
    and no stack file after the test."""
    pulumi = find_pulumi({**os.environ, **ENGINE_PATH})
    if pulumi is None:
        skip_or_fail("the pulumi CLI is not installed: bash scripts/setup.sh")
    original = lab.pool_file.read_text()
    made = PoolStack(lab.pool_file, "pool-sdlab", Path(tempfile.mkdtemp(prefix="sdlab-state-")),
                     pulumi)
    try:
        yield made
    finally:
        lab.pool_file.write_text(original)
        for agent in lab.pool.agents:
            with connector_for(agent) as conn:
                conn.run("docker swarm leave --force", timeout=60)
        shutil.rmtree(made.state, ignore_errors=True)
        (STACKS / f"Pulumi.{made.stack}.yaml").unlink(missing_ok=True)


@pytest.mark.lab
@pytest.mark.docker
def test_pool_destroy_in_another_process_leaves_the_swarm(lab, pool_stack):
    """``pool up`` in one process forms the swarm; ``pool destroy`` in the next calls each
    dynamic resource's delete (workers first), so every agent has left it."""
    started = time.monotonic()
    pool_stack.up()
    up_s = time.monotonic() - started
    assert swarm_roles(lab.pool) == {"agent1": "manager", "agent2": "worker",
                                     "agent3": "worker"}
    started = time.monotonic()
    gone = pool_stack.down()
    down_s = time.monotonic() - started
    assert gone.returncode == 0, gone.stderr
    assert swarm_roles(lab.pool) == ALL_LEFT
    assert pool_stack.resources() == []  # the stack holds nothing of the swarm
    print(f"pool up {up_s:.1f} s, pool destroy {down_s:.1f} s")


@pytest.mark.lab
@pytest.mark.docker
def test_an_agent_dropped_from_the_pool_leaves_the_swarm_at_the_next_pool_up(lab, pool_stack):
    """The program no longer declares agent3's worker: the next ``pool up`` (another process)
    deletes it through its provider (leave, node rm on the manager) and keeps the others."""
    pool_stack.up()
    whole = lab.pool
    doc = yaml.safe_load(lab.pool_file.read_text())
    doc["agents"] = [a for a in doc["agents"] if a["name"] != "agent3"]
    lab.pool_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    smaller = pool_stack.up()
    assert "1 delete" in smaller.stderr, smaller.stderr
    pool = lab.pool
    with connector_for(pool.agent("agent1")) as conn:
        nodes = list(gathering.gather(conn, facts.SwarmNodes()))
    assert len(nodes) == 2, nodes
    roles = swarm_roles(whole)
    assert roles == {"agent1": "manager", "agent2": "worker", "agent3": "inactive"}, roles
    gone = pool_stack.down()
    assert gone.returncode == 0, gone.stderr
    assert swarm_roles(pool) == {"agent1": "inactive", "agent2": "inactive"}
