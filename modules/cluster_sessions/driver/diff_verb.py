"""``sessionctl diff OLD NEW``: review a definition change offline (Markdown for a PR comment).

Each side is planned against its own pool (the one it names, found in the operator's pool
directories, or ``--old-pool``/``--new-pool``; ``--pool`` sets both; ``--old-pools DIRS`` gives
the old side its own directories, e.g. a base revision's ``stacks/pools``), with declared
capacity, as ``sessionctl plan`` does. A change of pool, or of what it decides for the session
(each agent it uses: engine, SSH identity, TLS; ``mount_sources``, ``volumes``), is a row.
``/dev/null`` (or ``-``) stands for a definition that does not exist on that side: a file
added or deleted by the change. A definition with ``count: K`` is its K sessions: each is
compared with the session of the same name on the other side (a count that grows adds
sessions; a session NEW no longer makes, after a count that shrinks or goes from 1 to 2, is left
running by ``up`` and shown so). In CI, check out the base revision in a second work tree
and compare the two files (examples/ci).

Exit codes: 0 (also for a pending side: the review says so), 2 invalid input. With
``--exit-code``, 1 when there are changes, like ``git diff --exit-code``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..agents.reach import reach_of
from ..core.loader import operator_pool_dirs
from ..core.plan import ClusterPlan, build_plans
from ..core.review import diff_plans, left_running, review_to_dict, to_markdown
from ..core.spec import Pool
from ..core.terminal import dumps
from ..core.units import format_size
from .errors import CommandError, Exit
from .session_args import load_definition, nonempty, verb_parser

ABSENT = ("/dev/null", "-")


def pool_rows(pool: Pool, plan: ClusterPlan) -> dict[str, str]:
    """What the pool decides for one session, a row each: which pool, for each agent the
    session uses where its engine is and with which identity it is reached, what may be
    mounted, and what each container may take and do."""
    rows = {"pool": pool.name}
    for name in plan.agents:
        r = reach_of(pool.agent(name))
        how = [f"key {r.key_file}" if r.key_file else "",
               f"known_hosts {r.known_hosts}" if r.known_hosts else "",
               f"tls {r.cert_path}" if r.cert_path else ""]
        rows[f"pool agent {name}"] = "; ".join([r.endpoint, *filter(None, how)])
    rows["pool mount_sources"] = ", ".join(pool.mount_sources) or "(none)"
    rows["pool volumes"] = ", ".join(pool.volumes) or "(none)"
    limits, privileges = pool.limits, pool.privileges
    rows["pool limits"] = (f"log {limits.log_max_files} x {format_size(limits.log_max_size)}, "
                           f"{limits.pids_limit} tasks per container")
    rows["pool privileges"] = " ".join(privileges.capabilities) + (
        ", no-new-privileges" if privileges.no_new_privileges else ", may gain privileges")
    return rows


def side(file: str, pool: str | None, dirs: str | None = None
         ) -> tuple[dict[str, ClusterPlan], dict[str, str], dict[str, dict[str, str]]]:
    """The sessions a definition makes, by name (none for an absent side), its agents, and
    each session's pool rows. ``dirs``: the pool directories of this side (``--old-pools``)."""
    if file in ABSENT:
        return {}, {}, {}
    loaded = load_definition(Path(file), Path(pool) if pool else None,
                             operator_pool_dirs(dirs) if dirs else None)
    hosts = {a.name: reach_of(a).endpoint for a in loaded.pool.agents}
    plans = {p.name: p for p in build_plans(loaded.session, loaded.pool)}
    return plans, hosts, {n: pool_rows(loaded.pool, p) for n, p in plans.items()}


def cmd_diff(args: argparse.Namespace) -> int:
    old_pool = args.old_pool or args.pool
    new_pool = args.new_pool or args.pool
    old, old_hosts, old_pools = side(args.old, old_pool, args.old_pools)
    new, new_hosts, new_pools = side(args.new, new_pool)
    if not old and not new:
        raise CommandError("both OLD and NEW are absent: nothing to compare", Exit.INVALID)
    # a session only OLD makes, while NEW is a definition: `up` leaves it running (count 1 -> 2,
    # a count that shrinks); only a deleted definition is destroyed (the CI example does)
    reviews = [left_running(old[name], old_hosts)
               if name not in new and args.new not in ABSENT
               else diff_plans(old.get(name), new.get(name), old_hosts, new_hosts,
                               old_pool=old_pools.get(name), new_pool=new_pools.get(name))
               for name in dict.fromkeys((*old, *new))]
    if args.json:
        docs = [review_to_dict(r) for r in reviews]
        print(dumps(docs[0] if len(docs) == 1 else {"sessions": docs}, indent=2))
    else:
        sys.stdout.write("\n".join(to_markdown(r, old_label=args.old, new_label=args.new)
                                   for r in reviews))
    if args.exit_code and any(r.changed for r in reviews):
        return Exit.CHANGES
    return Exit.OK


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "diff", "review a definition change offline: what `pulumi up` will replace",
        "Compare two session definitions (e.g. the base and the head of a pull "
        "request) and print, as Markdown, what applying NEW to a stack built from OLD does: "
        "containers added, removed, replaced or unchanged and why, env and cluster variable "
        "changes, resources, image, mounts, ports, placement and the network. Offline: no "
        "engine, no pulumi CLI. Use /dev/null for a side that does not exist.",
        epilog="exit codes: 0 ok (1 with --exit-code when there are changes), 2 invalid input")
    p.add_argument("old", metavar="OLD", type=nonempty,
                   help="the definition as deployed (or /dev/null)")
    p.add_argument("new", metavar="NEW", type=nonempty,
                   help="the definition to apply (or /dev/null)")
    p.add_argument("--pool", metavar="POOLFILE", type=nonempty, help="pool file for both sides")
    p.add_argument("--old-pool", metavar="POOLFILE", type=nonempty, help="pool file for OLD")
    p.add_argument("--new-pool", metavar="POOLFILE", type=nonempty, help="pool file for NEW")
    p.add_argument("--old-pools", metavar="DIRS", type=nonempty,
                   help="the pool directories for OLD (':'-separated), in place of "
                   "$CLUSTER_SESSIONS_POOLS; the project's stacks/pools comes last either way "
                   "(CI: the base revision's stacks/pools)")
    p.add_argument("--json", action="store_true", help="the review as JSON instead of Markdown")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when there are changes, 0 when there are none")
    p.set_defaults(func=cmd_diff)
