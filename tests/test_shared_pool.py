"""A shared pool on the real engine (issue 31): `up` places on live free capacity, keeps the
placement in the stack's config, refuses (exit 3, nothing created) what does not fit, and
`up --wait` queues until it does."""

from __future__ import annotations

import json
import time

import pytest

from cluster_sessions.core.names import PLACEMENT_KEY, SESSION_LABEL, config_key
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def objects_of(docker_client, session: str) -> list[str]:
    label = f"{SESSION_LABEL}={session}"
    return ([c.name for c in docker_client.containers.list(all=True,
                                                           filters={"label": label})]
            + [n.name for n in docker_client.networks.list(filters={"label": label})])


def definitions(tmp_path, image, names, **shape):  # noqa: F811
    """Sessions on a pool whose one agent is this engine: memory is what is short (two
    sessions of 600g do not fit 1000g), whatever else the engine runs (a few GiB at most)."""
    pool = factories.pool(unique("tiny"), factories.agent("local", cpu=2, mem="1000g"))
    pool_file = factories.write(tmp_path / "pool.yaml", pool)
    return [str(factories.write(tmp_path / f"{n}.yaml", factories.session(
        n, pool=str(pool_file), image=image, **shape))) for n in names]


@pytest.mark.docker
def test_a_second_session_that_the_agent_cannot_hold_is_pending_until_the_first_goes(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    names = [unique("poola"), unique("poolb")]
    a, b = definitions(tmp_path, image, names, cpu=0.1, mem="600g", shmem="64m")
    assert cli.main(["up", a, "--yes"]) == 0, capfd.readouterr().err
    assert "placed on live capacity (it has not been placed yet): main1@local" in \
        capfd.readouterr().err
    first = {c.name: c.id for c in docker_client.containers.list(
        all=True, filters={"label": f"{SESSION_LABEL}={names[0]}"})}

    # declared capacity holds b; what the agent holds now does not: pending, nothing made
    assert cli.main(["up", b, "--yes", "--json"]) == 3
    out, err = capfd.readouterr()
    doc = json.loads(out)
    assert doc["result"] == "pending" and "short of mem" in doc["reason"], doc
    assert objects_of(docker_client, names[1]) == []

    # --wait queues, says so, and gives up after its duration with the reason
    started = time.monotonic()
    assert cli.main(["up", b, "--yes", "--wait", "2s"]) == 3
    err = capfd.readouterr().err
    assert time.monotonic() - started >= 2
    assert "queued in pool" in err and "short of mem" in err, err
    assert objects_of(docker_client, names[1]) == []

    # the first session, untouched; its second up keeps its placement and changes nothing
    assert {c.name: c.id for c in docker_client.containers.list(
        all=True, filters={"label": f"{SESSION_LABEL}={names[0]}"})} == first
    assert cli.main(["up", a, "--yes", "--json"]) == 0
    out, err = capfd.readouterr()
    assert "keeps its placement" not in out  # --json: stdout is the document alone
    assert set(json.loads(out)["changes"]) == {"same"}, out

    # once the first is gone, the second fits
    assert cli.main(["destroy", a, "--yes"]) == 0
    capfd.readouterr()
    assert cli.main(["up", b, "--yes"]) == 0, capfd.readouterr().err
    assert sorted(objects_of(docker_client, names[1])) == sorted(
        [f"{names[1]}-main1", f"{names[1]}-net"])
    config = real_engine.stacks[names[1]].config
    recorded = json.loads(config[config_key(PLACEMENT_KEY)])
    assert recorded["slots"] == [["local", []]]
    assert cli.main(["destroy", b, "--yes"]) == 0


@pytest.mark.docker
def test_a_queued_up_runs_when_the_holder_leaves(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    import asyncio
    import threading

    names = [unique("qa"), unique("qb")]
    a, b = definitions(tmp_path, image, names, cpu=0.1, mem="600g", shmem="64m")
    assert cli.main(["up", a, "--yes"]) == 0, capfd.readouterr().err
    codes: list[int] = []

    def wait_up() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())  # the emulated engine runs in it
        codes.append(cli.main(["up", b, "--yes", "--wait", "120s"]))

    waiter = threading.Thread(target=wait_up)
    waiter.start()
    try:
        time.sleep(4)
        assert objects_of(docker_client, names[1]) == []  # still queued
        capfd.readouterr()
        assert cli.main(["ls", "--json"]) == 0  # ls shows it PENDING: queued, with whom
        rows = {r["name"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}
        assert rows[names[1]]["state"] == "queued" and rows[names[1]]["phase"] == "pending"
        assert "#1 in pool" in rows[names[1]]["detail"], rows[names[1]]
        assert rows[names[0]]["phase"] == "running"
        assert cli.main(["destroy", a, "--yes"]) == 0
        waiter.join(timeout=100)
        assert codes == [0]
        assert f"{names[1]}-main1" in objects_of(docker_client, names[1])
    finally:
        waiter.join(timeout=120)
        cli.main(["destroy", b, "--yes"])


@pytest.mark.docker
def test_ctrl_c_leaves_the_queue_cleanly(docker_client, image, tmp_path, real_engine):  # noqa: F811
    """SIGINT to the installed ``sessionctl up --wait`` (real engine) while it queues."""
    import signal
    import subprocess

    from cluster_sessions.agents.pool_ledger import Holder, Ledger
    from cluster_sessions.core.spec import Pool

    from .conftest import PROJECT

    name = unique("qint")
    path = definitions(tmp_path, image, [name], cpu=0.1, mem="600g", shmem="64m")[0]
    pool = Pool.model_validate_json(json.dumps(__import__("yaml").safe_load(
        (tmp_path / "pool.yaml").read_text())))
    with Ledger.open(pool) as ledger:
        full = ledger.renewed("reservation", "someone", "", Holder("someone"), 60,
                              {"local": {"cpu": 100, "mem": 900 * 2**30, "gpus": []}})
        proc = subprocess.Popen([*real_engine.sessionctl, "up", path, "--yes", "--wait"],
                                cwd=PROJECT, env=real_engine.env, stderr=subprocess.PIPE,
                                text=True)
        try:
            deadline = time.monotonic() + 60
            while not ledger.live("queue") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert [e.session for e in ledger.live("queue")] == [name]
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
            assert proc.returncode == 130, err
            assert ledger.live("queue") == [] and ledger.live("reservation")[0].session == \
                "someone"
            assert objects_of(docker_client, name) == []
        finally:
            proc.kill()
            full.close()
