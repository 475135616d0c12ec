"""The pool's ledger on the real engine (agents/pool_ledger.py): the lock admits one holder at a
time across processes, a killed holder's lock and reservations do not hold the pool, entries
are renewed while their holder lives and read on the engine's clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cluster_sessions.agents import pool_ledger
from cluster_sessions.agents.pool_ledger import Holder, Ledger, engine_time
from cluster_sessions.core.spec import Pool

from . import factories


def test_engine_times_read_with_nanoseconds_and_zones():
    assert engine_time("2026-11-27T15:40:00Z") == 1795794000.0
    assert engine_time("2026-11-27T15:40:00.123456789Z") == pytest.approx(1795794000.123456)
    assert engine_time("2026-11-27T16:40:00.5+01:00") == pytest.approx(1795794000.5)


def test_a_holder_label_reads_back_and_a_bad_one_is_nobody():
    h = Holder("s1", "up", "host1", 42, "ops")
    assert Holder.parse(h.label()) == h
    assert Holder.parse("{not json") is None
    assert "s1" in h.describe() and "ops@host1" in h.describe()


def unique_pool(tag: str) -> Pool:
    name = f"ledger-{tag}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    return Pool.model_validate(factories.pool(name, factories.agent("local")))


def markers(docker_client, pool: Pool) -> list[str]:
    return [c.name for c in docker_client.containers.list(
        all=True, filters={"label": f"{pool_ledger.POOL_LABEL}={pool.name}"})]


HOLD = textwrap.dedent("""
    import sys, time
    from cluster_sessions.agents.pool_ledger import Holder, Ledger, RESERVATION_LEASE
    from cluster_sessions.core.spec import Pool
    pool = Pool.model_validate_json(sys.argv[1])
    lease = float(sys.argv[2]) if len(sys.argv) > 2 else RESERVATION_LEASE
    with Ledger.open(pool) as ledger:
        with ledger.locked(Holder("holder"), lease=lease):
            ledger.renewed("reservation", "holder", "", Holder("holder"), lease,
                           {"local": {"cpu": 1000, "mem": 1, "gpus": [0]}})
            print("held", flush=True)
            time.sleep(600)
""")


@pytest.mark.docker
def test_the_lock_admits_one_holder_and_a_killed_ones_lapse_with_their_leases(docker_client):
    pool = unique_pool("kill")
    proc = subprocess.Popen([sys.executable, "-c", HOLD, pool.model_dump_json(), "3"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with Ledger.open(pool) as ledger:
            waited: list[str] = []
            with pytest.raises(pool_ledger.PoolBusy, match="sessionctl up of session holder"), \
                    ledger.locked(Holder("second"), timeout=1, on_wait=waited.append):
                pass
            assert waited and "holder" in waited[0]
            assert [e.session for e in ledger.live("reservation")] == ["holder"]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            # the holder's process is gone: its lock and reservation hold until their leases
            # (3 s here) run out on the engine's clock, and not a moment longer
            started = time.monotonic()
            with ledger.locked(Holder("second"), timeout=10):
                took = time.monotonic() - started
                time.sleep(3.1)  # its last renewal, at most a lease ago
                assert ledger.live("reservation") == []
            assert 0.5 < took < 5, took
        assert markers(docker_client, pool) == []
    finally:
        proc.kill()
        proc.wait()
        for c in docker_client.containers.list(
                all=True, filters={"label": f"{pool_ledger.POOL_LABEL}={pool.name}"}):
            c.remove(force=True)


def dead_pid() -> int:
    """A pid no process of this pid namespace has (a holder in another namespace looks so)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.docker
def test_a_holder_whose_pid_is_absent_here_keeps_its_lock_until_its_lease(docker_client):
    """Issue 47 item 6: two CI runners of one host name, or in other pid namespaces, must not
    remove each other's live locks: no pid or host name is believed, only the lease."""
    import socket

    pool = unique_pool("pidns")
    twin = Holder("twin", host=socket.gethostname(), pid=dead_pid())
    with Ledger.open(pool) as ledger:
        try:
            with ledger.locked(twin):
                with pytest.raises(pool_ledger.PoolBusy, match="session twin"), \
                        ledger.locked(Holder("near"), timeout=1):
                    pass
                holder = ledger.lock_holder()
                assert holder is not None and holder.holder.session == "twin"
                twin_reservation = ledger.renewed("reservation", "twin", "0123456789abcdef",
                                                  twin, 60, {})
                try:
                    assert [e.session for e in ledger.live("reservation")] == ["twin"]
                finally:
                    twin_reservation.close()
        finally:
            for c in docker_client.containers.list(
                    all=True, filters={"label": f"{pool_ledger.POOL_LABEL}={pool.name}"}):
                c.remove(force=True)


@pytest.mark.docker
def test_an_expired_lock_of_another_host_is_broken_and_a_live_one_is_not(docker_client,
                                                                         monkeypatch):
    pool = unique_pool("lease")
    elsewhere = Holder("far", host="another-host", pid=1)
    with Ledger.open(pool) as ledger:
        try:
            monkeypatch.setattr(pool_ledger, "LOCK_LEASE", 2.0)
            with ledger.locked(elsewhere):
                # the holder is on another host: alive as far as we can tell, until its lease
                with pytest.raises(pool_ledger.PoolBusy), \
                        ledger.locked(Holder("near"), timeout=0.5):
                    pass
                # the lease runs out on the engine's clock: the lock is broken
                time.sleep(2.2)
                with ledger.locked(Holder("near"), timeout=3):
                    holder = ledger.lock_holder()
                    assert holder is not None and holder.holder.session == "near"
        finally:
            for c in docker_client.containers.list(
                    all=True, filters={"label": f"{pool_ledger.POOL_LABEL}={pool.name}"}):
                c.remove(force=True)


@pytest.mark.docker
def test_a_renewed_entry_stays_one_live_marker_and_goes_when_closed(docker_client):
    pool = unique_pool("renew")
    with Ledger.open(pool) as ledger:
        entry = ledger.renewed("reservation", "s1", "abc", Holder("s1"), 0.9,
                               {"local": {"cpu": 500, "mem": 2, "gpus": [1]}})
        try:
            seen = set()
            for _ in range(12):  # ~4 renewals
                live = ledger.live("reservation")
                assert [e.session for e in live] == ["s1"], live
                assert live[0].holds == {"local": {"cpu": 500, "mem": 2, "gpus": [1],
                                                   "ports": []}}
                assert live[0].stack_id == "abc"
                seen.add(live[0].container_id)
                time.sleep(0.3)
            assert len(seen) >= 2  # renewed by new markers, never two at once
        finally:
            entry.close()
        assert ledger.live("reservation") == []
    assert markers(docker_client, pool) == []


@pytest.mark.docker
def test_pool_usage_shows_who_decides_what_is_reserved_and_the_queue(docker_client, tmp_path,
                                                                     capfd):
    import json

    from cluster_sessions.driver import cli

    pool = unique_pool("usage")
    pool_file = factories.write(tmp_path / "pool.yaml", pool.model_dump(mode="json",
                                                                       exclude_defaults=True))
    with Ledger.open(pool) as ledger:
        reserved = ledger.renewed("reservation", "s-res", "", Holder("s-res"), 60,
                                  {"local": {"cpu": 1500, "mem": 2**30, "gpus": [3]}})
        queued = ledger.renewed("queue", "s-wait", "", Holder("s-wait"), 60)
        try:
            with ledger.locked(Holder("s-lock")):
                assert cli.main(["pool", "usage", str(pool_file), "--json"]) == 0
                doc = json.loads(capfd.readouterr().out)["ledger"]
                assert cli.main(["pool", "usage", str(pool_file)]) == 0
                text = capfd.readouterr().out
        finally:
            reserved.close()
            queued.close()
    assert doc["lock"]["session"] == "s-lock"
    assert [(e["session"], e["holds"]) for e in doc["reservations"]] == [
        ("s-res", {"local": {"cpu": 1500, "mem": 2**30, "gpus": [3], "ports": []}})]
    assert [e["session"] for e in doc["queue"]] == ["s-wait"]
    assert "now by sessionctl up of session s-lock" in text
    assert "reserved for s-res by sessionctl up of session s-res" in text
    assert "local: cpu 1.5, mem 1.0g, gpus 3" in text
    assert "queued #1: s-wait" in text


@pytest.mark.parametrize("lease, arrival, want_lease", [
    ("nan", "nan", 0.0), ("inf", "-5", 0.0), ("1e12", "x", 0.0),
    ("400", "x", pool_ledger.MAX_LEASE), ("-1", "", 0.0), ("30", "12.5", 30.0)])
def test_a_markers_numbers_are_believed_only_within_bounds(lease, arrival, want_lease):
    from cluster_sessions.agents.engine import MarkerFacts

    labels = {pool_ledger.LEASE_LABEL: lease, pool_ledger.ARRIVAL_LABEL: arrival,
              pool_ledger.HOLDS_LABEL: '{"a1": {"cpu": "9", "mem": true, "gpus": [1, -1, '
                                       'true, "2", 3]}, "a2": 7}'}
    entry = pool_ledger.entry_of(MarkerFacts("id", "n", "2026-11-27T15:40:00Z", labels))
    assert entry.lease == want_lease
    assert entry.arrival == (12.5 if arrival == "12.5" else entry.created)
    # a holding that is not all sessionctl writes holds nothing, and the marker is malformed
    assert entry.holds == {} and any("holds" in m for m in entry.malformed), entry.malformed
    # an entry with a lease of nan or inf would never run out; bounded, it does
    assert entry.expired(entry.created + pool_ledger.MAX_LEASE + 1)


@pytest.mark.docker
def test_plan_probe_counts_what_an_up_under_way_has_reserved(docker_client, tmp_path, capfd):
    import json

    from cluster_sessions.driver import cli

    name = f"ledger-probe-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    pool_doc = factories.pool(name, factories.agent("local", cpu=2, mem="1000g"))
    pool_file = factories.write(tmp_path / "pool.yaml", pool_doc)
    path = factories.write(tmp_path / "s.yaml", factories.session(
        "probe-me", pool=str(pool_file), cpu=0.1, mem="600g"))
    assert cli.main(["plan", str(path), "--probe", "--json"]) == 0
    capfd.readouterr()
    pool = Pool.model_validate(pool_doc)
    with Ledger.open(pool) as ledger:
        reserved = ledger.renewed("reservation", "someone-else", "", Holder("someone-else"), 60,
                                  {"local": {"cpu": 100, "mem": 600 * 2**30, "gpus": []}})
        try:
            assert cli.main(["plan", str(path), "--probe", "--json"]) == 3
            doc = json.loads(capfd.readouterr().out)
        finally:
            reserved.close()
    assert doc["status"] == "pending" and "short of mem" in doc["reason"], doc
