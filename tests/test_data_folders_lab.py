"""Data folders on the lab's multi-node pool (issue 23, item 2): two agents in network
namespaces, reached only over SSH as the pool's non-root user, sharing one storage root (one
host directory every agent's engine sees, as agents share an NFS mount). ``sessionctl up`` and
``destroy`` run for real (the pulumi CLI stood in for by the emulation, building on the agents'
engines over their SSH).

Proved: the folder is made with the session user's uid/gid; a file written in main1 is seen
from sub1 on the other agent; ``destroy`` leaves the folder and the file; ``up`` again finds
them. A link planted at the folder's path is refused with exit 2 and nothing is created."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
import yaml

from cluster_sessions.agents.connectors import connector_for
from cluster_sessions.core.loader import load_file
from cluster_sessions.core.names import HOST_LABEL, SESSION_LABEL
from cluster_sessions.core.plan import build_plan
from cluster_sessions.driver import cli

from . import factories
from .factories import load_session
from .lab_support import lab_pool, pool_swarm
from .test_runtime import unique

pytestmark = [pytest.mark.lab, pytest.mark.docker, pytest.mark.slow]

PREFIX, SUBNET = "cslf", "10.251.107.0/24"
TARGET = "/home/work/mydata"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Two agents of one CPU each (a two-container session of one CPU each spans both), their
    swarm formed by the pool program, and the lab's storage root."""
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 2, name="dflab",
                  capacity={"cpu": 1, "mem": "4g", "gpus": []}) as pool, \
            pool_swarm(pool.pool_file, "pool-dflab"):
        storage = yaml.safe_load(pool.pool_file.read_text())["storage"]["data"]
        yield pool.pool_file, pool.image, Path(storage)


def definition(tmp_path: Path, pool_file: Path, image: str, folder: str) -> Path:
    name = unique("df")
    doc = factories.session(name, str(pool_file), image, size=2, mode="multi-node", cpu=1,
                            mem="512m", mounts=[{"folder": folder, "target": TARGET}])
    return factories.write(tmp_path / f"{name}.yaml", doc)


@pytest.fixture(scope="module")
def clients(lab):
    """Each agent's engine reached as the pool says: over SSH as the non-root user."""
    held, out = [], {}
    try:
        for agent in load_file(lab[0], expect="AgentPool").agents:
            conn = connector_for(agent, timeout=120)
            held.append(conn)
            out[agent.name] = conn.docker_client()
            held.append(out[agent.name])
        yield out
    finally:
        for h in reversed(held):
            with contextlib.suppress(Exception):
                h.close()


def session_containers(clients: dict, name: str) -> dict:
    """The session's containers on every agent, by host: (agent, container)."""
    found = {}
    for agent, client in clients.items():
        for c in client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={name}"}):
            found[c.labels[HOST_LABEL]] = (agent, c)
    return found


def as_user(container, command: str, timeout: float = 120) -> str:
    """``command`` as the session user, once the entrypoint has made the user."""
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        code, out = container.exec_run(["/bin/sh", "-c", command], user="work")
        last = (out or b"").decode(errors="replace")
        if code == 0:
            return last
        time.sleep(1)
    raise AssertionError(f"{command!r} in {container.name}: {last}")


def test_a_folder_is_shared_across_agents_and_outlives_destroy(lab, clients, real_engine,
                                                              tmp_path, capfd):
    pool_file, image, root = lab
    path = definition(tmp_path, pool_file, image, "mydata")
    loaded = load_session(path)
    plan = build_plan(loaded.session, loaded.pool)
    assert [c.agent for c in plan.containers] == ["agent1", "agent2"]  # across both agents
    folder = root / "mydata"
    try:
        assert cli.main(["up", str(path), "--yes"]) == 0, capfd.readouterr().err
        found = session_containers(clients, plan.name)
        assert {h: a for h, (a, _) in found.items()} == {"main1": "agent1", "sub1": "agent2"}
        st = os.lstat(folder)
        assert (st.st_uid, st.st_gid) == (9001, 9001)  # the session user's, made by the engine
        as_user(found["main1"][1], f"echo written-in-main1 > {TARGET}/note.txt")
        assert as_user(found["sub1"][1], f"cat {TARGET}/note.txt") == "written-in-main1\n"

        assert cli.main(["destroy", str(path), "--yes"]) == 0, capfd.readouterr().err
        assert session_containers(clients, plan.name) == {}
        assert (folder / "note.txt").read_text() == "written-in-main1\n"  # kept

        assert cli.main(["up", str(path), "--yes"]) == 0, capfd.readouterr().err
        found = session_containers(clients, plan.name)
        assert as_user(found["sub1"][1], f"cat {TARGET}/note.txt") == "written-in-main1\n"
        assert as_user(found["main1"][1], f"stat -c %u:%g {TARGET}/note.txt") == "9001:9001\n"
    finally:
        with contextlib.suppress(Exception):
            cli.main(["destroy", str(path), "--yes"])
        capfd.readouterr()
    assert (folder / "note.txt").exists()


def test_a_planted_link_is_refused_with_exit_2_and_nothing_is_created(
        lab, clients, real_engine, tmp_path, capfd):
    pool_file, image, root = lab
    (root / "planted").symlink_to("/etc")
    path = definition(tmp_path, pool_file, image, "planted")
    name = load_session(path).session.name
    try:
        assert cli.main(["up", str(path), "--yes"]) == 2
        err = capfd.readouterr().err
        assert f"{path}: mounts.0.folder: on agent agent1: {root}/planted is a symbolic link" \
            in err, err
        assert "nothing was created" in err
        assert session_containers(clients, name) == {}
        assert os.readlink(root / "planted") == "/etc"
        assert f"up {name}" not in real_engine.calls  # the engine was never asked
    finally:
        (root / "planted").unlink()
