"""Governance on the real engine (issue 44): a project's quota decided under the pool's lock
with the capacity decision, every object labelled with its project, a claim the operator did
not grant refused before anything is made."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from cluster_sessions.core.names import PROJECT_LABEL, SESSION_LABEL, config_key
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def objects_of(docker_client, session: str) -> list:
    label = f"{SESSION_LABEL}={session}"
    return (docker_client.containers.list(all=True, filters={"label": label})
            + docker_client.networks.list(filters={"label": label}))


def governed_pool(tmp_path, quota: dict, *others: str) -> None:
    """A pool of this engine (memory to spare: the quota is what holds sessions back), with a
    project ``vision`` whose definitions live in ``vision/`` beside it, and each of ``others``
    (the same quota, in its own directory)."""
    for where in ("vision", "other", *others):
        (tmp_path / where).mkdir()
    factories.write(tmp_path / "pool.yaml", factories.pool(
        unique("gov"), factories.agent("local", cpu=64, mem="1000g"),
        policies={"projects": {p: {"definitions": [p], "quota": dict(quota)}
                               for p in ("vision", *others)}}))  # a quota copy each: no YAML alias


def definition(tmp_path, image, where: str, name: str, **over) -> str:  # noqa: F811
    return str(factories.write(tmp_path / where / f"{name}.yaml", factories.session(
        name, pool=str(tmp_path / "pool.yaml"), image=image, cpu=0.1, mem="64m",
        shmem="8m", **over)))


@pytest.mark.docker
def test_a_project_at_its_quota_is_pending_naming_the_limit_and_runs_when_one_ends(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    governed_pool(tmp_path, {"containers": 2, "sessions": 1})
    names = [unique("qva"), unique("qvb"), unique("qdf")]
    a = definition(tmp_path, image, "vision", names[0], size=2, project="vision")
    b = definition(tmp_path, image, "vision", names[1], project="vision")
    free = definition(tmp_path, image, "other", names[2])
    assert cli.main(["up", a, "--yes"]) == 0, capfd.readouterr().err
    capfd.readouterr()
    # every object of the session carries its project; the stack keeps it
    assert {o.attrs.get("Config", o.attrs).get("Labels", {}).get(PROJECT_LABEL)
            for o in objects_of(docker_client, names[0])} == {"vision"}
    assert real_engine.stacks[names[0]].config[config_key("project")] == "vision"

    assert cli.main(["up", b, "--yes", "--json"]) == 3
    out, err = capfd.readouterr()
    doc = json.loads(out)
    assert doc["result"] == "pending", doc
    assert "project vision: containers 2 + 1 > 2" in doc["reason"], doc
    assert "project vision: sessions 1 + 1 > 1" in doc["reason"], doc
    assert objects_of(docker_client, names[1]) == []
    # plan --probe says which limit would hold it back
    assert cli.main(["plan", b, "--probe", "--json"]) == 3
    planned = json.loads(capfd.readouterr().out)
    assert planned["status"] == "pending", planned
    assert "project vision: sessions 1 + 1 > 1" in planned["reason"], planned
    # another project's (the default's) session is not held back by vision's quota
    assert cli.main(["up", free, "--yes"]) == 0, capfd.readouterr().err

    codes: list[int] = []

    def wait_up() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())  # the emulated engine runs in it
        codes.append(cli.main(["up", b, "--yes", "--wait", "120s"]))

    waiter = threading.Thread(target=wait_up)
    waiter.start()
    try:
        time.sleep(4)
        assert objects_of(docker_client, names[1]) == []  # still queued, over the quota
        assert cli.main(["destroy", a, "--yes"]) == 0
        waiter.join(timeout=100)
        assert codes == [0]
        assert objects_of(docker_client, names[1])
    finally:
        waiter.join(timeout=120)
        for f in (a, b, free):
            cli.main(["destroy", f, "--yes"])


@pytest.mark.docker
def test_a_claim_outside_the_operators_mapping_is_refused_and_nothing_is_made(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    governed_pool(tmp_path, {})
    name = unique("qclaim")
    path = definition(tmp_path, image, "other", name, project="vision")
    assert cli.main(["up", path, "--yes"]) == 2
    assert f"{path}: project: this definition may not claim project 'vision'" in \
        capfd.readouterr().err
    assert objects_of(docker_client, name) == []
    # the operator's word grants it
    assert cli.main(["up", path, "--yes", "--project", "vision"]) == 0, capfd.readouterr().err
    try:
        assert {c.labels.get(PROJECT_LABEL) for c in docker_client.containers.list(
            all=True, filters={"label": f"{SESSION_LABEL}={name}"})} == {"vision"}
    finally:
        assert cli.main(["destroy", path, "--yes", "--project", "vision"]) == 0


@pytest.mark.docker
def test_parallel_ups_do_not_take_a_project_past_its_quota(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    """Four ``up``s at once, two of each of two projects, each with a quota of one session:
    the quota is decided under the pool's lock with the placement, and a reservation counts,
    so one of each project runs, whatever the order."""
    governed_pool(tmp_path, {"sessions": 1}, "speech")
    projects = ["vision", "speech", "vision", "speech"]
    names = [unique(f"qrace{i}") for i in range(4)]
    files = [definition(tmp_path, image, p, n, project=p) for p, n in zip(projects, names,
                                                                            strict=True)]
    codes: dict[str, int] = {}

    def up(path: str) -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        codes[path] = cli.main(["up", path, "--yes"])

    threads = [threading.Thread(target=up, args=(f,)) for f in files]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=200)
        assert sorted(codes.values()) == [0, 0, 3, 3], codes
        made = [p for p, n in zip(projects, names, strict=True) if objects_of(docker_client, n)]
        assert sorted(made) == ["speech", "vision"], made
    finally:
        for f in files:
            cli.main(["destroy", f, "--yes"])


@pytest.mark.docker
def test_pool_usage_shows_each_projects_holdings_against_its_quota(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    governed_pool(tmp_path, {"containers": 4, "sessions": 2, "mem": "1g"})
    name = unique("qusage")
    path = definition(tmp_path, image, "vision", name, size=2, project="vision")
    assert cli.main(["up", path, "--yes"]) == 0, capfd.readouterr().err
    try:
        capfd.readouterr()
        pool = str(tmp_path / "pool.yaml")
        assert cli.main(["pool", "usage", pool, "--json", "--no-sample"]) == 0
        rows = {r["project"]: r for r in json.loads(capfd.readouterr().out)["projects"]}
        assert rows["vision"]["held"] == {"cpu": 0.2, "mem": 128 * 1024**2, "gpus": 0,
                                          "containers": 2, "sessions": 1}, rows
        assert rows["vision"]["quota"] == {"mem": 1024**3, "containers": 4, "sessions": 2}
        assert rows["vision"]["pending"] == 0
        assert cli.main(["pool", "usage", pool, "--no-sample"]) == 0
        assert ("project vision: cpu 0.2/-, mem 128m/1g, gpus 0/-, containers 2/4, "
                "sessions 1/2, pending 0/-") in capfd.readouterr().out
    finally:
        assert cli.main(["destroy", path, "--yes"]) == 0
