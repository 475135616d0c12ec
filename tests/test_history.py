"""The record of how a batch job ended, kept for ``ls`` after its containers are gone."""

from __future__ import annotations

import json
from pathlib import Path

from cluster_sessions.driver import history
from cluster_sessions.driver.stack_settings import engine_settings

from .test_listing import record


def test_a_record_reads_back_as_written_and_a_newer_one_replaces_it(tmp_path):
    history.write_record(tmp_path, record())
    assert history.read_record(tmp_path, "job-1") == record()
    history.write_record(tmp_path, record(exit_code=0, detail="ok"))
    assert history.read_record(tmp_path, "job-1").exit_code == 0
    assert [p.name for p in tmp_path.iterdir()] == ["job-1.json"]  # no temporary file left


def test_a_stack_name_with_a_slash_stays_one_file_in_the_directory(tmp_path):
    history.write_record(tmp_path, record(stack="org/project/job-1"))
    assert [p.name for p in tmp_path.iterdir()] == ["org%2Fproject%2Fjob-1.json"]
    assert history.read_record(tmp_path, "org/project/job-1").stack == "org/project/job-1"


def test_a_record_holds_names_and_times_only(tmp_path):
    history.write_record(tmp_path, record())
    data = json.loads((tmp_path / "job-1.json").read_text())
    assert set(data) == {"stack", "name", "session_id", "type", "mode", "size", "agents",
                         "state", "detail", "exit_code", "started", "finished"}


def test_an_unreadable_or_foreign_record_is_no_record(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text(json.dumps({"stack": "b"}))
    assert history.read_record(tmp_path, "a") is None
    assert history.read_record(tmp_path, "b") is None
    assert history.read_record(tmp_path, "c") is None
    history.write_record(tmp_path, record(stack="d", state="sleeping"))
    assert history.read_record(tmp_path, "d") is None  # ls would have no phase for it


def test_records_live_beside_a_file_backend_or_per_backend_in_the_project(tmp_path):
    project = tmp_path / "project"
    state = tmp_path / "state"
    settings = engine_settings({"PULUMI_BACKEND_URL": f"file://{state}"}, project)
    assert history.history_dir(settings, project) is None  # no backend yet: nothing to keep
    state.mkdir()
    assert history.history_dir(settings, project) == state / "sessionctl-history"
    one = history.history_dir(engine_settings({"PULUMI_BACKEND_URL": "s3://a"}, project),
                              project)
    two = history.history_dir(engine_settings({"PULUMI_BACKEND_URL": "s3://b"}, project),
                              project)
    assert one != two and Path(project / ".pulumi-state") in one.parents
