"""Reading what a pool holds before a placement (issue 31: 32 agents probed in < 2 s), on a
netns lab of N agents reached over SSH as a real pool is, against a floor measured in the same
run: one agent probed alone.

Every placement of an ``up`` probes every agent of the pool in parallel
(agents/capacity.py ``probe_pool``: SSH, ``docker info``, the session containers' labels,
CPUs, memory, GPUs). The ratio all/one says how much the parallel probe costs beyond one
agent's; the lab shares this machine's cores, so on real hosts it can only be lower.

    python3 benchmarks/probe_pool.py [--agents 32] [--runs 5]     # as root: it starts a lab
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "modules"))

from cluster_sessions.agents.capacity import probe_agent, probe_pool  # noqa: E402
from cluster_sessions.core.loader import load_file  # noqa: E402
from cluster_sessions.lab import netns  # noqa: E402

PREFIX, SUBNET = "cspb", "10.251.109.0/24"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="probe-bench-"))
    started = time.monotonic()
    info = netns.lab_up(args.agents, state, state / "lab.yaml", prefix=PREFIX, subnet=SUBNET)
    print(f"lab of {args.agents} agents up in {time.monotonic() - started:.1f}s")
    try:
        pool = load_file(info.pool_file, expect="AgentPool")
        probe_pool(pool)  # known hosts, first connections: not what an up pays each time
        alone, whole = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            report = probe_agent(pool.agents[0])
            alone.append(time.perf_counter() - t0)
            assert report.ok, report.problems
            t0 = time.perf_counter()
            reports = probe_pool(pool)
            whole.append(time.perf_counter() - t0)
            assert all(r.ok for r in reports), [p for r in reports for p in r.problems]
        one, all_ = statistics.median(alone), statistics.median(whole)
        print(f"one agent alone: median {one:.2f}s (min {min(alone):.2f})")
        print(f"all {args.agents} in parallel: median {all_:.2f}s (min {min(whole):.2f}, "
              f"max {max(whole):.2f}) over {args.runs} runs")
        print(f"ratio all/one: {all_ / one:.2f}; target < 2 s: "
              f"{'met' if all_ < 2 else 'missed'}")
    finally:
        netns.lab_down(state)


if __name__ == "__main__":
    main()
