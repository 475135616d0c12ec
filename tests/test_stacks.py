"""The engine verbs' driver: everything up to the Pulumi CLI, tested without faking the CLI.

This machine has the pulumi SDK but no CLI, so what is proven here is: how names, paths,
settings and arguments are built (checked against the SDK's own argument translation and
method signatures), and each exit path that must happen before or instead of an engine call.
"""

from __future__ import annotations

import inspect
import io
import json
import sys
from pathlib import Path

import pytest
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult
from pulumi.automation._stack import _parse_extra_args
from pulumi.automation.errors import create_command_error
from pulumi.automation.events import EngineEvent, OpType

from cluster_sessions.driver import cli, stack_settings, stacks
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import CommandError, Exit

from . import factories


def write_session(tmp_path: Path, *, size: int = 2, name: str = "engine-test",
                  docker_host: str = "ssh://ops@agent1.invalid") -> Path:
    return factories.write_pair(
        tmp_path, factories.session(name, image="busybox:stable", size=size),
        factories.pool("test", factories.agent(docker_host=docker_host)))


@pytest.fixture
def no_engine(monkeypatch):
    """Every way into the engine fails the test if it is taken."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the engine was called")

    for name in ("create_or_select_stack", "select_stack", "create_stack"):
        monkeypatch.setattr(auto, name, forbidden)
    monkeypatch.setattr(auto.LocalWorkspace, "__init__", forbidden)
    monkeypatch.setattr(stacks, "open_stack", forbidden)
    monkeypatch.setattr(stacks, "find_pulumi", forbidden)
    monkeypatch.setattr(stacks, "docker_answers", forbidden)


@pytest.fixture
def without_pulumi_cli(monkeypatch, tmp_path):
    """PATH and HOME that hold no pulumi CLI (whether or not this machine has one)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PULUMI_HOME", raising=False)


@pytest.fixture
def no_tty(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


# --- names, paths, settings ---------------------------------------------------------------------


def test_stack_is_named_after_the_session():
    assert stacks.stack_name_for("train-demo") == "train-demo"
    assert stacks.stack_name_for("a.b_c-1") == "a.b_c-1"


def test_stack_override_accepts_plain_and_fully_qualified_names():
    assert stacks.stack_name_for("train-demo", "ci-train") == "ci-train"
    assert stacks.stack_name_for("train-demo", "acme/cluster-sessions/x") == (
        "acme/cluster-sessions/x")


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "a/b/c/d", "x" * 101, "ü-nicode"])
def test_invalid_stack_override_is_invalid_input(bad):
    with pytest.raises(CommandError) as err:
        stacks.stack_name_for("train-demo", bad)
    assert err.value.code == Exit.INVALID


def test_config_path_is_relative_to_stacks_when_inside_it(tmp_path):
    stacks_dir = tmp_path / "stacks"
    (stacks_dir / "sessions").mkdir(parents=True)
    file = stacks_dir / "sessions" / "train-demo.yaml"
    assert stacks.config_path(file, stacks_dir) == "sessions/train-demo.yaml"
    # however the file was spelled on the command line
    assert stacks.config_path(stacks_dir / "pools" / ".." / "sessions" / "train-demo.yaml",
                              stacks_dir) == "sessions/train-demo.yaml"


def test_config_path_is_absolute_outside_stacks(tmp_path):
    stacks_dir = tmp_path / "project" / "stacks"
    stacks_dir.mkdir(parents=True)
    outside = tmp_path / "elsewhere" / "s.yaml"
    assert stacks.config_path(outside, stacks_dir) == outside.resolve().as_posix()


def test_config_path_of_a_relative_argument_is_resolved_against_the_cwd(tmp_path, monkeypatch):
    stacks_dir = tmp_path / "stacks"
    (stacks_dir / "sessions").mkdir(parents=True)
    monkeypatch.chdir(stacks_dir / "sessions")
    assert stacks.config_path(Path("x.yaml"), stacks_dir) == "sessions/x.yaml"


def test_stack_config_sets_the_definition_and_removes_a_stale_pool(tmp_path):
    project = tmp_path
    config = stacks.stack_config(project / "stacks/sessions/a.yaml", None, project)
    assert config == {"cluster-sessions:definition": "sessions/a.yaml",
                      "cluster-sessions:pool": None, "cluster-sessions:index": None}
    config = stacks.stack_config(project / "stacks/sessions/a.yaml",
                                 project / "stacks/pools/lab.yaml", project, index=3)
    assert config["cluster-sessions:pool"] == "pools/lab.yaml"
    assert config["cluster-sessions:index"] == "3"  # one of a count's sessions


def test_config_keys_are_the_ones_the_project_declares(project_dir):
    import yaml

    declared = yaml.safe_load((project_dir / "Pulumi.yaml").read_text())
    keys = {stack_settings.CONFIG_DEFINITION, stack_settings.CONFIG_POOL,
            stack_settings.CONFIG_INDEX}
    assert keys <= set(declared["config"])
    assert declared["name"] == stacks.PROJECT_NAME
    assert declared["stackConfigDir"] == stacks.STACKS_DIR


def test_default_backend_is_a_file_backend_inside_the_project(tmp_path):
    settings = stacks.engine_settings({}, tmp_path, python="/usr/bin/python3")
    assert settings.backend_url == f"file://{tmp_path.resolve()}/.pulumi-state"
    assert settings.default_backend
    assert settings.state_dir == tmp_path.resolve() / ".pulumi-state"
    assert settings.env["PULUMI_BACKEND_URL"] == settings.backend_url
    assert settings.env["PULUMI_PYTHON_CMD"] == "/usr/bin/python3"
    assert settings.env["PULUMI_SKIP_UPDATE_CHECK"] == "true"


def test_backend_url_from_the_environment_wins(tmp_path):
    settings = stacks.engine_settings({"PULUMI_BACKEND_URL": "s3://bucket/state"}, tmp_path)
    assert settings.backend_url == "s3://bucket/state"
    assert not settings.default_backend
    assert settings.state_dir is None


def test_default_passphrase_is_used_and_flagged_when_none_is_set(tmp_path):
    settings = stacks.engine_settings({}, tmp_path)
    assert settings.default_passphrase
    assert settings.env["PULUMI_CONFIG_PASSPHRASE"] == stack_settings.DEFAULT_PASSPHRASE


def test_default_passphrase_is_announced_once_as_insecure_without_its_value(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stacks, "_warned_passphrase", False)
    settings = stacks.engine_settings({}, tmp_path)
    stacks.warn_passphrase_once(settings)
    stacks.warn_passphrase_once(settings)
    err = capsys.readouterr().err
    assert err.count("PULUMI_CONFIG_PASSPHRASE is not set") == 1
    assert "protects nothing" in err
    assert stack_settings.DEFAULT_PASSPHRASE not in err


@pytest.mark.parametrize("own", [{"PULUMI_CONFIG_PASSPHRASE": "s3cret"},
                                 {"PULUMI_CONFIG_PASSPHRASE": ""},  # empty is a passphrase too
                                 {"PULUMI_CONFIG_PASSPHRASE_FILE": "/run/secrets/pp"}])
def test_the_users_passphrase_is_left_to_the_cli(tmp_path, own):
    settings = stacks.engine_settings(own, tmp_path)
    assert not settings.default_passphrase
    # not copied: the CLI inherits the caller's environment
    assert "PULUMI_CONFIG_PASSPHRASE" not in settings.env


def test_no_default_passphrase_for_the_pulumi_cloud_backend(tmp_path):
    settings = stacks.engine_settings({"PULUMI_BACKEND_URL": "https://api.pulumi.com"}, tmp_path)
    assert not settings.default_passphrase


def test_settings_never_show_the_passphrase(tmp_path):
    settings = stacks.engine_settings({}, tmp_path)
    assert stack_settings.DEFAULT_PASSPHRASE not in repr(settings)


def test_project_is_found_from_a_definition_inside_it(project_dir):
    found = stacks.find_project([project_dir / "stacks" / "sessions"])
    assert found == project_dir


def test_a_pulumi_project_of_another_name_is_not_ours(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: something-else\nruntime: python\n")
    assert stacks.find_project([tmp_path / "sub"]) is None


def test_project_search_falls_back_to_the_next_start(tmp_path, project_dir):
    assert stacks.find_project([tmp_path, project_dir]) == project_dir


# --- arguments for the Automation API ------------------------------------------------------------


def kwargs_for(call: str, **over):
    base = dict(json_mode=False, color=True, on_output=print, on_error=print, on_event=None,
                message="sessionctl up sessions/x.yaml")
    base.update(over)
    return stacks.call_kwargs(call, **base)


@pytest.mark.parametrize("call", ["preview", "up", "destroy", "refresh", "preview_destroy"])
@pytest.mark.parametrize("json_mode", [False, True])
def test_call_kwargs_fit_the_sdk_method(call, json_mode):
    kwargs = kwargs_for(call, json_mode=json_mode, diff=call in ("preview", "up"), parallel=8)
    inspect.signature(getattr(auto.Stack, call)).bind(None, **kwargs)  # raises on a bad name


def test_terminal_run_streams_in_colour_with_a_message():
    args = _parse_extra_args(**kwargs_for("up"))
    assert args[args.index("--color") + 1] == "always"
    assert args[args.index("--message") + 1] == "sessionctl up sessions/x.yaml"
    assert "--suppress-progress" not in args


def test_json_run_is_quiet_and_colourless():
    kwargs = kwargs_for("up", json_mode=True)
    args = _parse_extra_args(**kwargs)
    assert args[args.index("--color") + 1] == "never"
    assert "--suppress-progress" in args
    assert kwargs["show_secrets"] is False


def test_diff_flag_reaches_the_cli():
    assert "--diff" in _parse_extra_args(**kwargs_for("preview", diff=True))
    assert "--diff" not in _parse_extra_args(**kwargs_for("preview"))


def test_confirmation_rules():
    assert stacks.confirmation("up", yes=False, json_mode=False, interactive=True)
    assert stacks.confirmation("destroy", yes=False, json_mode=False, interactive=True)
    assert not stacks.confirmation("up", yes=True, json_mode=True, interactive=False)
    assert not stacks.confirmation("preview", yes=False, json_mode=False, interactive=False)
    assert not stacks.confirmation("refresh", yes=False, json_mode=True, interactive=False)
    for json_mode, interactive in ((False, False), (True, True)):
        with pytest.raises(CommandError) as err:
            stacks.confirmation("up", yes=False, json_mode=json_mode, interactive=interactive)
        assert err.value.code == Exit.INVALID and "--yes" in str(err.value)


class RecordingStack:
    """Records the config calls ``apply_config`` makes; runs nothing, returns nothing."""

    def __init__(self):
        self.calls: list[tuple] = []

    def set_all_config(self, config, *, path=False):
        self.calls.append(("set", {k: (v.value, v.secret) for k, v in config.items()}, path))

    def remove_all_config(self, keys, *, path=False):
        self.calls.append(("remove", list(keys), path))


def test_apply_config_sets_the_definition_and_clears_an_old_pool_in_two_calls(tmp_path):
    """One ``pulumi config set-all`` and one ``config rm-all`` (each call is a CLI process),
    whatever the number of keys; keys as written, not as paths."""
    stack = RecordingStack()
    stacks.apply_config(stack, stacks.stack_config(tmp_path / "stacks/sessions/a.yaml", None,
                                                   tmp_path))
    assert stack.calls == [
        ("set", {"cluster-sessions:definition": ("sessions/a.yaml", False)}, False),
        ("remove", ["cluster-sessions:pool", "cluster-sessions:index"], False)]


def test_apply_config_sets_the_pool_when_given_and_removes_nothing_when_all_are_set(tmp_path):
    stack = RecordingStack()
    stacks.apply_config(stack, stacks.stack_config(tmp_path / "stacks/sessions/a.yaml",
                                                   tmp_path / "pools/lab.yaml", tmp_path))
    (call, values, _), *rest = stack.calls
    assert call == "set" and values["cluster-sessions:pool"] == (
        (tmp_path / "pools/lab.yaml").resolve().as_posix(), False)
    assert [c[0] for c in rest] in ([], ["remove"])
    assert all(key not in values for c in rest for key in c[1])
    stack = RecordingStack()
    stacks.apply_config(stack, {"a:b": "1", "a:c": "2"})
    assert [c[0] for c in stack.calls] == ["set"]
    stack = RecordingStack()
    stacks.apply_config(stack, {"a:b": None})
    assert stack.calls == [("remove", ["a:b"], False)]


def test_declining_or_no_answer_means_no(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert stacks.ask("Apply?") is False
    monkeypatch.setattr(sys, "stdin", io.StringIO("yes\n"))
    assert stacks.ask("Apply?") is True


# --- results and failures ------------------------------------------------------------------------


def test_secret_outputs_are_masked():
    outputs = {"hosts": auto.OutputValue(["main1", "sub1"], False),
               "ssh_private_key": auto.OutputValue("-----BEGIN OPENSSH", True)}
    shown = stacks.masked_outputs(outputs)
    assert shown == {"hosts": ["main1", "sub1"], "ssh_private_key": "[secret]"}
    assert "BEGIN" not in json.dumps(shown)


def test_change_counts_from_an_op_map():
    assert stacks.change_counts({OpType.CREATE: 3, OpType.SAME: 1, "replace": 2}) == {
        "create": 3, "replace": 2, "same": 1}
    assert stacks.change_counts(None) == {}


def test_event_log_keeps_changed_steps_and_error_diagnostics():
    log = stacks.EventLog()
    urn = "urn:pulumi:demo::cluster-sessions::cluster-sessions:index:Session${}::demo-{}"
    log(EngineEvent.from_json({"resourcePreEvent": {"metadata": {
        "op": "replace", "urn": urn.format("docker:index/container:Container", "main1"),
        "type": "docker:index/container:Container", "provider": "",
        "keys": ["envs"], "diffs": ["envs"]}}}))
    log(EngineEvent.from_json({"resourcePreEvent": {"metadata": {
        "op": "same", "urn": urn.format("docker:index/network:Network", "net"),
        "type": "docker:index/network:Network", "provider": ""}}}))
    log(EngineEvent.from_json({"diagnosticEvent": {"message": "error: image not found\n",
                                                   "severity": "error", "color": "never"}}))
    log(EngineEvent.from_json({"diagnosticEvent": {"message": "just info",
                                                   "severity": "info", "color": "never"}}))
    assert log.steps == [{"op": "replace", "type": "docker:index/container:Container",
                          "name": "demo-main1", "diffs": ["envs"], "replace_keys": ["envs"]}]
    assert log.errors == ["error: image not found"]


def test_engine_failure_message_comes_from_the_sdk_error_text():
    exc = create_command_error(CommandResult(
        stdout="Previewing update (demo):\n\nDiagnostics:\n  pulumi:pulumi:Stack: error: x",
        stderr="error: no stack named 'demo' found", code=255))
    out, err = stacks.split_command_error(str(exc))
    assert out[0] == "Previewing update (demo):"
    assert err == ["error: no stack named 'demo' found"]
    assert stacks.engine_error_message([], out, err) == "error: no stack named 'demo' found"


def test_engine_failure_message_prefers_error_diagnostics_then_stderr_then_output_tail():
    assert stacks.engine_error_message(["error: a", "error: a"], ["o"], ["e"]) == "error: a"
    assert stacks.engine_error_message([], ["o"], ["", "e"]) == "e"
    tail = stacks.engine_error_message([], [str(i) for i in range(50)], [], limit=3)
    assert tail.splitlines() == ["47", "48", "49"]
    assert stacks.engine_error_message([], [], [])


def test_a_providers_python_traceback_is_folded_to_its_exception():
    """What CI showed for a dynamic provider that raised (the engine's diagnostic, verbatim
    but for the paths): the frames are ours to read; the user gets what failed."""
    diagnostic = "\n".join([
        "Traceback (most recent call last):",
        '  File "/x/.venv/lib/python3.11/site-packages/pulumi/dynamic/__main__.py", line 84, '
        "in wrapper",
        "    return fn(self, request, context)",
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^",
        '  File "/x/modules/cluster_sessions/agents/bundles.py", line 67, in _run',
        "    raise AgentError(conn.agent, COMMAND_FAILED, f\"{what}: {hint}\")",
        "cluster_sessions.agents.connectors.AgentError: agent agent1: command failed: cannot "
        "deliver the bundles into /var/lib/x/35b6: mkdir: File exists",
        "update failed"])
    text = stacks.engine_error_message([diagnostic, "error: update failed"], [], [])
    assert text.splitlines() == [
        "AgentError: agent agent1: command failed: cannot deliver the bundles into "
        "/var/lib/x/35b6: mkdir: File exists", "update failed", "error: update failed"]
    # a line that only looks like an exception, outside a traceback, is left as it is
    assert stack_settings.without_tracebacks(["a.b.C: text", "  indented"]) == ["a.b.C: text",
                                                                       "  indented"]
    # an exception without a module path, or without a message
    assert stack_settings.without_tracebacks([
        "Traceback (most recent call last):", '  File "x", line 1', "KeyError: 'x'"]) == [
        "KeyError: 'x'"]
    assert stack_settings.without_tracebacks([
        "Traceback (most recent call last):", '  File "x", line 1', "pkg.Stop"]) == ["Stop"]


class BackendWithout:
    """A workspace whose stack recorded no decisions (no ``kept`` output) and holds
    ``resources`` (what ``recovered`` asks of the Automation API's workspace)."""

    def __init__(self, resources: list) -> None:
        self.resources = resources

    def stack_outputs(self, _stack: str) -> dict:
        return {}

    def export_stack(self, _stack: str):
        from types import SimpleNamespace

        return SimpleNamespace(deployment={"resources": self.resources})


def test_a_stack_id_nothing_in_the_backend_carries_makes_the_stack_new_saying_why(capsys):
    from cluster_sessions.core.names import STACK_ID_LABEL

    claimed = "0123456789abcdef"
    checkout = {"cluster-sessions:stack-id": claimed, "cluster-sessions:definition": "d.yaml"}
    # destroyed (or a first up that did not finish): it holds nothing
    assert stacks.recovered(BackendWithout([]), "s", checkout) is None
    err = capsys.readouterr().err
    assert "(the stack holds nothing: destroyed, or its first up did not finish)" in err
    assert "another backend" not in err
    # it holds a network labelled with another stack's id (our SessionNetwork keeps labels as
    # a mapping): another backend's stack file
    network = {"type": "pulumi-python:dynamic/cluster-sessions:SessionNetwork",
               "inputs": {"labels": {STACK_ID_LABEL: "fedcba9876543210"}}}
    assert stacks.recovered(BackendWithout([network]), "s", checkout) is None
    assert "(another backend's stack file?): the stack is taken as new" in capsys.readouterr().err
    # it holds what carries the checkout's id: believed
    ours = {**network, "inputs": {"labels": {STACK_ID_LABEL: claimed}}}
    config = stacks.recovered(BackendWithout([ours]), "s", checkout)
    assert config is not None and config["cluster-sessions:stack-id"] == claimed


def test_install_instructions_say_how_and_where_from():
    text = stacks.install_instructions("3.272.0", "5.2.0", ["up", "ls"])
    assert "These verbs need it (they read or change stacks through the Automation API): " \
        "up, ls;" in text
    assert "bash scripts/install-pulumi.sh 3.272.0" in text
    assert "curl -fsSL https://get.pulumi.com | sh -s -- --version 3.272.0" in text
    assert "pulumi-v3.272.0-linux-x64.tar.gz" in text
    assert "pulumi plugin install resource docker 5.2.0" in text
    assert "get.pulumi.com and github.com" in text


# --- exit paths through `sessionctl` -------------------------------------------------------------


def test_missing_cli_exits_4_with_install_instructions(tmp_path, without_pulumi_cli, capsys):
    session = write_session(tmp_path)
    assert main(["preview", str(session)]) == Exit.MISSING
    err = capsys.readouterr().err
    assert "pulumi CLI is missing" in err
    assert "https://get.pulumi.com" in err
    assert "Traceback" not in err
    assert "\\n" not in err  # the instructions arrive as lines, not as one escaped line
    assert any(line.startswith("  bash scripts/install-pulumi.sh") for line in err.splitlines())


def leaf_verbs(parser, prefix=()):
    """(words, parser) of every verb of ``sessionctl`` (``pool up``: two words)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                subs = list(leaf_verbs(sub, (*prefix, name)))
                yield from subs or [((*prefix, name), sub)]


def argv_for(words, parser, values) -> list[str]:
    """A command line that gets past argparse: each required argument from ``values``."""
    argv = list(words)
    for action in parser._actions:
        if not action.option_strings and action.nargs not in ("?", "*"):
            argv.append(values[action.dest])
        elif action.required:
            argv += [action.option_strings[0], values[action.dest]]
    return argv + (["--yes"] if "--yes" in parser._option_string_actions else [])


def test_the_missing_cli_message_names_exactly_the_verbs_that_print_it(
        tmp_path, without_pulumi_cli, capsys):
    """Every verb of the parser run without the CLI (a pool whose engine socket is not there,
    so nothing is reached); those that exit 4 with the message are the ones it names. The
    ``lab`` verbs are left out: they start network namespaces and never read stacks."""
    from cluster_sessions.driver.verbs import pulumi_verbs

    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        "nowhere", factories.agent(docker_host=f"unix://{tmp_path}/no.sock"),
        swarm={"manager": "agent1"}))
    session = factories.write(tmp_path / "s.yaml", factories.session(
        "nocli", pool=str(pool), type="batch", command=["true"]))
    values = {"file": str(session), "files": str(session), "pool": str(pool),
              "session": "nocli", "old": str(session),
              "new": str(session), "service": "web", "host": "main1", "image": "img",
              "duration": "2h"}
    printed, named = set(), None
    for words, parser in leaf_verbs(cli.build_parser()):
        if words[0] in ("lab", "schema"):
            continue
        values["out"] = str(tmp_path / "-".join(words))  # render's directory, key's file
        code = main(argv_for(words, parser, values))
        err = capsys.readouterr().err
        if "the pulumi CLI is missing" in err:
            assert code == Exit.MISSING, words
            printed.add(" ".join(words))
            line = next(x for x in err.splitlines() if x.startswith("These verbs need it"))
            assert named in (None, line)  # one message
            named = line
    assert printed >= {"up", "ls", "ssh", "ssh-config", "key", "pool up", "run"}
    assert set(pulumi_verbs()) == printed
    assert named.split(": ", 1)[1].removesuffix("; every other verb works without it.") \
        .split(", ") == list(pulumi_verbs())


def test_missing_cli_with_json_prints_a_summary(tmp_path, without_pulumi_cli, capsys):
    session = write_session(tmp_path)
    assert main(["up", str(session), "--yes", "--json"]) == Exit.MISSING
    doc = json.loads(capsys.readouterr().out)
    assert doc["verb"] == "up" and doc["stack"] == "engine-test"
    assert doc["result"] == "missing-prerequisite"
    assert "get.pulumi.com" in doc["error"]


def test_the_automation_api_itself_fails_without_the_cli_and_becomes_exit_4(
        tmp_path, without_pulumi_cli):
    # No pre-check here: the real SDK looks for the CLI and must not find it.
    settings = stacks.engine_settings({}, tmp_path)
    with pytest.raises(CommandError) as err:
        stacks.open_stack("engine-test", tmp_path, settings, pulumi=None)
    assert err.value.code == Exit.MISSING
    assert "curl -fsSL https://get.pulumi.com" in str(err.value)


def test_find_pulumi_also_looks_where_the_installer_puts_it(tmp_path):
    home = tmp_path / "home"
    assert stacks.find_pulumi({"PATH": str(tmp_path), "HOME": str(home)}) is None
    binary = home / ".pulumi" / "bin" / "pulumi"
    binary.parent.mkdir(parents=True)
    binary.write_text("")  # only looked up, never run
    binary.chmod(0o755)
    assert stacks.find_pulumi({"PATH": str(tmp_path), "HOME": str(home)}) == binary


def test_no_docker_engine_on_a_unix_agent_exits_4_with_the_cli_problem_too(
        tmp_path, without_pulumi_cli, capsys):
    socket = tmp_path / "no-such-docker.sock"
    session = write_session(tmp_path, docker_host=f"unix://{socket}")
    assert main(["preview", str(session)]) == Exit.MISSING
    err = capsys.readouterr().err
    assert f"agent agent1: no Docker Engine answers on unix://{socket}" in err
    assert "pulumi CLI is missing" in err


def test_remote_agents_are_not_probed_before_the_engine(tmp_path):
    from cluster_sessions.core.plan import build_plan

    from .factories import load_session

    loaded = load_session(write_session(tmp_path, docker_host="ssh://ops@10.0.0.1"))
    plan = build_plan(loaded.session, loaded.pool)

    def ping(url):
        raise AssertionError(f"probed {url}")

    assert stacks.unreachable_local_agents(plan, loaded, ping=ping) == []


@pytest.mark.parametrize("verb", ["preview", "up"])
def test_pending_exits_3_with_the_reason_before_any_engine_call(tmp_path, no_engine, capsys,
                                                                 verb):
    session = write_session(tmp_path, size=20)  # 20 x 1 cpu on an 8-cpu agent
    assert main([verb, str(session), "--yes"] if verb == "up" else [verb, str(session)]) == (
        Exit.PENDING)
    err = capsys.readouterr().err
    assert "pending" in err and "no single agent can hold all 20 containers" in err
    assert "nothing was sent to the engine" in err


def test_pending_with_json_reports_the_reason(tmp_path, no_engine, capsys):
    session = write_session(tmp_path, size=20)
    assert main(["preview", str(session), "--json"]) == Exit.PENDING
    doc = json.loads(capsys.readouterr().out)
    assert doc["result"] == "pending" and "20 containers" in doc["reason"]


def test_destroy_of_a_pending_definition_still_goes_on(tmp_path, without_pulumi_cli, no_tty,
                                                       capsys):
    # A session grown past its pool must stay destroyable: no exit 3, the next check runs.
    session = write_session(tmp_path, size=20)
    assert main(["destroy", str(session), "--yes"]) == Exit.MISSING
    assert "is pending now" in capsys.readouterr().err


def test_invalid_definition_exits_2_before_any_engine_call(tmp_path, no_engine, capsys):
    session = write_session(tmp_path)
    session.write_text(session.read_text() + "imgae: typo\n")
    assert main(["up", str(session), "--yes"]) == Exit.INVALID
    assert "imgae: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["up", "destroy"])
def test_apply_without_a_terminal_needs_yes(tmp_path, no_engine, no_tty, capsys, verb,
                                            monkeypatch):
    monkeypatch.setattr(stacks, "find_pulumi", lambda env: Path("/usr/bin/true"))
    session = write_session(tmp_path)
    assert main([verb, str(session)]) == Exit.INVALID
    assert "--yes" in capsys.readouterr().err


def test_json_apply_needs_yes_even_on_a_terminal(tmp_path, no_engine, monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Tty(""))
    monkeypatch.setattr(stacks, "find_pulumi", lambda env: Path("/usr/bin/true"))
    session = write_session(tmp_path)
    assert main(["up", str(session), "--json"]) == Exit.INVALID
    captured = capsys.readouterr()
    assert "--yes" in captured.err
    doc = json.loads(captured.out)  # --json still prints its one document
    assert doc["result"] == "needs-confirmation" and "--yes" in doc["error"]


def test_invalid_stack_name_exits_2_before_any_engine_call(tmp_path, no_engine, capsys):
    session = write_session(tmp_path)
    assert main(["preview", str(session), "--stack", "no spaces"]) == Exit.INVALID
    assert "not a valid Pulumi stack name" in capsys.readouterr().err


def test_engine_verbs_are_registered():
    from cluster_sessions.driver.cli import build_parser

    parser = build_parser()
    for verb in stacks.VERBS:
        args = parser.parse_args([verb, "x.yaml", "--json"])
        assert args.func is stacks.cmd_stack


def test_an_unreachable_agent_stops_up_before_the_engine_is_opened(tmp_path, monkeypatch,
                                                                    capsys):
    """Preflight runs after the prerequisites and before any stack is opened: nothing made."""
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "pulumi-was-run"
    cli = bin_dir / "pulumi"
    cli.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def forbidden(*args, **kwargs):
        raise AssertionError("a stack was opened")

    monkeypatch.setattr(stacks, "open_stack", forbidden)
    session = write_session(tmp_path, docker_host=f"ssh://root@127.0.0.1:{port}")
    code = main(["up", str(session), "--yes"])
    err = capsys.readouterr().err
    assert code == Exit.MISSING
    assert "agent1" in err and "nothing was created" in err
    assert not marker.exists()


@pytest.mark.parametrize("argv", [["up"], ["up", "--json"], ["destroy", "--json"]])
def test_a_missing_cli_is_exit_4_even_without_yes(tmp_path, without_pulumi_cli, no_tty,
                                                  capsys, argv):
    session = write_session(tmp_path)
    assert main([argv[0], str(session), *argv[1:]]) == Exit.MISSING
    assert "pulumi CLI is missing" in capsys.readouterr().err


# --- one check order for every engine verb (issue 12) -----------------------------------------

ENGINE_VERBS = [("preview",), ("up",), ("destroy",), ("refresh",), ("pool", "up"),
                ("pool", "destroy")]


def _verb_argv(verb: tuple[str, ...], session: Path, pool: Path, *rest: str) -> list[str]:
    return [*verb, str(pool if verb[0] == "pool" else session), *rest]


@pytest.mark.parametrize("verb", ENGINE_VERBS, ids=" ".join)
def test_every_engine_verb_checks_definition_then_cli_then_yes(tmp_path, monkeypatch, no_tty,
                                                               capsys, verb):
    """definition (exit 2) -> pulumi CLI (exit 4) -> --yes (exit 2), as the README says, and
    nothing reaches the engine on the way."""
    monkeypatch.setattr(stacks, "open_stack", lambda *a, **k: pytest.fail("stack opened"))
    monkeypatch.setattr(stacks, "docker_answers", lambda host: None)
    session = write_session(tmp_path)
    pool = tmp_path / "pool.yaml"
    pool.write_text(pool.read_text() + "swarm: {manager: agent1}\n")
    cli_missing = tmp_path / "empty-bin"
    cli_missing.mkdir()
    monkeypatch.setenv("PATH", str(cli_missing))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PULUMI_HOME", raising=False)

    # 1. a bad definition is reported first, though the CLI is missing and --yes absent
    good = (pool if verb[0] == "pool" else session).read_text()
    (pool if verb[0] == "pool" else session).write_text(good + "colour: blue\n")
    assert main(_verb_argv(verb, session, pool)) == Exit.INVALID
    assert "colour: unknown key" in capsys.readouterr().err
    (pool if verb[0] == "pool" else session).write_text(good)

    # 2. then the CLI, whether or not --yes was given (every engine verb takes it)
    for yes in ([], ["--yes"], ["-y"]):
        assert main(_verb_argv(verb, session, pool, *yes)) == Exit.MISSING, yes
        assert "pulumi CLI is missing" in capsys.readouterr().err

    # 3. then --yes, for the verbs that change something
    monkeypatch.setattr(stacks, "find_pulumi", lambda env: Path("/usr/bin/true"))
    if verb[-1] in stacks.CONFIRM:
        assert main(_verb_argv(verb, session, pool)) == Exit.INVALID
        assert "--yes" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ENGINE_VERBS, ids=" ".join)
def test_an_unknown_option_is_said_with_the_verbs_own_usage(tmp_path, capsys, verb):
    session = write_session(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(_verb_argv(verb, session, tmp_path / "pool.yaml", "--yes", "--bogus"))
    assert exc.value.code == Exit.INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"usage: sessionctl {' '.join(verb)} ")  # not `sessionctl VERB ...`
    assert f"sessionctl {' '.join(verb)}: error: unrecognized arguments: --bogus" in err


def test_an_agent_with_an_ssh_block_is_not_probed_here_before_the_engine(tmp_path):
    """Its unix:// docker_host is the engine as the agent reaches it, not a socket here."""
    from cluster_sessions.core.plan import build_plan

    from .factories import load_session

    path = factories.write_pair(tmp_path, factories.session("remote-unix", image="busybox"),
                                factories.pool("test", factories.agent(
                                    docker_host="unix:///var/run/docker.sock",
                                    ssh={"host": "10.0.0.7", "user": "ops"})))
    loaded = load_session(path)

    def ping(agent):
        raise AssertionError(f"probed {agent.name} on this machine")

    assert stacks.unreachable_local_agents(build_plan(loaded.session, loaded.pool), loaded,
                                           ping=ping) == []


@pytest.mark.parametrize("agent, parallel", [
    ({"docker_host": "unix:///var/run/docker.sock"}, None),  # this machine: Pulumi's default
    ({"docker_host": "unix:///var/run/docker.sock", "ssh": {"host": "10.0.0.7", "user": "ops"}},
     stack_settings.SSH_PARALLEL),
    ({"docker_host": "ssh://ops@10.0.0.7"}, stack_settings.SSH_PARALLEL),
])
def test_a_session_on_a_pool_with_an_agent_over_ssh_runs_eight_operations_at_once(
        tmp_path, agent, parallel):
    """Unbounded, 11 creates at once on one agent over ssh:// failed on the lab (sshd's
    MaxStartups): the engine's --parallel is 8 for such a stack, for every verb."""
    import argparse

    from cluster_sessions.core.decisions import StackIdentity
    from cluster_sessions.core.plan import build_plan

    from .factories import load_session

    path = factories.write_pair(tmp_path, factories.session("remote", image="busybox"),
                                factories.pool("test", factories.agent(**agent)))
    loaded = load_session(path)
    plan = build_plan(loaded.session, loaded.pool)
    target = stacks.session_target(argparse.Namespace(file=str(path)), loaded.pool, plan,
                                   "remote", {}, "m", StackIdentity("a" * 16, ""))
    assert target.parallel == parallel
    for call in ("preview", "up", "destroy", "refresh"):
        args = _parse_extra_args(**kwargs_for(call, parallel=target.parallel))
        if parallel is None:
            assert "--parallel" not in args
        else:
            assert args[args.index("--parallel") + 1] == str(parallel)


@pytest.mark.docker
def test_pool_takes_a_name_everywhere_and_the_stack_keeps_the_file_it_names(
        real_engine, tmp_path, capfd):
    """Issue 41, item 3: `up FILE --pool NAME` (the README's lab command) looks the name up as
    `pool:` does, like `plan` and `status`; the stack keeps the pool's file, not
    `<checkout>/NAME`."""
    from cluster_sessions.lab.image import ensure_image

    from .test_runtime import unique

    image = ensure_image(real_engine_client())
    pool_name = unique("named")
    (tmp_path / "pools").mkdir(exist_ok=True)
    pool_file = factories.write(tmp_path / "pools" / f"{pool_name}.yaml",
                                factories.pool(pool_name))
    name = unique("pool-opt")
    path = str(factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, image=image, cpu=0.25, mem="256m")))
    try:
        assert main(["plan", path, "--pool", pool_name]) == 0
        assert main(["up", path, "--pool", pool_name, "--yes"]) == 0, capfd.readouterr().err
        state = real_engine.stacks[name]
        assert Path(state.config["cluster-sessions:pool"]).resolve() == pool_file.resolve()
        assert main(["status", path, "--pool", pool_name]) == 0, capfd.readouterr().err
    finally:
        assert main(["destroy", path, "--pool", pool_name, "--yes"]) == 0


def real_engine_client():
    import docker

    return docker.from_env()


def test_preview_names_each_step_once_and_what_forces_a_replacement():
    """Issue 41, item 11: a replacement's three engine steps are one `replace` line with the
    keys that force it; an update names what it changes; a create names its resource."""
    steps = [
        {"op": "create-replacement", "type": "docker:index/container:Container",
         "name": "s-main1", "diffs": ["upload", "labels"], "replace_keys": ["upload"]},
        {"op": "replace", "type": "docker:index/container:Container", "name": "s-main1",
         "diffs": ["upload", "labels"], "replace_keys": ["upload"]},
        {"op": "delete-replaced", "type": "docker:index/container:Container",
         "name": "s-main1"},
        {"op": "update", "type": "pulumi-python:dynamic/cluster-sessions:ContainerLimits",
         "name": "s-limits-local", "diffs": ["containers"]},
        {"op": "create", "type": "docker:index/network:Network", "name": "s-net"},
    ]
    assert stack_settings.step_lines(steps) == [
        "  replace  Container s-main1  (replaced: upload changed)",
        "  update   ContainerLimits s-limits-local  (containers changed)",
        "  create   Network s-net",
    ]
    assert stack_settings.step_lines([]) == []
