"""``sessionctl extend FILE DURATION``: a longer life for a running session (issue 44).

The expiry fixed at the first ``up`` is in each container's bundle and on its label, and
changing either would replace the containers; so an extension is written into each running
container instead (``agents.engine.extend_lifetime``: a root-owned file on its run tmpfs),
which its lifetime timer reads each time it wakes (templates/lifetime.sh.j2). The policy
bounds it: the session may live at most its project's ``max_lifetime`` from its start (its
first expiry minus its lifetime). An extension lasts while the containers run: a container
started again (its restart policy, ``docker start``) keeps the first expiry.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..agents import engine
from ..core.governance import extension_problem, lifetime_of
from ..core.spec import DEFAULT_PROJECT
from ..core.terminal import printable
from ..core.units import parse_duration
from .errors import CommandError, Exit
from .observe import connect, disconnect
from .session_args import add_session_args, selected, verb_parser


def duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_extend(args: argparse.Namespace) -> int:
    sel = selected(args)
    session = sel.loaded.session
    pool = sel.loaded.pool
    project = session.project or DEFAULT_PROJECT
    policy = pool.policies.of(session.project)
    lifetime = lifetime_of(session, policy)
    if lifetime is None:
        raise CommandError(f"{args.file}: the session has no lifetime (neither `lifetime:` "
                           f"nor project {project}'s policy sets one): nothing to extend",
                           Exit.INVALID)
    now = time.time()
    for _, plan in sel.chosen:
        running = []
        for agent in pool.agents:
            client = connect(agent)
            try:
                running += [c for c in engine.session_containers(client, plan.name)
                            if c.status == "running"
                            and engine.container_facts(c.attrs).expires_at is not None]
            finally:
                disconnect(client)
        if not running:
            raise CommandError(f"{plan.name}: no running container with a lifetime: nothing "
                               "to extend (`up` starts it again)", Exit.INVALID)
        first = engine.container_facts(running[0].attrs).expires_at
        assert first is not None
        current = max([first, *(u for c in running if (u := engine.lifetime_until(c)))])
        problem = extension_problem(current, now, args.duration, first - lifetime, policy,
                                    project)
        if problem is not None:
            raise CommandError(f"{args.file}: extend: {problem}; nothing was changed",
                               Exit.INVALID)
        until = int(max(current, now)) + args.duration
        for c in running:
            engine.extend_lifetime(c, until)
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(until))
        print(printable(f"{plan.name}: its lifetime now ends at {when} "
                        f"({len(running)} containers)"), file=sys.stderr)
    return Exit.OK


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "extend", "give a running session a longer lifetime",
        "Move the end of a running session's lifetime DURATION later (from its current end, "
        "or from now if that has passed), within its project's max_lifetime counted from "
        "its start. Written into each running container (its lifetime timer reads it); a "
        "container started again keeps the first expiry.")
    add_session_args(p)
    p.add_argument("duration", metavar="DURATION", type=duration,
                   help="how much longer: 90s, 30m, 2h, 1d")
    p.set_defaults(func=cmd_extend)
