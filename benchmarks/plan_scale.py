"""Planning at scale: time and peak memory of validate + plan, 10 ... 10,000 containers.

Each case is a multi-node session spread over a pool whose agents hold 4 containers each, so
placement has to choose and fill many agents. The definition goes through the same path as
``sessionctl plan``: YAML text -> strict load -> validation -> plan.

    python benchmarks/plan_scale.py            # the table
    python benchmarks/plan_scale.py --repeat 7

Target (issue 2): 1,000 containers over 250 agents in under 0.2 s, growth close to linear.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc

from cluster_sessions.loader import parse_yaml, to_model
from cluster_sessions.plan import build_plan

CASES = [(10, 3), (100, 25), (1_000, 250), (10_000, 2_500)]


def pool_yaml(agents: int) -> str:
    lines = ["kind: AgentPool", "name: bench", "agents:"]
    for i in range(agents):
        lines.append(f"  - {{name: agent{i}, docker_host: 'tcp://10.0.{i // 250}.{i % 250}:2376',"
                     f" capacity: {{cpu: 16, mem: 64g, gpus: [0, 1, 2, 3]}}}}")
    lines.append("swarm: {manager: agent0}")
    return "\n".join(lines) + "\n"


def session_yaml(size: int) -> str:
    return (
        "kind: ClusterSession\nname: bench-session\npool: bench\nimage: img:1\n"
        f"cluster: {{mode: multi-node, size: {size}}}\n"
        "resources: {cpu: 4, mem: 16g, shmem: 1g, gpu: 1}\n"
        "env: {FOO: bar, OMP_NUM_THREADS: '4'}\n"
        "distributed: {master_port: 29500}\n"
    )


def validate_and_plan(session_text: str, pool_text: str):
    pool = to_model(parse_yaml(pool_text, "pool.yaml"), "pool.yaml", "AgentPool")
    session = to_model(parse_yaml(session_text, "s.yaml"), "s.yaml", "ClusterSession")
    return build_plan(session, pool)


def measure(size: int, agents: int, repeat: int) -> tuple[float, float, float]:
    session_text, pool_text = session_yaml(size), pool_yaml(agents)
    plan = validate_and_plan(session_text, pool_text)
    assert not plan.pending and len(plan.containers) == size and len(plan.agents) == agents
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        validate_and_plan(session_text, pool_text)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    validate_and_plan(session_text, pool_text)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), min(times), peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'containers':>10} {'agents':>7} {'median s':>9} {'min s':>8} {'peak MiB':>9} "
          f"{'us/container':>13}")
    rows = []
    for size, agents in CASES:
        median, fastest, peak = measure(size, agents, args.repeat)
        rows.append((size, median))
        print(f"{size:>10} {agents:>7} {median:>9.4f} {fastest:>8.4f} {peak:>9.1f} "
              f"{median / size * 1e6:>13.1f}")
    (small, t_small), (big, t_big) = rows[1], rows[-1]
    print(f"\ngrowth {small} -> {big} containers: x{t_big / t_small:.1f} time for "
          f"x{big / small:.0f} size (linear would be x{big / small:.0f})")
    t_1000 = dict(rows)[1_000]
    verdict = "meets" if t_1000 < 0.2 else "MISSES"
    print(f"1,000 containers over 250 agents: {t_1000:.3f} s ({verdict} the 0.2 s target)")


if __name__ == "__main__":
    main()
