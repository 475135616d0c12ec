"""``sessionctl validate|plan|schema``: contracts 1 and 2, exit codes, no tracebacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

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
    assert [c["agent"] for c in doc["containers"]] == ["agent1"] * 6 + ["agent2"] * 2


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
    assert f"{bad}: pool: required" in err.splitlines()


def test_plan_says_a_name_came_from_the_file_name(tmp_path, capsys):
    text = (STACKS / "sessions" / "train-demo.yaml").read_text()
    doc = tmp_path / "night-run.yaml"
    doc.write_text(re.sub(r"(?m)^name: .*\n", "", text).replace("pool: local",
                   f"pool: {STACKS / 'pools' / 'local.yaml'}"))
    code, out, _ = run(capsys, "plan", str(doc))
    assert code == 0
    assert out.splitlines()[0].startswith("session  night-run (from the file name)  (id ")
    code, out, _ = run(capsys, "plan", str(STACKS / "sessions" / "train-demo.yaml"))
    assert "from the file name" not in out


def test_the_schema_lets_a_session_omit_its_name(capsys):
    code, out, _ = run(capsys, "schema", "ClusterSession")
    assert code == 0 and "name" not in json.loads(out)["required"]


def test_schema_describes_both_kinds(capsys):
    code, out, _ = run(capsys, "schema")
    doc = json.loads(out)
    assert code == 0
    assert [one["$ref"] for one in doc["oneOf"]] == ["#/$defs/ClusterSession",
                                                     "#/$defs/AgentPool"]
    assert {"ClusterSession", "AgentPool", "Resources", "Agent"} <= set(doc["$defs"])
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


# --- issue 9: one problem is one line; no control byte reaches the terminal ----------------------

POOL_FILE = STACKS / "pools" / "local.yaml"
SESSION_TEXT = (f"kind: ClusterSession\nname: hostile\npool: {POOL_FILE}\nimage: img\n"
                "cluster: {size: 2}\nresources: {cpu: 0.5, mem: 1g, shmem: 64m}\n")
HOSTILE = "a\nb\rc\x1b[2J\x1b]0;title\x07\x9b31m\u202edef\u2028\x7f\U000e0041"


def yq(text: str) -> str:
    """``text`` as a double-quoted YAML scalar (escapes for what YAML may not hold raw)."""
    import yaml

    return yaml.safe_dump(text, default_style='"', width=10**6).strip()


def assert_no_control(text: str) -> None:
    import unicodedata

    bad = [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    assert not bad, bad


def test_a_newline_or_escape_in_a_key_or_value_stays_on_its_problems_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    key = yq("K\nsecond.path: forged line\x1b[2J")
    value = yq("/a\n" + HOSTILE)
    bad.write_text(SESSION_TEXT.replace("image: img\n", f"image: {value}\n")
                   + f"env: {{{key}: x}}\nmounts: [{{source: {value}, target: /x}}]\n")
    code, out, err = run(capsys, "validate", str(bad))
    assert code == 2
    assert_no_control(err)
    lines = err.splitlines()
    assert all(line.startswith(f"{bad}: ") for line in lines), lines
    assert any(line.startswith(f"{bad}: env.K\\nsecond.path: forged line\\x1b[2J: ")
               for line in lines), lines
    assert any(line.startswith(f"{bad}: mounts.0.source: ") for line in lines), lines


def test_a_file_name_with_a_newline_is_printed_escaped(tmp_path, capsys):
    bad = tmp_path / "x\nforged: ok\x1b[1A.yaml"
    bad.write_text("kind: ClusterSession\n")
    code, _, err = run(capsys, "validate", str(bad))
    assert code == 2
    assert_no_control(err)
    assert all(line.startswith(str(tmp_path) + "/x\\nforged: ok\\x1b[1A.yaml: ")
               for line in err.splitlines())
    good = tmp_path / "ok\x1b[1A.yaml"
    good.write_text(SESSION_TEXT)
    code, out, _ = run(capsys, "validate", str(good))
    assert code == 0 and out == f"{tmp_path}/ok\\x1b[1A.yaml: ok\n"


def test_plan_json_and_table_carry_hostile_env_values_without_control_bytes(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(SESSION_TEXT + f"env: {{V: {yq(HOSTILE)}}}\n", encoding="utf-8")
    code, out, err = run(capsys, "plan", str(path), "--json")
    assert code == 0, err
    assert_no_control(out)
    container = json.loads(out)["containers"][0]
    assert container["user_env"]["V"] == HOSTILE  # the same value
    assert "V" not in container["env"]  # the container is created without it
    code, out, err = run(capsys, "plan", str(path))
    assert code == 0, err
    assert_no_control(out + err)


def test_diff_markdown_and_json_carry_hostile_values_without_control_bytes(tmp_path, capsys):
    old = tmp_path / "old.yaml"
    new = tmp_path / "new\x1b[2J.yaml"
    old.write_text(SESSION_TEXT + "env: {V: plain}\n")
    new.write_text(SESSION_TEXT + f"env: {{V: {yq(HOSTILE)}, {yq('W')}: "
                   f"{yq(HOSTILE)}}}\n", encoding="utf-8")
    code, out, err = run(capsys, "diff", str(old), str(new))
    assert code == 0, err
    assert_no_control(out + err)
    assert "a\\nb\\rc\\x1b[2J" in out
    code, out, err = run(capsys, "diff", str(old), str(new), "--json")
    assert code == 0, err
    assert_no_control(out)
    assert json.loads(out)["user_env"][-1]["new"] == HOSTILE


# --- issue 9 item 10: invalid input exits 2 with file and field named ---------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("size: 2", "size: " + "9" * 5000), "cluster.size"),
        (("kind: ClusterSession", "kind: [ClusterSession]"), "kind"),
        (("mem: 1g", "mem: '" + "9" * 400 + ".5g'"), "resources.mem"),
        ((f"pool: {POOL_FILE}", "pool: ~nosuchuser/p.yaml"), "pool"),
        ((f"pool: {POOL_FILE}", "pool: " + "p" * 300), "pool"),
        ((f"pool: {POOL_FILE}", "pool: /proc/kallsyms"), "pool"),
        (("kind: ClusterSession", "kind: ClusterSession\ndistributed: {slots: 0}"),
         "distributed.slots"),
    ],
)
def test_invalid_input_exits_2_with_file_and_field(tmp_path, change, field):
    path = tmp_path / "s.yaml"
    path.write_text(SESSION_TEXT.replace(*change))
    for verb in (["validate"], ["plan", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "cluster_sessions.driver.cli", verb[0],
                               str(path), *verb[1:]], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"{path}: {field}: "), proc.stderr


def test_a_deleted_working_directory_exits_2_naming_the_pool(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SESSION_TEXT.replace(f"pool: {POOL_FILE}", "pool: somewhere"))
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
            "from cluster_sessions.driver.cli import main; sys.exit(main(sys.argv[2:]))")
    for verb in ("validate", "plan"):
        proc = subprocess.run([sys.executable, "-c", code, str(gone), verb, str(path)],
                              capture_output=True, text=True, timeout=60)
        gone.mkdir()
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"{path}: pool: no pool 'somewhere' found"), proc.stderr
        assert "working directory no longer exists" in proc.stderr


@pytest.mark.parametrize("argv", [["plan", "--pool", ""], ["render", "--out", "OUT", "--pool", ""],
                                  ["diff", "/dev/null", "--pool", ""], ["validate"]])
def test_an_empty_file_or_pool_argument_is_an_error(capsys, argv, tmp_path):
    session = str(STACKS / "sessions" / "train-demo.yaml")
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    if argv[0] == "validate":
        argv = ["validate", session, ""]
    else:
        argv = [argv[0], *argv[1:2], session, *argv[2:]] if argv[0] == "diff" else \
            [argv[0], session, *argv[1:]]
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    assert "must not be empty" in capsys.readouterr().err


# --- sessionctl schema: what an editor checks against (issue 12) ------------------------------

def whole_schema_validator():
    import jsonschema

    from cluster_sessions.driver.cli import definitions_schema

    schema = definitions_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def definition_files() -> list[Path]:
    stacks = Path(__file__).resolve().parent.parent / "stacks"
    fixtures = Path(__file__).resolve().parent / "fixtures"
    return sorted([*stacks.glob("sessions/*.yaml"), *stacks.glob("pools/*.yaml"),
                   *fixtures.rglob("*.yaml")])


@pytest.mark.parametrize("path", definition_files(), ids=lambda p: p.name)
def test_every_example_and_test_definition_is_valid_against_the_schema(path):
    import yaml

    validator = whole_schema_validator()
    document = yaml.safe_load(path.read_text())
    errors = [e.message for e in validator.iter_errors(document)]
    assert errors == [], f"{path}: {errors}"


@pytest.mark.parametrize("change", [
    {"resources": {"mem": "4 gigs"}},
    {"resources": {"mem": -1}},
    {"cluster": {"size": "four"}},
    {"colour": "blue"},
    {"env": {"A": 1}},
    {"kind": "Cluster"},
])
def test_definitions_the_loader_refuses_for_their_type_fail_the_schema_too(change):
    import yaml

    validator = whole_schema_validator()
    stacks = Path(__file__).resolve().parent.parent / "stacks"
    document = yaml.safe_load((stacks / "sessions" / "train-demo.yaml").read_text())
    for key, value in change.items():
        document[key] = {**document[key], **value} if isinstance(value, dict) and isinstance(
            document.get(key), dict) else value
    assert list(validator.iter_errors(document)), change


def test_the_schema_has_no_reference_that_leads_nowhere():
    from cluster_sessions.driver.cli import definitions_schema

    text = json.dumps(definitions_schema())
    defs = definitions_schema()["$defs"]
    for ref in set(re.findall(r'"\$ref": "#/\$defs/([^"]+)"', text)):
        assert ref in defs, ref


def test_pool_may_be_given_by_name_on_the_command_line(capsys):
    definition = str(STACKS / "sessions" / "multi-demo.yaml")
    by_name = run(capsys, "plan", definition, "--pool", "lab3", "--json")
    by_file = run(capsys, "plan", definition, "--pool", str(STACKS / "pools" / "lab3.yaml"),
                  "--json")
    assert by_name[0] == 0 and by_name[1] == by_file[1]
    code, _, err = run(capsys, "plan", definition, "--pool", "nosuchpool")
    assert code == 2 and "no pool 'nosuchpool' found" in err


@pytest.mark.docker
def test_plan_probe_says_which_pool_it_probed_and_what_it_found(docker_client, capsys):
    code, out, err = run(capsys, "plan", str(STACKS / "sessions" / "solo.yaml"), "--probe")
    assert code in (0, 3), err
    lines = err.splitlines()
    assert lines[0] == f"probed pool local ({STACKS / 'pools' / 'local.yaml'}), free now:"
    assert lines[1].startswith("  local: cpu ") and ", mem " in lines[1]


# --- what a user reads: --version and help (issue 12) ------------------------------------------

def test_version_is_the_checkouts_own(capsys):
    import tomllib

    pyproject = tomllib.loads((STACKS.parent / "pyproject.toml").read_text())
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"sessionctl {pyproject['project']['version']}\n"


def _every_parser():
    """The top-level parser and every verb's and sub-verb's, with the path that reaches it."""
    import argparse

    from cluster_sessions.driver.cli import build_parser

    todo = [((), build_parser())]
    while todo:
        path, parser = todo.pop()
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    assert helps.get(name), f"{' '.join((*path, name))} has no one-line help"
                    todo.append(((*path, name), sub))


def test_every_verb_has_help_and_no_jargon():
    seen = set()
    for path, parser in _every_parser():
        seen.add(" ".join(path))
        text = parser.format_help()
        assert parser.description or not path, f"{' '.join(path)}: no description"
        for jargon in ("contract", "(top)", "(top):"):
            assert jargon not in text.lower(), (path, jargon)
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{' '.join(path)} {action.option_strings[0]}: no help"
    assert {"schema", "lab down", "lab status", "pool sweep", "refresh"} <= seen


def test_agents_that_cannot_be_used_are_a_missing_prerequisite_exit_4(tmp_path, capsys,
                                                                      monkeypatch):
    """The agents layer raises PreflightError without an exit code; the CLI makes it 4."""
    from cluster_sessions.agents import capacity
    from cluster_sessions.agents.capacity import AgentReport

    bad = AgentReport("a1")
    bad.fail("unreachable", "ssh root@h:22: Connection refused")

    monkeypatch.setattr(capacity, "probe_pool", lambda *_args, **_kwargs: [bad])
    path = tmp_path / "s.yaml"
    path.write_text(SESSION_TEXT)
    assert main(["plan", str(path), "--probe"]) == 4
    err = capsys.readouterr().err
    assert "1 of 1 agent(s) cannot be used to probe free capacity" in err
    assert "agent a1: unreachable: ssh root@h:22: Connection refused" in err


@pytest.mark.parametrize("pending", [False, True])
def test_output_cut_short_by_the_reader_is_never_a_success(tmp_path, pending):
    """``sessionctl plan ... | head -c 100``: the reader goes away before the verb finishes.
    That must not exit 0 (under ``pipefail`` a failing plan would pass); it exits as a program
    SIGPIPE ended, with nothing on stderr."""
    import subprocess
    import sys

    from tests import factories

    pool = factories.pool("wide", factories.agent(cpu=1000, mem="2000g"))
    session = factories.session("wide-plan", str(tmp_path / "pool.yaml"), size=400,
                                cpu=5 if pending else 1)
    factories.write(tmp_path / "pool.yaml", pool)
    path = factories.write(tmp_path / "s.yaml", session)
    proc = subprocess.Popen([sys.executable, "-m", "cluster_sessions.driver.cli", "plan",
                             str(path), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.read(100)
    proc.stdout.close()
    code = proc.wait(timeout=120)
    assert code == 141, (code, proc.stderr.read())
    assert proc.stderr.read() == b""


@pytest.mark.parametrize("args", [["--agents", "0"], ["--agents", "33"], ["--agents", "x"],
                                  ["--subnet", "banana"], ["--subnet", "8.8.8.0/24"],
                                  ["--prefix", "Bad-Prefix"]])
def test_bad_lab_arguments_are_invalid_input(args, capsys):
    """Invalid input is exit 2 (contract 4), refused before anything is started."""
    with pytest.raises(SystemExit) as caught:
        main(["lab", "up", *args])
    assert caught.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_a_pool_s_bad_limits_or_privileges_are_named_with_file_and_field_exit_2(tmp_path, capsys):
    bad = tmp_path / "pool.yaml"
    bad.write_text("kind: AgentPool\nname: p\nagents: [{name: a, capacity: {cpu: 1, mem: 1g}}]\n"
                   "limits: {log_max_size: 10k, log_max_files: 0}\n"
                   "privileges: {capabilities: [CAP_SYS_ADMIN], no_new_privileges: 'no'}\n")
    code, out, err = run(capsys, "validate", str(bad))
    assert (code, out) == (2, "")
    fields = {line.split(": ")[1] for line in err.splitlines()}
    assert {"limits.log_max_size", "limits.log_max_files",
            "privileges.no_new_privileges"} <= fields
    assert "Traceback" not in err and all(line.startswith(f"{bad}: ") for line in err.splitlines())
    bad.write_text("kind: AgentPool\nname: p\nagents: [{name: a, capacity: {cpu: 1, mem: 1g}}]\n"
                   "privileges: {capabilities: [CAP_SYS_ADMIN]}\n")
    code, _, err = run(capsys, "validate", str(bad))
    assert code == 2
    assert f"{bad}: privileges.capabilities.0: 'CAP_SYS_ADMIN' is not a Linux capability " \
           "(write SYS_ADMIN)" in err.splitlines()


def test_validate_json_and_every_json_verb_prints_a_document_on_invalid_input(tmp_path,
                                                                              capsys):
    """Issue 41, item 10: `validate --json` exists; `up --json` (and `preview`, `plan`) on an
    invalid file print one document on stdout naming each problem, exit 2."""
    import json as json_

    good = tmp_path / "good.yaml"
    good.write_text("kind: ClusterSession\nname: good-one\npool: local\nimage: img\n"
                    "cluster: {mode: single-node, size: 1}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ClusterSession\nname: x\nimage: img\ncluster: {size: 0}\n")
    assert main(["validate", "--json", str(good), str(bad)]) == 2
    doc = json_.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    assert doc["files"] == [{"file": str(good), "valid": True},
                            {"file": str(bad), "valid": False}]
    paths = {p["path"] for p in doc["problems"]}
    assert {"pool", "cluster.size"} <= paths and all(p["file"] == str(bad)
                                                     for p in doc["problems"])
    assert main(["validate", "--json", str(good)]) == 0
    assert json_.loads(capsys.readouterr().out)["valid"] is True
    for verb in (["up", "--yes"], ["preview"], ["plan"]):
        assert main([verb[0], str(bad), "--json", *verb[1:]]) == 2
        out, err = capsys.readouterr()
        doc = json_.loads(out)
        assert (doc["verb"], doc["result"]) == (verb[0], "invalid"), doc
        assert "cluster.size" in {p["path"] for p in doc["problems"]}
        assert "cluster.size" in err  # the lines stay on stderr
