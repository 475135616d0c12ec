"""A lifetime for every session (issue 44, part 3), on the real engine: at its expiry a
session's containers end the user's command by themselves (templates/lifetime.sh: TERM, then
KILL after a grace), with no process of sessionctl's running; main1 exits 124 with a line
saying why, its capacity is free, ``ls`` says EXPIRED."""

from __future__ import annotations

import json
import time

import pytest

from cluster_sessions.core.decisions import decide_expiry
from cluster_sessions.core.names import EXPIRES_KEY, SESSION_LABEL, config_key
from cluster_sessions.core.render import LIFETIME_EXIT
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

ENDED = ("exited", "restarting")


def _epoch(stamp: str) -> float:
    """Docker's RFC 3339 time (nanoseconds) as seconds since the epoch."""
    from datetime import datetime
    return datetime.fromisoformat(stamp[:19] + "+00:00").timestamp()


def test_the_expiry_is_decided_at_the_first_up_and_kept_and_anew_after_it_ended():
    assert decide_expiry(None, 20, 1000.5) == 1020
    assert decide_expiry("1020", 20, 1010) == 1020  # kept: a second up does not extend it
    assert decide_expiry("1020", 20, 1030) == 1050  # ended: the next up starts it again
    assert decide_expiry("10x", 20, 1000) == 1020  # not ours: decided anew
    assert decide_expiry("1020", None, 1000) is None  # no lifetime (any more)


@pytest.mark.docker
def test_a_20_second_lifetime_ends_the_session_by_itself(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        unique("life"), factories.agent("local", cpu=64, mem="1000g"),
        policies={"default": {"max_lifetime": "1h"}}))
    names = [unique("life"), unique("after")]
    first, second = (str(factories.write(tmp_path / f"{n}.yaml", factories.session(
        n, pool=str(pool), image=image, cpu=0.1, shmem="8m", **over)))
        for n, over in ((names[0], {"lifetime": "20s", "size": 2, "mem": "300g"}),
                        (names[1], {"mem": "600g"})))
    started = time.time()
    assert cli.main(["up", first, "--yes"]) == 0, capfd.readouterr().err
    capfd.readouterr()
    recorded = int(real_engine.stacks[names[0]].config[config_key(EXPIRES_KEY)])
    assert started + 20 <= recorded + 1 <= time.time() + 21
    assert cli.main(["ls", "--json"]) == 0
    row = {r["name"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}[names[0]]
    assert row["expires_at"] == recorded, row
    # while it lives (the lifetime counts from the placement: on a loaded machine the up
    # itself may take much of the 20 s), it runs and the second does not fit beside it
    if time.time() < recorded - 5:
        assert row["phase"] == "running", row
        assert cli.main(["up", second, "--yes"]) == 3
        capfd.readouterr()

    # nothing of ours runs from here: the containers end by themselves
    containers = docker_client.containers.list(filters={"label": f"{SESSION_LABEL}={names[0]}"})
    assert len(containers) == 2
    deadline = recorded + 30
    ended: set[str] = set()  # each seen stopped with the lifetime's code at least once
    while time.time() < deadline and len(ended) < len(containers):
        for c in containers:
            c.reload()
            if c.status in ENDED and c.attrs["State"]["ExitCode"] == LIFETIME_EXIT:
                ended.add(c.name)
        time.sleep(0.5)
    assert ended == {c.name for c in containers}, [(c.name, c.status) for c in containers]
    for c in containers:
        c.reload()
        state = c.attrs["State"]
        # ended; a restart policy starts it again, and it exits at once, running nothing: seen
        # between two of those restarts it is "running" for a moment, started after the expiry
        assert c.status in ENDED or (
            c.status == "running" and c.attrs["RestartCount"] > 0
            and _epoch(state["StartedAt"]) >= recorded), (c.name, c.status, state)
    main1 = next(c for c in containers if c.name.endswith("-main1"))
    logs = main1.logs().decode()
    assert "lifetime: the session's lifetime ended; stopping the command" in logs, logs
    assert "lifetime: the session expired: the command ended" in logs, logs
    assert time.time() >= recorded

    assert cli.main(["ls", "--json"]) == 0
    row = {r["name"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}[names[0]]
    assert row["state"] == "expired" and row["phase"] == "expired", row
    assert "its lifetime ended" in row["detail"], row
    assert cli.main(["ls"]) == 0
    line = next(x for x in capfd.readouterr().out.splitlines() if x.startswith(names[0]))
    assert "EXPIRED" in line.split()[5:9], line
    try:
        # its capacity is free: the second session fits now
        assert cli.main(["up", second, "--yes"]) == 0, capfd.readouterr().err
        capfd.readouterr()
        # the operator's reaper ends the expired session through its stack's destroy (its
        # ended containers go); the running one, within its lifetime, is kept
        assert cli.main(["pool", "reap", str(pool), "--json"]) == 0, capfd.readouterr().err
        reaped = {r["session"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}
        assert (reaped[names[0]]["action"], reaped[names[0]]["kind"]) == ("ended", "expired"), (
            reaped)
        assert reaped[names[1]]["action"] == "kept", reaped
        assert not docker_client.containers.list(
            all=True, filters={"label": f"{SESSION_LABEL}={names[0]}"})
        assert docker_client.containers.list(filters={"label": f"{SESSION_LABEL}={names[1]}"})
    finally:
        assert cli.main(["destroy", second, "--yes"]) == 0
        assert cli.main(["destroy", first, "--yes"]) == 0


@pytest.mark.parametrize("directory", [True, False], ids=["render-out", "uploaded"])
def test_a_lifetimes_scripts_pass_shellcheck_and_quote_the_expiry(tmp_path, directory):
    import shutil
    import subprocess

    from cluster_sessions.core.keys import generate_session_keys
    from cluster_sessions.core.plan import build_plan, with_expiry
    from cluster_sessions.core.render import render_session
    from cluster_sessions.core.spec import Pool, Session

    from .conftest import skip_or_fail

    found = shutil.which("shellcheck")
    if found is None:
        skip_or_fail("shellcheck is not installed (apt-get install shellcheck)")
    pool = Pool.model_validate(factories.pool("p"))
    session = Session.model_validate(factories.session("life-test", "p", size=2,
                                                       lifetime="20s"))
    plan = with_expiry(build_plan(session, pool), 1_900_000_000)
    files = {f.path: f for f in render_session(plan, generate_session_keys(plan.hosts),
                                               directory=directory)["sub1"]}
    assert "_cs_expires=1900000000" in files["lifetime.sh"].content
    assert files["setup.sh"].content.count('. "$bundle/lifetime.sh"') == 2
    paths = []
    for name in ("lifetime.sh", "setup.sh"):
        (tmp_path / name).write_text(files[name].content)
        paths.append(str(tmp_path / name))
    result = subprocess.run([found, "--shell=sh", "--exclude=SC1091", "--format=gcc", *paths],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # without a lifetime, neither the file nor the hook
    plain = render_session(build_plan(session.model_copy(update={"lifetime": None}), pool),
                           generate_session_keys(plan.hosts))["sub1"]
    assert "lifetime.sh" not in {f.path for f in plain}
    assert "lifetime.sh" not in next(f for f in plain if f.path == "setup.sh").content


@pytest.mark.docker
def test_extend_moves_the_end_in_the_running_containers_within_the_policy(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        unique("ext"), factories.agent("local", cpu=64, mem="1000g"),
        policies={"default": {"max_lifetime": "60s"}}))
    name = unique("ext")
    path = str(factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, pool=str(pool), image=image, cpu=0.1, mem="64m", shmem="8m", lifetime="20s")))
    assert cli.main(["up", path, "--yes"]) == 0, capfd.readouterr().err
    try:
        first = int(real_engine.stacks[name].config[config_key(EXPIRES_KEY)])
        ids = {c.name: c.id for c in docker_client.containers.list(
            filters={"label": f"{SESSION_LABEL}={name}"})}
        capfd.readouterr()
        assert cli.main(["extend", path, "25s"]) == 0, capfd.readouterr().err
        # past the max_lifetime from its start (20 s + 25 s + 25 s > 60 s): refused, named
        assert cli.main(["extend", path, "25s"]) == 2
        assert "more than project default's max_lifetime (1m)" in capfd.readouterr().err
        while time.time() < first + 8:
            time.sleep(1)
        (main1,) = docker_client.containers.list(filters={"label": f"{SESSION_LABEL}={name}"})
        assert main1.status == "running" and main1.id == ids[main1.name]  # not replaced
        deadline = first + 25 + 30
        while time.time() < deadline:
            main1.reload()
            if main1.status in ENDED:
                break
            time.sleep(1)
        assert main1.status in ENDED, main1.status
        assert main1.attrs["State"]["ExitCode"] == LIFETIME_EXIT
        assert time.time() >= first + 25
    finally:
        assert cli.main(["destroy", path, "--yes"]) == 0
