"""Bytes per container (issue 22): what each container is sent, and what the stack keeps.

For N = 8, 64, 256 and 1,024 containers (a multi-node session, 4 containers per agent, as
``plan_scale.py``), the real ``__main__.py`` runs once under the mock engine
(``tests.standin.engine``, a fresh stack), and the report gives per container:

- bundle bytes: the ``bundle.pack`` upload each container is declared with (the inputs the
  engine received), as the median and the largest over the session's containers;
- state bytes: the stack's state as the mock engine keeps it (every resource's id and outputs,
  JSON), divided by N; Pulumi's own checkpoint also keeps each resource's inputs (about as
  much again).

    python3 benchmarks/bundle_size.py               # N = 8, 64, 256, 1024
    python3 benchmarks/bundle_size.py --sizes 8 512

The bundle must stay the same size whatever N (at most 32 KiB per container:
``tests/test_session_ca.py``); the state then grows only by what every container's own
resource holds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
for _path in (PROJECT / "modules", PROJECT, PROJECT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from plan_scale import agents_for, pool_yaml, session_yaml  # noqa: E402

SIZES = [8, 64, 256, 1_024]
CONTAINER = "docker:index/container:Container"


def _plain(value):
    """Secrets (wrapped by the mock engine) as their values, for counting bytes."""
    from tests.standin.engine import plain

    return plain(value)


def measure(size: int, directory: Path) -> dict[str, float]:
    from tests.standin.engine import Engine, run_program

    name = f"bundle-{size}"
    pool = directory / f"pool-{size}.yaml"
    pool.write_text(pool_yaml(agents_for(size)))
    definition = directory / f"{name}.yaml"
    definition.write_text(session_yaml(size, name=name, pool=str(pool)))
    engine = Engine()
    start = time.perf_counter()
    run_program(engine, name, {"cluster-sessions:definition": str(definition)})
    took = time.perf_counter() - start
    bundles = []
    for reg in engine.of_type(CONTAINER):
        uploads = reg.plain_inputs.get("uploads") or []
        bundles.append(sum(len(str(u.get("content", "")).encode()) for u in uploads))
    assert len(bundles) == size
    state = len(json.dumps({urn: [id_, _plain(outs)] for urn, (id_, outs)
                            in engine.state.items()}, default=str).encode())
    return {"bundle_median": statistics.median(bundles), "bundle_max": max(bundles),
            "state": state, "seconds": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    args = parser.parse_args()
    print("## bytes per container: the upload each container is sent, and the stack's state\n")
    print("| containers | bundle bytes (median) | bundle bytes (largest) | state bytes | "
          "state bytes / container | program s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bundle-size-") as tmp:
        # the benchmark's pool is in its own directory: the operator's, for this run
        os.environ["CLUSTER_SESSIONS_POOLS"] = os.pathsep.join(
            filter(None, [tmp, os.environ.get("CLUSTER_SESSIONS_POOLS")]))
        for size in args.sizes:
            m = measure(size, Path(tmp))
            print(f"| {size:,} | {m['bundle_median']:,.0f} | {m['bundle_max']:,.0f} | "
                  f"{m['state']:,.0f} | {m['state'] / size:,.0f} | {m['seconds']:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
