"""Data folders (issue 23, item 2), offline: the names a folder may have, the pool's storage
roots, which root a folder is in, the resolved host path in the plan, the container's bind,
the review line, and the Pulumi program (folders made before the containers, never deleted)
under the emulation. The engine-side part is tests/test_agents_folders.py (local engine) and
tests/test_data_folders_lab.py (the lab's multi-node pool)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_sessions.core.container_args import container_args
from cluster_sessions.core.folders import (
    MODE_DIR,
    MODE_SYMLINK,
    FolderStat,
    folder_name_problem,
    folder_path,
    folder_verdict,
    storage_of,
)
from cluster_sessions.core.plan import build_plan, plan_to_dict
from cluster_sessions.core.review import definition_fields
from cluster_sessions.driver.session_args import validate_files
from cluster_sessions.pulumi_layer import folders as folder_resources
from tests.standin.engine import Engine, run_program

from . import factories
from .factories import load_session

CONTAINER = "docker:index/container:Container"


def write(tmp_path: Path, mounts: list, storage: dict | None = None, **session) -> Path:
    pool = factories.pool("lab", factories.agent("agent1"), factories.agent("agent2"),
                          swarm={"manager": "agent1"},
                          **({"storage": storage} if storage is not None else {}))
    doc = factories.session("train-demo", size=2, mounts=mounts, **session)
    return factories.write_pair(tmp_path, doc, pool)


def problems(path: Path) -> list[str]:
    return [f"{p.path}: {p.message}" for p in validate_files([path])]


# --- names and roots ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mydata", "a", "data_2026.v1", "x-y", "_tmp", "9" * 64])
def test_plain_folder_names_are_accepted(name):
    assert folder_name_problem(name) is None


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "-rf", "a/b", "../etc", "/etc",
                                  "a\\b", "a b", "9" * 65, "dätä", "a\nb", "a:b", "a,b"])
def test_folder_names_that_are_paths_hidden_or_odd_are_refused(name):
    assert folder_name_problem(name)


def test_a_folder_mount_is_valid_and_resolves_below_the_pools_only_root(tmp_path):
    path = write(tmp_path, [{"folder": "mydata", "target": "/home/work/mydata"}],
                 {"data": "/srv/vfolders"})
    assert problems(path) == []
    plan = build_plan(load_session(path).session, load_session(path).pool)
    (mount,) = plan.mounts
    assert (mount.source, mount.type, mount.folder, mount.storage, mount.root) == (
        "/srv/vfolders/mydata", "bind", "mydata", "data", "/srv/vfolders")


@pytest.mark.parametrize(("mount", "storage", "path", "words"), [
    ({"folder": "../etc"}, {"data": "/srv/v"}, "mounts.0.folder", "not a folder name"),
    ({"folder": ".ssh"}, {"data": "/srv/v"}, "mounts.0.folder", "not a folder name"),
    ({"folder": "a/b"}, {"data": "/srv/v"}, "mounts.0.folder", "not a folder name"),
    ({"folder": "d", "storage": "dta"}, {"data": "/srv/v"}, "mounts.0.storage",
     "did you mean 'data'"),
    ({"folder": "d"}, {}, "mounts.0.folder", "has no storage roots"),
    ({"folder": "d"}, {"a": "/srv/a", "b": "/srv/b"}, "mounts.0.folder", "say which"),
    ({"folder": "d", "source": "/a"}, {"data": "/srv/v"}, "mounts.0", "not both"),
    ({"source": "/a", "storage": "data"}, {"data": "/srv/v"}, "mounts.0.storage",
     "only to a folder"),
    ({}, {"data": "/srv/v"}, "mounts.0", "needs a source"),
    ({"folder": "d", "target": "/etc/x"}, {"data": "/srv/v"}, "mounts.0.target",
     "not where a user's data goes"),
    ({"folder": "d", "target": "/home/work/.ssh"}, {"data": "/srv/v"}, "mounts.0.target",
     "not where a user's data goes"),
])
def test_bad_folder_mounts_name_the_field(tmp_path, mount, storage, path, words):
    found = problems(write(tmp_path, [{"target": "/data/d", **mount}], storage))
    assert any(p.startswith(f"{path}: ") and words in p for p in found), found


def test_with_several_roots_the_named_one_is_used(tmp_path):
    path = write(tmp_path, [{"folder": "d", "storage": "scratch", "target": "/data/d"}],
                 {"data": "/srv/data", "scratch": "/srv/scratch"})
    assert problems(path) == []
    loaded = load_session(path)
    assert build_plan(loaded.session, loaded.pool).mounts[0].source == "/srv/scratch/d"


def test_the_same_folder_twice_is_refused_but_two_folders_are_fine(tmp_path):
    found = problems(write(tmp_path, [{"folder": "d", "target": "/data/a"},
                                      {"folder": "d", "target": "/data/b"},
                                      {"folder": "e", "target": "/data/c"}],
                           {"data": "/srv/v"}))
    assert found == ["mounts.1.folder: folder 'd' of storage 'data' is mounted twice "
                     "(also mounts.0)"]


@pytest.mark.parametrize(("storage", "words"), [
    ({"data": "relative"}, "absolute host directory"),
    ({"data": "/"}, "other than '/'"),
    ({"data": "//"}, "other than '/'"),
    ({"data": "/srv/../etc"}, "without '..'"),
    ({"data": "/srv/a:b"}, "':'"),
    ({"a": "/srv/v", "b": "/srv/v/inner"}, "overlaps storage 'a'"),
    ({"bad name": "/srv/v"}, "not a storage name"),
])
def test_bad_storage_roots_are_refused_in_the_pool(tmp_path, storage, words):
    found = problems(write(tmp_path, [], storage))
    assert any(words in p for p in found), found


# --- what the engine found at the folder's path ------------------------------------------------

def test_a_link_is_refused_whatever_it_points_to():
    link = FolderStat(mode=MODE_SYMLINK | 0o777, link_target="/etc")
    assert "symbolic link" in folder_verdict(link, 9001)


def test_a_file_or_another_users_directory_is_refused_and_ours_is_kept():
    assert "not a directory" in folder_verdict(FolderStat(0o644, ""), 9001)
    theirs = FolderStat(MODE_DIR | 0o750, "", uid=1234, gid=1234)
    assert "another user's folder" in folder_verdict(theirs, 9001)
    assert folder_verdict(FolderStat(MODE_DIR | 0o750, "", uid=9001, gid=5), 9001) is None
    assert folder_verdict(None, 9001) is None  # nothing there: it is made


# --- plan, container arguments, review -----------------------------------------------------

def test_plan_json_container_bind_and_review_show_the_folder(tmp_path):
    path = write(tmp_path, [{"folder": "mydata", "target": "/home/work/mydata"},
                            {"source": "vol", "target": "/data/v", "read_only": True}],
                 {"data": "/srv/vfolders"})
    loaded = load_session(path)
    plan = build_plan(loaded.session, loaded.pool)
    doc = plan_to_dict(plan)
    for c in doc["containers"]:
        assert c["mounts"] == [
            {"source": "/srv/vfolders/mydata", "target": "/home/work/mydata",
             "read_only": False, "folder": "mydata", "storage": "data"},
            {"source": "vol", "target": "/data/v", "read_only": True}]
    args = container_args(plan, plan.containers[0])
    assert [(m.source, m.target, m.type, m.read_only) for m in args.mounts] == [
        ("/srv/vfolders/mydata", "/home/work/mydata", "bind", False),
        ("vol", "/data/v", "volume", True)]
    assert definition_fields(plan)["mounts"] == (  # one row per entry (issue 32, class 4)
        "folder mydata (/srv/vfolders/mydata, kept after destroy):/home/work/mydata",
        "vol:/data/v:ro")


def test_the_plan_table_shows_the_folder_and_that_it_is_kept(tmp_path, capsys):
    from cluster_sessions.driver import cli

    path = write(tmp_path, [{"folder": "mydata", "target": "/home/work/mydata"}],
                 {"data": "/srv/vfolders"})
    assert cli.main(["plan", str(path)]) == 0
    assert ("mount    folder mydata (/srv/vfolders/mydata: made if missing, kept after destroy)"
            " -> /home/work/mydata") in capsys.readouterr().out.splitlines()


def test_a_folder_mount_needs_no_mount_sources_and_host_paths_still_do(tmp_path):
    found = problems(write(tmp_path, [{"folder": "d", "target": "/data/d"},
                                      {"source": "/srv/vfolders/d", "target": "/data/e"}],
                           {"data": "/srv/vfolders"}))
    assert found == ["mounts.1.source: /srv/vfolders/d: pool 'lab' lets sessions mount no "
                     "host path (it has no mount_sources): use a named volume, or ask the "
                     "pool's operator to add the directory to mount_sources"]


# --- the Pulumi program --------------------------------------------------------------------------

def test_the_program_makes_each_folder_on_each_agent_before_the_containers_and_never_deletes(
        tmp_path, monkeypatch):
    made: list[tuple] = []

    def ensure(self, props):
        made.append((props["agent"]["name"], props["root"], props["folder"], props["uid"],
                     props["gid"]))
        return {**props, "outcome": "made"}

    monkeypatch.setattr(folder_resources.DataFolderProvider, "ensure", ensure)
    pool = factories.pool("lab", factories.agent("agent1", cpu=1),
                          factories.agent("agent2", cpu=1), swarm={"manager": "agent1"},
                          storage={"data": "/srv/vfolders"})
    doc = factories.session("train-demo", size=2, mode="multi-node",
                            mounts=[{"folder": "mydata", "target": "/home/alice/mydata"}],
                            user={"name": "alice", "uid": 2000, "gid": 3000})
    path = factories.write_pair(tmp_path, doc, pool)
    engine = Engine()
    run_program(engine, "train-demo", {"cluster-sessions:definition": str(path)})
    assert sorted(made) == [("agent1", "/srv/vfolders", "mydata", 2000, 3000),
                            ("agent2", "/srv/vfolders", "mydata", 2000, 3000)]
    folders = {r.name: r for r in engine.registrations if "-folder-" in r.name}
    assert sorted(folders) == ["train-demo-folder-agent1/data/mydata",
                               "train-demo-folder-agent2/data/mydata"]
    for host, agent in (("main1", "agent1"), ("sub1", "agent2")):
        container = engine.named(CONTAINER, f"train-demo-{host}")
        assert folders[f"train-demo-folder-{agent}/data/mydata"].urn in container.dependencies
        # the folder, then the container's own bundle directory (issue 45)
        assert container.plain_inputs["mounts"][:1] == [
            {"target": "/home/alice/mydata", "source": "/srv/vfolders/mydata",
             "readOnly": False, "type": "bind"}]
        assert [m["target"] for m in container.plain_inputs["mounts"][1:]] == [
            "/opt/cluster-session"]
    provider = folder_resources.DataFolderProvider()
    assert provider.delete("agent1:/srv/vfolders/mydata", {}) is None  # nothing is removed


# --- the messages, word for word (the loader prints them after the file and field) -------------

def test_a_bad_folder_name_is_told_what_a_folder_name_is():
    assert folder_name_problem("a/b") == (
        "'a/b' is not a folder name: one name of at most 64 letters, digits, '_', '.' or '-', "
        "not starting with '.' or '-' (a folder is a directory directly below the pool's "
        "storage root, never a path)")


@pytest.mark.parametrize(("storage", "wanted", "answer"), [
    ({"data": "/srv/d"}, None, ("data", None)),
    ({}, None, (None, "the pool has no storage roots (storage: {NAME: /host/dir}), so sessions "
                      "on it mount no folders; ask the pool's operator")),
    ({"data": "/d", "scratch": "/s"}, None,
     (None, "the pool has several storage roots (data, scratch): say which with storage: NAME")),
    ({"data": "/d", "scratch": "/s"}, "scratch", ("scratch", None)),
    ({"data": "/d", "date": "/e"}, "dat",
     (None, "the pool has no storage 'dat' (it has: data, date); did you mean 'date'?")),
    ({"data": "/d", "scratch": "/s"}, "zzz",
     (None, "the pool has no storage 'zzz' (it has: data, scratch)")),
    ({}, "data", (None, "the pool has no storage 'data' (it has: none)")),
])
def test_storage_of_picks_the_root_or_says_why_not(storage, wanted, answer):
    assert storage_of(storage, wanted) == answer


@pytest.mark.parametrize(("root", "path"), [("/srv/vfolders", "/srv/vfolders/mydata"),
                                            ("/srv/vfolders/", "/srv/vfolders/mydata"),
                                            ("/srv/X", "/srv/X/mydata")])
def test_folder_path_joins_root_and_name_once(root, path):
    assert folder_path(root, "mydata") == path


def test_the_verdicts_say_what_is_in_the_way():
    link = folder_verdict(FolderStat(MODE_SYMLINK, ""), 1000)
    assert link == ("is a symbolic link (to ''), which the engine would follow: a folder must "
                    "be a plain directory; remove the link")
    assert folder_verdict(FolderStat(0, "/etc"), 1000).startswith("is a symbolic link (to '/etc')")
    assert folder_verdict(FolderStat(0o644, ""), 1000) == "exists and is not a directory"
    assert folder_verdict(FolderStat(MODE_DIR | 0o750, "", 1001, 1000), 1000) == (
        "is owned by uid 1001, not the session user's 1000: it is another user's folder")
    assert folder_verdict(FolderStat(MODE_DIR | 0o750, "", 1000, 5), 1000) is None
    assert folder_verdict(None, 1000) is None
