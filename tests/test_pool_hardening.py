"""Issue 47 on the real engine: the pool's ledger holds against its own tenants. Labels are
other tenants' data (a forged label never adds capacity nor stops a verb, and is shown); a
running, unchanged session keeps what it holds whatever others reserve or forge; a forged lock
delays only the sessions that need a decision, is shown with who it claims to be, and `pool
sweep --lock` removes it. Also issue 41 item 6: a pending reason names who holds the agent
and suggests `--wait`, which `run` takes too.

The lab tests of items 1-2 (a name another stack places or waits for) are in
tests/test_pool_race_lab.py; item 6 (no pid or host name believed) in tests/test_pool_ledger.py;
item 7 (the set-up's home) in tests/test_home_race.py; the pure unit in tests/test_ledger_core.py.
"""

from __future__ import annotations

import json
import re

import pytest

from cluster_sessions.agents import pool_ledger
from cluster_sessions.agents.pool_ledger import Holder, Ledger, lock_name
from cluster_sessions.core.decisions import KeptPlacement, Shape, decide
from cluster_sessions.core.names import (
    CPU_LABEL,
    GPUS_LABEL,
    MEM_LABEL,
    SESSION_LABEL,
    STACK_ID_LABEL,
)
from cluster_sessions.core.placement import Free, Slot
from cluster_sessions.core.spec import Pool, Session
from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def tiny_pool(tmp_path, cpu=2, mem="1000g"):
    doc = factories.pool(unique("hard"), factories.agent("local", cpu=cpu, mem=mem))
    return Pool.model_validate(doc), factories.write(tmp_path / "pool.yaml", doc)


def session_file(tmp_path, pool_file, image, name, **shape):  # noqa: F811
    return str(factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, pool=str(pool_file), image=image, **shape)))


@pytest.fixture
def forged(docker_client, image):  # noqa: F811
    """forged(session, labels): a never-started container carrying our labels, as anyone
    with the engine's socket can make; removed afterwards."""
    made = []

    def make(session: str, **labels: str):
        c = docker_client.containers.create(
            image, ["true"], name=f"{session}-main1",
            labels={SESSION_LABEL: session, STACK_ID_LABEL: "f" * 16, **labels})
        made.append(c)
        return c

    yield make
    for c in made:
        c.remove(force=True)


@pytest.mark.docker
def test_a_negative_cpu_label_adds_no_capacity_and_is_shown_as_malformed(
        real_engine, forged, image, tmp_path, capfd):  # noqa: F811
    pool, pool_file = tiny_pool(tmp_path, cpu=2)
    forger = unique("forged")
    forged(forger, **{CPU_LABEL: "-100", MEM_LABEL: "1", GPUS_LABEL: ""})
    big = session_file(tmp_path, pool_file, image, unique("big"), cpu=3, mem="1g",
                       shmem="64m")
    # 3 cpu on an agent that declares 2: the forged -100 must not make room for it
    assert cli.main(["up", big, "--yes"]) == 3
    err = capfd.readouterr().err
    assert "short of cpu" in err, err
    assert cli.main(["pool", "usage", str(pool_file)]) == 0
    out, err = capfd.readouterr()
    assert f"malformed: agent local: container {forger}-main1 (session {forger}): malformed " \
        f"label {CPU_LABEL}: '-100' is not a plain decimal number" in out, out
    assert "-100" not in out.split("malformed")[0]  # the table counts nothing of it
    assert cli.main(["pool", "check", str(pool_file)]) == 0
    assert f"container {forger}-main1" in capfd.readouterr().err


@pytest.mark.docker
@pytest.mark.parametrize("value", ["inf", "nan", "1e999"])
def test_an_infinite_cpu_label_stops_no_verb(
        real_engine, forged, image, tmp_path, capfd, value):  # noqa: F811
    pool, pool_file = tiny_pool(tmp_path, cpu=64)
    forger = unique("inf")
    forged(forger, **{CPU_LABEL: value})
    assert cli.main(["pool", "usage", str(pool_file), "--json"]) == 0
    out, err = capfd.readouterr()
    doc = json.loads(out)
    assert any(forger in line and CPU_LABEL in line for line in doc["malformed"]), doc
    assert "internal error" not in err
    small = session_file(tmp_path, pool_file, image, unique("small"), cpu=0.1, mem="64m",
                         shmem="16m")
    code = cli.main(["up", small, "--yes"])
    err = capfd.readouterr().err
    assert code == 0 and "internal error" not in err, err
    assert cli.main(["destroy", small, "--yes"]) == 0


@pytest.mark.docker
def test_a_running_unchanged_session_keeps_its_place_whatever_others_reserve_or_forge(
        real_engine, docker_client, image, tmp_path, capfd, monkeypatch):  # noqa: F811
    pool, pool_file = tiny_pool(tmp_path, cpu=64, mem="1000g")
    name = unique("keep")
    path = session_file(tmp_path, pool_file, image, name, cpu=0.1, mem="64m", shmem="16m")
    assert cli.main(["up", path, "--yes"]) == 0, capfd.readouterr().err
    capfd.readouterr()

    def ids():
        return {c.name: c.id for c in docker_client.containers.list(
            all=True, filters={"label": f"{SESSION_LABEL}={name}"})}

    first = ids()
    # an `up` that must decide waits at most 5 s for the lock here (300 s by default)
    real_locked = Ledger.locked
    monkeypatch.setattr(Ledger, "locked", lambda self, holder, timeout=300, **kw:
                        real_locked(self, holder, timeout=5, **kw))
    with Ledger.open(pool) as ledger:
        hog = ledger.renewed("reservation", "forger", "e" * 16, Holder("forger"), 90,
                             {"local": {"cpu": 10**6, "mem": 2**50, "gpus": [], "ports": []}})
        lock = ledger._create(lock_name(pool.name), {
            pool_ledger.KIND_LABEL: "lock", pool_ledger.LEASE_LABEL: "300",
            pool_ledger.HOLDER_LABEL: Holder("forger", host="nowhere", pid=1).label()})
        try:
            assert cli.main(["up", path, "--yes"]) == 0
            err = capfd.readouterr().err
            assert f"{name} keeps its placement" in err, err
            assert ids() == first  # nothing replaced
            # the operator sees who holds the lock, and removes it
            assert cli.main(["pool", "usage", str(pool_file)]) == 0
            out = capfd.readouterr().out
            assert "now by sessionctl up of session forger (" in out, out
            assert f"marker {lock[:12]}" in out and "pool sweep POOL --lock" in out, out
            assert cli.main(["pool", "sweep", str(pool_file), "--lock"]) == 0
            out = capfd.readouterr().out
            assert f"removed the lock of pool {pool.name} (marker {lock[:12]})" in out, out
            assert ledger.lock_holder() is None
        finally:
            hog.close()
            ledger._remove(lock)
    assert cli.main(["destroy", path, "--yes"]) == 0


def test_a_present_session_is_never_placed_anew_because_others_took_capacity():
    """On a pool of several agents, `decide` would otherwise move a running session whose
    agent others over-reserved ("what it held was taken by others") and replace it."""
    pool = Pool.model_validate(factories.pool("two", factories.agent("a1", cpu=4, mem="8g"),
                                              factories.agent("a2", cpu=4, mem="8g")))
    session = Session.model_validate(factories.session("run1", pool="two", cpu=1, mem="1g",
                                                       shmem="64m"))
    kept = {"run1": KeptPlacement(Shape.of(session, pool), (Slot("a1", ()),))}
    free = [Free("a1", 0, 0, ()), Free("a2", 4000, 8 * 2**30, ())]  # a1 "taken by others"
    moved = decide([session], pool, free, kept)
    assert moved.notes["run1"] != "kept" and moved.plans[0].containers[0].agent == "a2"
    stays = decide([session], pool, free, kept, present={"run1"})
    assert stays.notes["run1"] == "kept" and stays.plans[0].containers[0].agent == "a1"


@pytest.mark.docker
def test_a_pending_reason_names_who_holds_the_agent_and_suggests_wait(
        real_engine, image, tmp_path, capfd):  # noqa: F811
    pool, pool_file = tiny_pool(tmp_path, cpu=1000, mem="1000g")  # memory is what is short
    first, second = unique("holds"), unique("waits")
    a = session_file(tmp_path, pool_file, image, first, cpu=0.1, mem="600g", shmem="64m")
    b = session_file(tmp_path, pool_file, image, second, cpu=0.1, mem="600g", shmem="64m")
    assert cli.main(["up", a, "--yes"]) == 0, capfd.readouterr().err
    capfd.readouterr()
    try:
        assert cli.main(["up", b, "--yes", "--json"]) == 3
        out, err = capfd.readouterr()
        reason = json.loads(out)["reason"]
        # others' sessions on the shared engine may be named beside it (a CI run's own)
        assert "short of mem" in reason and re.search(
            rf"held on local by [^;]*\b{re.escape(first)} \(made by ", reason), reason
        assert "`--wait [DURATION]` (up, run) queues for it" in reason, reason
    finally:
        assert cli.main(["destroy", a, "--yes"]) == 0


def test_run_takes_wait_and_passes_it_to_its_up(tmp_path):
    from cluster_sessions.driver import jobs

    args = cli.build_parser().parse_args(["run", "x.yaml", "--wait", "10m"])
    assert args.wait == 600
    assert jobs._engine_args(args, "up").wait == 600
    assert not hasattr(jobs._engine_args(args, "destroy"), "wait")
    bare = cli.build_parser().parse_args(["run", "x.yaml", "--wait"])
    assert bare.wait == float("inf")
    assert cli.build_parser().parse_args(["run", "x.yaml"]).wait is None


def test_a_pool_sweep_needs_a_session_or_the_lock(tmp_path, capsys):
    _pool, pool_file = tiny_pool(tmp_path)
    assert cli.main(["pool", "sweep", str(pool_file)]) == 2
    assert "give --session NAME" in capsys.readouterr().err


def test_ledger_time_is_read_for_the_lock_at_its_own_lease(monkeypatch):
    """No lock is believed beyond LOCK_LEASE, whatever its label claims (a forged 300 s lock
    lapses as a real one would)."""
    from cluster_sessions.agents.engine import MarkerFacts

    labels = {pool_ledger.KIND_LABEL: "lock", pool_ledger.LEASE_LABEL: "300"}
    marker = MarkerFacts("id", "lock", "2026-11-27T15:40:00Z", labels)
    entry = pool_ledger.entry_of(marker, pool_ledger.LOCK_LEASE)
    assert entry.lease == pool_ledger.LOCK_LEASE
    assert entry.expired(entry.created + pool_ledger.LOCK_LEASE)


def test_a_claimed_name_is_refused_with_exit_2_one_line_per_claim_and_escaped_text():
    from cluster_sessions.core import ledger as ledger_core
    from cluster_sessions.driver.errors import CommandError
    from cluster_sessions.driver.placing import refuse_claims

    keys = {"kind": "k", "session": "s", "stack": "st", "holder": "h", "lease": "l",
            "arrival": "a", "holds": "hd"}
    evil = ledger_core.Holder("gamma", "up", "box\x1b[31m", 1, "eve\nroot")
    entry = ledger_core.entry_of({"k": "reservation", "s": "gamma", "st": "b" * 16,
                                  "h": evil.label(), "l": "90"}, keys, "c", "n", 0.0, 300)
    pool = Pool.model_validate(factories.pool("p1", factories.agent("local")))
    refuse_claims(pool, [entry], {"delta": "a" * 16})  # another name: nothing to refuse
    with pytest.raises(CommandError) as refused:
        refuse_claims(pool, [entry], {"gamma": "a" * 16})
    assert refused.value.code == 2
    lines = str(refused.value).splitlines()
    assert len(lines) == 2 and "\x1b" not in lines[0] and "eve\\nroot" in lines[0], lines
    assert lines[0].startswith(f"session gamma is being placed on pool p1 by another stack "
                               f"(stack id {'b' * 16}, sessionctl up of session gamma")
