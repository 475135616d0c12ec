"""Preemption at ``up`` (issue 44, part 5) on the real engine: on a pool with
``policies.preemption``, a higher-priority session that would be pending for capacity ends a
lower-priority ``preemptible: true`` batch session through its stack's destroy, and runs; the
victim is PREEMPTED in ``ls`` with the reason. A session that did not declare it, or of the
same priority, is never ended: the ``up`` is pending (exit 3). The decision's own rules:
tests/test_preemption.py."""

from __future__ import annotations

import json

import pytest

from cluster_sessions.core.names import SESSION_LABEL
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def _pool(tmp_path, preemption=True):
    # one agent whose declared memory holds one 3000g session, not two (the engine does not
    # hold the memory: only what our labels declare counts; what other runs' sessions hold
    # on the same engine, up to 2000g, leaves room for one)
    return factories.write(tmp_path / "pool.yaml", factories.pool(
        unique("pre"), factories.agent("local", cpu=64, mem="5000g"),
        policies={"default": {"max_priority": 50}, "preemption": preemption}))


def _definition(tmp_path, pool, image, name, priority, **over):  # noqa: F811
    return str(factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, pool=str(pool), image=image, cpu=0.1, mem="3000g", shmem="8m",
        priority=priority, **over)))


def _containers(docker_client, name):
    return docker_client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={name}"})


BATCH = {"type": "batch", "command": ["sleep", "600"]}


@pytest.mark.docker
def test_a_higher_priority_up_preempts_a_preemptible_batch_session_and_runs(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    pool = _pool(tmp_path)
    low_name, high_name = unique("low"), unique("high")
    low = _definition(tmp_path, pool, image, low_name, 10, preemptible=True, **BATCH)
    high = _definition(tmp_path, pool, image, high_name, 20)
    try:
        assert cli.main(["up", low, "--yes"]) == 0, capfd.readouterr().err
        assert _containers(docker_client, low_name)
        capfd.readouterr()
        assert cli.main(["up", high, "--yes"]) == 0, capfd.readouterr().err
        err = capfd.readouterr().err
        assert f"preempting {low_name} (priority 10, preemptible batch) for {high_name}" in err
        assert f"preempted {low_name}: preempted by {high_name} (priority 20 > its 10)" in err
        assert not _containers(docker_client, low_name)  # its stack's destroy removed them
        assert [c.status for c in _containers(docker_client, high_name)] == ["running"]

        assert cli.main(["ls", "--json"]) == 0
        rows = {r["name"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}
        victim = rows[low_name]
        assert (victim["state"], victim["phase"], victim["priority"]) == (
            "preempted", "preempted", 10), victim
        assert f"preempted by {high_name} (priority 20 > its 10)" in victim["detail"], victim
        assert rows[high_name]["phase"] == "running", rows[high_name]
        assert cli.main(["ls"]) == 0
        line = next(x for x in capfd.readouterr().out.splitlines() if x.startswith(low_name))
        assert "PREEMPTED" in line.split(), line
        assert cli.main(["status", low]) == 1  # its containers are gone
        assert "preempted at" in capfd.readouterr().out
        # destroyed by hand afterwards, it is an empty stack like any other (no stale record)
        assert cli.main(["destroy", low, "--yes"]) == 0
        capfd.readouterr()
        assert cli.main(["ls", "--json", "--all"]) == 0
        rows = {r["name"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}
        assert rows[low_name]["state"] == "empty", rows[low_name]
    finally:
        assert cli.main(["destroy", high, "--yes"]) == 0
        assert cli.main(["destroy", low, "--yes"]) == 0


@pytest.mark.docker
def test_a_session_that_is_not_preemptible_or_of_the_same_priority_is_never_preempted(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    pool = _pool(tmp_path)
    keeps_name, equal_name, high_name = unique("keeps"), unique("equal"), unique("high")
    keeps = _definition(tmp_path, pool, image, keeps_name, 0, **BATCH)  # did not declare it
    equal = _definition(tmp_path, pool, image, equal_name, 20, preemptible=True, **BATCH)
    high = _definition(tmp_path, pool, image, high_name, 20)
    try:
        for holder, name in ((keeps, keeps_name), (equal, equal_name)):
            assert cli.main(["up", holder, "--yes"]) == 0, capfd.readouterr().err
            capfd.readouterr()
            assert cli.main(["up", high, "--yes"]) == 3
            err = capfd.readouterr().err
            assert "pending" in err and "preempt" not in err, err
            assert [c.status for c in _containers(docker_client, name)] == ["running"]
            assert not _containers(docker_client, high_name)
            assert cli.main(["destroy", holder, "--yes"]) == 0
    finally:
        for f in (keeps, equal, high):
            cli.main(["destroy", f, "--yes"])


@pytest.mark.docker
def test_without_policies_preemption_a_higher_priority_up_is_pending(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    pool = _pool(tmp_path, preemption=False)
    low_name, high_name = unique("low"), unique("high")
    low = _definition(tmp_path, pool, image, low_name, 0, preemptible=True, **BATCH)
    high = _definition(tmp_path, pool, image, high_name, 20)
    try:
        assert cli.main(["up", low, "--yes"]) == 0, capfd.readouterr().err
        capfd.readouterr()
        assert cli.main(["up", high, "--yes"]) == 3
        assert [c.status for c in _containers(docker_client, low_name)] == ["running"]
    finally:
        for f in (low, high):
            cli.main(["destroy", f, "--yes"])


@pytest.mark.docker
def test_over_its_quota_a_higher_priority_up_preempts_nobody(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    """Preemption makes room on the agents, never in a quota: ending the victim would bring
    the project under its limit, but an up over its quota is pending all the same."""
    project = unique("q").lower()  # its own project: nobody else's sessions count in it
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        unique("pre"), factories.agent("local", cpu=64, mem="5000g"),
        policies={"projects": {project: {"definitions": ["."], "max_priority": 50,
                                         "quota": {"mem": "5000g"}}},
                  "preemption": True}))
    low_name, high_name = unique("low"), unique("high")
    low = _definition(tmp_path, pool, image, low_name, 0, preemptible=True, project=project,
                      **BATCH)
    high = _definition(tmp_path, pool, image, high_name, 20, project=project)
    try:
        assert cli.main(["up", low, "--yes"]) == 0, capfd.readouterr().err
        capfd.readouterr()
        assert cli.main(["up", high, "--yes"]) == 3
        err = capfd.readouterr().err
        assert f"project {project}: mem 3000g + 3000g > 5000g" in err, err
        assert "preempt" not in err, err
        assert [c.status for c in _containers(docker_client, low_name)] == ["running"]
    finally:
        for f in (low, high):
            cli.main(["destroy", f, "--yes"])


@pytest.mark.docker
def test_when_a_victims_destroy_fails_the_new_session_is_not_placed_and_the_victim_named(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    import os

    from cluster_sessions.driver.stack_lock import stack_lock

    pool = _pool(tmp_path)
    low_name, high_name = unique("low"), unique("high")
    low = _definition(tmp_path, pool, image, low_name, 0, preemptible=True, **BATCH)
    high = _definition(tmp_path, pool, image, high_name, 20)
    try:
        assert cli.main(["up", low, "--yes"]) == 0, capfd.readouterr().err
        capfd.readouterr()
        # another run holds the victim's stack: its destroy is refused
        with stack_lock(os.environ["PULUMI_BACKEND_URL"], low_name, "test"):
            assert cli.main(["up", high, "--yes"]) == 1
        err = capfd.readouterr().err
        assert f"preemption of {low_name} (stack {low_name}) for {high_name} failed" in err, err
        assert f"{high_name} was not placed" in err, err
        assert not _containers(docker_client, high_name)
        assert [c.status for c in _containers(docker_client, low_name)] == ["running"]
        # nothing is left held: its claim and the new session's reservation are gone, so a
        # second try preempts it
        assert cli.main(["up", high, "--yes"]) == 0, capfd.readouterr().err
        assert not _containers(docker_client, low_name)
    finally:
        for f in (high, low):
            cli.main(["destroy", f, "--yes"])
