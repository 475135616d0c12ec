"""What the pool's ledger adds to an uncontended ``up`` (issue 31: < 200 ms), on the local
engine, against a floor measured in the same run.

The ledger's part of an ``up`` (driver/placing.py ``placed``, without the probe of the agents,
which the preflight made before this issue too): open a client of the ledger agent, take the
lock (create a marker), read the queue and the reservations, check the lease, write the
reservation (create and inspect a marker), release the lock, and when the ``up`` ends close
the reservation (remove it). The floor: the same client doing the cheapest round trip the
engine offers (``GET /_ping``) as many times as the ledger makes calls, so the ratio says how
close the ledger is to the engine's own cost per call.

    python3 benchmarks/pool_lock.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "modules"))

from cluster_sessions.agents.pool_ledger import (  # noqa: E402
    RESERVATION_LEASE,
    Holder,
    Ledger,
)
from cluster_sessions.core.spec import Pool  # noqa: E402


def pool_named(name: str) -> Pool:
    return Pool.model_validate({"kind": "AgentPool", "name": name, "agents": [
        {"name": "local", "docker_host": "unix:///var/run/docker.sock",
         "capacity": {"cpu": 2, "mem": "4g"}}]})


def ledger_round(pool: Pool) -> tuple[float, int]:
    """One ``up``'s ledger work; seconds, and the engine calls it made."""
    calls = 0
    started = time.perf_counter()
    with Ledger.open(pool) as ledger:
        api = ledger.client.api
        counted = {}
        for name in ("create_container", "inspect_container", "remove_container",
                     "containers", "info", "inspect_image"):
            real = getattr(api, name)

            def wrap(*a, _real=real, **k):
                nonlocal calls
                calls += 1
                return _real(*a, **k)
            counted[name] = real
            setattr(api, name, wrap)
        holder = Holder("bench")
        with ledger.locked(holder) as taken:
            ledger.live("queue")
            ledger.live("reservation")
            assert ledger.still_locked(taken)
            entry = ledger.renewed("reservation", "bench", "", holder, RESERVATION_LEASE,
                                   {"local": {"cpu": 1000, "mem": 2**30, "gpus": []}})
        entry.close()
    return time.perf_counter() - started, calls


def floor_round(pool: Pool, calls: int) -> float:
    started = time.perf_counter()
    with Ledger.open(pool) as ledger:
        for _ in range(calls):
            ledger.client.api.ping()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    pool = pool_named(f"bench-{time.time_ns()}")
    ledger_round(pool)  # the marker image, imported once
    ledger_s, floor_s, calls = [], [], 0
    for _ in range(args.runs):
        took, calls = ledger_round(pool)
        ledger_s.append(took)
        floor_s.append(floor_round(pool, calls))
    led, flo = statistics.median(ledger_s), statistics.median(floor_s)
    print(f"ledger per uncontended up: median {led * 1000:.0f} ms (min {min(ledger_s) * 1000:.0f}"
          f", max {max(ledger_s) * 1000:.0f}) over {args.runs} runs, {calls} engine calls")
    print(f"floor ({calls} pings on one client): median {flo * 1000:.0f} ms")
    print(f"ratio ledger/floor: {led / flo:.2f}; target < 200 ms: "
          f"{'met' if led < 0.2 else 'missed'}")


if __name__ == "__main__":
    main()
