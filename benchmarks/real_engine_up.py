"""``sessionctl up`` of train-demo through the real engine (issue 42, step 5): from nothing and
with no change, against the engine's own floor measured in the same run.

The floor is the real CLI's ``pulumi up`` of a Python program that registers nothing, in a
project of its own on the same kind of backend: the CLI, the language host and the SDK's
start-up, the stack's checkpoint, nothing of ours. What a session's ``up`` costs above it is
our driver (load, plan, placement under the pool's lock, the image step), our program and
the docker provider's work on the engine.

    .venv/bin/python benchmarks/real_engine_up.py [--runs 3]

Needs the CLI and the docker provider plugin (``bash scripts/setup.sh --install-pulumi``) and
the local Docker engine; run it on an idle machine. Prints one line per figure (median of the
runs, min-max) and the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parent.parent
DEMO = PROJECT / "stacks" / "sessions" / "train-demo.yaml"
FLOOR_PROGRAM = "import pulumi\n\npulumi.export('nothing', 0)\n"


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return took


def floor(pulumi: str, env: dict[str, str], work: Path) -> tuple[float, float]:
    """The bare engine's ``up`` of an empty program: a new stack, then no change."""
    project = work / f"floor-{uuid.uuid4().hex[:6]}"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(
        "name: floor\nruntime:\n  name: python\n")
    (project / "__main__.py").write_text(FLOOR_PROGRAM)
    stack = "floor"
    subprocess.run([pulumi, "stack", "init", stack], cwd=project, env=env, check=True,
                   capture_output=True)
    up = [pulumi, "up", "--yes", "--skip-preview", "--non-interactive", "-s", stack]
    first = timed(up, project, env)
    again = timed(up, project, env)
    subprocess.run([pulumi, "stack", "rm", "--yes", "--force", "-s", stack], cwd=project,
                   env=env, capture_output=True)
    return first, again


def session(env: dict[str, str], work: Path) -> tuple[float, float, float]:
    """``sessionctl up`` of a copy of train-demo from nothing, again, and its destroy."""
    doc = yaml.safe_load(DEMO.read_text())
    doc["name"] = f"bench-{uuid.uuid4().hex[:6]}"
    doc["pool"] = str(PROJECT / "stacks" / "pools" / "local.yaml")
    path = work / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    sessionctl = [sys.executable, "-m", "cluster_sessions.driver.cli"]
    first = timed([*sessionctl, "up", str(path), "--yes"], PROJECT, env)
    again = timed([*sessionctl, "up", str(path), "--yes"], PROJECT, env)
    gone = timed([*sessionctl, "destroy", str(path), "--yes", "--remove"], PROJECT, env)
    return first, again, gone


def line(label: str, values: list[float]) -> float:
    median = statistics.median(values)
    print(f"{label:<44} {median:6.2f} s  ({min(values):.2f}-{max(values):.2f}, "
          f"{len(values)} runs)")
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(PROJECT / "modules"))
    from cluster_sessions.driver.stacks import find_pulumi

    pulumi = find_pulumi(os.environ)
    if pulumi is None:
        sys.exit("no pulumi CLI: bash scripts/setup.sh --install-pulumi")
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        (work / "state").mkdir()
        env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{work / 'state'}",
               "PULUMI_CONFIG_PASSPHRASE": "bench", "PULUMI_SKIP_UPDATE_CHECK": "true",
               "PULUMI_PYTHON_CMD": sys.executable,
               "PYTHONPATH": str(PROJECT / "modules"),
               "PATH": f"{pulumi.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        floors = [floor(str(pulumi), env, work) for _ in range(args.runs)]
        sessions = [session(env, work) for _ in range(args.runs)]
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    f_new = line("floor: pulumi up, empty program, new stack", [f[0] for f in floors])
    f_same = line("floor: pulumi up, empty program, no change", [f[1] for f in floors])
    s_new = line("sessionctl up train-demo from nothing", [s[0] for s in sessions])
    s_same = line("sessionctl up train-demo, no change", [s[1] for s in sessions])
    line("sessionctl destroy train-demo --remove", [s[2] for s in sessions])
    print(f"ratio from nothing: {s_new / f_new:.2f}x the floor (the engine's share "
          f"{f_new / s_new:.0%})")
    print(f"ratio no change:    {s_same / f_same:.2f}x the floor (the engine's share "
          f"{f_same / s_same:.0%})")


if __name__ == "__main__":
    main()
