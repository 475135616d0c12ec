"""``count: K`` across the offline verbs: every verb acts on all K sessions, or on one with
``--index I``; an index out of range is invalid input naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cluster_sessions.driver import cli
from cluster_sessions.driver.errors import Exit
from cluster_sessions.driver.session_args import combined

from . import factories

POOL = {"kind": "AgentPool", "name": "two", "agents": [
    {"name": "a1", "docker_host": "unix:///a1.sock", "capacity": {"cpu": 4, "mem": "8g"}},
    {"name": "a2", "docker_host": "unix:///a2.sock", "capacity": {"cpu": 4, "mem": "8g"}}]}


@pytest.fixture
def counted(tmp_path):
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(POOL))

    def write(count: int, size: int = 2) -> str:
        return str(factories.write(tmp_path / "job.yaml", factories.session(
            "train", str(tmp_path / "two.yaml"), size=size, cpu=2, count=count)))

    return write


def test_plan_shows_all_k_sessions_or_one_with_index(counted, capsys):
    path = counted(2)
    assert cli.main(["plan", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["count"] == 2
    assert [(s["session"]["name"], s["agents"]) for s in doc["sessions"]] == [
        ("train-1", ["a1"]), ("train-2", ["a2"])]
    assert cli.main(["plan", path, "--json", "--index", "2"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["session"]["name"] == "train-2" and one["agents"] == ["a2"]
    assert cli.main(["plan", path]) == 0
    table = capsys.readouterr().out
    assert "session  train-1" in table and "session  train-2" in table


def test_k_sessions_that_do_not_fit_together_are_pending(counted, capsys):
    assert cli.main(["plan", counted(3)]) == Exit.PENDING
    err = capsys.readouterr().err
    assert "pending: the 3 sessions of count: 3 do not fit together, train-3 is left over" in err


@pytest.mark.parametrize("verb", [["plan"], ["render", "--out", "OUT"], ["status"], ["wait"],
                                  ["up", "--yes"], ["destroy", "--yes"], ["run"]])
def test_an_index_out_of_range_is_invalid_input_naming_file_and_field(
        counted, tmp_path, capsys, verb):
    path = counted(2)
    args = [a.replace("OUT", str(tmp_path / "out")) for a in verb]
    assert cli.main([args[0], path, *args[1:], "--index", "3"]) == Exit.INVALID
    assert capsys.readouterr().err.strip() == (
        f"{path}: count: --index 3 is out of range: count: 2 makes sessions 1..2")
    assert not (tmp_path / "out").exists()


def test_an_index_that_is_not_a_positive_number_is_refused_by_the_parser(counted, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["plan", counted(2), "--index", "0"])
    assert caught.value.code == 2
    assert "--index: must be a session number 1, 2, ... (count)" in capsys.readouterr().err


def test_render_writes_each_sessions_files_under_its_name(counted, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["render", counted(2), "--out", str(out)]) == 0
    for name in ("train-1", "train-2"):
        assert (out / name / "sub1" / "entrypoint.sh").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["train-1", "train-2"]
    assert "rendered session train-2 (2 container(s))" in capsys.readouterr().out
    single = tmp_path / "single"
    assert cli.main(["render", counted(2), "--out", str(single), "--index", "1"]) == 0
    assert (single / "main1" / "entrypoint.sh").is_file()


def test_diff_of_a_count_that_grows_adds_sessions_and_keeps_the_others(counted, tmp_path,
                                                                       capsys):
    old = tmp_path / "old.yaml"
    old.write_text(Path(counted(1)).read_text())
    new = counted(2)
    assert cli.main(["diff", str(old), new, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_name = {r["session"]: r for r in doc["sessions"]}
    assert set(by_name) == {"train", "train-1", "train-2"}
    # nothing removes the count-less session: it is left running (issue 32, class 4)
    assert by_name["train"]["left"] and not by_name["train"]["deleted"]
    assert {c["action"] for c in by_name["train-2"]["containers"]} == {"add"}


def test_combined_exit_codes_put_a_failure_to_act_before_a_lost_then_a_failed_job():
    assert combined([0, 0]) == 0
    assert combined([0, 5]) == 5
    assert combined([5, 6, 0]) == 6
    assert combined([6, 1]) == 1
    assert combined([]) == 0


@pytest.mark.parametrize("verb", [["key", "--out", "OUT"], ["ssh-config"],
                                  ["up", "--yes", "--stack", "mine"]])
def test_a_verb_that_acts_on_one_session_asks_for_an_index_with_count(
        counted, tmp_path, capsys, verb):
    """Which of K sessions a verb means is decided once (``Selected.one``): a verb or option
    that reaches one session refuses K of them as invalid input, saying how to choose."""
    path = counted(2)
    args = [a.replace("OUT", str(tmp_path / "key")) for a in verb]
    assert cli.main([args[0], path, *args[1:]]) == Exit.INVALID
    assert not (tmp_path / "key").exists()
    err = capsys.readouterr().err
    assert f"but {path} makes 2 sessions (count): choose one with --index I" in err, err
