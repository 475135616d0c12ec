"""What one sample of a session costs (issue 43: a 3-agent lab pool of 32 containers sampled
in <= 3 s wall, one SSH connection per agent), on a netns lab reached over SSH as a real pool
is.

A sample (agents/sampling.py, what ``sessionctl top``, ``ls --sample`` and ``pool usage``
take) is, on every agent at once: one SSH connection, the session's containers listed by
label, one command on one channel that reads each container's cgroup files and
``/proc/PID/net/dev`` twice ``--interval`` apart (the engine's stats API only for a container
whose files it could not read), main1's sshd log tail and ``/proc/net/tcp`` meanwhile, and
``nvidia-smi`` where a container holds GPUs. The containers are plain ones carrying the
session's labels (sleeping): the cost measured is the sampling's, not a workload's. Reported:
wall time per sample (median, min, max over ``--runs``), the part of it that is the interval
itself, where the figures came from (``cgroup`` files or the stats ``api``), and the SSH
connections each agent's connector opened (1 = the connection was never outgrown).
``--pause`` spaces the samples as a one-off ``top --once`` or ``pool usage`` finds the engines
(0: back to back, as a fast ``top --watch``); it mattered when the readings were the stats
API's one-shot calls, answered at the engine's once-a-second collector tick (design notes,
"What a session uses, live"). ``--api`` measures that way (the files not read) for comparison.
The lab shares this machine's cores: on real hosts it can only be lower.

    python3 benchmarks/sample_cost.py [--agents 3] [--containers 32] [--runs 5]   # as root
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "modules"))

from cluster_sessions.agents import sampling  # noqa: E402
from cluster_sessions.core.loader import load_file  # noqa: E402
from cluster_sessions.driver.cli import quiet_libraries  # noqa: E402
from cluster_sessions.lab import netns  # noqa: E402
from cluster_sessions.lab.image import ensure_images  # noqa: E402

PREFIX, SUBNET = "csuc", "10.251.143.0/24"
SESSION = "bench-sample"


def main() -> None:
    import docker

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--containers", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--pause", type=float, default=1.5,
                        help="seconds between samples (default 1.5): the engine answers a "
                        "one-shot stats call at once when its stats collector is idle, else "
                        "at its next tick, up to a second later (0: samples back to back)")
    parser.add_argument("--api", action="store_true",
                        help="read through the engine's stats API only (as before the cgroup "
                        "read), for comparison")
    parser.add_argument("--show", action="store_true",
                        help="also print `top --once` and `pool usage` of the lab")
    args = parser.parse_args()
    quiet_libraries()  # paramiko logs a refused channel open; sessionctl keeps it quiet too
    if args.api:  # no cgroup read: every container through the stats API
        sampling._cgroup_readings = lambda connector, running, interval: {}
    state = Path(tempfile.mkdtemp(prefix="sample-bench-"))
    started = time.monotonic()
    info = netns.lab_up(args.agents, state, state / "lab.yaml", prefix=PREFIX, subnet=SUBNET)
    print(f"lab of {args.agents} agents up in {time.monotonic() - started:.1f}s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    local = [docker.DockerClient(base_url=f"unix://{a.socket}", timeout=600)
             for a in info.agents]
    try:
        image = ensure_images(local, progress=lambda _m: None)
        for i in range(args.containers):
            host = "main1" if i == 0 else f"sub{i}"
            local[i % len(local)].containers.run(
                image, ["sleep", "infinity"], detach=True, name=f"{SESSION}-{host}",
                nano_cpus=100_000_000, mem_limit="64m",
                labels={"cluster-sessions.session": SESSION, "cluster-sessions.host": host,
                        "cluster-sessions.role": "main" if i == 0 else "sub",
                        "cluster-sessions.cpu": "0.1", "cluster-sessions.mem": str(64 << 20)})
        pool = load_file(info.pool_file, expect="AgentPool")
        sampling.sample(pool.agents, SESSION, interval=args.interval)  # first connections
        walls, counts, sources = [], [], Counter()
        for _ in range(args.runs):
            time.sleep(args.pause)
            t0 = time.perf_counter()
            got = sampling.sample(pool.agents, SESSION, interval=args.interval)
            walls.append(time.perf_counter() - t0)
            assert got.ok, got.unreachable
            measured = [c for c in got.containers if c.cpu_percent is not None]
            assert len(measured) == args.containers, (len(measured), got.containers[:2])
            counts.append(max(got.connections.values()))  # as each connector had them
            sources.update(c.source for c in measured)
        med = statistics.median(walls)
        print(f"{args.containers} containers on {args.agents} agents: median {med:.2f}s "
              f"(min {min(walls):.2f}, max {max(walls):.2f}) over {args.runs} samples, of which "
              f"{args.interval:g}s is the interval between the two readings; "
              f"{args.pause:g}s between samples")
        print("readings from: " + ", ".join(f"{k} {n}" for k, n in sorted(sources.items())))
        print(f"SSH connections per agent: at most {max(counts)}; target <= 3 s wall: "
              f"{'met' if med <= 3 else 'missed'}; load average now "
              f"{os.getloadavg()[0]:.1f}")
        if args.show:  # what the verbs print of this lab (the closing note)
            from cluster_sessions.driver import cli

            definition = state / f"{SESSION}.yaml"
            definition.write_text(
                f"kind: ClusterSession\nname: {SESSION}\npool: local\nimage: {image}\n"
                f"cluster: {{mode: single-node, size: {args.containers}}}\n"
                "resources: {cpu: 0.1, mem: 64m, shmem: 8m}\n")
            cli.main(["top", str(definition), "--pool", str(info.pool_file), "--once"])
            cli.main(["pool", "usage", str(info.pool_file)])
    finally:
        for c in local:
            c.close()
        netns.lab_down(state)


if __name__ == "__main__":
    main()
