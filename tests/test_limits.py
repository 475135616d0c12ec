"""The pool's pids limit (pulumi_layer/limits.py, agents/engine.py ``set_pids_limit``): one
``ContainerLimits`` per agent of the session, set through the engine once the containers exist;
the set-up waits for it (tests/test_runtime.py)."""

from __future__ import annotations

import uuid

import pytest

from cluster_sessions.agents.engine import set_pids_limit
from cluster_sessions.core.errors import EngineFailure
from cluster_sessions.core.spec import MAX_PIDS_LIMIT, MIN_PIDS_LIMIT
from cluster_sessions.pulumi_layer.limits import ContainerLimitsProvider
from tests.standin.engine import Engine, run_program

from .test_session import config_of, expected_plan

CONTAINER = "docker:index/container:Container"
AGENT = {"name": "agent1", "docker_host": "unix:///var/run/docker.sock"}


def props(**over) -> dict:
    return {"agent": AGENT, "containers": {"main1": "c1", "sub1": "c2"},
            "pids_limit": 8192, **over}


@pytest.mark.parametrize("limit", [True, 1.5, "8192", MIN_PIDS_LIMIT - 1, MAX_PIDS_LIMIT + 1,
                                   -1, 0])
def test_a_limit_that_is_not_a_whole_number_in_range_is_refused_by_check(limit):
    result = ContainerLimitsProvider().check({}, props(pids_limit=limit))
    assert [f.property for f in result.failures] == ["pids_limit"]


def test_a_limit_in_range_passes_check():
    for limit in (MIN_PIDS_LIMIT, 8192, MAX_PIDS_LIMIT):
        assert not ContainerLimitsProvider().check({}, props(pids_limit=limit)).failures


def test_a_replaced_container_or_another_limit_is_an_update_another_agent_a_replacement():
    provider = ContainerLimitsProvider()
    same = provider.diff("agent1:pids", props(), props())
    assert not same.changes
    replaced = provider.diff("agent1:pids", props(),
                             props(containers={"main1": "c9", "sub1": "c2"}))
    assert replaced.changes and not replaced.replaces
    raised = provider.diff("agent1:pids", props(), props(pids_limit=100))
    assert raised.changes and not raised.replaces
    moved = provider.diff("agent1:pids", props(), props(agent={**AGENT, "name": "agent2"}))
    assert moved.changes and moved.replaces == ["agent"]


@pytest.mark.parametrize("stack", ["spread-demo", "train-demo", "spread-on-workers"])
def test_the_program_limits_every_container_once_on_its_own_agent(stack):
    """One resource per agent that holds containers; together they name every container
    once, by the id the docker resource got, on the agent the plan put it, with the pool's
    limit. (Under mocks no container is made: the engine records what would be set.)"""
    config = config_of(stack)
    plan = expected_plan(config, stack)
    engine = Engine()
    run_program(engine, stack, config)
    # the mocked effects of the ContainerLimits resources (the bundle deliveries, issue 45,
    # are recorded there too)
    pids_limits_applied = [inputs for step, _, inputs in engine.mocked_effects
                           if "pids_limit" in inputs]
    assert pids_limits_applied
    assert {step for step, _, _ in engine.mocked_effects} == {"create"}
    expected: dict[str, set[str]] = {}
    for c in plan.containers:
        expected.setdefault(c.agent, set()).add(c.host)
    got = {a["agent"]["name"]: set(a["containers"]) for a in pids_limits_applied}
    assert got == expected and len(pids_limits_applied) == len(expected)
    assert {a["pids_limit"] for a in pids_limits_applied} == {plan.limits.pids_limit}
    ids = {r.plain_inputs["hostname"]: r.name for r in engine.of_type(CONTAINER)}
    for applied in pids_limits_applied:  # the mocks' ids: "<resource name>-id"
        assert all(cid == f"{ids[h]}-id" for h, cid in applied["containers"].items())


@pytest.mark.docker
def test_set_pids_limit_bounds_a_created_container_and_the_engine_keeps_it(docker_client):
    from cluster_sessions.lab.image import ensure_image

    image = ensure_image(docker_client)
    container = docker_client.containers.create(
        image, ["sleep", "60"], entrypoint=[], name=f"cst-pids-{uuid.uuid4().hex[:8]}")
    try:
        assert set_pids_limit(docker_client, container.id, 100) == 100
        container.start()
        container.reload()
        assert container.attrs["HostConfig"]["PidsLimit"] == 100
        code, out = container.exec_run(["sh", "-c", "cat /sys/fs/cgroup/pids.max 2>/dev/null"
                                        " || cat /sys/fs/cgroup/pids/pids.max"])
        assert (code, out.strip()) == (0, b"100")
        # past the limit, fork fails (threads count: the pids cgroup counts tasks)
        code, out = container.exec_run(["sh", "-c", "n=0; while [ $n -lt 150 ]; do "
                                        "sleep 30 & n=$((n+1)); done 2>&1 | head -3; echo end"])
        assert b"end" in out
        code, out = container.exec_run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"])
        assert int(out) <= 100
    finally:
        container.remove(force=True)


@pytest.mark.docker
def test_set_pids_limit_on_a_container_that_is_gone_is_an_engine_error(docker_client):
    import docker.errors

    with pytest.raises(docker.errors.NotFound):
        set_pids_limit(docker_client, f"cst-gone-{uuid.uuid4().hex[:8]}", 100)


def test_an_engine_that_does_not_apply_the_limit_is_refused():
    """A kernel without the pids cgroup: the engine answers with a warning and keeps no
    limit; the container must not be left unbounded silently."""

    class Api:
        def _url(self, path, *args):
            return path.format(*args)

        def _post_json(self, url, data):
            return {"Warnings": ["Your kernel does not support PIDs limit capabilities"]}

        def _result(self, answer, json):
            return answer

        def inspect_container(self, cid):
            return {"HostConfig": {"PidsLimit": None}}

    class Client:
        api = Api()

    with pytest.raises(EngineFailure, match="does not support PIDs limit"):
        set_pids_limit(Client(), "abc", 100)


class _CountingApi:
    """An engine that keeps one container's ``PidsLimit`` and counts the update calls."""

    def __init__(self, held):
        self.held, self.updates = held, 0

    def _url(self, path, *args):
        return path.format(*args)

    def _post_json(self, url, data):
        self.updates += 1
        self.held = data["PidsLimit"]
        return {}

    def _result(self, answer, json):
        return answer

    def inspect_container(self, cid):
        return {"HostConfig": {"PidsLimit": self.held}}


@pytest.mark.parametrize(("held", "updates"), [(None, 1), (0, 1), (99, 1), (100, 0)])
def test_container_limits_leave_a_container_that_holds_the_limit(held, updates):
    """ContainerLimits' pass after `up`'s watch: a container already at the limit gets no
    update (on a running one that is a `runc update`, taken from the session's start-ups);
    any other value is set."""

    class Client:
        api = _CountingApi(held)

    assert set_pids_limit(Client(), "abc", 100, unless_held=True) == 100
    assert Client.api.updates == updates
    assert set_pids_limit(Client(), "abc", 100) == 100  # the watch's call: always
    assert Client.api.updates == updates + 1


def test_container_limits_pass_asks_to_leave_held_limits(monkeypatch):
    from cluster_sessions.pulumi_layer import limits

    calls = []
    monkeypatch.setattr(limits, "set_pids_limit",
                        lambda client, cid, limit, **kw: calls.append((cid, limit, kw)) or limit)

    class Conn:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def docker_client(self):
            return type("C", (), {"close": lambda self: None})()

    from cluster_sessions.pulumi_layer import engine_resource

    monkeypatch.setattr(engine_resource, "connector_from_props", lambda agent, timeout: Conn())
    limits.ContainerLimitsProvider().ensure({"agent": {"name": "a"},
                                             "containers": {"main1": "x", "sub1": "y"},
                                             "pids_limit": 100})
    assert sorted(calls) == [("x", 100, {"unless_held": True}), ("y", 100, {"unless_held": True})]
