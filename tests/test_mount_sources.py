"""A mount source is what it says, at create and at every restart (issue 32, class 2).

Docker follows links in a bind source on the agent whenever the container starts. So nothing a
session can write may decide what another session's (or its own later) mount resolves to: no
mount source below a directory anyone but root can write, and no link on its way, checked on
each agent through the engine's archive API before ``up`` creates anything (exit 2); the pool
cannot list a directory every user can write, and the default pool lists none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

import pytest

from cluster_sessions.agents.folders import HELPER_LABEL
from cluster_sessions.core.folders import (
    MODE_DIR,
    MODE_SYMLINK,
    FolderStat,
    bind_component_verdict,
    path_prefixes,
)
from cluster_sessions.core.loader import BUILTIN_POOLS, load_file
from cluster_sessions.core.spec import Pool, pool_problems
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (a fixture used by name)

DIR = MODE_DIR


# --- offline: the pool, and the verdict on what the engine reports ---------------------------


@pytest.mark.parametrize("root", ["/tmp", "/tmp/", "/tmp/data", "//tmp", "/var/tmp/x",
                                  "/dev/shm", "/run/lock/d", "/dev/mqueue"])
def test_a_pool_cannot_list_a_directory_every_user_can_write(root):
    pool = Pool.model_validate(factories.pool("shared", mount_sources=[root]))
    assert [p for p, _ in pool_problems(pool)] == ["mount_sources.0"]
    assert "every user (every session) can write" in dict(pool_problems(pool))["mount_sources.0"]


@pytest.mark.parametrize("root", ["/srv/data", "/tmpdata", "/var/tmpx", "/data/tmp"])
def test_directories_beside_the_shared_ones_stay_allowed(root):
    assert pool_problems(Pool.model_validate(factories.pool("p", mount_sources=[root]))) == []


def test_the_default_pool_lists_no_directory_others_can_write():
    """It listed /tmp, which every session on the agent can write (the issue's example)."""
    local = load_file(BUILTIN_POOLS / "local.yaml")
    assert pool_problems(local) == []
    assert local.mount_sources == ()


def test_the_path_is_judged_from_the_root_down():
    assert path_prefixes("/srv/data/set1") == ["/", "/srv", "/srv/data", "/srv/data/set1"]
    assert path_prefixes("/") == ["/"]


@pytest.mark.parametrize(("stat", "last", "words"), [
    (None, False, "does not exist"),
    (None, True, "does not exist"),
    (FolderStat(MODE_SYMLINK | 0o777, "/"), False, "is a symbolic link (to '/')"),
    (FolderStat(MODE_SYMLINK | 0o777, "/"), True, "is a symbolic link (to '/')"),
    (FolderStat(DIR | 0o777, "", 0, 0), False, "writable by group and others (mode 777)"),
    (FolderStat(DIR | 0o1777 & 0o777, "", 0, 0), True, "writable by group and others"),
    (FolderStat(DIR | 0o775, "", 0, 0), False, "writable by its group (mode 775)"),
    (FolderStat(DIR | 0o757, "", 0, 0), True, "writable by others (mode 757)"),
    (FolderStat(DIR | 0o755, "", 4242, 0), False, "owned by uid 4242, not root"),
    (FolderStat(0o644, "", 0, 0), False, "is not a directory"),
])
def test_a_component_anyone_but_root_could_change_is_refused(stat, last, words):
    assert words in (bind_component_verdict(stat, last=last) or "")


@pytest.mark.parametrize(("stat", "last"), [
    (FolderStat(DIR | 0o755, "", 0, 0), False),
    (FolderStat(DIR | 0o700, "", 0, 0), False),
    (FolderStat(DIR | 0o755, "", 4242, 4242), True),   # what is mounted may be anyone's
    (FolderStat(0o600, "", None, None), True),          # a file, mounted itself
])
def test_root_only_directories_on_the_way_are_accepted(stat, last):
    assert bind_component_verdict(stat, last=last) is None


# --- on the real engine: `up` refuses before anything is made ---------------------------------


@pytest.fixture
def base():
    """A directory only root can write, outside /tmp (which every user can write): where an
    operator keeps what sessions mount. Removed afterwards."""
    path = Path("/run") / f"cst-mounts-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    os.chown(path, 0, 0)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def up_definition(tmp_path: Path, base: Path, image_tag: str, source: str, **over) -> Path:
    factories.write(tmp_path / "pool.yaml", factories.pool(
        "mounts", factories.agent("local", cpu=2, mem="4g"), mount_sources=[str(base)]))
    name = unique("mnt")
    return factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, str(tmp_path / "pool.yaml"), image=image_tag, cpu=0.5, mem="512m",
        mounts=[{"source": source, "target": "/home/work/data", "read_only": False}],
        user={"name": "work", "uid": 4242, "gid": 4242}, **over))


def refused(path: Path, real_engine, docker_client, capfd) -> str:
    name = path.stem
    assert cli.main(["up", str(path), "--yes"]) == 2
    err = capfd.readouterr().err
    assert f"{path}: mounts.0.source: on agent local: " in err, err
    assert "nothing was created" in err
    assert f"up {name}" not in real_engine.calls  # the engine was never asked
    assert not docker_client.containers.list(all=True, filters={"name": name})
    assert not docker_client.containers.list(all=True, filters={"label": HELPER_LABEL})
    return err


@pytest.mark.docker
def test_a_link_planted_in_a_shared_directory_is_refused_before_anything_is_created(
        real_engine, docker_client, image, base, tmp_path, capfd):  # noqa: F811
    """The issue's example: a directory every session can write, where session A planted
    ``h4-rootlink -> /``; session B (uid 4242) mounting it would get the agent's ``/``."""
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "h4-rootlink").symlink_to("/")
    for source in (shared / "h4-rootlink", shared / "h4-rootlink" / "var" / "tmp", shared):
        err = refused(up_definition(tmp_path, base, image, str(source)), real_engine,
                      docker_client, capfd)
        assert f"{shared} is writable by group and others (mode 777)" in err, err


@pytest.mark.docker
@pytest.mark.parametrize(("make", "source", "words"), [
    (lambda b: (b / "rootlink").symlink_to("/"), "rootlink", "rootlink is a symbolic link"),
    (lambda b: (b / "rootlink").symlink_to("/"), "rootlink/etc", "rootlink is a symbolic link"),
    (lambda b: (b / "rel").symlink_to("."), "rel/x", "rel is a symbolic link (to '{base}')"),
    (lambda b: ((b / "u").mkdir(), os.chown(b / "u", 4242, 4242), (b / "u" / "d").mkdir()),
     "u/d", "u is owned by uid 4242, not root"),
    (lambda b: ((b / "g").mkdir(), (b / "g").chmod(0o775), (b / "g" / "d").mkdir()),
     "g/d", "g is writable by its group (mode 775)"),
    (lambda b: None, "nothing-here", "nothing-here does not exist"),
])
def test_a_link_or_a_directory_others_can_write_anywhere_on_the_way_is_refused(
        real_engine, docker_client, image, base, tmp_path, capfd,  # noqa: F811
        make, source, words):
    make(base)
    err = refused(up_definition(tmp_path, base, image, str(base / source)), real_engine,
                  docker_client, capfd)
    assert f"{base}/{words.format(base=base)}" in err, err
    assert "/cluster-session-storage" not in err  # the agent's paths, not the helper's


@pytest.mark.docker
def test_a_source_only_root_can_change_is_mounted(
        real_engine, docker_client, image, base, tmp_path, capfd):  # noqa: F811
    data = base / "data"
    data.mkdir(mode=0o755)
    (data / "hello.txt").write_text("from the agent\n")
    path = up_definition(tmp_path, base, image, str(data))
    try:
        assert cli.main(["up", str(path), "--yes"]) == 0, capfd.readouterr().err
        main1 = docker_client.containers.get(f"{path.stem}-main1")
        code, out = main1.exec_run(["cat", "/home/work/data/hello.txt"])
        assert (code, out) == (0, b"from the agent\n")
    finally:
        with contextlib.suppress(Exception):
            cli.main(["destroy", str(path), "--yes"])
        capfd.readouterr()
