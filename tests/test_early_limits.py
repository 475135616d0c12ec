"""The pids limit while ``up`` runs (agents/early_limits.py, agents/engine.py
``follow_creations``/``created_container``): each container of the stack gets the pool's limit
as soon as its agent reports it created, before its start; nothing of another stack is
touched; ``ContainerLimits`` stays the guarantee (tests/test_limits.py)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from cluster_sessions.agents.early_limits import early_pids_limits, wait_following
from cluster_sessions.agents.engine import created_container
from cluster_sessions.core.names import STACK_ID_LABEL
from cluster_sessions.core.spec import Agent

from . import factories
from .test_cross_process import home, sessionctl  # noqa: F401 (a fixture, used by name)
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

CID = "a" * 64
LOCAL = Agent.model_validate({"name": "local", "capacity": {"cpu": 1, "mem": "1g",
                                                            "gpus": []}})


def event(action="create", kind="container", cid=CID, stack="s1") -> dict:
    attributes = {"name": "x-main1"} if stack is None else {"name": "x-main1",
                                                            STACK_ID_LABEL: stack}
    return {"Type": kind, "Action": action, "Actor": {"ID": cid, "Attributes": attributes}}


def test_a_create_of_the_stacks_container_is_taken():
    assert created_container(event(), "s1") == CID


@pytest.mark.parametrize("changed", [
    {"stack": "s2"},  # another stack's container
    {"stack": None},  # no stack id at all
    {"action": "start"},
    {"action": "update"},
    {"kind": "network"},
    {"cid": "a" * 63},  # not a full id: nothing an engine sends for a container
    {"cid": "../" + "a" * 61},
    {"cid": None},
])
def test_any_other_event_is_not(changed):
    assert created_container(event(**changed), "s1") is None


def test_an_empty_stack_id_takes_nothing():
    """An object without the label has "" for it: no stack id matches it."""
    assert created_container(event(stack=""), "") is None


def _create(client, image: str, stack_id: str) -> str:  # noqa: F811 - not the fixture
    return client.api.create_container(image, ["true"], name=unique("early"),
                                       labels={STACK_ID_LABEL: stack_id})["Id"]


def _limit(client, cid: str):
    return client.api.inspect_container(cid)["HostConfig"]["PidsLimit"]


@pytest.mark.docker
def test_a_container_of_the_stack_is_limited_while_it_is_still_created_and_no_other(
        docker_client, image):  # noqa: F811
    """One made before the watch began (never started) and one made while it runs get the
    limit with neither started; another stack's is left as it was; the watch's threads end
    with the block."""
    stack_id, other_id = uuid.uuid4().hex[:16], uuid.uuid4().hex[:16]
    made = [_create(docker_client, image, stack_id)]
    before = set(threading.enumerate())
    try:
        with early_pids_limits([LOCAL], stack_id, 4321) as watches:
            (watch,) = watches
            wait_following(watches, 10)
            made.append(_create(docker_client, image, stack_id))
            made.append(other := _create(docker_client, image, other_id))
            deadline = time.monotonic() + 10
            while (any(_limit(docker_client, c) != 4321 for c in made[:2])
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            assert [_limit(docker_client, c) for c in made[:2]] == [4321, 4321], watch.error
            assert {docker_client.api.inspect_container(c)["State"]["Status"]
                    for c in made} == {"created"}
        assert watch.error is None and watch.refused == []
        assert sorted(watch.limited) == sorted(made[:2])
        assert _limit(docker_client, other) in (None, 0)
        assert set(threading.enumerate()) <= before
    finally:
        for cid in made:
            docker_client.api.remove_container(cid, force=True)


def test_an_agent_that_does_not_answer_leaves_it_to_containerlimits():
    """The watch is a head start: an engine that is not there is no error of ``up``'s."""
    gone = Agent.model_validate({"name": "gone", "docker_host": "unix:///nonexistent.sock",
                                 "capacity": {"cpu": 1, "mem": "1g", "gpus": []}})
    with early_pids_limits([gone], "s1", 100) as (watch,):
        time.sleep(0.2)
    assert watch.error is not None and watch.limited == []


@pytest.mark.docker
def test_up_limits_every_container_before_containerlimits_does(  # noqa: F811
        docker_client, image, home, tmp_path):  # noqa: F811
    """``sessionctl up`` (the installed one, through the real engine): every container of the
    session gets its limit from the watch, before the last start; ``ContainerLimits``, once
    all exist, finds it held and leaves it (no ``runc update`` during the start-ups): one
    update each.
    Without the watch, one each, after every start."""
    name = unique("early")
    path = str(factories.write(tmp_path / f"{name}.yaml",
                               factories.session(name, image=image, size=3, cpu=0.5,
                                                 mem="256m")))
    state = tmp_path / "state"
    state.mkdir()
    env = {"HOME": str(home)}
    since = time.time() - 1
    try:
        up = sessionctl(state, "up", path, "--yes", env=env)
        assert up.returncode == 0, up.stderr
        ids = {c.id: c.name for c in docker_client.containers.list(
            all=True, filters={"name": f"{name}-"})}
        assert len(ids) == 3
        seen = docker_client.api.events(since=since, until=time.time(), decode=True, filters={
            "type": ["container"], "event": ["update", "start"]})
        order = [(e["Action"], e["Actor"]["ID"]) for e in seen if e["Actor"]["ID"] in ids]
        for cid, cname in ids.items():
            updates = [i for i, (action, c) in enumerate(order)
                       if c == cid and action == "update"]
            assert len(updates) == 1, f"{cname}: {order}"
        starts = [i for i, (action, _) in enumerate(order) if action == "start"]
        first_updates = [min(i for i, (a, c) in enumerate(order) if c == cid and a == "update")
                         for cid in ids]
        # ContainerLimits waits for every start; the watch's updates do not
        assert min(first_updates) < max(starts), order
    finally:
        down = sessionctl(state, "destroy", path, "--yes", env=env)
    assert down.returncode == 0, down.stderr


@pytest.mark.docker
def test_one_already_running_without_the_limit_gets_it_and_one_that_has_it_is_left(
        docker_client, image):  # noqa: F811
    """A watch that opens late (an agent over SSH under load): the stack's containers already
    started and waiting for the limit get it as the stream opens; one that has it is not
    touched again."""
    stack_id = uuid.uuid4().hex[:16]
    waiting = docker_client.api.create_container(
        image, ["sleep", "60"], entrypoint=[], name=unique("early-run"),
        labels={STACK_ID_LABEL: stack_id})["Id"]
    limited = docker_client.api.create_container(
        image, ["sleep", "60"], entrypoint=[], name=unique("early-has"),
        labels={STACK_ID_LABEL: stack_id},
        host_config=docker_client.api.create_host_config(pids_limit=4321))["Id"]
    try:
        for cid in (waiting, limited):
            docker_client.api.start(cid)
        with early_pids_limits([LOCAL], stack_id, 4321) as watches:
            wait_following(watches, 10)
            deadline = time.monotonic() + 10
            while _limit(docker_client, waiting) != 4321 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert _limit(docker_client, waiting) == 4321
        assert watches[0].limited == [waiting]
    finally:
        for cid in (waiting, limited):
            docker_client.api.remove_container(cid, force=True)
