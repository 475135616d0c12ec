"""``sessionctl pool ...`` and ``sessionctl lab ...`` without a lab: arguments, refusals, exit
codes, and agents that do not answer (nothing here needs root or another machine)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from cluster_sessions.core.errors import InvalidInput
from cluster_sessions.driver import cli, lab_verbs, pool_verbs
from cluster_sessions.driver.errors import CommandError, Exit
from cluster_sessions.lab.pool_file import POOL_FILE_HEADER
from tests.conftest import PROJECT, STACKS
from tests.standin.engine import Engine, run_program

from . import factories


def write_pool(path: Path, *agents: dict, swarm: str | None = None) -> Path:
    doc = {"kind": "AgentPool", "name": path.stem, "agents": list(agents)}
    if swarm:
        doc["swarm"] = {"manager": swarm}
    path.write_text(yaml.safe_dump(doc))
    return path


def agent(name: str, docker_host: str, **extra) -> dict:
    return {"name": name, "docker_host": docker_host, "capacity": {"cpu": 2, "mem": "2g"},
            **extra}


def test_a_pool_is_a_name_in_stacks_pools_or_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the project's, from anywhere
    assert pool_verbs.pool_path("lab3") == STACKS / "pools" / "lab3.yaml"
    own = write_pool(tmp_path / "mine.yaml", agent("a", "unix:///x.sock"))
    assert pool_verbs.pool_path(str(own)) == own
    assert pool_verbs.pool_path("mine.yaml") == Path("mine.yaml")
    with pytest.raises(InvalidInput) as caught:
        pool_verbs.pool_path("nosuchpool")
    assert caught.value.code == Exit.INVALID and "nosuchpool" in str(caught.value)


def test_lab_never_overwrites_a_pool_file_it_did_not_write(tmp_path):
    committed = STACKS / "pools" / "lab3.yaml"
    with pytest.raises(CommandError) as caught:
        lab_verbs.check_pool_file_is_ours(committed, force=False)
    assert caught.value.code == Exit.INVALID and "--force" in str(caught.value)
    lab_verbs.check_pool_file_is_ours(committed, force=True)  # asked for: allowed
    ours = tmp_path / "lab.yaml"
    ours.write_text(POOL_FILE_HEADER + " (cluster_sessions.lab.netns)\nkind: AgentPool\n")
    lab_verbs.check_pool_file_is_ours(ours, force=False)
    lab_verbs.check_pool_file_is_ours(tmp_path / "new.yaml", force=False)


def test_the_default_lab_pool_file_is_the_projects_lab_pool(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert lab_verbs.default_lab_pool_file() == PROJECT / "stacks" / "pools" / "lab.yaml"
    assert Path("/run/cluster-sessions-lab") == lab_verbs.DEFAULT_LAB_STATE


def test_lab_verbs_need_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for verb in (["lab", "up", "--agents", "2"], ["lab", "down"]):
        assert cli.main(verb) == Exit.MISSING
        assert "needs root" in capsys.readouterr().err


def test_lab_status_of_a_lab_that_is_not_there(tmp_path, capsys):
    assert cli.main(["lab", "status", "--state-dir", str(tmp_path)]) == Exit.ENGINE
    assert capsys.readouterr().out.startswith("lab down")
    assert cli.main(["lab", "status", "--state-dir", str(tmp_path), "--json"]) == Exit.ENGINE
    assert json.loads(capsys.readouterr().out)["state"] == "down"


def test_pool_up_without_a_swarm_manager_is_invalid(capsys):
    assert cli.main(["pool", "up", str(STACKS / "pools" / "local.yaml"), "--yes"]) == Exit.INVALID
    assert "swarm.manager" in capsys.readouterr().err


@pytest.mark.parametrize(("ref", "words"), [("", "must not be empty"),
                                            ("p" * 300, "File name too long"),
                                            ("~nosuchuser/p.yaml", "no user 'nosuchuser'")])
def test_a_pool_that_cannot_be_looked_up_is_invalid_input(capsys, ref, words):
    assert cli.main(["pool", "check", ref]) == Exit.INVALID
    err = capsys.readouterr().err
    assert err.startswith("sessionctl pool: ") and words in err, err


def test_pool_up_and_destroy_without_the_pulumi_cli_exit_4(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no pulumi (and nothing else) on PATH
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PULUMI_HOME", raising=False)
    for verb in ("up", "destroy"):
        for yes in (["--yes"], []):  # the CLI is checked first, as for the session verbs
            code = cli.main(["pool", verb, str(STACKS / "pools" / "lab3.yaml"), *yes, "--json"])
            out, err = capsys.readouterr()
            assert code == Exit.MISSING, (verb, yes, err)
            assert "pulumi" in err.lower()
            assert json.loads(out)["result"] == "missing-prerequisite"


def tls_dir(tmp_path: Path) -> str:
    """A TLS directory in Docker's layout (the files need only exist: nothing answers)."""
    certs = tmp_path / "certs"
    certs.mkdir(exist_ok=True)
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (certs / name).touch()
    return str(certs)


def test_pool_check_names_agents_whose_engine_does_not_answer(tmp_path, capsys):
    pool = write_pool(
        tmp_path / "dead.yaml",
        agent("gone-socket", f"unix://{tmp_path}/no-docker.sock"),
        agent("closed-port", "tcp://127.0.0.1:9", tls={"cert_path": tls_dir(tmp_path)}),
    )
    code = cli.main(["pool", "check", str(pool)])
    out, err = capsys.readouterr()
    assert code == Exit.ENGINE
    lines = [line for line in err.splitlines() if line.startswith("agent ")]
    assert lines[0].startswith("agent gone-socket: ")
    assert lines[1].startswith("agent closed-port: docker not answering: docker API "
                               "tcp://127.0.0.1:9: ")
    assert "2 of 2 agent(s) failed the check" in err
    assert out.splitlines()[0].split()[:2] == ["AGENT", "REACHABLE"]


def test_plan_probe_on_an_unusable_pool_exits_4_naming_the_agent(tmp_path, capsys):
    pool = write_pool(tmp_path / "dead.yaml", agent("closed-port", "tcp://127.0.0.1:9",
                                                    tls={"cert_path": tls_dir(tmp_path)}))
    session = factories.write(tmp_path / "s.yaml", factories.session("probe-test", str(pool)))
    assert cli.main(["plan", str(session), "--probe"]) == Exit.MISSING
    err = capsys.readouterr().err
    assert "pool dead: 1 of 1 agent(s) cannot be used to probe free capacity:" in err
    assert "agent closed-port: docker not answering" in err


@pytest.mark.docker
def test_pool_check_of_this_machines_engine(docker_client, capsys):
    code = cli.main(["pool", "check", str(STACKS / "pools" / "local.yaml"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == Exit.OK, doc
    (local,) = doc["agents"]
    assert local["reachable"] and local["docker_version"] == docker_client.version()["Version"]
    assert local["via"] == "local (unix:///var/run/docker.sock)"
    assert local["machine"]["cpus"] >= 1


def test_the_pool_program_refuses_a_pool_without_a_swarm():
    from cluster_sessions.pulumi_layer import pool_program

    config = {"cluster-sessions:pool-definition": "pools/local.yaml"}
    with pytest.raises(Exception, match="swarm.manager: required for a pool stack"):
        run_program(Engine(), "pool-local", config, program=lambda: pool_program.run(PROJECT))


def test_the_pool_stack_is_named_after_the_pool():
    from cluster_sessions.core.loader import load_file

    assert pool_verbs.pool_stack_name(load_file(STACKS / "pools" / "lab3.yaml")) == "pool-lab3"


def test_pool_check_exits_1_when_the_swarm_is_not_formed(tmp_path, capsys, monkeypatch):
    """Every agent answers, but the pool's swarm is missing: a session across agents would not
    be placed, so the check fails (the table says so, and now the exit code too)."""
    from cluster_sessions.agents import capacity, facts

    def engine(name: str) -> facts.EngineInfo:  # what `docker info` says of an engine in no swarm
        return facts.EngineInfo("20.10.24", f"id-{name}", name, 2, 2**33,
                                facts.SwarmState("inactive"))

    monkeypatch.setattr(capacity, "probe_pool", lambda pool, **_: [
        capacity.AgentReport(a.name, via="test", reachable=True, engine=engine(a.name))
        for a in pool.agents])
    pool = write_pool(tmp_path / "pair.yaml", agent("one", "unix:///one.sock"),
                      agent("two", "unix:///two.sock"), swarm="one")
    code = cli.main(["pool", "check", str(pool)])
    out, err = capsys.readouterr()
    assert code == Exit.ENGINE, (out, err)
    assert "not formed" in out and "the swarm is not formed" in err


def test_plan_probe_and_pool_check_give_one_answer_while_the_swarm_is_not_formed(
        tmp_path, capsys, monkeypatch):
    """Capacity places a multi-node session on two agents, but their swarm is not formed:
    ``plan --probe`` says pending (exit 3) with the sentence ``pool check`` ends with, and a
    session that fits on one agent is placed (issue 23: one answer, from one place)."""
    from cluster_sessions.agents import capacity, facts
    from cluster_sessions.core.placement import Free

    def report(name: str) -> capacity.AgentReport:
        return capacity.AgentReport(
            name, via="test", reachable=True,
            engine=facts.EngineInfo("20.10.24", f"id-{name}", name, 2, 2**33,
                                    facts.SwarmState("inactive")),
            free=Free(name, 2000, 2 * 2**30))

    monkeypatch.setattr(capacity, "probe_pool", lambda pool, **_: [
        report(a.name) for a in pool.agents])
    pool = write_pool(tmp_path / "pair.yaml", agent("one", "unix:///one.sock"),
                      agent("two", "unix:///two.sock"), swarm="one")
    assert cli.main(["pool", "check", str(pool)]) == Exit.ENGINE
    check_says = capsys.readouterr().err.strip().splitlines()[-1]
    assert check_says.startswith("pool pair: the swarm is not formed")

    spread = factories.write(tmp_path / "spread.yaml", factories.session(
        "spread", str(pool), size=2, mode="multi-node", cpu=2, mem="1g"))
    assert cli.main(["plan", str(spread), "--probe"]) == Exit.PENDING
    out, err = capsys.readouterr()
    pending = [line for line in err.splitlines() if ": pending: " in line]
    assert [line.split(": pending: ", 1)[1] for line in pending] == [
        check_says.removeprefix("pool pair: ")]
    assert "is the pool's swarm manager but its swarm state is inactive" in err  # as check
    # one verdict: the table says pending with the same reason, never "scheduled"
    assert "status scheduled" not in out and "status pending" in out
    assert f"reason   {check_says.removeprefix('pool pair: ')}" in out.splitlines()
    for flag, key in (("--json", "status"), ("--markdown", None)):
        assert cli.main(["plan", str(spread), "--probe", flag]) == Exit.PENDING
        out, err = capsys.readouterr()
        assert "scheduled" not in out
        if key:
            assert json.loads(out)["status"] == "pending"

    alone = factories.write(tmp_path / "alone.yaml", factories.session(
        "alone", str(pool), size=2, cpu=1, mem="512m"))
    assert cli.main(["plan", str(alone), "--probe"]) == Exit.OK
    assert "pending" not in capsys.readouterr().err


def test_an_agent_that_is_not_an_ssh_server_is_one_line_not_a_traceback(tmp_path):
    """paramiko logs a banner failure with its traceback; the check says it in one line.
    (In a process of its own: pytest's log capture would hide what a user's terminal shows.)"""
    import socket
    import subprocess
    import sys
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def serve() -> None:  # accept and hang up, like a port that is not sshd
        for _ in range(8):
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    pool = write_pool(tmp_path / "liar.yaml",
                      agent("liar", f"ssh://ops@127.0.0.1:{port}"),
                      agent("liar2", f"ssh://ops@127.0.0.1:{port}"))
    try:
        proc = subprocess.run([sys.executable, "-m", "cluster_sessions.driver.cli", "pool",
                               "check", str(pool), "--timeout", "5"], capture_output=True,
                              text=True, timeout=60)
    finally:
        server.close()
    err = proc.stderr
    assert proc.returncode == Exit.ENGINE, err
    assert "Traceback" not in err and "Exception (client)" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert [line.split(":")[0] for line in lines] == ["agent liar", "agent liar2",
                                                     "pool liar"], err


def test_pool_verbs_and_definitions_find_a_pool_name_in_the_same_place(tmp_path, monkeypatch,
                                                                        capsys):
    """One lookup rule (loader.find_pool): a name in $CLUSTER_SESSIONS_POOLS is found by the
    pool verbs and by a definition outside the project alike (issue 12)."""
    from cluster_sessions.driver.session_args import load_definition

    mine = tmp_path / "my-pools"
    mine.mkdir()
    pool = write_pool(mine / "shared.yaml", agent("a", f"unix://{tmp_path}/no.sock"))
    session = tmp_path / "elsewhere" / "s.yaml"
    session.parent.mkdir()
    factories.write(session, factories.session("lookup", "shared"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLUSTER_SESSIONS_POOLS", str(mine))
    assert pool_verbs.pool_path("shared") == pool == load_definition(session).pool_file
    monkeypatch.delenv("CLUSTER_SESSIONS_POOLS")
    assert cli.main(["pool", "check", "shared"]) == Exit.INVALID
    verb_err = capsys.readouterr().err
    assert cli.main(["validate", str(session)]) == Exit.INVALID
    definition_err = capsys.readouterr().err
    def looked(err: str) -> list[str]:
        return err.split("(looked for ", 1)[1].rstrip(")\n").split(", ")

    # the definition looks where the verbs look (the operator's directories), in that order
    assert looked(definition_err) == looked(verb_err)
    assert verb_err.startswith("sessionctl pool: no pool 'shared' found")


def test_pool_usage_names_an_agent_it_could_not_ask_and_exits_1(tmp_path, capsys):
    pool = write_pool(tmp_path / "dead.yaml", agent("gone-socket",
                                                    f"unix://{tmp_path}/no-docker.sock"))
    assert cli.main(["pool", "usage", str(pool), "--json"]) == Exit.ENGINE
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["agents"] == [] and list(doc["unreachable"]) == ["gone-socket"]
    assert "agent gone-socket: " in err


def test_pool_usage_of_a_missing_pool_is_invalid_input(tmp_path, capsys):
    assert cli.main(["pool", "usage", str(tmp_path / "nope.yaml")]) == Exit.INVALID
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.docker
def test_pool_check_says_which_agents_lack_an_image(docker_client, capsys):
    """Issue 33: `pool check --image` names the agents without it (not a fault: up pulls it)."""
    from cluster_sessions.lab.image import ensure_image

    image = ensure_image(docker_client)
    local = str(STACKS / "pools" / "local.yaml")
    assert cli.main(["pool", "check", local, "--image", image, "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["image"] == {"reference": image,
                            "held": {"local": docker_client.images.get(image).id}}
    assert f"image {image}: on every agent" in doc["notes"]
    missing = "cluster-sessions/no-such-image:never"
    assert cli.main(["pool", "check", local, "--image", missing]) == Exit.OK
    out = capsys.readouterr().out
    assert (f"image {missing}: missing on local: `up` pulls it there first, or `sessionctl "
            f"pool pull {local} {missing}` now") in out


def test_pool_usage_prints_each_ledger_entry_on_its_own_line_with_its_lease_explained(
        tmp_path, capsys, monkeypatch):
    """Issue 41, item 9: no literal ``\\n`` between "nobody deciding now" and the queue, and
    the lease says what it is."""
    pool = write_pool(tmp_path / "dead.yaml", agent("gone-socket",
                                                    f"unix://{tmp_path}/no-docker.sock"))
    queued = {"session": "train-2", "holder": "sessionctl up of session train-2 "
              "(ana@vm, pid 7)", "since": 94.0, "until": 184.0}
    monkeypatch.setattr(pool_verbs, "ledger_view", lambda pool, entries=None: {
        "agent": "gone-socket", "now": 100.0, "lock": None, "reservations": [],
        "queue": [queued, {**queued, "session": "x\nforged line"}]})
    cli.main(["pool", "usage", str(pool)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].endswith("nobody deciding now"), lines
    assert lines[-2] == ("queued #1: train-2 by sessionctl up of session train-2 (ana@vm, pid 7) "
                         "(waiting for 6s; its lease, renewed while that sessionctl runs, would "
                         "lapse in 84s if it stopped)")
    assert lines[-1].startswith("queued #2: x\\nforged line by ")  # another's text: escaped


def test_a_ledger_holder_is_named_by_user_name_even_without_USER(monkeypatch):
    """Issue 41, item 9: with $USER unset (sudo -i, cron, a container) the holder was ``0@vm``."""
    import pwd

    from cluster_sessions.agents.pool_ledger import Holder

    for var in ("USER", "LOGNAME", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    holder = Holder("train-2")
    assert holder.user == pwd.getpwuid(os.getuid()).pw_name
    assert f"({holder.user}@" in holder.describe() and not holder.user.isdigit()
