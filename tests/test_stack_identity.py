"""A session name on a pool belongs to one stack (issue 31, item 7).

Every stack has an identity kept in its config (``stack-id``, ``made-by``: core/decisions.py),
on every label of what it makes; ``up``'s and ``destroy``'s sweeps, ``pool sweep --stack-id``
and the verbs that look touch only objects carrying it, and an ``up``/``preview`` of a name
another stack holds on the pool is refused (exit 2) naming the holder, before anything is
swept or created.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster_sessions.agents.cleanup import Leftover
from cluster_sessions.agents.engine import Owner
from cluster_sessions.core.decisions import (
    KEPT_OUTPUT,
    StackIdentity,
    derived_stack_id,
    stack_identity,
    valid_stack_id,
)
from cluster_sessions.core.errors import Exit
from cluster_sessions.core.names import (
    MADE_BY_KEY,
    MADE_BY_LABEL,
    SESSION_LABEL,
    STACK_ID_KEY,
    STACK_ID_LABEL,
    STACK_LABEL,
    config_key,
)
from cluster_sessions.driver import cli
from cluster_sessions.driver import stack_identity as identity_mod
from cluster_sessions.driver.errors import CommandError
from cluster_sessions.pulumi_layer.program import InvalidDefinition
from tests.standin.engine import STACKS, Engine, run_program

from . import factories
from .test_interrupted import swept  # noqa: F401 (a fixture, used by name)
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

CONTAINER = "docker:index/container:Container"
NETWORK = "pulumi-python:dynamic/cluster-sessions:SessionNetwork"

# --- the decision (pure) -----------------------------------------------------------------------


def test_a_new_stack_gets_a_random_id_and_who_made_it():
    first = stack_identity("train", None, "ops@ci-7")
    second = stack_identity("train", None, "ops@ci-7")
    assert valid_stack_id(first.stack_id) and first.stack_id != second.stack_id
    assert first.new and not first.adopted and first.made_by == "ops@ci-7"
    assert first.config() == {STACK_ID_KEY: first.stack_id, MADE_BY_KEY: "ops@ci-7"}


def test_an_existing_stack_keeps_the_id_and_maker_its_config_holds():
    kept = stack_identity("train", {STACK_ID_KEY: "0123456789abcdef", MADE_BY_KEY: "a@b"},
                          "someone@else")
    assert (kept.stack_id, kept.made_by, kept.new, kept.adopted) == (
        "0123456789abcdef", "a@b", False, False)
    assert kept.config() == {STACK_ID_KEY: "0123456789abcdef", MADE_BY_KEY: "a@b"}


def test_a_stack_that_kept_no_id_runs_with_the_one_its_name_derives_and_writes_nothing():
    """A bare ``pulumi up`` stack, or one made before stack ids: the program derives the same
    id, so ``sessionctl`` adopts it without writing (no label changes), and the objects it made
    before ids (no label) stay its own."""
    adopted = stack_identity("org/proj/train", {"definition": "x.yaml"}, "me@here")
    assert adopted.stack_id == derived_stack_id("train") == derived_stack_id("train")
    assert valid_stack_id(adopted.stack_id) and derived_stack_id("other") != adopted.stack_id
    assert adopted.adopted and adopted.made_by == "" and adopted.config() == {}
    assert adopted.owns("") and adopted.owns(adopted.stack_id)


def test_only_a_stack_that_kept_no_id_takes_objects_without_one_for_its_own():
    kept = StackIdentity("0123456789abcdef")
    assert kept.owns("0123456789abcdef")
    assert not kept.owns("") and not kept.owns("fedcba9876543210")


@pytest.mark.parametrize("recorded", [
    {STACK_ID_KEY: "../../etc"}, {STACK_ID_KEY: "0123456789ABCDEF"},
    {STACK_ID_KEY: "0123456789abcdef0"}, {STACK_ID_KEY: "x", MADE_BY_KEY: "ok@host"},
    {STACK_ID_KEY: "0123456789abcdef", MADE_BY_KEY: "a b\x1b[2J"},
])
def test_a_kept_value_we_did_not_write_is_invalid_input_naming_the_stack_and_key(recorded):
    with pytest.raises(ValueError):
        stack_identity("train", recorded)
    full = {config_key(k): v for k, v in recorded.items()}
    with pytest.raises(CommandError) as raised:
        identity_mod.identities({"train": "train"}, {"train": full}, "me@here")
    assert raised.value.code == Exit.INVALID
    text = str(raised.value)
    assert "stack train" in text and "cluster-sessions:" in text and "\x1b" not in text


def test_who_made_a_stack_is_reduced_to_what_a_label_may_hold(monkeypatch):
    monkeypatch.setattr(identity_mod.getpass, "getuser", lambda: "we ird\nuser")
    monkeypatch.setattr(identity_mod.socket, "gethostname", lambda: "h" * 300)
    made = identity_mod.made_by_here()
    assert made.startswith("we_ird_user@h") and len(made) == 128
    assert stack_identity("s", None, made).made_by == made


def leftover(kind: str, name: str, owner: Owner) -> Leftover:
    return Leftover("agent1", kind, name, f"id-{name}", "running", owner)


def test_the_refusal_names_each_holder_by_its_labels_and_shows_them_escaped():
    hostile = Owner("fedcba9876543210", "other\x1b[31m", "eve@box\r\nFAKE: ok")
    held = [leftover("container", "s-main1", hostile), leftover("network", "s-net", hostile),
            leftover("container", "s-sub1", Owner())]
    text = identity_mod.holder_refusal(Path("s.yaml"), "s", "local", held)
    assert text.startswith("s.yaml: name: session s is held on pool local by another stack")
    assert "nothing was created or removed" in text
    assert "stack id fedcba9876543210" in text and "container s-main1 on agent1" in text
    assert "network s-net on agent1" in text
    assert "a stack made before stack ids" in text and "container s-sub1" in text
    assert "\x1b" not in text and "\r" not in text and "\nFAKE" not in text
    assert "--stack-id fedcba9876543210" in text


def test_refuse_held_names_is_invalid_input_and_takes_no_offence_at_its_own_objects():
    mine = StackIdentity("0123456789abcdef")
    own = [leftover("container", "s-main1", Owner("0123456789abcdef", "s", "me@here"))]
    plan = SimpleNamespace(name="s")  # all the check reads of a plan
    pool = local_pool()
    identity_mod.refuse_held_names(Path("s.yaml"), pool, [(plan, mine)],
                                   find=lambda pool, name: (own, []))
    theirs = [*own, leftover("network", "s-net", Owner("fedcba9876543210", "s", "you@there"))]
    with pytest.raises(CommandError) as raised:
        identity_mod.refuse_held_names(Path("s.yaml"), pool, [(plan, mine)],
                                       find=lambda pool, name: (theirs, []))
    assert raised.value.code == Exit.INVALID
    assert "you@there" in str(raised.value) and "s-main1" not in str(raised.value)


def local_pool():
    from cluster_sessions.core.loader import load_file

    return load_file(STACKS / "pools" / "local.yaml")


# --- the program ---------------------------------------------------------------------------------


def labels_of(engine: Engine, kind: str) -> list[dict[str, str]]:
    return [r.inputs["labels"] if isinstance(r.inputs["labels"], dict)  # the network's
            else {x["label"]: x["value"] for x in r.inputs["labels"]}
            for r in engine.registrations if r.type == kind]


def test_the_program_puts_the_kept_identity_on_every_label():
    engine = Engine()
    outputs = run_program(engine, "solo-demo", {
        config_key("definition"): "sessions/solo.yaml",
        config_key(STACK_ID_KEY): "0123456789abcdef", config_key(MADE_BY_KEY): "ops@ci-7"})
    found = labels_of(engine, CONTAINER) + labels_of(engine, NETWORK)
    assert len(found) >= 2
    for labels in found:
        assert (labels[STACK_ID_LABEL], labels[STACK_LABEL], labels[MADE_BY_LABEL]) == (
            "0123456789abcdef", "solo-demo", "ops@ci-7"), labels
    assert outputs["session"][0]["stack_id"] == "0123456789abcdef"


@pytest.mark.parametrize(("key", "value"), [(STACK_ID_KEY, "not-an-id"),
                                            (MADE_BY_KEY, "$(reboot)")])
def test_the_program_refuses_a_kept_value_it_did_not_write_before_any_resource(key, value):
    engine = Engine()
    with pytest.raises(InvalidDefinition, match=f"cluster-sessions:{key}"):
        run_program(engine, "solo-demo", {config_key("definition"): "sessions/solo.yaml",
                                          config_key(key): value})
    assert not labels_of(engine, CONTAINER) and not labels_of(engine, NETWORK)


@pytest.mark.parametrize("value", ["0123", "ABCDEF0123456789", "all", ""])
def test_pool_sweep_takes_a_stack_id_or_none_and_nothing_else(value, capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["pool", "sweep", "local", "--session", "abcd", "--stack-id", value])
    assert raised.value.code == Exit.INVALID
    assert "--stack-id" in capsys.readouterr().err


# --- on the engine -------------------------------------------------------------------------------


def snapshot(client, name: str) -> tuple[list, list]:
    """What the engine holds of session ``name``: every container and network with its id,
    creation and start time, and stack-id label."""
    flt = {"label": f"{SESSION_LABEL}={name}"}
    containers = sorted((c.name, c.id, c.attrs["Created"], c.attrs["State"]["StartedAt"],
                         c.labels.get(STACK_ID_LABEL))
                        for c in client.containers.list(all=True, filters=flt))
    networks = sorted((n.name, n.id, n.attrs["Created"], n.attrs["Labels"].get(STACK_ID_LABEL))
                      for n in client.networks.list(filters=flt, greedy=True))
    return containers, networks


def definition(tmp_path: Path, image_tag: str) -> tuple[str, str]:
    name = unique("own")
    doc = factories.session(name, image=image_tag, size=2, cpu=0.25, mem="256m")
    return name, str(factories.write(tmp_path / f"{name}.yaml", doc))


def first_up(real_engine, docker_client, tmp_path, image_tag, capsys):  # noqa: F811
    name, path = definition(tmp_path, image_tag)
    assert cli.main(["up", path, "--yes"]) == Exit.OK, capsys.readouterr().err
    capsys.readouterr()
    config = real_engine.stacks[name].config
    kept = config[config_key(STACK_ID_KEY)]
    before = snapshot(docker_client, name)
    containers, networks = before
    assert len(containers) == 2 and len(networks) == 1
    assert {c[4] for c in containers} == {n[3] for n in networks} == {kept}
    return name, path, kept, config[config_key(MADE_BY_KEY)], before


def assert_refused_naming(err: str, name: str, kept: str, made_by: str) -> None:
    assert f"session {name} is held on pool local by another stack" in err, err
    assert f"stack id {kept}" in err and f"stack {name}" in err and f"made by {made_by}" in err
    assert f"container {name}-main1 on local" in err and "nothing was created" in err
    assert "file://" not in err  # no backend path


def first_still_works_and_destroy_leaves_nothing(docker_client, name, path, capsys) -> None:
    assert cli.main(["status", path]) == Exit.OK, capsys.readouterr().err
    assert cli.main(["destroy", path, "--yes"]) == Exit.OK, capsys.readouterr().err
    assert snapshot(docker_client, name) == ([], [])


@pytest.mark.docker
def test_a_second_backend_with_the_same_name_is_refused_and_the_first_is_untouched(
        real_engine, docker_client, image, tmp_path, capsys, monkeypatch):  # noqa: F811
    name, path, kept, made_by, before = first_up(real_engine, docker_client, tmp_path,
                                                 image, capsys)
    from .conftest import STACKS, RealEngine

    stack_file = STACKS / f"Pulumi.{name}.yaml"
    saved = stack_file.read_bytes()
    (tmp_path / "state-2").mkdir()
    other = RealEngine(real_engine.pulumi, tmp_path / "state-2")  # the same CLI, its backend
    monkeypatch.setenv("PULUMI_BACKEND_URL", other.env["PULUMI_BACKEND_URL"])
    try:
        calls = len(real_engine.calls)  # the driver's calls, recorded whatever the backend
        for verb in (["up", path, "--yes"], ["preview", path]):
            assert cli.main(verb) == Exit.INVALID
            assert_refused_naming(capsys.readouterr().err, name, kept, made_by)
        # no stack made, nothing swept or built
        assert real_engine.calls[calls:] == ["list_stacks"] * 2
        assert other.stack_names() == []
        assert snapshot(docker_client, name) == before
        # the verbs that look, from the other backend: nothing there is its stack's
        assert cli.main(["status", path, "--json"]) == Exit.ENGINE
        doc = json.loads(capsys.readouterr().out)
        assert {r["state"] for r in doc["containers"]} == {"missing"}, doc
        assert doc["network"]["state"] == "missing", doc["network"]
        assert cli.main(["logs", path]) == Exit.ENGINE
        assert "none of the containers" in capsys.readouterr().err
        # a stack of that name there, destroyed: its sweep leaves the holder's objects alone
        # (the checkout's stack file is the first backend's: this one's stack shares it)
        other.cli("stack", "init", name)
        assert cli.main(["destroy", path, "--yes"]) == Exit.OK, capsys.readouterr().err
        assert snapshot(docker_client, name) == before
        # the operator's sweep of another stack id leaves them too, and shows whose they are
        assert cli.main(["pool", "sweep", "local", "--session", name, "--dry-run"]) == Exit.OK
        assert f"[stack id {kept}]" in capsys.readouterr().out
        assert cli.main(["pool", "sweep", "local", "--session", name,
                         "--stack-id", "0123456789abcdef"]) == Exit.OK
        assert snapshot(docker_client, name) == before
    finally:
        other.remove_all()  # (which removes the stack file it would leave)
        stack_file.write_bytes(saved)
    monkeypatch.setenv("PULUMI_BACKEND_URL", real_engine.env["PULUMI_BACKEND_URL"])
    first_still_works_and_destroy_leaves_nothing(docker_client, name, path, capsys)


@pytest.mark.docker
def test_up_with_another_stack_name_is_refused_and_the_first_is_untouched(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name, path, kept, made_by, before = first_up(real_engine, docker_client, tmp_path,
                                                 image, capsys)
    assert cli.main(["up", path, "--yes", "--stack", "other"]) == Exit.INVALID
    assert_refused_naming(capsys.readouterr().err, name, kept, made_by)
    assert cli.main(["up", path, "--yes", "--stack", "other", "--json"]) == Exit.INVALID
    doc = json.loads(capsys.readouterr().out)  # CI's one document says why
    assert doc["result"] == "invalid" and f"stack id {kept}" in doc["error"], doc
    assert "other" not in real_engine.stacks  # nothing created, not even the stack
    assert snapshot(docker_client, name) == before
    first_still_works_and_destroy_leaves_nothing(docker_client, name, path, capsys)


@pytest.mark.docker
def test_a_second_up_of_the_same_stack_keeps_its_id_and_changes_nothing(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name, path, kept, made_by, before = first_up(real_engine, docker_client, tmp_path,
                                                 image, capsys)
    assert cli.main(["up", path, "--yes", "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["changes"]) == {"same"}, doc["changes"]
    config = real_engine.stacks[name].config
    assert (config[config_key(STACK_ID_KEY)], config[config_key(MADE_BY_KEY)]) == (kept, made_by)
    assert snapshot(docker_client, name) == before
    first_still_works_and_destroy_leaves_nothing(docker_client, name, path, capsys)


def on_backend(state: Path) -> list[str]:
    """The processes running with ``state`` as their backend (a CLI and its plugins)."""
    url = f"PULUMI_BACKEND_URL=file://{state}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if url in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone meanwhile
            continue
    return found


@pytest.mark.docker
def test_a_killed_first_up_keeps_its_id_and_the_next_up_sweeps_what_it_left(
        real_engine, docker_client, image, tmp_path, capsys, swept):  # noqa: F811
    """The first ``up`` of a new stack (the installed ``sessionctl``, the CLI and its plugins
    under it) is killed once sub1 exists: its objects carry the id it wrote; the next ``up``
    (another process's view of the backend) keeps that id, so they are its own leftovers,
    swept, not another stack's (no refusal)."""
    import signal
    import subprocess
    import time

    from .conftest import PROJECT, SESSIONCTL, backend_env

    name, path = definition(tmp_path, image)
    swept.append(name)
    proc = subprocess.Popen([SESSIONCTL, "up", path, "--yes"], cwd=PROJECT,
                            env=backend_env(real_engine.state), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own group: the CLI dies with it
    deadline = time.monotonic() + 180
    while proc.poll() is None and not docker_client.containers.list(
            all=True, filters={"name": f"^{name}-sub1$"}):
        assert time.monotonic() < deadline, "sub1 was never created"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read()
    proc.stderr.close()
    # the CLI it ran (a process group of its own) cancels and stops its plugins: nothing of
    # the killed run goes on applying, or lingers, under the stack's lock
    while on_backend(real_engine.state):
        assert time.monotonic() < deadline + 120, on_backend(real_engine.state)
        time.sleep(0.2)
    left = snapshot(docker_client, name)
    ids = {c[4] for c in left[0]} | {n[3] for n in left[1]}
    assert len(ids) == 1 and valid_stack_id(next(iter(ids))), left
    killed = docker_client.containers.list(all=True, filters={
        "label": f"cluster-sessions.ledger-session={name}"})
    assert killed, "the killed up left no reservation: the next check proves nothing"
    assert cli.main(["up", path, "--yes"]) == Exit.OK, capsys.readouterr().err
    capsys.readouterr()
    # the killed up's reservation went with the next up of its stack (one up of a stack runs
    # at a time): it holds nothing of the pool until its lease would have run out
    assert docker_client.containers.list(all=True, filters={
        "label": f"cluster-sessions.ledger-session={name}"}) == []
    now = snapshot(docker_client, name)
    assert len(now[0]) == 2 and {c[4] for c in now[0]} == ids
    assert cli.main(["destroy", path, "--yes"]) == Exit.OK, capsys.readouterr().err
    assert snapshot(docker_client, name) == ([], [])


@pytest.mark.docker
def test_the_verbs_and_sweeps_of_a_stack_leave_another_stacks_object_of_its_name_alone(
        real_engine, docker_client, image, tmp_path, capsys, monkeypatch):  # noqa: F811
    """A container labelled with the session's name and another stack's id (made behind our
    back, or in a race the pool lock is to close): ``status`` and ``ls`` do not count it, the
    next ``up`` is refused naming its maker, and even past the refusal ``up``'s and
    ``destroy``'s sweeps leave it."""
    name, path, kept, _made_by, _before = first_up(real_engine, docker_client, tmp_path,
                                                   image, capsys)
    intruder = docker_client.containers.run(
        image, name=f"{name}-intruder", entrypoint=["sleep", "infinity"], detach=True,
        labels={SESSION_LABEL: name, STACK_ID_LABEL: "fedcba9876543210",
                STACK_LABEL: "elsewhere", MADE_BY_LABEL: "eve@box"})
    try:
        assert cli.main(["status", path, "--json"]) == Exit.OK, capsys.readouterr().err
        rows = json.loads(capsys.readouterr().out)["containers"]
        assert sorted(r["host"] for r in rows) == ["main1", "sub1"], rows
        assert cli.main(["ls", "--json"]) == Exit.OK
        doc = json.loads(capsys.readouterr().out)
        assert [s["state"] for s in doc["sessions"]] == ["running"], doc["sessions"]
        held = {a["agent"]: a["allocated"]["containers"] for p in doc["usage"]
                for a in p["agents"]}
        assert held == {"local": 2}, doc["usage"]
        assert cli.main(["up", path, "--yes"]) == Exit.INVALID
        err = capsys.readouterr().err
        assert "stack id fedcba9876543210, stack elsewhere, made by eve@box" in err, err
        monkeypatch.setattr(identity_mod, "refuse_held_names", lambda *args, **kwargs: None)
        assert cli.main(["up", path, "--yes"]) == Exit.OK, capsys.readouterr().err
        assert "intruder" not in capsys.readouterr().err
        assert cli.main(["destroy", path, "--yes"]) == Exit.OK, capsys.readouterr().err
        intruder.reload()
        assert intruder.status == "running"
        assert [c.name for c in docker_client.containers.list(
            all=True, filters={"label": f"{SESSION_LABEL}={name}"})] == [f"{name}-intruder"]
    finally:
        intruder.remove(force=True)


# --- the verbs that look, without an engine ------------------------------------------------------


def two_stacks_containers(tmp_path):
    """A 2-host session whose main1 is stack A's and sub1 stack B's (fake engine objects)."""
    from cluster_sessions.core.plan import with_identity

    from .test_observe import FakeClient, FakeContainer, make_session

    file, plan = make_session(tmp_path, "img", size=2)
    mine = with_identity(plan, "0123456789abcdef", plan.name)
    theirs = with_identity(plan, "fedcba9876543210", "elsewhere")
    return file, plan, FakeClient([FakeContainer(mine, "main1"), FakeContainer(theirs, "sub1")])


def with_outputs(engine, stack: str, outputs: dict, tmp_path: Path) -> None:
    """The stack's root resource given ``outputs``, as its last ``up`` would have left them
    (``pulumi stack export``, the outputs set, ``stack import``)."""
    from cluster_sessions.core.names import PROJECT

    doc = json.loads(engine.cli("stack", "export", "-s", stack))
    doc["deployment"]["resources"] = [{
        "urn": f"urn:pulumi:{stack}::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-{stack}",
        "custom": False, "type": "pulumi:pulumi:Stack", "outputs": outputs}]
    exported = tmp_path / f"{stack}.json"
    exported.write_text(json.dumps(doc))
    engine.cli("stack", "import", "-s", stack, "--file", str(exported))


def test_status_shows_only_its_stacks_containers_when_the_backend_says_which(
        real_cli, tmp_path, capsys, monkeypatch):
    from .test_observe import fake_connect

    file, plan, client = two_stacks_containers(tmp_path)
    real_cli.cli("stack", "init", plan.name)
    real_cli.cli("config", "set", "-s", plan.name, config_key(STACK_ID_KEY), "0123456789abcdef")
    # the backend's word: the decisions its last up kept (a checkout's alone is not believed)
    with_outputs(real_cli, plan.name, {KEPT_OUTPUT: {STACK_ID_KEY: "0123456789abcdef"}},
                 tmp_path)
    fake_connect(monkeypatch, "status", client)
    assert cli.main(["status", str(file), "--json"]) == Exit.ENGINE  # sub1 is missing
    rows = {r["host"]: r["state"] for r in json.loads(capsys.readouterr().out)["containers"]}
    assert rows == {"main1": "running", "sub1": "missing"}
    assert f"stack_outputs {plan.name}" in real_cli.calls, real_cli.calls


def test_status_without_the_cli_shows_every_stacks_containers_and_says_so(
        tmp_path, capsys, monkeypatch):
    from cluster_sessions.driver import stacks

    from .test_observe import fake_connect

    file, plan, client = two_stacks_containers(tmp_path)
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: None)
    fake_connect(monkeypatch, "status", client)
    assert cli.main(["status", str(file), "--json"]) == Exit.OK
    out, err = capsys.readouterr()
    rows = {r["host"]: r["state"] for r in json.loads(out)["containers"]}
    assert rows == {"main1": "running", "sub1": "running"}
    assert f"containers of 2 stacks carry session name {plan.name}" in err
