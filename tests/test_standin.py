"""The stand-in for the pulumi CLI behaves like Pulumi (issue 34, items 10 and 11): stacks are
the DIY backend's files, read by every later ``sessionctl`` process, and dynamic resources go
through ``check``/``create``/``diff``/``update``/``delete`` as the engine drives them.

Cross-process tests start ``python -m tests.standin.sessionctl`` for each verb,
on one file backend. The dynamic-provider tests run a program of their own under the mock
engine with a provider that records every call it gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pulumi
import pytest
import yaml
from pulumi import automation as auto
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult
from pulumi.runtime import rpc

from cluster_sessions.agents import facts, gathering
from cluster_sessions.agents.connectors import connector_for
from tests.standin import provider as docker_provider
from tests.standin.automation import Backend
from tests.standin.engine import Engine, run_program
from tests.standin.sessionctl import CONFIG_DIR_ENV

from . import factories
from .conftest import PROJECT
from .lab_support import lab_pool
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

PREFIX, SUBNET = "cssd", "10.251.113.0/24"


def sessionctl(backend: Path, *argv: str, env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """One ``sessionctl`` process with the stand-in, on the file backend ``backend``."""
    environ = {**os.environ, "PULUMI_BACKEND_URL": f"file://{backend}",
               "PULUMI_CONFIG_PASSPHRASE": "test", CONFIG_DIR_ENV: str(backend / "config"),
               **(env or {})}
    return subprocess.run([sys.executable, "-m", "tests.standin.sessionctl",
                           *argv], cwd=PROJECT, env=environ, capture_output=True, text=True,
                          timeout=timeout, check=False)


# --- item 10: the backend is its files ----------------------------------------------------------


@pytest.mark.parametrize("directory", [True, False])
def test_a_stack_the_backend_does_not_hold_is_the_sdks_stack_not_found_error(tmp_path,
                                                                             directory):
    backend = Backend(tmp_path / "state", tmp_path / "config") if directory else Backend()
    backend.open_workspace(PROJECT, None, None)
    with pytest.raises(auto.errors.StackNotFoundError, match="no stack named 'gone' found"):
        backend.stack_outputs("gone")
    with pytest.raises(auto.errors.StackNotFoundError):
        backend.get_all_config("gone")
    with pytest.raises(auto.errors.StackNotFoundError):
        backend.open_stack("gone", PROJECT, None, None, create=False)
    assert backend.list_stacks() == []


def test_a_checkpoint_is_where_and_what_the_diy_backend_writes(tmp_path):
    """``.pulumi/stacks/<project>/<stack>.json``, a version-3 checkpoint; the config in
    ``Pulumi.<stack>.yaml``; a second Backend (another process) lists and reads it."""
    state, config = tmp_path / "state", tmp_path / "config"
    first = Backend(state, config)
    stack = first.open_stack("made-here", PROJECT, None, None)
    stack.set_config("cluster-sessions:definition", auto.ConfigValue("sessions/x.yaml"))
    path = state / ".pulumi" / "stacks" / "cluster-sessions" / "made-here.json"
    doc = json.loads(path.read_text())
    assert doc["version"] == 3
    assert doc["checkpoint"]["stack"] == "organization/cluster-sessions/made-here"
    assert (state / ".pulumi" / "meta.yaml").read_text() == "version: 1\n"
    assert "sessions/x.yaml" in (config / "Pulumi.made-here.yaml").read_text()

    second = Backend(state, config)
    second.open_workspace(PROJECT, None, None)
    assert [s.name for s in second.list_stacks()] == ["made-here"]
    assert second.get_all_config("made-here")["cluster-sessions:definition"].value == \
        "sessions/x.yaml"
    assert second.stack_outputs("made-here") == {}


def test_without_a_config_dir_the_config_is_the_projects_stack_file(tmp_path, monkeypatch):
    """As the CLI keeps it: ``<project>/<stackConfigDir>/Pulumi.<stack>.yaml`` (the suite
    names a directory of its own in $CLUSTER_SESSIONS_EMULATION_CONFIG_DIR: not here)."""
    monkeypatch.delenv(CONFIG_DIR_ENV)
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    (project / "Pulumi.yaml").write_text((PROJECT / "Pulumi.yaml").read_text())
    backend = Backend(tmp_path / "state")
    stack = backend.open_stack("cfg", project, None, None)
    stack.set_config("cluster-sessions:index", auto.ConfigValue("2"))
    assert (project / "stacks" / "Pulumi.cfg.yaml").exists()
    stack.remove_config("cluster-sessions:index")
    assert backend.get_all_config("cfg") == {}


def test_access_verbs_of_a_stack_no_process_made_say_so_without_a_traceback(tmp_path):
    """A second process's ``ssh-config`` of a session never brought up: the SDK's
    StackNotFoundError, said in one line (exit 1), not a KeyError."""
    path = factories.write(tmp_path / "never-up.yaml", factories.session("never-up"))
    (tmp_path / "state").mkdir()
    done = sessionctl(tmp_path / "state", "ssh-config", str(path))
    assert done.returncode == 1, done.stderr
    assert "no stack named 'never-up' found" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "KeyError" not in done.stderr


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me",
                    "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    return home


@pytest.mark.docker
def test_a_session_one_process_brought_up_is_listed_and_reached_by_the_next(
        docker_client, image, home, tmp_path):  # noqa: F811
    """``up`` in one process; ``ls``, ``ssh-config`` and ``key`` in others see it; ``destroy``
    in another removes it."""
    name = unique("xproc")
    path = str(factories.write(tmp_path / f"{name}.yaml",
                               factories.session(name, image=image, size=2, cpu=0.5,
                                                 mem="256m")))
    state = tmp_path / "state"
    state.mkdir()
    env = {"HOME": str(home)}
    try:
        up = sessionctl(state, "up", path, "--yes", env=env)
        assert up.returncode == 0, up.stderr
        listed = sessionctl(state, "ls", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)["sessions"]
        assert [r["name"] for r in rows] == [name], rows
        config = sessionctl(state, "ssh-config", path, env=env)
        assert config.returncode == 0, config.stderr
        assert f"Host {name}" in config.stdout or name in config.stdout, config.stdout
        key = sessionctl(state, "key", path, "--out", str(tmp_path / "k"), env=env)
        assert key.returncode == 0, key.stderr
        assert (tmp_path / "k").read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    finally:
        down = sessionctl(state, "destroy", path, "--yes", env=env)
    assert down.returncode == 0, down.stderr
    assert not docker_client.containers.list(all=True, filters={"name": name})
    assert not docker_client.networks.list(names=[f"{name}-net"])


# --- item 11: dynamic resources as the engine drives them ---------------------------------------

CALLS: list[str] = []


class Recorder(ResourceProvider):
    """Says what it is asked; ``diff`` answers what the inputs ``diff_*`` say."""

    def check(self, olds, news):
        CALLS.append(f"check {news['tag']} olds={sorted(k for k in olds if k != '__provider')}")
        return super().check(olds, news)

    def create(self, props):
        CALLS.append(f"create {props['tag']} v={int(props['v'])}")  # numbers arrive as floats
        return CreateResult(f"{props['tag']}-{int(props['v'])}", {"tag": props["tag"],
                                                             "v": props["v"], "made": True})

    def diff(self, id_, olds, news):
        CALLS.append(f"diff {id_} olds.made={olds.get('made')}")
        if news.get("src") == rpc.UNKNOWN:  # what it was made from is being replaced
            return DiffResult(changes=True, replaces=["src"] if news.get("follow") else [])
        if news.get("diff_unknown"):
            return DiffResult()
        changed = olds["v"] != news["v"]
        return DiffResult(changes=changed,
                          replaces=["v"] if changed and news.get("replace") else [],
                          delete_before_replace=news.get("dbr"))

    def update(self, id_, olds, news):
        CALLS.append(f"update {id_} v={int(news['v'])}")
        return UpdateResult({"tag": news["tag"], "v": news["v"], "updated": True})

    def delete(self, id_, props):
        CALLS.append(f"delete {id_} made={props.get('made')}")


class Recorded(pulumi.dynamic.Resource):
    made: pulumi.Output[bool]

    def __init__(self, tag: str, opts: pulumi.ResourceOptions | None = None, **inputs):
        super().__init__(Recorder(), tag, {"tag": tag, "made": None, **inputs}, opts)


def program(spec: dict[str, dict]):
    """``a`` and, when ``spec`` has it, ``b`` depending on ``a``."""
    def run() -> None:
        a = Recorded("a", pulumi.ResourceOptions(
            delete_before_replace=spec["a"].pop("option_dbr", None)), **spec["a"])
        if "b" in spec:
            b = dict(spec["b"])
            if b.pop("from_a", False):
                b["src"] = a.made
            Recorded("b", pulumi.ResourceOptions(depends_on=[a]), **b)
    return run


def up(engine: Engine, spec: dict[str, dict]) -> list[str]:
    """One ``pulumi up`` of the program: its steps, then the deletes the engine makes after
    them; the provider calls made, in order."""
    CALLS.clear()
    run_program(engine, "recorded", {}, program=program({k: dict(v) for k, v in spec.items()}))
    assert not engine.delete_resources(engine.unregistered())
    return list(CALLS)


def test_a_resource_is_checked_against_its_old_inputs_and_keeps_only_what_create_returned():
    engine = Engine()
    assert up(engine, {"a": {"v": 1, "extra": "x"}}) == ["check a olds=[]", "create a v=1"]
    (urn,) = engine.state
    _id, outs = engine.state[urn]
    assert "extra" not in outs and outs["made"] is True and "__provider" in outs
    calls = up(engine, {"a": {"v": 1, "extra": "x"}})
    assert calls[0] == "check a olds=['extra', 'tag', 'v']", calls  # inputs: 'extra' is one
    assert calls[1:] == ["diff a-1 olds.made=True"]


def test_a_change_without_replaces_updates_in_place_and_the_outputs_are_updates():
    engine = Engine()
    up(engine, {"a": {"v": 1}})
    assert up(engine, {"a": {"v": 2}})[-1] == "update a-1 v=2"
    (_id, outs), = engine.state.values()
    assert outs.get("updated") is True and "made" not in outs, outs


def test_a_replacement_creates_first_and_deletes_the_old_one_after_the_run():
    engine = Engine()
    up(engine, {"a": {"v": 1, "replace": True}, "b": {"v": 1}})
    calls = up(engine, {"a": {"v": 2, "replace": True}, "b": {"v": 1}})
    assert calls.index("create a v=2") < calls.index("diff b-1 olds.made=True") \
        < calls.index("delete a-1 made=True"), calls
    assert [i for i, _ in engine.state.values()][:1] == ["a-2"]


@pytest.mark.parametrize(("diff_says", "option", "first"), [
    (True, None, True), (None, None, False), (True, False, False), (None, True, True)])
def test_delete_before_replace_is_the_diffs_unless_the_resource_option_says(
        diff_says, option, first):
    engine = Engine()
    spec = {"v": 1, "replace": True, "dbr": diff_says, "option_dbr": option}
    up(engine, {"a": spec})
    calls = up(engine, {"a": {**spec, "v": 2}})
    deleted, created = calls.index("delete a-1 made=True"), calls.index("create a v=2")
    assert (deleted < created) == first, calls


@pytest.mark.parametrize("follow", [True, False])
def test_a_delete_first_replacement_deletes_first_the_dependents_it_would_replace(follow):
    """``b`` takes an input from ``a``: asked with it unknown, its diff says replace (or
    not); replaced, ``b`` is deleted before ``a`` and created again after it."""
    engine = Engine()
    a = {"v": 1, "replace": True, "dbr": True}
    b = {"v": 1, "from_a": True, "follow": follow}
    up(engine, {"a": a, "b": b})
    calls = up(engine, {"a": {**a, "v": 2}, "b": b})
    if follow:
        assert calls.index("delete b-1 made=True") < calls.index("delete a-1 made=True") \
            < calls.index("create a v=2") < calls.index("create b v=1"), calls
    else:
        assert "delete b-1 made=True" not in calls and "create b v=1" not in calls, calls


def test_an_unknown_diff_is_decided_by_comparing_the_inputs():
    engine = Engine()
    up(engine, {"a": {"v": 1, "diff_unknown": True}})
    assert "update a-1 v=1" not in up(engine, {"a": {"v": 1, "diff_unknown": True}})
    assert up(engine, {"a": {"v": 1, "diff_unknown": True, "more": 1}})[-1] == \
        "update a-1 v=1"


def test_what_the_program_no_longer_declares_is_deleted_through_its_provider():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    assert up(engine, {"a": {"v": 1}})[-1] == "delete b-1 made=True"
    assert [u.rsplit("::", 1)[-1] for u in engine.state] == ["a"]


def test_destroy_deletes_each_dynamic_resource_dependents_first():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    CALLS.clear()
    assert engine.delete_resources(list(engine.state)) == {}
    assert CALLS == ["delete b-1 made=True", "delete a-1 made=True"]
    assert engine.state == {}


def test_a_failed_delete_keeps_it_and_what_it_depends_on():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    b = next(u for u in engine.state if u.endswith("::b"))
    _id, outs = engine.state[b]
    engine.state[b] = (_id, {**outs, "__provider": "not a pickle"})
    failed = engine.delete_resources(list(engine.state), go_on=True)
    assert list(failed) == [b]
    assert b in engine.state and any(u.endswith("::a") for u in engine.state)


def test_a_preview_never_creates_updates_or_deletes():
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1}})
    scratch = Engine(state=dict(engine.state), old_inputs=dict(engine.old_inputs),
                     known=dict(engine.known), dry_run=True)
    CALLS.clear()
    run_program(scratch, "recorded", {}, program=program({"a": {"v": 2, "replace": True}}))
    assert not [c for c in CALLS if c.split()[0] in ("create", "update", "delete")], CALLS
    assert scratch.actions[next(u for u in scratch.state if u.endswith("::a"))][0] == \
        docker_provider.REPLACE


def test_a_previews_update_leaves_unknown_what_the_inputs_do_not_give():
    """A provider without provider previews hands back its new inputs as the state of a
    previewed update: ``a.made`` (an output the inputs leave unset) is unknown to what reads
    it, not the value the last ``up`` gave (the stand-in kept the old outputs)."""
    engine = Engine()
    up(engine, {"a": {"v": 1}, "b": {"v": 1, "from_a": True}})
    scratch = Engine(state=dict(engine.state), old_inputs=dict(engine.old_inputs),
                     known=dict(engine.known), dry_run=True)
    run_program(scratch, "recorded", {}, program=program({"a": {"v": 2},
                                                          "b": {"v": 1, "from_a": True}}))
    a = next(u for u in scratch.state if u.endswith("::a"))
    b = next(u for u in scratch.state if u.endswith("::b"))
    assert scratch.actions[a][0] == docker_provider.UPDATE
    assert isinstance(scratch.old_inputs[b]["src"], pulumi.output.Unknown), \
        scratch.old_inputs[b]


# --- item 11 on the lab: pool up, pool destroy, the swarm is gone -------------------------------


def swarm_roles(pool) -> dict[str, str]:
    roles = {}
    for agent in pool.agents:
        with connector_for(agent) as conn:
            roles[agent.name] = gathering.gather(conn, facts.SwarmInfo()).role
    return roles


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 3, name="sdlab",
                  capacity={"cpu": 1, "mem": "1g", "gpus": []}) as built:
        yield built


@pytest.fixture
def pool_backend(lab, tmp_path):
    """A file backend for the pool stack; whatever a failure left, no swarm after the test."""
    state = tmp_path / "state"
    state.mkdir()
    original = lab.pool_file.read_text()
    try:
        yield state
    finally:
        lab.pool_file.write_text(original)
        for agent in lab.pool.agents:
            with connector_for(agent) as conn:
                conn.run("docker swarm leave --force", timeout=60)


ALL_LEFT = {"agent1": "inactive", "agent2": "inactive", "agent3": "inactive"}


@pytest.mark.lab
@pytest.mark.docker
def test_pool_destroy_in_another_process_leaves_the_swarm(lab, pool_backend):
    """``pool up`` in one process forms the swarm; ``pool destroy`` in the next calls each
    dynamic resource's delete (workers first), so every agent has left it."""
    started = time.monotonic()
    made = sessionctl(pool_backend, "pool", "up", str(lab.pool_file), "--yes")
    assert made.returncode == 0, made.stderr
    up_s = time.monotonic() - started
    assert swarm_roles(lab.pool) == {"agent1": "manager", "agent2": "worker",
                                     "agent3": "worker"}
    started = time.monotonic()
    gone = sessionctl(pool_backend, "pool", "destroy", str(lab.pool_file), "--yes")
    down_s = time.monotonic() - started
    assert gone.returncode == 0, gone.stderr
    assert swarm_roles(lab.pool) == ALL_LEFT
    print(f"pool up {up_s:.1f} s, pool destroy {down_s:.1f} s")


@pytest.mark.lab
@pytest.mark.docker
def test_an_agent_dropped_from_the_pool_leaves_the_swarm_at_the_next_pool_up(lab, pool_backend):
    """The program no longer declares agent3's worker: the next ``pool up`` (another process)
    deletes it through its provider (leave, node rm on the manager) and keeps the others."""
    assert sessionctl(pool_backend, "pool", "up", str(lab.pool_file), "--yes").returncode == 0
    whole = lab.pool
    doc = yaml.safe_load(lab.pool_file.read_text())
    doc["agents"] = [a for a in doc["agents"] if a["name"] != "agent3"]
    lab.pool_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    smaller = sessionctl(pool_backend, "pool", "up", str(lab.pool_file), "--yes")
    assert smaller.returncode == 0, smaller.stderr
    assert "1 delete" in smaller.stderr, smaller.stderr
    pool = lab.pool
    with connector_for(pool.agent("agent1")) as conn:
        nodes = list(gathering.gather(conn, facts.SwarmNodes()))
    assert len(nodes) == 2, nodes
    roles = swarm_roles(whole)
    assert roles == {"agent1": "manager", "agent2": "worker", "agent3": "inactive"}, roles
    gone = sessionctl(pool_backend, "pool", "destroy", str(lab.pool_file), "--yes")
    assert gone.returncode == 0, gone.stderr
    assert swarm_roles(pool) == {"agent1": "inactive", "agent2": "inactive"}
