"""Batch sessions: main1's command is the job; its end is logged with its exit code, which is
the container's; the subs stay up; ``sessionctl wait`` follows it and exits 0, 5 or 6. Real
engine, real entrypoints, containers named and labelled as the Session component makes them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from cluster_sessions.driver import cli
from cluster_sessions.plan import build_plan, container_command, runs_job

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
    assert "main1 | working on main1" in out
    assert "the job on main1 failed with exit code 3" in err
    assert '"job_exit_code": 3' in out
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
    path = tmp_path / "interactive.yaml"
    path.write_text(yaml.safe_dump({"kind": "ClusterSession", "name": "inter-active",
                                    "pool": "local", "image": "img"}))
    assert cli.main(["wait", str(path)]) == 2
    assert "only a batch session" in capsys.readouterr().err


def test_a_batch_session_without_a_command_is_refused(tmp_path, capsys):
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump({"kind": "ClusterSession", "name": "no-command",
                                    "pool": "local", "image": "img", "type": "batch"}))
    assert cli.main(["validate", str(path)]) == 2
    assert f"{path}: command: a batch session needs a command" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"kind": "ClusterSession", "name": "bad-type",
                                    "pool": "local", "image": "img", "type": "batchh"}))
    assert cli.main(["validate", str(path)]) == 2
    assert f"{path}: type: " in capsys.readouterr().err


class EmulatedEngine:
    """The engine verbs `run` calls, done by the program under the engine-backed mocks: `up`
    runs the real __main__.py and builds what it declares on the real engine, `destroy`
    removes it (the Automation API itself needs the pulumi CLI, absent here)."""

    def __init__(self, client):
        from cluster_sessions.emulation.docker_builder import DockerBuilder
        from cluster_sessions.emulation.engine import Engine

        self.builder = DockerBuilder(client)
        self.engine = Engine(on_create=self.builder)
        self.calls: list[str] = []

    def __call__(self, args) -> int:
        from cluster_sessions.emulation.engine import run_program

        self.calls.append(args.verb)
        assert args.yes is True
        if args.verb == "up":
            name = yaml.safe_load(Path(args.file).read_text())["name"]
            run_program(self.engine, name, {"cluster-sessions:definition": args.file})
        elif args.verb == "destroy":
            self.builder.remove_all()
        return 0


def write_definition(tmp_path, name: str, image_tag: str, script: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "kind": "ClusterSession", "name": name, "pool": "local", "image": image_tag,
        "type": "batch", "command": ["sh", "-c", script], "cluster": {"size": 2},
        "resources": {"cpu": 0.5, "mem": "512m", "shmem": "64m"}}))
    return str(path)


@pytest.mark.docker
@pytest.mark.parametrize(("script", "code", "words"), [
    ("echo training; exit 0", 0, "succeeded (exit code 0)"),
    ("echo training; exit 4", 5, "failed with exit code 4"),
])
def test_run_ups_waits_and_destroys_leaving_nothing(
        docker_client, image, tmp_path, capsys, script, code, words):  # noqa: F811
    from cluster_sessions.driver import jobs

    name = unique("run")
    path = write_definition(tmp_path, name, image, script)
    fake = EmulatedEngine(docker_client)
    args = cli.build_parser().parse_args(["run", path, "--timeout", "120", "--json"])
    try:
        assert jobs.cmd_run(args, engine_verb=fake) == code
    finally:
        fake.builder.remove_all()
    out, err = capsys.readouterr()
    assert fake.calls == ["up", "destroy"]
    assert words in err and "main1 | training" in out
    summary = json.loads(out[out.index("{\n"):])
    assert summary["exit"] == code and summary["destroyed"] is True
    assert [r["host"] for r in summary["containers"]] == ["main1", "sub1"]
    assert summary["containers"][0]["state"] == "exited"
    assert summary["containers"][1]["state"] == "running"  # until destroy
    assert not docker_client.containers.list(all=True, filters={"name": name})


@pytest.mark.docker
def test_run_keep_on_failure_keeps_the_failed_session(
        docker_client, image, tmp_path, capsys):  # noqa: F811
    from cluster_sessions.driver import jobs

    name = unique("keep")
    path = write_definition(tmp_path, name, image, "exit 9")
    fake = EmulatedEngine(docker_client)
    args = cli.build_parser().parse_args(["run", path, "--keep-on-failure", "--timeout", "120"])
    try:
        assert jobs.cmd_run(args, engine_verb=fake) == 5
        assert fake.calls == ["up"]
        assert len(docker_client.containers.list(all=True, filters={"name": name})) == 2
        assert "kept" in capsys.readouterr().err
    finally:
        fake.builder.remove_all()
