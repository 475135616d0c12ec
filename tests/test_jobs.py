"""Batch sessions: main1's command is the job; its end is logged with its exit code, which is
the container's; the subs stay up; ``sessionctl wait`` follows it and exits 0, 5 or 6. Real
engine, real entrypoints, containers named and labelled as the Session component makes them."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from cluster_sessions.core.plan import build_plan, container_command, runs_job
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import (  # noqa: F401 (fixtures used by name)
    POOL,
    image,
    session_def,
    session_factory,
    unique,
)


def batch(name: str, script: str, size: int = 2, **over):
    return session_def(unique(name), size, type="batch", command=["sh", "-c", script],
                       resources={"cpu": 0.5, "mem": "512m", "shmem": "64m"}, **over)


def test_only_main1_runs_the_job_and_it_is_never_restarted():
    session = batch("plan", "exit 0", size=3)
    plan = build_plan(session, POOL)
    assert [runs_job(plan, c) for c in plan.containers] == [True, False, False]
    assert container_command(plan, plan.containers[0]) == ("sh", "-c", "exit 0")
    assert container_command(plan, plan.containers[1]) == ("sleep", "infinity")


def run_wait(tmp_path, session, image_tag: str, *extra: str, capsys) -> tuple[int, str, str]:
    """``sessionctl wait`` on a definition file of ``session`` (pool: the local engine)."""
    data = session.model_dump(mode="json", exclude_defaults=False)
    data["image"] = image_tag
    data["pool"] = "local"
    path = tmp_path / f"{session.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    code = cli.main(["wait", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.docker
def test_a_failing_job_ends_main1_with_its_code_and_wait_exits_5(
        session_factory, image, tmp_path, capsys):  # noqa: F811
    session = batch("fail", "echo working on $(hostname); sleep 1; exit 3")
    running = session_factory(session, wait=False)
    code, out, err = run_wait(tmp_path, session, image, "--timeout", "90", "--json",
                              capsys=capsys)
    assert code == 5, err
    assert "main1 | working on main1" in err  # --json: stdout is the one document
    assert "the job on main1 failed with exit code 3" in err
    assert json.loads(out) == {"session": session.name, "exit": 5, "job_exit_code": 3,
                               "result": "the job on main1 failed with exit code 3"}
    main1 = running.containers["main1"]
    main1.reload()
    assert main1.attrs["State"]["ExitCode"] == 3
    assert b"cluster-session[main1]: job exited with code 3" in running.logs("main1")
    sub1 = running.containers["sub1"]
    sub1.reload()
    assert sub1.status == "running"  # the subs stay up until the session is torn down


@pytest.mark.docker
def test_a_succeeding_job_gets_its_exact_environment_and_wait_exits_0(
        session_factory, image, tmp_path, capsys):  # noqa: F811
    session = batch("ok", 'test "$MASTER_ADDR" = main1 && test "$X" = "a b" && echo fine',
                    env={"X": "a b"})
    session_factory(session, wait=False)
    code, out, err = run_wait(tmp_path, session, image, "--timeout", "90", capsys=capsys)
    assert code == 0, err
    assert "main1 | fine" in out
    assert "succeeded (exit code 0)" in err


@pytest.mark.docker
def test_a_timeout_or_a_sub_that_dies_first_exits_6(
        session_factory, image, tmp_path, capsys):  # noqa: F811
    session = batch("slow", "sleep 600")
    running = session_factory(session, wait=False)
    code, _, err = run_wait(tmp_path, session, image, "--timeout", "3", capsys=capsys)
    assert code == 6, err
    assert "did not end within 3 s" in err
    running.containers["sub1"].kill()
    time.sleep(1)
    code, _, err = run_wait(tmp_path, session, image, "--timeout", "60", capsys=capsys)
    assert code == 6, err
    assert "sub1 is exited" in err and "before the job ended" in err


@pytest.mark.docker
def test_docker_stop_reaches_the_job_and_is_logged(session_factory, image):  # noqa: F811
    session = batch("stop", "trap 'echo got TERM; exit 7' TERM; sleep 600 & wait")
    running = session_factory(session, wait=False)
    main1 = running.containers["main1"]
    deadline = time.monotonic() + 60
    while b"ready:" not in running.logs("main1") and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    main1.stop(timeout=20)
    main1.reload()
    logs = running.logs("main1")
    assert main1.attrs["State"]["ExitCode"] == 7, logs
    assert b"got TERM" in logs and b"job exited with code 7" in logs


def test_wait_refuses_an_interactive_session(tmp_path, capsys):
    path = factories.write(tmp_path / "interactive.yaml", factories.session("inter-active"))
    assert cli.main(["wait", str(path)]) == 2
    assert "only a batch session" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["wait", "run"])
def test_json_stdout_is_one_document_even_when_the_verb_stops_first(verb, tmp_path, capsys):
    """An interactive definition (exit 2), a missing file (exit 2): stdout still parses."""
    path = factories.write(tmp_path / "interactive.yaml", factories.session("inter-active"))
    for file in (path, tmp_path / "missing.yaml"):
        assert cli.main([verb, str(file), "--json"]) == 2
        out, err = capsys.readouterr()
        doc = json.loads(out)
        assert (doc["verb"], doc["exit"], doc["result"], doc["file"]) == (
            verb, 2, "failed", str(file))
        assert err  # said on stderr as well, as without --json


def test_a_batch_session_without_a_command_is_refused(tmp_path, capsys):
    path = factories.write(tmp_path / "batch.yaml", factories.session("no-command", type="batch"))
    assert cli.main(["validate", str(path)]) == 2
    assert f"{path}: command: a batch session needs a command" in capsys.readouterr().err
    factories.write(path, factories.session("bad-type", type="batchh"))
    assert cli.main(["validate", str(path)]) == 2
    assert f"{path}: type: " in capsys.readouterr().err


def write_definition(tmp_path, name: str, image_tag: str, script: str, **over) -> str:
    """A batch definition on a pool of this engine that declares room for it beside what the
    module's other sessions hold while it runs (`up` places on live capacity: issue 31)."""
    pool = factories.write(tmp_path / "jobs-pool.yaml", factories.pool(
        "jobs", factories.agent("local", cpu=64, mem="256g")))
    doc = factories.session(name, pool=str(pool), image=image_tag, size=2, cpu=0.5,
                            mem="512m", type="batch", command=["sh", "-c", script])
    return str(factories.write(tmp_path / f"{name}.yaml", {**doc, **over}))


@pytest.mark.docker
@pytest.mark.parametrize(("script", "code", "words"), [
    ("echo training; exit 0", 0, "succeeded (exit code 0)"),
    ("echo training; exit 4", 5, "failed with exit code 4"),
])
def test_run_ups_waits_and_destroys_leaving_nothing(
        real_engine, docker_client, image, tmp_path, capsys,  # noqa: F811
        script, code, words):
    name = unique("run")
    path = write_definition(tmp_path, name, image, script)
    assert cli.main(["run", path, "--timeout", "120", "--json"]) == code
    out, err = capsys.readouterr()
    assert real_engine.calls[:5] == [  # the stack is new: no other definition's
        "list_stacks",
        # the definition, its project, new stack-id and made-by, its placement on live
        # capacity and its image (core.decisions), in one call; the old pool, index and (no
        # lifetime) expires-at removed in another
        f"set_all_config {name}", f"remove_all_config {name}",
        f"export_stack {name}", f"up {name}"]
    assert f"destroy {name}" in real_engine.calls
    assert words in err and "main1 | training" in err  # --json: main1's log on stderr
    summary = json.loads(out)  # stdout is exactly one document
    assert summary["exit"] == code and summary["destroyed"] is True
    assert [r["host"] for r in summary["containers"]] == ["main1", "sub1"]
    assert summary["containers"][0]["state"] == "exited"
    assert summary["containers"][1]["state"] == "running"  # until destroy
    assert not docker_client.containers.list(all=True, filters={"name": name})
    assert not docker_client.networks.list(names=[f"{name}-net"])


@pytest.mark.docker
def test_run_keep_on_failure_keeps_the_failed_session(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name = unique("keep")
    path = write_definition(tmp_path, name, image, "exit 9")
    assert cli.main(["run", path, "--keep-on-failure", "--timeout", "120"]) == 5
    assert not any(c.startswith("destroy") for c in real_engine.calls)
    assert len(docker_client.containers.list(all=True, filters={"name": name})) == 2
    assert "kept" in capsys.readouterr().err


@pytest.mark.docker
def test_run_of_a_count_runs_every_session_and_exits_with_the_worst_job(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name = unique("cnt")
    path = write_definition(tmp_path, name, image,
                            'echo "job of $BACKENDAI_SESSION_NAME"; '
                            'case "$BACKENDAI_SESSION_NAME" in *-2) exit 3;; esac', count=2)
    assert cli.main(["run", path, "--timeout", "120", "--json"]) == 5
    out, err = capsys.readouterr()
    ups = [c for c in real_engine.calls if c.startswith("up ")]
    assert ups == [f"up {name}-1", f"up {name}-2"]
    stacks = real_engine.stacks
    assert stacks[f"{name}-2"].config["cluster-sessions:index"] == "2"
    assert f"{name}-1/main1 | job of {name}-1" in err  # --json: main1's log on stderr
    assert f"{name}-2/main1 | job of {name}-2" in err
    assert f"{name}-1: the job on main1 succeeded" in err
    assert f"{name}-2: the job on main1 failed with exit code 3" in err
    summary = json.loads(out)  # stdout is exactly one document, `up --json`'s shape
    assert (summary["verb"], summary["count"], summary["exit"]) == ("run", 2, 5)
    assert [(j["session"], j["exit"]) for j in summary["sessions"]] == [
        (f"{name}-1", 0), (f"{name}-2", 5)]
    assert [[(r["session"], r["host"]) for r in j["containers"]]
            for j in summary["sessions"]] == [
        [(f"{name}-1", "main1"), (f"{name}-1", "sub1")],
        [(f"{name}-2", "main1"), (f"{name}-2", "sub1")]]
    assert all(j["destroyed"] is True for j in summary["sessions"])
    assert not docker_client.containers.list(all=True, filters={"name": name})


@pytest.mark.docker
def test_one_session_of_a_count_is_acted_on_with_index(
        real_engine, docker_client, image, tmp_path, capsys):  # noqa: F811
    name = unique("idx")
    path = write_definition(tmp_path, name, image, "sleep 600", count=3,
                            resources={"cpu": 0.25, "mem": "256m", "shmem": "64m"})
    assert cli.main(["up", path, "--yes", "--index", "2"]) == 0
    assert sorted(c.name for c in docker_client.containers.list(
        all=True, filters={"name": name})) == [f"{name}-2-main1", f"{name}-2-sub1"]
    assert cli.main(["status", path, "--index", "2"]) == 0
    assert cli.main(["status", path]) == 1  # the other two were never up: missing
    err = capsys.readouterr().err
    assert f"status: {name}-1: main1: no container" in err
    assert f"status: {name}-2:" not in err and f"status: {name}-3: sub1: no container" in err
    assert cli.main(["destroy", path, "--yes"]) == 0  # all three; two had no stack
    assert "no stack" in capsys.readouterr().err
    assert not docker_client.containers.list(all=True, filters={"name": name})


@pytest.mark.docker
def test_run_whose_reader_goes_away_destroys_the_session_and_exits_141_quietly(
        real_engine, docker_client, image, tmp_path):  # noqa: F811
    """``sessionctl run FILE | head -1`` (issue 34): the job's first line is read, the pipe
    closed; ``run`` stops waiting, tears the session down as after a timeout, and exits as a
    program SIGPIPE ended, without a traceback."""
    import os
    import subprocess

    name = unique("runpipe")
    path = write_definition(tmp_path, name, image, "echo started; exec sleep 600")
    proc = subprocess.Popen(
        [*real_engine.sessionctl, "run", path],
        env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        proc.stdout.close()
        code = proc.wait(timeout=120)
        err = proc.stderr.read().decode()
        assert line.startswith(b"main1 | ")  # sshd's first line, or the job's
        assert code == 141, err
        assert "Traceback" not in err and "Exception in thread" not in err
        assert not docker_client.containers.list(all=True, filters={"name": name})
        assert not docker_client.networks.list(names=[f"{name}-net"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for c in docker_client.containers.list(all=True, filters={"name": name}):
            c.remove(force=True)
        for n in docker_client.networks.list(names=[f"{name}-net"]):
            n.remove()
