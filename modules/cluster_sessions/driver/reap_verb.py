"""``sessionctl pool reap POOL [--dry-run] [--json]``: end the pool's idle and expired sessions
(issue 44, part 4), each through its stack's own ``destroy``.

One pass (docs/scheduling.md, "Idle sessions and pool reap"):

1. the session stacks of the state backend (``PULUMI_BACKEND_URL``, as ``ls``) whose
   definition runs on POOL, each loaded as its stack's config says (definition, pool file,
   index, the project the operator granted);
2. one sample of every container of the pool (agents/sampling.py, as ``pool usage``): cpu %
   of the allocation, GPUs, main1's last login and its open connections to sshd and its
   services;
3. for each session with containers: expired (its ``expires-at`` passed), or, for an
   interactive session under an ``idle`` policy, this pass's sample added to the samples kept
   in main1 (root's file on its run tmpfs, agents/engine.py ``IDLE_SAMPLES``) and judged by
   core/idleness.py ``idle_verdict``;
4. each session to end: under the pool's lock, its containers still there and a claim marker
   made for it (agents/pool_ledger.py ``claim_reap``: one reaper only), then ``destroy`` of
   its stack (driver/stacks.py ``cmd_stack``, as ``sessionctl destroy FILE --yes``), then
   the claim removed. Two reapers at once end each session once: the second finds the claim
   (skipped) or no containers (already ended).

``--dry-run`` says what it would end and changes nothing (no sample is kept either). Exit 0;
1 when a destroy failed or an agent could not be sampled; 2 invalid pool; 4 no pulumi CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..agents import engine, sampling
from ..agents.pool_ledger import Holder, Ledger
from ..core import idleness, stats
from ..core.spec import Agent, Pool
from ..core.terminal import printable
from .ending import Candidate, candidates, destroy_args
from .errors import CommandError, Exit
from .pool_files import load_pool

MAIN = "main1"


@dataclass
class Outcome:
    session: str
    stack: str
    project: str
    type: str
    action: str  # ended | would end | kept | skipped | failed
    kind: str  # expired | idle | "" (kept)
    reason: str


def _main1(client: Any, c: Candidate) -> Any | None:
    mine = (lambda sid: sid == c.stack_id) if c.stack_id else None
    for container in engine.session_containers(client, c.session, mine):
        if engine.container_facts(container.attrs).host == MAIN and container.status == "running":
            return container
    return None


def judge(c: Candidate, uses: Sequence[stats.ContainerUse], started: float | None,
          agents: dict[str, Agent], now: float, dry_run: bool) -> idleness.Verdict:
    """Expired or idle now (this pass's sample kept in main1 unless ``dry_run``)."""
    ended = idleness.expired(c.expires_at, now)
    if ended is not None:
        return ended
    if c.session_type == "batch" or c.idle is None:
        return idleness.idle_verdict(c.session_type, c.idle, started, now, None, 0, [], False)
    main = next((u for u in uses if u.host == MAIN and u.state == "running"), None)
    if main is None:
        return idleness.Verdict(False, "main1 does not run")
    used = stats.session_used(uses)
    client = engine.open_client(agents[main.agent], 15)
    try:
        container = _main1(client, c)
        if container is None:
            return idleness.Verdict(False, "main1 does not run")
        kept = idleness.parse_samples(engine.idle_samples(client, container.id))
        kept.append(idleness.Sample(now, used["cpu_percent"], used["gpu_percent"]))
        kept = idleness.kept_samples(kept, now, c.idle.timeout, started)
        if not dry_run:
            engine.keep_idle_samples(client, container.id, idleness.format_samples(kept))
    finally:
        engine.close_client(client)
    return idleness.idle_verdict(c.session_type, c.idle, started, now, main.last_login,
                                 sum(main.connections.values()), kept,
                                 any(u.gpu_ids for u in uses))


def still_there(pool: Pool, c: Candidate) -> bool:
    """The session's containers (of its stack) are still on some agent."""
    mine = (lambda sid: sid == c.stack_id) if c.stack_id else None
    for agent in pool.agents:
        client = engine.open_client(agent, 15)
        try:
            if engine.session_containers(client, c.session, mine):
                return True
        finally:
            engine.close_client(client)
    return False


def destroy(c: Candidate) -> int:
    """``sessionctl destroy FILE --yes`` of the candidate's stack (its engine output on stderr)."""
    from .stacks import cmd_stack

    try:
        return cmd_stack(destroy_args(c))
    except CommandError as exc:
        print(printable(f"sessionctl pool reap: {c.session}: destroy: {exc}"), file=sys.stderr)
        return exc.code


@dataclass
class Pass:
    """What one pass did: each judged session's outcome, the agents not sampled, the backend."""

    pool: str
    backend: str
    outcomes: list[Outcome]
    unreachable: dict[str, str]

    @property
    def failed(self) -> bool:
        return bool(self.unreachable) or any(o.action == "failed" for o in self.outcomes)


def reap(pool: Pool, dry_run: bool, say) -> Pass:
    """One pass of ``pool reap`` over ``pool`` (the module's steps)."""
    from . import stacks

    project = stacks.find_project([Path.cwd(), Path(__file__).resolve().parent])
    if project is None:
        raise CommandError(f"no Pulumi project {stacks.PROJECT_NAME!r} (Pulumi.yaml) found "
                           "above the current directory or the installed package", Exit.MISSING)
    settings = stacks.engine_settings(os.environ, project)
    pulumi = stacks.find_pulumi(os.environ)
    if pulumi is None:
        raise CommandError(stacks.how_to_install(), Exit.MISSING)
    found: list[Candidate] = []
    if settings.state_dir is None or settings.state_dir.exists():  # else: no stack yet
        found = candidates(pool, stacks.open_workspace(project, settings, pulumi), project, say)
    say(f"{len(found)} session stack(s) of this pool in {settings.backend_url}; sampling "
        f"{len(pool.agents)} agent(s)")
    sampled = sampling.sample(pool.agents, None) if found else sampling.Sampled(time.time())
    for agent, why in sampled.unreachable.items():
        say(f"agent {agent} could not be sampled: {why}")
    agents = {a.name: a for a in pool.agents}
    now = time.time()
    outcomes: list[Outcome] = []
    to_end: list[tuple[Candidate, idleness.Verdict]] = []
    for c in found:
        uses = sampling.of_session(sampled, c.session)
        row = Outcome(c.session, c.stack, c.project or "default", c.session_type, "kept", "",
                      "")
        if not uses:
            continue  # nothing on the engines: destroyed, or never up
        if sampled.unreachable:
            row.reason = "an agent could not be sampled: not judged"
        else:
            try:
                verdict = judge(c, uses, sampled.started.get(c.session), agents, now, dry_run)
            except Exception as exc:  # an engine that failed meanwhile: this one not judged
                verdict = idleness.Verdict(False, f"could not be judged: {exc}")
            row.reason, row.kind = verdict.reason, verdict.kind
            if verdict.end:
                if not dry_run:
                    to_end.append((c, verdict))
                    continue
                row.action = "would end"
        outcomes.append(row)
        say(f"{c.session}: {row.action}: {row.reason}")
    if to_end:
        with Ledger.open(pool) as ledger:
            for c, verdict in to_end:
                outcomes.append(end_one(pool, ledger, c, verdict, say))
    return Pass(pool.name, settings.backend_url, outcomes, dict(sampled.unreachable))


def end_one(pool: Pool, ledger: Ledger, c: Candidate, verdict: idleness.Verdict,
            say) -> Outcome:
    """End one session: claimed under the pool's lock (its containers still there, no other
    reaper's claim), destroyed, the claim removed."""
    row = Outcome(c.session, c.stack, c.project or "default", c.session_type, "skipped",
                  verdict.kind, verdict.reason)
    holder = Holder(session=c.session, verb="reap")
    claim = None
    with ledger.locked(holder, on_wait=lambda who: say(f"waiting for the pool's lock, held "
                                                       f"by {who}")):
        if not still_there(pool, c):
            row.reason = "already ended (by another reaper, or destroyed)"
        else:
            claim = ledger.claim_reap(c.stack_id or c.stack, c.session, holder)
            if claim is None:
                row.reason = "another reaper is ending it"
    if claim is not None:
        say(f"{c.session}: ending ({verdict.reason}): destroy of stack {c.stack}")
        try:
            code = destroy(c)
        finally:
            ledger.release_reap(claim)
        row.action = "ended" if code == Exit.OK else "failed"
        if code != Exit.OK:
            row.reason = f"destroy exited {code} ({verdict.reason})"
    say(f"{c.session}: {row.action}: {row.reason}")
    return row


def cmd_pool_reap(args: argparse.Namespace) -> int:
    pool, _ = load_pool(args.pool)

    def say(line: str) -> None:
        print(printable(f"reap {pool.name}: {line}"), file=sys.stderr, flush=True)

    done = reap(pool, args.dry_run, say)
    ended = sum(o.action in ("ended", "would end") for o in done.outcomes)
    say(f"{ended} session(s) {'would be ' if args.dry_run else ''}ended, "
        f"{sum(o.action == 'kept' for o in done.outcomes)} kept")
    if args.json:
        json.dump({"pool": pool.name, "dry_run": args.dry_run, "backend": done.backend,
                   "sessions": [asdict(o) for o in done.outcomes],
                   "unreachable": done.unreachable},
                  sys.stdout, indent=2, ensure_ascii=False)
        print()
    return Exit.ENGINE if done.failed else Exit.OK


def register(verbs, fmt) -> None:
    """``pool reap`` among the pool verbs (driver/pool_verbs.py ``register``)."""
    from .session_args import needs_pulumi

    p = verbs.add_parser(
        "reap", help="end the pool's idle and expired sessions (through their destroy)",
        description="End the sessions of POOL whose lifetime ended, and the interactive "
        "sessions its projects' `idle` policy finds idle (no login or connection to main1 "
        "for idle.timeout, cpu and GPU use under idle.cpu_below / idle.gpu_below over that "
        "window, after idle.grace from the start; batch sessions are exempt), each through "
        "`sessionctl destroy` of its stack in the state backend (PULUMI_BACKEND_URL). Each "
        "pass adds one sample to those kept in main1: a session is judged idle once the "
        "samples cover the window, so run it periodically (deploy/systemd/, examples/ci/). "
        "Safe from two places at once: each session is ended by one reaper (the pool's "
        "lock, a claim per session). Exit 0; 1 when a destroy failed or an agent could not "
        "be sampled; 2 for an invalid pool file; 4 without the pulumi CLI.",
        formatter_class=fmt)
    p.add_argument("pool", metavar="POOL")
    p.add_argument("--dry-run", action="store_true",
                   help="only say what would be ended (and keep no sample)")
    p.add_argument("--json", action="store_true",
                   help="print {pool, dry_run, backend, sessions: [{session, stack, project, "
                   "type, action, kind, reason}], unreachable} (action: ended | would end | "
                   "kept | skipped | failed)")
    p.set_defaults(func=cmd_pool_reap)
    needs_pulumi(p)
