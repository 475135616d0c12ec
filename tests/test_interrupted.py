"""Ctrl-C (SIGINT) during ``up`` and ``run``, in a driver process of its own (the installed
``sessionctl`` through the real engine, on the local engine): both exit 130, as every verb does;
an interrupted ``up`` names what its agents hold and what to run next; ``run`` without a
terminal destroys what it made. The signal comes once the container named has been created,
as a user's Ctrl-C comes while the CLI is applying."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time

import pytest

from cluster_sessions.agents import cleanup
from cluster_sessions.core.loader import load_file
from cluster_sessions.core.names import LABEL_PREFIX

from . import factories
from .conftest import PROJECT, SESSIONCTL, backend_env, signal_when
from .test_runtime import image, unique  # noqa: F401 (a fixture, used by name)

LOCAL_POOL = PROJECT / "stacks" / "pools" / "local.yaml"
SIGNS_OF_A_CRASH = ("Traceback", "Exception in thread", "Error in event stream")


def driver(tmp_path, *argv: str) -> subprocess.Popen:
    """``sessionctl ARGV`` in a process of its own, without a terminal (stdin closed), through
    the real engine on a file backend of the test's own."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return subprocess.Popen([SESSIONCTL, *argv], cwd=PROJECT, env=backend_env(state),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def interrupted(proc: subprocess.Popen, docker_client, container: str) -> tuple[str, str]:
    """SIGINT to the driver once ``container`` exists; its stdout and stderr once it ended."""
    out, err, _running = signal_when(proc, lambda: docker_client.containers.list(
        all=True, filters={"name": f"^{container}$"}, ignore_removed=True), signal.SIGINT)
    return out, err


def labelled(docker_client, name: str) -> list:
    return docker_client.containers.list(
        all=True, filters={"label": f"{LABEL_PREFIX}.session={name}"},
        ignore_removed=True)  # a container the CLI removes while it is listed


@pytest.fixture
def swept(docker_client):
    """Session names a test makes; whatever of them is left is removed afterwards: their
    objects, and the bundles' directories an interrupted up left in the scratch root (what
    ``pool sweep`` would remove; these tests run one at a time, so a new one is theirs)."""
    from cluster_sessions.agents.bundles import stacks_on, sweep_stack
    from cluster_sessions.agents.connectors import LocalConnector

    pool = load_file(LOCAL_POOL, expect="AgentPool")
    conn = LocalConnector("local")
    before = set(stacks_on(conn, pool.scratch))
    names: list[str] = []
    yield names
    for name in names:
        cleanup.sweep(pool, name, wait=10)
    for stack_id in set(stacks_on(conn, pool.scratch)) - before:
        sweep_stack(conn, pool.scratch, stack_id)


@pytest.mark.docker
@pytest.mark.parametrize("json_flag", [(), ("--json", "--pool", "stacks/pools/local.yaml")])
def test_ctrl_c_during_up_names_what_the_agents_hold_and_what_to_run_next(
        docker_client, image, tmp_path, swept, json_flag):  # noqa: F811
    name = unique("intup")
    swept.append(name)
    path = factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, image=image, size=2, cpu=0.25, mem="256m"))
    proc = driver(tmp_path, "up", str(path), "--yes", *json_flag)
    out, err = interrupted(proc, docker_client, f"{name}-main1")
    assert proc.returncode == 130, (out, err)
    assert f"sessionctl up: session {name}: interrupted; its agents hold:" in err, err
    assert re.search(rf"local: container {name}-main1 \((created|running)\)", err), err
    assert f"local: network {name}-net (bridge, local)" in err
    again = f"{path} --pool stacks/pools/local.yaml" if json_flag else str(path)
    assert f"Run `sessionctl up {again}` again" in err  # the same session arguments
    assert f"`sessionctl destroy {again}` to remove it all" in err
    assert err.rstrip().endswith("interrupted")
    if json_flag:  # stdout is one document, saying what was left
        doc = json.loads(out)
        assert (doc["result"], doc["session"]) == ("interrupted", name)
        assert re.search(rf"container {name}-main1 \((created|running)\)", doc["error"])
    # without --json stdout has the CLI's progress, as an up that was not interrupted shows it
    for sign in SIGNS_OF_A_CRASH:
        assert sign not in out + err, (out, err)
    assert {c.name for c in labelled(docker_client, name)} >= {f"{name}-main1"}


@pytest.mark.docker
def test_ctrl_c_while_run_waits_without_a_terminal_destroys_and_exits_130(
        docker_client, image, tmp_path, swept):  # noqa: F811
    name = unique("intrun")
    swept.append(name)
    path = factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, image=image, size=2, cpu=0.25, mem="256m", type="batch",
        command=["sh", "-c", "echo started; sleep 600"]))
    proc = driver(tmp_path, "run", str(path), "--json")
    lines: list[str] = []
    waiting = threading.Event()

    def read_stderr() -> None:  # `up` is over when it says its summary line
        for line in proc.stderr:
            lines.append(line)
            if line.startswith(f"sessionctl up: stack {name}: "):
                waiting.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert waiting.wait(180), "".join(lines)
    time.sleep(1)  # run is waiting for the job now
    proc.send_signal(signal.SIGINT)
    out = proc.stdout.read()
    proc.wait(timeout=300)
    reader.join(30)
    err = "".join(lines)
    assert proc.returncode == 130, (out, err)  # was 6: "lost", though nothing was lost
    doc = json.loads(out)
    assert (doc["exit"], doc["destroyed"]) == (130, True)
    assert "interrupted (Ctrl-C) before the job ended" in err
    assert labelled(docker_client, name) == []


@pytest.mark.docker
def test_after_ctrl_c_in_up_every_verb_tells_the_same_truth_and_destroy_finishes(
        docker_client, image, tmp_path, swept):  # noqa: F811
    """Issue 41, item 7: after an interrupted `up`, `status` and `ls` say the same thing (the
    last up did not finish, with what the stack holds), neither claims the stack holds
    nothing while `destroy` deletes its resources, and one `destroy` removes it all."""
    name = unique("intall")
    swept.append(name)
    path = factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, image=image, size=3, cpu=0.25, mem="256m"))
    proc = driver(tmp_path, "up", str(path), "--yes")
    _out, err = interrupted(proc, docker_client, f"{name}-sub2")
    assert proc.returncode == 130, err
    status = driver(tmp_path, "status", str(path), "--json")
    out, err = status.communicate(timeout=120)
    assert status.returncode == 1, err
    said = json.loads(out)["unfinished"]
    assert said and "the last up did not finish" in said, out
    assert f"stack: {said}" in err
    ls = driver(tmp_path, "ls", "--json")
    out, err = ls.communicate(timeout=120)
    assert ls.returncode == 0, err
    (row,) = [r for r in json.loads(out)["sessions"] if r["name"] == name]
    assert row["phase"] == "error" and said in row["detail"], row
    assert "holds nothing" not in row["detail"]
    gone = driver(tmp_path, "destroy", str(path), "--yes")
    out, err = gone.communicate(timeout=300)
    assert gone.returncode == 0, err
    assert labelled(docker_client, name) == []
    assert not docker_client.networks.list(names=[f"{name}-net"])
    ls = driver(tmp_path, "ls", "--json", "--all")
    out, _ = ls.communicate(timeout=120)
    (row,) = [r for r in json.loads(out)["sessions"] if r["name"] == name]
    assert row["state"] == "empty"
