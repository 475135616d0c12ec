"""Mutation testing of ``core/`` and ``agents/`` against the offline tests (docs/testing.md).

mutmut changes one thing at a time in the code (``<`` to ``<=``, a string, a dropped argument)
and runs the tests that reach that function: a change no test notices ("survived") is
behaviour nobody checks. A habit, not a CI step: a full ``core`` run takes the better part of
an hour on two cores.

mutmut names a mutant's module after its file path, with ``src/`` stripped, so it runs in a
staging copy of the checkout whose package sits in ``src/`` (``.mutation/<target>/``, ignored
by git and ruff); the checkout itself is never changed. The score is printed per module and
in total; ``--list`` prints the surviving mutants' names (``mutmut show NAME`` in the staging
directory prints one's diff).

    .venv/bin/python scripts/mutation.py core                      # all of core/
    .venv/bin/python scripts/mutation.py core --only placement,units
    .venv/bin/python scripts/mutation.py agents --max-children 2
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
PACKAGE = PROJECT / "modules" / "cluster_sessions"

# The offline tests that exercise each module: mutmut runs, for each mutant, only those of them
# that reached the mutated function while it collected its statistics; a module run with
# --only takes its own tests alone, which keeps a survivor (every test it reaches runs) cheap.
MODULE_TESTS = {
    "core": {
        "accounts": ["test_accounts.py", "test_loader.py"],
        "admission": ["test_admission.py"],
        "bundles": ["test_bundles.py"],
        "capacity_types": ["test_placement.py", "test_selectors.py"],
        "clusterenv": ["test_clusterenv.py", "test_plan.py", "test_cluster_env_sh.py"],
        "container_args": ["test_container_args.py", "test_provider_facts.py"],
        "decisions": ["test_decisions.py", "test_session.py"],
        "errors": ["test_errors.py"],
        "flowchart": ["test_flowchart.py", "test_review.py"],
        "idleness": ["test_idleness.py"],
        "images": ["test_images.py", "test_decisions.py"],
        "folders": ["test_folders.py", "test_loader.py"],
        "governance": ["test_governance_rules.py", "test_projects.py", "test_quotas.py",
                       "test_priority.py", "test_lifetime.py"],
        "keys": ["test_keystore.py", "test_session_ca.py", "test_access.py", "test_render.py"],
        "ledger": ["test_ledger_core.py"],
        "loader": ["test_loader.py", "test_schema_agreement.py", "test_one_definition.py"],
        "names": ["test_names.py", "test_container_args.py", "test_plan.py", "test_loader.py"],
        "placement": ["test_placement.py", "test_plan.py"],
        "plan": ["test_plan.py", "test_container_args.py", "test_jobs.py", "test_observe.py"],
        "preemption": ["test_preemption.py"],
        "problems": ["test_problems.py", "test_loader.py"],
        "provider_facts": ["test_provider_facts.py", "test_container_args.py"],
        "render": ["test_render.py", "test_render_verb.py", "test_cluster_env_sh.py"],
        "review": ["test_review.py", "test_provider_facts.py"],
        "scheduling": ["test_scheduling.py"],
        "selectors": ["test_selectors.py", "test_placement.py"],
        "services": ["test_services.py", "test_loader.py"],
        "spec": ["test_spec.py", "test_loader.py", "test_schema_agreement.py", "test_plan.py"],
        "stats": ["test_stats.py"],
        "terminal": ["test_terminal.py", "test_review.py"],
        "units": ["test_units.py", "test_loader.py"],
        "usage": ["test_usage.py"],
    },
    "agents": {
        "bundles": ["test_bundles.py"],
        "capacity": ["test_agents_facts.py", "test_pool_verbs.py", "test_cli.py"],
        "cleanup": ["test_cleanup.py"],
        "connectors": ["test_agents_facts.py", "test_reach.py", "test_swarm.py"],
        "docker_transport": ["test_engine.py", "test_top.py"],
        "early_limits": ["test_early_limits.py"],
        "engine": ["test_engine.py", "test_agents_facts.py", "test_cleanup.py",
                   "test_early_limits.py"],
        "errors": ["test_agents_facts.py"],
        "facts": ["test_agents_facts.py", "test_pool_verbs.py"],
        "folders": ["test_agents_folders.py"],  # the engine's side: no offline test reaches it
        "gathering": ["test_agents_facts.py"],
        "images": ["test_images.py"],
        "polling": ["test_polling.py"],
        "pool_ledger": ["test_pool_ledger.py", "test_service_ports.py"],
        "reach": ["test_reach.py", "test_access.py"],
        "sampling": ["test_top.py"],
    },
    # the Pulumi layer's providers and the program's graph under the SDK's mocks (its
    # real-engine tests are left out, as everywhere here)
    "pulumi_layer": {
        "bundles": ["test_bundles.py", "test_engine_resource.py"],
        "engine_resource": ["test_engine_resource.py"],
        "folders": ["test_folders.py", "test_engine_resource.py"],
        "keystore": ["test_keystore.py"],
        "limits": ["test_limits.py", "test_engine_resource.py"],
        "network": ["test_network.py", "test_provider_facts.py", "test_engine_resource.py"],
        "pool_program": ["test_pool_verbs.py", "test_multinode.py"],
        "program": ["test_session.py", "test_errors.py", "test_pool_trust.py"],
        "session": ["test_session.py"],
        "swarm": ["test_swarm.py", "test_engine_resource.py"],
        "volumes": ["test_volumes.py", "test_engine_resource.py"],
    },
}
# What the tests read besides the package (templates, pools, examples, the README's commands).
ALSO_COPY = ["tests", "templates", "stacks", "examples", "docs", "README.md", "Pulumi.yaml",
             "__main__.py", "requirements.txt", "requirements-dev.txt", "scripts", ".ci"]
OFFLINE = ["-m", "not docker and not lab", "-p", "no:cacheprovider", "-x", "-q", "-n", "0"]


def stage(target: str, only: list[str], staging: Path) -> None:
    """A copy of the checkout with the package in ``src/`` and mutmut's settings."""
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    shutil.copytree(PACKAGE, staging / "src" / "cluster_sessions",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ALSO_COPY:
        source = PROJECT / name
        if source.is_dir():
            shutil.copytree(source, staging / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, staging / name)
    pyproject = (PROJECT / "pyproject.toml").read_text()
    pyproject = pyproject.replace('pythonpath = ["modules", "."]', 'pythonpath = ["src", "."]')
    pyproject = pyproject.replace('where = ["modules"]', 'where = ["src"]')
    layer = f"src/cluster_sessions/{target}/"
    mutate = [f"{layer}{m}.py" for m in only] if only else [f"{layer}*"]
    chosen = only or sorted(MODULE_TESTS[target])
    tests = sorted({f"tests/{t}" for m in chosen for t in MODULE_TESTS[target][m]})
    also = ["templates", "stacks", "examples", "docs", "README.md", "Pulumi.yaml", "__main__.py",
            "requirements.txt", "requirements-dev.txt", "scripts", ".ci", "src"]
    pyproject += "\n[tool.mutmut]\n" + "\n".join([
        f"source_paths = {json.dumps([layer])}",
        f"only_mutate = {json.dumps(mutate)}",
        f"also_copy = {json.dumps(also)}",
        f"pytest_add_cli_args = {json.dumps(OFFLINE)}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        "use_git_change_detection = false",
        # a worker forked from the process that ran the statistics hangs (a lock held by a
        # thread that fork does not copy); a dedicated fork server does not
        'process_isolation = "forkserver"',
        "timeout_multiplier = 5.0",
        "timeout_constant = 10.0",
    ]) + "\n"
    (staging / "pyproject.toml").write_text(pyproject)
    # subprocesses (``python -m cluster_sessions...``) import the mutated package too
    conftest = staging / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text().replace('PROJECT / "modules"', 'PROJECT / "src"')
                        + QUICKEST_FIRST)


QUICKEST_FIRST = '''

def pytest_collection_modifyitems(session, config, items):
    """(scripts/mutation.py) A mutant's tests, quickest first: mutmut stops at the first
    failure, so a mutant a quick test kills costs that test, not the slow ones before it.
    The durations are those mutmut's statistics run recorded."""
    import json as _json
    from pathlib import Path as _Path

    stats = _Path("mutmut-stats.json")
    if stats.is_file():
        durations = _json.loads(stats.read_text()).get("duration_by_test", {})
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))
'''


def tally(staging: Path) -> dict[str, Counter]:
    """Mutant statuses per module, from ``mutmut results --all true``."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"],
                         cwd=staging, capture_output=True, text=True, check=True).stdout
    per_module: dict[str, Counter] = {}
    for line in out.splitlines():
        found = re.match(r"\s+cluster_sessions\.\w+\.(\w+)\.\S+: (.+)$", line)
        if found:
            per_module.setdefault(found[1], Counter())[found[2].strip()] += 1
    return per_module


def survivors(staging: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=staging,
                         capture_output=True, text=True, check=True).stdout
    return [line.split(":")[0].strip() for line in out.splitlines() if line.strip()]


def report(per_module: dict[str, Counter]) -> str:
    """Killed, survived (everything a test did not notice) and the surviving share."""
    rows = ["module            mutants  killed  survived  surviving"]
    total = Counter()
    for module, counts in sorted(per_module.items()):
        total.update(counts)
        rows.append(row(module, counts))
    rows.append(row("total", total))
    return "\n".join(rows)


def row(name: str, counts: Counter) -> str:
    mutants = sum(counts.values())
    killed = counts["killed"] + counts["timeout"] + counts["caught by type check"]
    survived = mutants - killed
    share = 100 * survived / mutants if mutants else 0.0
    return f"{name:<17} {mutants:>7} {killed:>7} {survived:>9} {share:>9.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Mutation score of core/ or agents/ against the offline tests "
                    "(mutmut in a staging copy; the checkout is not changed).",
        epilog="Surviving mutants: 'cd .mutation/core && ../../.venv/bin/python -m mutmut "
               "show NAME'. docs/testing.md records the last scores.")
    parser.add_argument("target", choices=sorted(MODULE_TESTS), help="the layer to mutate")
    parser.add_argument("--only", default="",
                        help="comma-separated modules of the layer (default: all of them)")
    parser.add_argument("--max-children", type=int, default=1,
                        help="mutants tested at once (default 1: the machine is shared)")
    parser.add_argument("--list", action="store_true", help="print the surviving mutants")
    parser.add_argument("--staging", type=Path, default=None,
                        help="staging directory (default .mutation/<target>)")
    args = parser.parse_args(argv)
    only = [m for m in args.only.split(",") if m]
    unknown = [m for m in only if not (PACKAGE / args.target / f"{m}.py").is_file()]
    if unknown:
        parser.error(f"--only: no module {', '.join(unknown)} in {args.target}/")
    staging = args.staging or PROJECT / ".mutation" / args.target
    stage(args.target, only, staging)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "mutmut", "run",
                          "--max-children", str(args.max_children)], cwd=staging)
    duration = time.monotonic() - started
    if run.returncode != 0:
        print(f"mutmut run failed (exit {run.returncode}); see {staging}", file=sys.stderr)
        return 1
    print(report(tally(staging)))
    print(f"{args.target}{' (' + ', '.join(only) + ')' if only else ''}: "
          f"{duration:.0f} s with --max-children {args.max_children}")
    if args.list:
        print("\n".join(survivors(staging)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
