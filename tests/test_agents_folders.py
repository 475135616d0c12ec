"""Data folders on a real engine (issue 23, item 2): made through the engine's archive API,
owned by the session user, a planted link refused without being followed, never removed.

The local engine here; the lab's multi-node pool over SSH in tests/test_data_folders_lab.py.
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid

import pytest

from cluster_sessions.agents.folders import HELPER_LABEL, FolderRefused, ensure_folder

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def empty_image(docker_client):
    """An image of one empty layer: the helper container is never started, so nothing in it
    is needed (and nothing in it runs)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w"):
        pass
    tag = "cluster-sessions/test-empty:1"
    docker_client.api.import_image_from_data(out.getvalue(), repository=tag.split(":")[0],
                                             tag="1")
    return tag


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "vfolders"
    path.mkdir(mode=0o755)
    return path


def helpers_left(docker_client) -> list:
    return docker_client.containers.list(all=True, filters={"label": HELPER_LABEL})


def test_a_missing_folder_is_made_with_the_users_ids_and_kept_on_the_next_call(
        docker_client, empty_image, root):
    assert ensure_folder(docker_client, empty_image, str(root), "mydata", 2000, 3000) == "made"
    st = os.lstat(root / "mydata")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (2000, 3000, 0o750)
    (root / "mydata" / "kept.txt").write_text("x")
    assert ensure_folder(docker_client, empty_image, str(root), "mydata", 2000, 3000) == "kept"
    assert (root / "mydata" / "kept.txt").read_text() == "x"
    assert helpers_left(docker_client) == []


def test_a_planted_link_is_refused_and_not_followed(docker_client, empty_image, root, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.chown(target, 2000, 2000)  # even a directory the user owns: a link is never used
    (root / "mydata").symlink_to(target)
    with pytest.raises(FolderRefused, match="symbolic link"):
        ensure_folder(docker_client, empty_image, str(root), "mydata", 2000, 2000)
    assert os.readlink(root / "mydata") == str(target)  # left as it was
    with pytest.raises(FolderRefused, match="symbolic link"):
        ensure_folder(docker_client, empty_image, str(root), "mydata", 2000, 2000, create=False)
    assert helpers_left(docker_client) == []


def test_a_file_or_another_users_directory_is_refused(docker_client, empty_image, root):
    (root / "afile").write_text("x")
    with pytest.raises(FolderRefused, match="not a directory"):
        ensure_folder(docker_client, empty_image, str(root), "afile", 2000, 2000)
    (root / "theirs").mkdir()
    os.chown(root / "theirs", 1234, 1234)
    with pytest.raises(FolderRefused, match="another user's folder"):
        ensure_folder(docker_client, empty_image, str(root), "theirs", 2000, 2000)


def test_a_check_without_create_makes_nothing(docker_client, empty_image, root):
    name = f"f{uuid.uuid4().hex[:8]}"
    assert ensure_folder(docker_client, empty_image, str(root), name, 2000, 2000,
                         create=False) == "missing"
    assert not (root / name).exists()


def test_a_storage_root_missing_on_the_agent_is_named(docker_client, empty_image, tmp_path):
    with pytest.raises(FolderRefused, match="storage root .* does not exist on this agent"):
        ensure_folder(docker_client, empty_image, str(tmp_path / "absent"), "d", 2000, 2000)
    assert not (tmp_path / "absent").exists()


def _plan(tmp_path, root, image: str, folder: str):
    from cluster_sessions.core.plan import build_plan

    from . import factories
    from .factories import load_session

    pool = factories.pool("local-df", factories.agent("agent1"), storage={"data": str(root)})
    doc = factories.session("df-check", image=image, size=2,
                            mounts=[{"source": "vol", "target": "/data/v"},
                                    {"folder": folder, "target": "/home/work/d"}])
    loaded = load_session(factories.write_pair(tmp_path, doc, pool))
    return loaded.pool, build_plan(loaded.session, loaded.pool)


def test_the_check_before_up_names_the_mount_and_agent_of_a_refused_folder(
        empty_image, root, tmp_path):
    from cluster_sessions.agents.folders import folder_refusals

    (root / "planted").symlink_to("/etc")
    pool, plan = _plan(tmp_path, root, empty_image, "planted")
    assert folder_refusals(pool, plan) == [
        ("mounts.1.folder", f"on agent agent1: {root}/planted is a symbolic link (to '/etc'), "
         "which the engine would follow: a folder must be a plain directory; remove the link")]
    pool, plan = _plan(tmp_path, root, empty_image, "fresh")
    assert folder_refusals(pool, plan) == [] and not (root / "fresh").exists()


def test_an_image_missing_on_the_agent_is_an_unusable_agent_not_a_traceback(root, tmp_path):
    from cluster_sessions.agents.errors import AgentsUnusable
    from cluster_sessions.agents.folders import folder_refusals

    pool, plan = _plan(tmp_path, root, "cluster-sessions/absent:none", "d")
    with pytest.raises(AgentsUnusable, match="agent agent1: could not check the session's data"):
        folder_refusals(pool, plan)


@pytest.mark.parametrize("check, what", [("folder_refusals", "data folders"),
                                         ("bind_refusals", "mount sources"),
                                         ("volume_refusals", "volumes")])
def test_an_agent_that_cannot_be_reached_is_unusable_saying_which_check(
        check, what, monkeypatch):
    """Each read-only check before ``up`` opens the agent the same way (folders._checking):
    a failure to reach it names the agent and what was being checked, and nothing is made."""
    from types import SimpleNamespace

    from cluster_sessions.agents import connectors, folders
    from cluster_sessions.agents.errors import AgentsUnusable

    def unreachable(agent, **_):
        raise connectors.AgentError("agent2", connectors.COMMAND_FAILED, "connection refused")
    monkeypatch.setattr(connectors, "connector_for", unreachable)
    mounts = [SimpleNamespace(source="/srv/x", folder=None, type="bind", made=True)]
    plan = SimpleNamespace(agents=["agent2"], folders=[SimpleNamespace(source="/srv/x")],
                           mounts=mounts, name="s", session=SimpleNamespace(
                               image="img", user=SimpleNamespace(uid=1000, gid=1000)))
    pool = SimpleNamespace(agent=lambda name: name)
    with pytest.raises(AgentsUnusable) as err:
        getattr(folders, check)(pool, plan)
    assert str(err.value).startswith(f"agent agent2: could not check the session's {what}: ")
    assert str(err.value).endswith("; nothing was created")
