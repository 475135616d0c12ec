"""Named volumes are not a way into other workloads (issue 32, class 3).

A session mounts only the volumes the pool lists (``volumes:``, the operator's) or its own: a
volume that does not exist yet is made by the session's first container, labelled with the
session's name (core.plan.volume_labels, passed as the mount's volume options), and one that
exists must carry that label. Anything else (another service's data, another session's
volume) is exit 2 naming ``mounts.N.source`` before anything is created.
"""

from __future__ import annotations

import contextlib

import pytest

from cluster_sessions.core.container_args import container_args
from cluster_sessions.core.folders import volume_verdict
from cluster_sessions.core.names import SESSION_LABEL
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.spec import Pool, Session, mount_source_problems, pool_problems
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (a fixture used by name)


def plan_of(mounts: list, **pool_over):
    pool = Pool.model_validate(factories.pool("p", **pool_over))
    session = Session.model_validate(factories.session("vols", "p", mounts=mounts))
    return build_plan(session, pool)


# --- offline -------------------------------------------------------------------------------------


def test_the_pools_volumes_are_volume_names():
    pool = Pool.model_validate(factories.pool("p", volumes=["datasets", "-x", "a/b", "ok.v_1"]))
    assert [p for p, _ in pool_problems(pool)] == ["volumes.1", "volumes.2"]


def test_a_volume_the_session_makes_is_created_with_its_label_and_a_listed_one_is_not():
    plan = plan_of([{"source": "scratch", "target": "/home/work/s"},
                    {"source": "datasets", "target": "/home/work/d"},
                    {"source": "/srv/x", "target": "/home/work/x"}],
                   volumes=["datasets"], mount_sources=["/srv"])
    mounts = container_args(plan, plan.containers[0], "unix:///var/run/docker.sock").mounts
    assert [(m.source, m.volume_labels) for m in mounts] == [
        ("scratch", ((SESSION_LABEL, "vols"),)), ("datasets", ()), ("/srv/x", ())]


def test_the_sessions_of_a_count_cannot_share_a_volume_the_pool_does_not_list():
    pool = Pool.model_validate(factories.pool("p", volumes=["datasets"]))
    mounts = [{"source": "cache", "target": "/home/work/c"},
              {"source": "datasets", "target": "/home/work/d"}]
    counted = Session.model_validate(factories.session("vols", "p", mounts=mounts, count=2))
    assert [p for p, _ in mount_source_problems(counted, pool)] == ["mounts.0.source"]
    assert "shared by the 2 sessions of count" in mount_source_problems(counted, pool)[0][1]
    single = Session.model_validate(factories.session("vols", "p", mounts=mounts))
    assert mount_source_problems(single, pool) == []


@pytest.mark.parametrize(("labels", "ok"), [
    (None, True),                                      # missing: the session makes it
    ({SESSION_LABEL: "vols"}, True),                   # made by this session
    ({}, False),                                       # another service's
    ({"com.example.app": "db"}, False),
    ({SESSION_LABEL: "other"}, False),                 # another session's
    ({SESSION_LABEL: "vols-2"}, False),
])
def test_only_a_missing_volume_or_the_sessions_own_may_be_mounted(labels, ok):
    assert (volume_verdict(labels, "vols", SESSION_LABEL) is None) == ok


# --- on the real engine ------------------------------------------------------------------------


def definition(tmp_path, image_tag: str, volume: str, **pool_over):
    factories.write(tmp_path / "pool.yaml", factories.pool(
        "vols", factories.agent("local", cpu=2, mem="4g"), **pool_over))
    name = unique("vol")
    return factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, str(tmp_path / "pool.yaml"), image=image_tag, cpu=0.5, mem="512m",
        mounts=[{"source": volume, "target": "/home/work/data"}]))


@pytest.fixture
def volumes(docker_client):
    """Volumes a test makes or expects, removed afterwards (with any container still using
    one: the emulated automation's clean-up comes after this)."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(Exception):
            for c in docker_client.containers.list(all=True, filters={"volume": name}):
                c.remove(force=True)
            docker_client.volumes.get(name).remove(force=True)


def secret_volume(docker_client, name: str, labels: dict | None = None) -> None:
    """Another workload's volume holding a 0600 file."""
    docker_client.volumes.create(name, labels=labels or {})
    docker_client.containers.run(
        "cluster-sessions/debian-sshd:latest", ["sh", "-c", "echo s3cret > /v/db && chmod 600 "
                                                "/v/db"],
        entrypoint=[], volumes={name: {"bind": "/v", "mode": "rw"}}, remove=True)


@pytest.mark.docker
@pytest.mark.parametrize("labels", [None, {SESSION_LABEL: "someone-else"},
                                    {"com.example.app": "othersvc"}])
def test_another_workloads_volume_is_refused_before_anything_is_created(
        real_engine, docker_client, image, tmp_path, capfd, volumes,  # noqa: F811
        labels):
    volume = f"{unique('h4-othersvc')}-data"
    volumes.append(volume)
    secret_volume(docker_client, volume, labels)
    path = definition(tmp_path, image, volume)
    assert cli.main(["up", str(path), "--yes"]) == 2
    err = capfd.readouterr().err
    assert f"{path}: mounts.0.source: on agent local: volume {volume} exists and is " in err, err
    assert "nothing was created" in err
    assert f"up {path.stem}" not in real_engine.calls
    assert not docker_client.containers.list(all=True, filters={"name": path.stem})
    assert docker_client.volumes.get(volume).attrs["Labels"] in ({}, None, labels)


@pytest.mark.docker
def test_a_volume_the_session_makes_is_labelled_and_stays_its_own(
        real_engine, docker_client, image, tmp_path, capfd, volumes):  # noqa: F811
    volume = f"{unique('own')}-data"
    volumes.append(volume)
    path = definition(tmp_path, image, volume)
    try:
        assert cli.main(["up", str(path), "--yes"]) == 0, capfd.readouterr().err
        assert docker_client.volumes.get(volume).attrs["Labels"] == {SESSION_LABEL: path.stem}
        assert cli.main(["destroy", str(path), "--yes"]) == 0
        assert docker_client.volumes.get(volume)  # named volumes outlive destroy
        assert cli.main(["up", str(path), "--yes"]) == 0, capfd.readouterr().err  # its own
    finally:
        with contextlib.suppress(Exception):
            cli.main(["destroy", str(path), "--yes"])
        capfd.readouterr()


@pytest.mark.docker
def test_a_volume_the_pool_lists_is_mounted_whoever_made_it(
        real_engine, docker_client, image, tmp_path, capfd, volumes):  # noqa: F811
    volume = f"{unique('shared')}-datasets"
    volumes.append(volume)
    secret_volume(docker_client, volume)
    path = definition(tmp_path, image, volume, volumes=[volume])
    try:
        assert cli.main(["up", str(path), "--yes"]) == 0, capfd.readouterr().err
        main1 = docker_client.containers.get(f"{path.stem}-main1")
        assert main1.exec_run(["cat", "/home/work/data/db"]) == (0, b"s3cret\n")
    finally:
        with contextlib.suppress(Exception):
            cli.main(["destroy", str(path), "--yes"])
        capfd.readouterr()
