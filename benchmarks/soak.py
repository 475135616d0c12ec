"""Load and soak on a netns lab: sessions brought up at once, then up/destroy cycles.

Brings up its own 2-agent lab (prefix ``cslk``, 10.251.105.0/24; root), then

1. load: ``--sessions`` sessions of ``--size`` containers, each ``sessionctl up`` in a process
   of its own (the installed ``sessionctl`` through the real engine, stacks in one file
   backend), all at once; every
   session ready (ssh from main1 to the last host); then all destroyed at once;
2. soak: ``--cycles`` cycles of ``up`` + ready + ``destroy`` of one session on agent1.

Prints, per phase: failures, wall time, and after every cycle the engine objects left beyond
the lab's own (containers, networks, volumes, container network namespaces, processes in the
agents' cgroups: all must be 0), the first and last cycle's time and dockerd's resident memory
before and after. ``--json`` prints one document instead.

    python3 benchmarks/soak.py                                  # CI size: 4 x 2, 5 cycles
    python3 benchmarks/soak.py --sessions 16 --size 4 --cycles 50   # the documented run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT / "modules"))

import yaml  # noqa: E402

from cluster_sessions.core.names import LABEL_PREFIX  # noqa: E402
from cluster_sessions.lab import netns, processes  # noqa: E402
from cluster_sessions.lab.layout import LabInfo  # noqa: E402

PREFIX, SUBNET = "cslk", "10.251.105.0/24"
DEFAULTS = ("bridge", "host", "none", "docker_gwbridge", "ingress")


def objects(info: LabInfo, clients: list) -> dict[str, int]:
    counts = {"containers": 0, "networks": 0, "volumes": 0, "netns": 0, "processes": 0}
    for agent, client in zip(info.agents, clients, strict=True):
        counts["containers"] += len(client.containers.list(all=True))
        counts["networks"] += len([n for n in client.networks.list() if n.name not in DEFAULTS])
        counts["volumes"] += len(client.volumes.list())
        sandboxes = Path(f"/run/csl-lab/{PREFIX}") / f"x{agent.index}" / "netns"
        if sandboxes.is_dir():
            counts["netns"] += len(list(sandboxes.iterdir()))
        counts["processes"] += len(processes.pids_in_cgroups(agent.netns))
    return counts


def dockerd_rss_kib(state: Path) -> int:
    rec = json.loads((state / "lab.json").read_text())
    total = 0
    for pids in rec["pids"].values():
        lines = Path(f"/proc/{pids['dockerd']}/status").read_text().splitlines()
        total += int(next(x.split()[1] for x in lines if x.startswith("VmRSS:")))
    return total


SESSIONCTL = shutil.which("sessionctl") or str(PROJECT / ".venv" / "bin" / "sessionctl")


def sessionctl(env: dict, *argv: str) -> subprocess.Popen:
    """The installed ``sessionctl`` (scripts/setup.sh links it on the ``PATH``), as a user
    runs it."""
    return subprocess.Popen([SESSIONCTL, *argv],
                            cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def ready(clients: list, name: str, timeout: float = 150) -> bool:
    """main1 reaches the last host by ssh."""
    label = f"{LABEL_PREFIX}.session={name}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {c.labels[f"{LABEL_PREFIX}.host"]: c for client in clients
                 for c in client.containers.list(all=True, filters={"label": label})}
        if "main1" in found:
            last = sorted(found)[-1]
            code, _ = found["main1"].exec_run(
                ["sh", "-c", f"ssh -o BatchMode=yes -o ConnectTimeout=5 {last} true"],
                user="work")
            if code == 0:
                return True
        time.sleep(0.5)
    return False


def definition(directory: Path, pool: Path, image: str, name: str, size: int) -> str:
    doc = {"kind": "ClusterSession", "name": name, "pool": str(pool), "image": image,
           "cluster": {"mode": "single-node", "size": size},
           "resources": {"cpu": 0.25, "mem": "128m", "shmem": "32m"}}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def run_all(env: dict, verb: str, paths: list[str]) -> tuple[int, float, list[str]]:
    t0 = time.monotonic()
    procs = [sessionctl(env, verb, p, "--yes") for p in paths]
    errors = [err for p in procs if (err := p.communicate()[1]) and p.returncode != 0]
    return len(errors), time.monotonic() - t0, errors


def main(argv: list[str] | None = None) -> int:
    import docker

    from cluster_sessions.lab.image import ensure_images

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--size", type=int, default=2)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    say = (lambda _m: None) if args.json else (lambda m: print(m, flush=True))

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    info = netns.lab_up(2, work / "lab", work / "lab.yaml", prefix=PREFIX, subnet=SUBNET)
    clients = []
    try:
        doc = yaml.safe_load(info.pool_file.read_text())
        cpu = max(args.sessions * args.size * 0.25, 1)
        for a in doc["agents"]:
            a["capacity"] = {"cpu": cpu, "mem": "64g", "gpus": []}
        # Each session is its own stack, planned on the pool's declared capacity (not on what
        # the others just took), so concurrent ups of one pool all pick its first agent:
        # half the sessions get a pool of agent1 only, half one of agent2 only.
        halves = []
        for agent in doc["agents"]:
            half = work / f"soak-pool-{agent['name']}.yaml"
            half.write_text(yaml.safe_dump({**doc, "name": f"soak-{agent['name']}",
                                            "agents": [agent], "swarm": None},
                                           sort_keys=False))
            halves.append(half)
        pool = halves[0]
        local = [docker.DockerClient(base_url=f"unix://{a.socket}", timeout=300)
                 for a in info.agents]
        clients = local
        image = ensure_images(local, progress=lambda _m: None)
        (work / "state").mkdir()
        env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{work / 'state'}",
               "PULUMI_CONFIG_PASSPHRASE": "soak", "PULUMI_SKIP_UPDATE_CHECK": "true"}
        baseline = objects(info, clients)
        rss_before = dockerd_rss_kib(work / "lab")
        report: dict = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                                    "python": platform.python_version()},
                        "baseline": baseline}

        names = [f"soak{i}-{uuid.uuid4().hex[:4]}" for i in range(args.sessions)]
        paths = [definition(work, halves[i % len(halves)], image, n, args.size)
                 for i, n in enumerate(names)]
        failed, up_s, errors = run_all(env, "up", paths)
        not_ready = [n for n in names if not ready(clients, n)]
        down_failed, down_s, down_errors = run_all(env, "destroy", paths)
        report["load"] = {"sessions": args.sessions, "containers_each": args.size,
                          "up_failures": failed, "not_ready": len(not_ready),
                          "up_all_s": round(up_s, 1), "destroy_failures": down_failed,
                          "destroy_all_s": round(down_s, 1),
                          "left": {k: v - baseline[k] for k, v in objects(info, clients).items()},
                          "errors": (errors + down_errors)[:3]}
        say(f"load: {json.dumps(report['load'])}")

        name = f"soak-{uuid.uuid4().hex[:4]}"
        path = definition(work, pool, image, name, args.size)
        times, failures, leaks = [], 0, 0
        for i in range(args.cycles):
            t0 = time.monotonic()
            ok = sessionctl(env, "up", path, "--yes").wait() == 0 and ready(clients, name)
            ok = sessionctl(env, "destroy", path, "--yes").wait() == 0 and ok
            times.append(time.monotonic() - t0)
            failures += not ok
            left = {k: v - baseline[k] for k, v in objects(info, clients).items()
                    if v != baseline[k]}
            leaks += bool(left)
            say(f"cycle {i + 1}: {times[-1]:.1f}s {'ok' if ok else 'FAILED'} left={left}")
        report["soak"] = {"cycles": args.cycles, "failures": failures,
                          "cycles_with_leftovers": leaks, "first_cycle_s": round(times[0], 1),
                          "last_cycle_s": round(times[-1], 1),
                          "median_cycle_s": round(sorted(times)[len(times) // 2], 1),
                          "dockerd_rss_kib_before": rss_before,
                          "dockerd_rss_kib_after": dockerd_rss_kib(work / "lab")}
        say(f"soak: {json.dumps(report['soak'])}")
        if args.json:
            print(json.dumps(report, indent=2))
        bad = (report["load"]["up_failures"] or report["load"]["not_ready"] or failures
               or leaks or any(report["load"]["left"].values()))
        return 1 if bad else 0
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()
        netns.lab_down(work / "lab")


if __name__ == "__main__":
    sys.exit(main())
