"""Time to a ready cluster through ``sessionctl up`` on the real Pulumi engine (issue 45's
second harness), against the floor measured in the same run.

``ready_time.py`` builds what the program declares with the stand-in's ``DockerBuilder``; this
one starts the containers as users do: ``sessionctl up DEF --yes`` (the real CLI, the Python
language host, the docker provider plugin, our program and dynamic providers) of train-demo at
size N on the local engine. For each N (default 2, 4, 8) and run (default 3), interleaved:

(a) floor: ``ready_time.floor_run``: a fresh bridge, N plain containers created and started
    in parallel, until every start call has returned;
(b) session: from the engine's creation of the session's network (its ``Created``) until every
    container has logged its entrypoint's ``ready:`` line (Docker's timestamps): ready_time's
    span (b) without its ssh round, here with the real engine's scheduling between the
    resources. The bundles' delivery runs beside the network (the containers depend on both).

Beside (b), from Docker's own records: the first and last container's creation (``Created``),
the last container running (``StartedAt``), the delivery's end (the last host directory's
change under ``<scratch>/<stack id>/``) after the network, and ``put_archive`` calls (an
upload; 0 where the agent delivers into its scratch root). The whole ``up`` (CLI start-up,
load, plan, placement under the pool's lock, image step, program, engine) is shown beside, not
in (b). Each session is destroyed (``--remove``) before the next run.

    .venv/bin/python benchmarks/ready_up.py [--sizes 2,4,8] [--runs 3]

Needs the CLI and the docker provider plugin (``bash scripts/setup.sh --install-pulumi``), the
local engine and the test image (``bash scripts/setup.sh``); run it on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quiet import settle  # noqa: E402
from ready_time import PREFIX, READY, docker_time, floor_run, sweep_prefix, write_definition  # noqa: E402


def session_env(work: Path, pulumi: Path) -> dict[str, str]:
    (work / "state").mkdir(exist_ok=True)
    return {**os.environ, "PULUMI_BACKEND_URL": f"file://{work / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": "bench", "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_PYTHON_CMD": sys.executable, "PYTHONPATH": str(PROJECT / "modules"),
            # the benchmark is the operator: its pool's directory is one pools are read from
            "CLUSTER_SESSIONS_POOLS": str(work),
            "PATH": f"{pulumi.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def ready_lines(api, cid: str, deadline: float) -> float:
    """Docker's timestamp of the container's ``ready:`` line, once it has logged it."""
    while time.monotonic() < deadline:
        for line in api.logs(cid, timestamps=True).decode(errors="replace").splitlines():
            stamp, _, message = line.partition(" ")
            if READY.search(message):
                return docker_time(stamp)
        time.sleep(0.05)
    raise RuntimeError(f"container {cid[:12]} logged no ready: line")


def session_run(client, work: Path, env: dict[str, str], image: str, size: int, tag: str,
                cpu: float) -> dict[str, float]:
    from cluster_sessions.core.loader import load_session
    from cluster_sessions.core.names import HOST_LABEL, SESSION_LABEL
    from cluster_sessions.core.plan import build_plan

    definition = write_definition(work, tag, size, image, cpu)
    loaded = load_session(definition, work / "pool.yaml")
    scratch = Path(loaded.pool.scratch)
    name = build_plan(loaded.session, loaded.pool).name
    sessionctl = [sys.executable, "-m", "cluster_sessions.driver.cli"]
    api = client.api
    t0 = time.time()
    done = subprocess.run([*sessionctl, "up", str(definition), "--yes"], cwd=PROJECT,
                          env=env, capture_output=True, text=True)
    up_wall = time.time() - t0
    try:
        if done.returncode != 0:
            raise SystemExit(f"sessionctl up failed ({done.returncode}):\n{done.stderr[-3000:]}")
        found = api.containers(all=True, filters={"label": f"{SESSION_LABEL}={name}"})
        if len(found) != size:
            raise SystemExit(f"{tag}: {len(found)} containers, not {size}")
        inspected = [api.inspect_container(c["Id"]) for c in found]
        (net_name,) = {n for c in inspected for n in c["NetworkSettings"]["Networks"]}
        t_net = docker_time(api.inspect_network(net_name)["Created"])
        deadline = time.monotonic() + 150
        ready = [ready_lines(api, c["Id"], deadline) for c in inspected]
        created = [docker_time(c["Created"]) for c in inspected]
        running = [docker_time(c["State"]["StartedAt"]) for c in inspected]
        hosts = [c["Config"]["Labels"][HOST_LABEL] for c in inspected]
        stack_dirs = [d for d in scratch.iterdir() if (d / hosts[0]).is_dir()] \
            if scratch.is_dir() else []
        delivered = max((os.stat(d / h).st_ctime for d in stack_dirs for h in hosts
                         if (d / h).exists()), default=None)
        return {"session": max(ready) - t_net, "up": up_wall,
                "before_network": t_net - t0,
                "first_created": min(created) - t_net, "last_created": max(created) - t_net,
                "all_running": max(running) - t_net,
                "after_running": max(ready) - max(running),
                "delivered": (delivered - t_net) if delivered is not None else float("nan")}
    finally:
        subprocess.run([*sessionctl, "destroy", str(definition), "--yes", "--remove"],
                       cwd=PROJECT, env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpu", type=float, default=0.5, help="cpu per container (default 0.5)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(PROJECT / "modules"))
    import docker

    from cluster_sessions.driver.stacks import find_pulumi

    pulumi = find_pulumi(os.environ)
    if pulumi is None:
        sys.exit("no pulumi CLI: bash scripts/setup.sh --install-pulumi")
    image = yaml_image()
    client = docker.from_env(timeout=300)
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[int, dict[str, list]] = {n: {"floor": [], "session": []} for n in sizes}
    busy: list[float] = []
    prefix = f"{PREFIX}{uuid.uuid4().hex[:6]}"
    counter = iter(range(10**6))
    with tempfile.TemporaryDirectory(prefix="bench-up-") as tmp:
        work = Path(tmp)
        env = session_env(work, pulumi)
        try:
            for run in range(args.runs):
                for n in sizes:
                    busy.append(settle(20))
                    floor = floor_run(client, image, n, f"{prefix}-{next(counter)}")
                    results[n]["floor"].append(floor)
                    busy.append(settle(20))
                    results[n]["session"].append(session_run(
                        client, work, env, image, n, f"{prefix}-{next(counter)}", args.cpu))
                    s = results[n]["session"][-1]
                    print(f"run {run + 1} N={n}: floor {floor.total:.2f} s, session "
                          f"{s['session']:.2f} s (up {s['up']:.1f} s)", file=sys.stderr)
        finally:
            with contextlib.suppress(Exception):
                sweep_prefix(client, prefix)
    report(results, busy, args.runs)
    return 0


def yaml_image() -> str:
    import yaml
    return yaml.safe_load((PROJECT / "stacks/sessions/train-demo.yaml").read_text())["image"]


def med(values) -> float:
    return statistics.median(values)


def report(results: dict[int, dict[str, list]], busy: list[float], runs: int) -> None:
    print(f"machine busy before each run: median {med(busy):.0%}, max {max(busy):.0%}; "
          f"load average at the end {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"{runs} runs per size")
    print("| N | floor (a) | session (b) | b/a (medians) | b/a per run | first / last created "
          "| all running | last ready after running | delivery done | floor create / start "
          "| whole up | before the network |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in results.items():
        f = r["floor"]
        s = r["session"]
        a = med(x.total for x in f)
        b = med(x["session"] for x in s)
        per = [x["session"] / y.total for x, y in zip(s, f, strict=True)]
        print(f"| {n} | {a:.2f} | {b:.2f} | **{b / a:.2f}** | {med(per):.2f} "
              f"[{min(per):.2f}-{max(per):.2f}] | {med(x['first_created'] for x in s):.2f} / "
              f"{med(x['last_created'] for x in s):.2f} | {med(x['all_running'] for x in s):.2f} "
              f"| {med(x['after_running'] for x in s):.2f} | "
              f"{med(x['delivered'] for x in s):.2f} | {med(x.create for x in f):.3f} / "
              f"{med(x.start for x in f):.3f} | {med(x['up'] for x in s):.1f} | "
              f"{med(x['before_network'] for x in s):.1f} |")
    print("(seconds; the session's span and its parts from the network's creation; "
          "'delivery done' is the last host directory's change under the scratch root)")


if __name__ == "__main__":
    sys.exit(main())
