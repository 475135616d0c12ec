"""``sessionctl ls``: the session stacks of the backend with a status read from the engines."""

from __future__ import annotations

import json
import time

import pytest

from cluster_sessions.driver import cli, history, stacks
from cluster_sessions.driver.listing import (
    PHASE_OF,
    PHASES,
    Listed,
    Observed,
    duration_s,
    expired_state,
    format_duration,
    listed,
    parse_states,
    session_state,
)
from cluster_sessions.driver.observe import Found
from cluster_sessions.driver.status import Planned, host_faults, planned_rows

from . import factories
from .test_runtime import image, unique  # noqa: F401 (a fixture, used by name)


def found(host: str, state: str, exit_code: int | None = None) -> Found:
    return Found("a1", "id", f"s-{host}", host, "main" if host == "main1" else "sub", state,
                 None, "2026-01-02T03:04:05.5Z", exit_code, "img",
                 "2026-01-02T03:05:10.75Z" if state == "exited" else None)


PLANNED = [Planned("main1", "main", "a1", "s-main1"), Planned("sub1", "sub", "a1", "s-sub1")]


@pytest.mark.parametrize(("kind", "states", "unreachable", "expected"), [
    ("interactive", {"main1": "running", "sub1": "running"}, {}, ("running", "", None)),
    ("batch", {"main1": "exited", "sub1": "running"}, {}, ("finished", "exit code 3", 3)),
    ("interactive", {"main1": "exited", "sub1": "running"}, {},
     ("degraded", "main1: exited (exit code 3)", None)),
    ("batch", {"main1": "running"}, {},
     ("degraded", "sub1: no container (is the session up?)", None)),
    ("interactive", {"sub1": "restarting"}, {},
     ("degraded", "main1: no container (is the session up?); sub1: restarting", None)),
    ("interactive", {}, {}, ("down", "no container of it on its agents", None)),
    ("interactive", {"main1": "running"}, {"a2": "gone"}, ("unreachable", "a2: gone", None)),
])
def test_the_status_of_a_listed_session(kind, states, unreachable, expected):
    codes = {"main1": 3}
    seen = [found(h, s, codes.get(h) if s == "exited" else None) for h, s in states.items()]
    got = session_state(kind, PLANNED, seen, unreachable)
    assert (got.state, got.detail, got.exit_code) == expected
    assert PHASE_OF[got.state] in PHASES


def test_an_error_carries_the_faults_status_reports_for_the_same_containers():
    seen = [found("main1", "running"), found("sub1", "exited", 137)]
    rows = planned_rows(PLANNED, seen, {})
    got = session_state("interactive", PLANNED, seen, {})
    assert got.faults == tuple(host_faults("interactive", rows)) == ("sub1: exited (exit code "
                                                                      "137)",)
    assert PHASE_OF[got.state] == "error"


def test_a_finished_job_has_its_exit_code_start_end_and_duration():
    got = session_state("batch", PLANNED, [found("main1", "exited", 0), found("sub1", "running")],
                        {})
    assert (got.state, got.exit_code, got.started, got.finished) == (
        "finished", 0, "2026-01-02T03:04:05.5Z", "2026-01-02T03:05:10.75Z")
    assert duration_s(got.started, got.finished) == 65.25
    assert format_duration(65.25) == "1m05s"


EXPIRES = 1767323100  # 2026-01-02T03:05:00Z


@pytest.mark.parametrize(("state", "started", "now", "expected"), [
    ("running", "2026-01-02T03:04:05.5Z", EXPIRES - 1, "running"),  # before the expiry
    # within the grace, the command may still be ending
    ("running", "2026-01-02T03:04:05.5Z", EXPIRES + 3, "running"),
    ("running", "2026-01-02T03:04:05.5Z", EXPIRES + 60, "expired"),  # after the grace
    # started again by the restart policy after the expiry: running nothing (issue 48's CI)
    ("running", "2026-01-02T03:05:00.2Z", EXPIRES + 3, "expired"),
    ("running", None, EXPIRES + 3, "running"),
    ("finished", "2026-01-02T03:04:05.5Z", EXPIRES + 1, "expired"),
    ("unreachable", None, EXPIRES + 60, "unreachable"),
])
def test_a_session_past_its_lifetime_is_expired_once_its_command_ended(state, started, now,
                                                                       expected):
    assert expired_state(Observed(state, started=started), EXPIRES, now).state == expected
    assert expired_state(Observed(state, started=started), None, now).state == state


@pytest.mark.parametrize(("start", "end", "seconds"), [
    ("2026-01-02T03:04:05.123456789Z", "2026-01-02T03:04:06.123456789Z", 1.0),
    ("2026-01-02T23:59:59Z", "2026-01-03T00:00:01.5Z", 2.5),
    ("2026-01-02T03:04:05Z", None, None),
    ("2026-01-02T03:04:05Z", "2026-01-02T03:04:04Z", None),  # a clock step: no duration
    ("garbage", "2026-01-02T03:04:04Z", None),
])
def test_durations_from_docker_timestamps(start, end, seconds):
    assert duration_s(start, end) == seconds


def test_every_state_has_exactly_one_phase_and_the_phases_are_the_tabs():
    assert PHASES == ("running", "finished", "error", "unknown", "empty", "pending", "expired",
                      "preempted")
    for state in ("running", "finished", "degraded", "down", "lost", "unreachable", "empty",
                  "queued", "placing", "expired", "preempted"):
        assert Listed("s", "s", "batch", "-", 1, (), state).phase == PHASE_OF[state]
    with pytest.raises(KeyError):
        Listed("s", "s", "batch", "-", 1, (), "sleeping")


PREEMPTED = {"at": 1_800_000_000, "by": "urgent", "by_priority": 50, "priority": 5,
             "session": "sweep-3", "type": "batch", "project": "vision",
             "reason": "preempted by urgent (priority 50 > its 5): ..."}


def test_an_empty_stack_whose_destroy_recorded_a_preemption_is_preempted_with_the_reason():
    import json

    from cluster_sessions.driver.ending import PREEMPTED_KEY
    from cluster_sessions.driver.listing import preempted_row

    empty = Listed("sweep-3", "sweep-3", "-", "-", 0, (), "empty", "no resources in the stack")
    key = f"cluster-sessions:{PREEMPTED_KEY}"
    got = preempted_row(empty, {key: json.dumps(PREEMPTED)})
    assert (got.state, got.phase, got.type, got.project, got.priority) == (
        "preempted", "preempted", "batch", "vision", 5)
    assert "preempted by urgent (priority 50 > its 5)" in got.detail
    assert "2027-01-15 08:00:00Z" in got.detail
    # no record, or one we did not write (edited by hand): it stays as the stack says
    assert preempted_row(empty, {}) is None
    for bad in ("", "{", "[]", json.dumps({**PREEMPTED, "at": "soon"}),
                json.dumps({**PREEMPTED, "extra": 1}), json.dumps({**PREEMPTED, "at": True})):
        assert preempted_row(empty, {key: bad}) is None, bad


@pytest.mark.parametrize(("value", "expected"), [
    ("running", ("running",)), ("RUNNING,finished", ("running", "finished")),
    ("error, error", ("error",)),
])
def test_state_filters_are_phases_in_any_case(value, expected):
    assert parse_states(value) == expected


@pytest.mark.parametrize(("value", "guess"), [("runing", "running"), ("FINSHED", "finished"),
                                              ("running,eror", "error")])
def test_a_misspelt_state_filter_gets_a_did_you_mean(value, guess, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["ls", "--state", value])
    assert exc.value.code == 2
    assert f"did you mean {guess!r}?" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["bogus", "running,paused", "", ","])
def test_a_bad_state_filter_exits_2_naming_the_flag_and_the_allowed_values(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["ls", "--state", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--state" in err and "running, finished, error, unknown, empty" in err
    assert "Traceback" not in err


def record(**over) -> history.JobRecord:
    base = {"stack": "job-1", "name": "job-1", "session_id": "sid", "type": "batch",
            "mode": "single-node", "size": 2, "agents": ("local",), "state": "finished",
            "detail": "the job on main1 failed with exit code 7", "exit_code": 7,
            "started": "2026-01-02T03:04:05Z", "finished": "2026-01-02T03:04:07Z"}
    return history.JobRecord(**{**base, **over})


def test_a_destroyed_batch_session_is_listed_from_its_record(tmp_path):
    history.write_record(tmp_path, record())
    got = listed("job-1", {}, tmp_path, lambda agent: None, records=tmp_path)
    assert (got.phase, got.exit_code, got.duration_s, got.recorded) == ("finished", 7, 2.0, True)
    assert "the stack is empty" in got.detail
    lost = record(stack="job-2", state="lost", exit_code=None,
                  detail="sub1 is exited (exit code 137) before the job ended")
    history.write_record(tmp_path, lost)
    got = listed("job-2", {}, tmp_path, lambda agent: None, records=tmp_path)
    assert (got.phase, got.faults) == ("error", (lost.detail,))
    assert listed("job-3", {}, tmp_path, lambda agent: None, records=tmp_path).phase == "empty"


def test_ls_without_the_pulumi_cli_exits_4_saying_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: None)
    assert cli.main(["ls"]) == 4
    assert "the pulumi CLI is missing" in capsys.readouterr().err


class Workspace:
    """A backend of stacks that hold nothing, each with its config (``list_stacks``,
    ``stack_outputs``, ``get_all_config``: what ``ls`` asks)."""

    def __init__(self, configs: dict[str, dict[str, str]]):
        self.configs = configs

    def list_stacks(self):
        from pulumi import automation as auto

        return [auto.StackSummary(name, False) for name in self.configs]

    def stack_outputs(self, name):
        return {}

    def get_all_config(self, name):
        from pulumi import automation as auto

        return {k: auto.ConfigValue(v) for k, v in self.configs[name].items()}


def backend_of(monkeypatch, tmp_path, configs: dict[str, dict[str, str]]) -> None:
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: tmp_path / "pulumi")
    monkeypatch.setattr(stacks, "open_workspace", lambda *a: Workspace(configs))
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path}")


def test_the_pool_stack_is_never_a_session_row_even_with_its_swarm_gone(
        monkeypatch, tmp_path, capsys):
    backend_of(monkeypatch, tmp_path, {  # after `pool destroy`: a stack without outputs
        "pool-lab": {"cluster-sessions:pool-definition": "pools/lab.yaml"}})
    assert ls_json(capsys)["sessions"] == []
    assert cli.main(["ls"]) == 0
    out, err = capsys.readouterr()
    assert "pool-lab" not in out and "no sessions in file://" in err


@pytest.mark.docker
def test_a_stack_that_holds_nothing_while_its_agents_hold_the_session_is_leftover(
        monkeypatch, docker_client, image, tmp_path, capsys):  # noqa: F811
    """What an interrupted ``up`` leaves (a container the stack never recorded) is shown, by
    label from the engine, with what to run; not EMPTY."""
    name = unique("lsleft")
    path = factories.write(tmp_path / "s.yaml", factories.session(name, image=image))
    backend_of(monkeypatch, tmp_path, {name: {"cluster-sessions:definition": str(path)}})
    assert ls_json(capsys)["sessions"] == []  # nothing there: empty, hidden by default
    (row,) = ls_json(capsys, "--all")["sessions"]
    assert (row["state"], row["phase"]) == ("empty", "empty")
    left = docker_client.containers.create(image, name=f"{name}-main1", labels={
        "cluster-sessions.session": name, "cluster-sessions.host": "main1"})
    try:
        (row,) = ls_json(capsys)["sessions"]
        assert (row["name"], row["state"], row["phase"]) == (name, "leftover", "error")
        assert row["agents"] == ["local"]
        assert f"local: container {name}-main1 (created)" in row["detail"]
        assert f"`sessionctl up {path}` converges" in row["detail"]
        assert f"`sessionctl destroy {path}` removes them" in row["detail"]
        assert [r["name"] for r in ls_json(capsys, "--state", "error")["sessions"]] == [name]
        assert cli.main(["ls"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(name))
        assert line.split()[5] == "ERROR"
    finally:
        left.remove(force=True)
    # one of a count's sessions, on a pool given apart: the commands say so
    factories.write(path, factories.session(name, image=image, count=2))
    pool = stacks.STACKS_DIR + "/pools/local.yaml"
    backend_of(monkeypatch, tmp_path, {f"{name}-2": {
        "cluster-sessions:definition": str(path), "cluster-sessions:pool": "pools/local.yaml",
        "cluster-sessions:index": "2"}})
    left = docker_client.containers.create(image, name=f"{name}-2-main1", labels={
        "cluster-sessions.session": f"{name}-2", "cluster-sessions.host": "main1"})
    try:
        (row,) = ls_json(capsys)["sessions"]
        assert (row["name"], row["state"]) == (f"{name}-2", "leftover")
        assert f"`sessionctl up {path} --pool {pool} --index 2` converges" in row["detail"]
    finally:
        left.remove(force=True)


def ls_json(capsys, *extra: str) -> dict:
    assert cli.main(["ls", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.docker
def test_ls_lists_each_session_with_what_its_engine_says(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name = unique("ls")
    small = {"image": image, "size": 2, "cpu": 0.25, "mem": "256m"}
    inter = factories.write(tmp_path / "i.yaml", factories.session(f"{name}-i", **small))
    batch = factories.write(tmp_path / "b.yaml", factories.session(
        f"{name}-b", **small, type="batch", command=["sh", "-c", "sleep 2; exit 7"]))
    assert cli.main(["ls"]) == 0
    assert "no sessions in file://" in capsys.readouterr().err
    assert cli.main(["up", str(inter), "--yes"]) == 0
    assert cli.main(["up", str(batch), "--yes"]) == 0
    assert cli.main(["wait", str(batch), "--timeout", "60"]) == 5
    capsys.readouterr()
    doc = ls_json(capsys)
    rows = {r["name"]: r for r in doc["sessions"]}
    started = rows[f"{name}-i"].pop("started")
    assert started and started.startswith(time.strftime("%Y-", time.gmtime()))
    assert rows[f"{name}-i"] == {
        "stack": f"{name}-i", "name": f"{name}-i", "type": "interactive", "mode": "single-node",
        "size": 2, "agents": ["local"], "state": "running", "detail": "", "exit_code": None,
        "phase": "running", "finished": None, "duration_s": None, "faults": [],
        "recorded": False, "services": [],
        # what its containers run: the test image, built here (no registry), by its ID
        "image": docker_client.images.get(image).id,
        # governance (issue 44): the default policy's, no lifetime
        "project": "default", "priority": 0, "expires_at": None}
    job = rows[f"{name}-b"]
    assert (job["phase"], job["state"], job["exit_code"]) == ("finished", "finished", 7)
    main1 = docker_client.containers.get(f"{name}-b-main1").attrs["State"]
    assert (job["started"], job["finished"]) == (main1["StartedAt"], main1["FinishedAt"])
    assert 2 <= job["duration_s"] < 30
    assert "stack_outputs " + f"{name}-b" in real_engine.calls
    # what the listed sessions hold on the agent: both interactive containers and the batch
    # session's sub1 run; its main1 has exited
    (usage,) = doc["usage"]
    assert usage["pool"] == "local"
    (local,) = usage["agents"]
    assert local["allocated"] == {"cpu": 0.75, "mem": 3 * 256 * 2**20, "gpus": [],
                                  "containers": 3}
    assert (local["declared"]["cpu"], local["stopped_containers"]) == (6.0, 1)
    assert cli.main(["pool", "usage", "local", "--json"]) == 0
    (agent,) = json.loads(capsys.readouterr().out)["agents"]
    assert {f"{name}-i", f"{name}-b"} <= set(agent["sessions"])  # others may run here too
    assert agent["allocated"]["containers"] >= 3 and agent["allocated"]["cpu"] >= 0.75

    docker_client.containers.get(f"{name}-i-sub1").kill()
    time.sleep(0.5)
    assert cli.main(["status", str(inter), "--json"]) == 1
    faults = json.loads(capsys.readouterr().out)["faults"]
    rows = {r["name"]: r for r in ls_json(capsys)["sessions"]}
    assert (rows[f"{name}-i"]["phase"], rows[f"{name}-i"]["faults"]) == ("error", faults)
    assert faults == ["sub1: exited (exit code 137)"]
    assert [r["name"] for r in ls_json(capsys, "--state", "finished")["sessions"]] == [
        f"{name}-b"]
    assert [r["name"] for r in ls_json(capsys, "--state", "RUNNING,error")["sessions"]] == [
        f"{name}-i"]
    assert ls_json(capsys, "--state", "running")["sessions"] == []
    assert cli.main(["ls"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "TYPE", "MODE", "SIZE", "AGENTS", "STATE", "PROJECT",
                                "PRIO", "LEFT", "STARTED", "ENDED", "DURATION", "DETAIL"]
    line = next(x for x in table if x.startswith(f"{name}-i "))
    assert line.split()[1:6] == ["interactive", "single-node", "2", "local", "ERROR"]
    assert line.endswith("degraded: sub1: exited (exit code 137)")
    line = next(x for x in table if x.startswith(f"{name}-b "))
    assert line.split()[5] == "FINISHED" and line.endswith("finished: exit code 7")
    assert table[-1].startswith("pool local: local: cpu 0.5/6, mem 512m/16g, gpus 0/0, "
                                "2 containers of 2 sessions (2 stopped)")

    # after destroy, the batch session is what `wait` recorded; the other has nothing left
    assert cli.main(["destroy", str(batch), "--yes"]) == 0
    assert cli.main(["destroy", str(inter), "--yes"]) == 0
    capsys.readouterr()
    # issue 41, item 8: a destroyed session's empty stack is hidden unless asked for
    assert f"{name}-i" not in {r["name"] for r in ls_json(capsys)["sessions"]}
    assert cli.main(["ls"]) == 0
    out, err = capsys.readouterr()
    assert f"{name}-i " not in out and "--all shows them" in err
    rows = {r["name"]: r for r in ls_json(capsys, "--all")["sessions"]}
    gone = rows[f"{name}-b"]
    assert (gone["phase"], gone["exit_code"], gone["recorded"]) == ("finished", 7, True)
    assert (gone["started"], gone["finished"]) == (job["started"], job["finished"])
    assert rows[f"{name}-i"]["state"] == "empty"
    assert [r["name"] for r in ls_json(capsys, "--state", "empty")["sessions"]] == [
        f"{name}-i"]
    # destroy --remove: the stack leaves the backend (pulumi stack rm)
    assert cli.main(["destroy", str(inter), "--yes", "--remove"]) == 0
    assert f"removed stack {name}-i" in capsys.readouterr().err
    assert f"{name}-i" not in {r["name"] for r in ls_json(capsys, "--all")["sessions"]}
    assert f"remove_stack {name}-i" in real_engine.calls


@pytest.mark.docker
def test_a_job_lost_to_a_dying_sub_is_an_error_before_and_after_destroy(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name = unique("lslost")
    batch = factories.write(tmp_path / "b.yaml", factories.session(
        name, image=image, size=2, cpu=0.25, mem="256m", type="batch",
        command=["sh", "-c", "sleep 60"]))
    assert cli.main(["up", str(batch), "--yes"]) == 0
    docker_client.containers.get(f"{name}-sub1").kill()
    assert cli.main(["wait", str(batch), "--timeout", "60"]) == 6
    capsys.readouterr()
    (live,) = ls_json(capsys, "--state", "error")["sessions"]
    assert (live["name"], live["state"], live["faults"]) == (
        name, "degraded", ["sub1: exited (exit code 137)"])
    assert cli.main(["destroy", str(batch), "--yes"]) == 0
    capsys.readouterr()
    (gone,) = ls_json(capsys, "--state", "error")["sessions"]
    assert (gone["state"], gone["recorded"], gone["exit_code"]) == ("lost", True, None)
    assert gone["faults"] == ["sub1 is exited (exit code 137) before the job ended"]
    assert gone["started"] and gone["finished"] and gone["duration_s"] >= 0


@pytest.mark.docker
def test_a_batch_session_run_destroyed_is_listed_finished_as_run_saw_it_end(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name = unique("lsrun")
    batch = factories.write(tmp_path / "b.yaml", factories.session(
        name, image=image, size=2, cpu=0.25, mem="256m", type="batch",
        command=["sh", "-c", "sleep 1"]))
    assert cli.main(["run", str(batch), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)  # --json: the one document, no log
    assert summary["destroyed"]
    main1 = next(c for c in summary["containers"] if c["host"] == "main1")
    (row,) = ls_json(capsys, "--state", "finished")["sessions"]
    assert (row["name"], row["exit_code"], row["recorded"]) == (name, 0, True)
    assert (row["started"], row["finished"]) == (main1["started"], main1["finished"])
    assert 1 <= row["duration_s"] < 30
    assert not docker_client.containers.list(all=True, filters={
        "label": f"cluster-sessions.session={name}"})


@pytest.mark.parametrize("at", [10**20, -1, 253402300800])
def test_a_preemption_record_whose_time_cannot_be_shown_is_no_record(at):
    """The record is the stack's config: edited by hand, a time ``datetime`` cannot hold made
    ``ls`` fail with an internal error; it is not believed (no record)."""
    from cluster_sessions.driver import ending

    record = {"at": at, "by": "b", "by_priority": 9, "priority": 1, "session": "s",
              "type": "batch", "project": "default", "reason": "preempted by b"}
    assert ending.read_preempted(json.dumps(record)) is None
    assert ending.read_preempted(json.dumps({**record, "at": 1767323100})) is not None
    ending.preempted_text(ending.read_preempted(json.dumps({**record, "at": 253402300799})))
