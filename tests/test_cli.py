"""``sessionctl validate|plan|schema``: contracts 1 and 2, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster_sessions.driver.cli import main

from .conftest import STACKS

EXAMPLES = sorted((STACKS / "sessions").glob("*.yaml"))
POOLS = sorted((STACKS / "pools").glob("*.yaml"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_example_definition_is_valid(capsys):
    code, out, err = run(capsys, "validate", *map(str, EXAMPLES + POOLS))
    assert (code, err) == (0, "")
    assert out.count(": ok") == len(EXAMPLES + POOLS)


def test_validate_prints_one_line_per_problem_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ClusterSession\nname: x\npool: local\nimage: i\n"
                   "cluster: {size: 0}\nbogus: 1\n")
    code, out, err = run(capsys, "validate", str(bad), str(EXAMPLES[0]))
    assert code == 2
    lines = err.splitlines()
    assert f"{bad}: cluster.size: must be greater than or equal to 1" in lines
    assert any(line.startswith(f"{bad}: bogus: unknown key") for line in lines)
    assert all(line.startswith(f"{bad}: ") for line in lines)


def test_plan_json_of_the_four_container_example(capsys):
    code, out, _ = run(capsys, "plan", str(STACKS / "sessions" / "train-demo.yaml"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["status"] == "scheduled"
    assert [c["host"] for c in doc["containers"]] == ["main1", "sub1", "sub2", "sub3"]
    assert {c["agent"] for c in doc["containers"]} == {"local"}


def test_plan_of_the_multi_node_example_spreads_over_the_lab(capsys):
    code, out, _ = run(capsys, "plan", str(STACKS / "sessions" / "multi-demo.yaml"), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["network"]["driver"] == "overlay"
    assert [c["agent"] for c in doc["containers"]] == (
        ["agent1"] * 3 + ["agent2"] * 3 + ["agent3"] * 2)


def test_plan_with_pool_override_can_be_pending_and_exits_3(tmp_path, capsys):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("kind: AgentPool\nname: tiny\nagents:\n"
                    "  - {name: a, docker_host: 'unix:///s', capacity: {cpu: 4, mem: 2g}}\n")
    code, out, err = run(capsys, "plan", str(STACKS / "sessions" / "train-demo.yaml"),
                         "--pool", str(tiny), "--json")
    assert code == 3
    assert json.loads(out)["status"] == "pending"
    assert "pending: no single agent can hold all 4 containers" in err
    assert "a holds 2 (short of mem)" in err


def test_plan_text_is_a_table_for_review(capsys):
    code, out, _ = run(capsys, "plan", str(STACKS / "sessions" / "train-demo.yaml"))
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("HOST"))
    assert header.split() == ["HOST", "ROLE", "AGENT", "CPU", "MEM", "SHMEM", "GPUS"]
    assert any(line.split()[:3] == ["sub3", "sub", "local"] for line in out.splitlines())


def test_plan_of_an_invalid_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ClusterSession\n")
    code, out, err = run(capsys, "plan", str(bad))
    assert code == 2 and out == ""
    assert f"{bad}: name: required" in err.splitlines()


def test_schema_describes_both_kinds(capsys):
    code, out, _ = run(capsys, "schema")
    doc = json.loads(out)
    assert code == 0
    assert set(doc["$defs"]) == {"ClusterSession", "AgentPool"}
    session = doc["$defs"]["ClusterSession"]
    assert session["additionalProperties"] is False
    assert {"name", "pool", "image", "cluster", "resources"} <= set(session["properties"])


@pytest.mark.parametrize(
    "content",
    ["\x00\x01", "kind: [", "{{{{", "kind: ClusterSession\nname: !!binary aGVsbG8=\n",
     "kind: ClusterSession\nenv: {A: {B: {C: 1}}}\n", "- - - -\n", "kind: 12\n"],
)
def test_hostile_files_never_produce_a_traceback(tmp_path, content):
    path = tmp_path / "h.yaml"
    path.write_text(content)
    for verb in (["validate"], ["plan", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "cluster_sessions.driver.cli", verb[0],
                               str(path), *verb[1:]], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.startswith(f"{path}: ")


def test_sessionctl_is_on_path_with_help():
    proc = subprocess.run(["sessionctl", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "exit codes" in proc.stdout and "validate" in proc.stdout


def test_missing_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as err:
        main(["plan"])
    assert err.value.code == 2
