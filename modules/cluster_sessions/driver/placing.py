"""Placing sessions on the pool's live free capacity at ``up`` and ``preview`` (issue 31):
what the engines hold is read (agents.capacity probes, the ledger's reservations), the
decision is core.decisions' pure ``decide``, and for ``up`` it is made under the pool's lock
and held by a reservation until the ``up`` ends (agents.pool_ledger). ``--wait`` queues.
docs/scheduling.md tells the whole story."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..agents.capacity import AgentReport, PreflightError, probe_pool
from ..agents.pool_ledger import (
    QUEUE_LEASE,
    RESERVATION_LEASE,
    Entry,
    Holder,
    Ledger,
)
from ..core import admission, governance, preemption, scheduling
from ..core import ledger as ledger_core
from ..core.decisions import Decided, KeptPlacement, decide, read_kept_or_again
from ..core.names import PLACEMENT_KEY, config_key
from ..core.placement import Free
from ..core.plan import ClusterPlan
from ..core.scheduling import AgentHold, ContainerHold, Holding, Reservation
from ..core.spec import DEFAULT_PROJECT, Pool, Session
from ..core.terminal import printable
from ..core.units import format_duration
from . import service_ports
from .ending import Candidate
from .errors import ClusterSessionsError, CommandError, Exit

WAIT_POLL = 2.0  # seconds between looks while queued


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h`` as seconds (argparse type of ``--wait``)."""
    import argparse

    units = {"s": 1, "m": 60, "h": 3600}
    value, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        seconds = float(value) * units[unit]
    except ValueError:
        seconds = -1
    if not 0 < seconds < 10**8 or math.isnan(seconds):
        raise argparse.ArgumentTypeError("must be a duration: seconds, or 90s, 10m, 2h")
    return seconds


def recorded_placements(configs: Mapping[str, Mapping[str, str]]
                        ) -> dict[str, KeptPlacement | None]:
    """The kept placement in each session's recorded stack config (by session name); a value
    that is not one (edited by hand) counts as none, and is said."""
    found: dict[str, KeptPlacement | None] = {}
    for session, config in configs.items():
        found[session] = read_kept_or_again(
            PLACEMENT_KEY, config.get(config_key(PLACEMENT_KEY)),
            lambda why, s=session: print(f"sessionctl: {s}: recorded {printable(why)}; "
                                         "placing the session again", file=sys.stderr))
    return found


def live_free(reports: Sequence[AgentReport], reservations: Sequence[Entry],
              mine: Mapping[str, str], now: float) -> list[Free]:
    """What each agent can still give (core.scheduling.live_free, the one computation of it):
    declared (less GPUs the machine lacks) − what containers and others' live reservations
    hold, the sessions being placed left out (``mine``: session name -> its stack id; a
    container of one of them from before stack ids carries none)."""
    declared = [r.total or r.free for r in reports]
    assert all(d is not None for d in declared)
    containers = [ContainerHold(h.session, h.owner.stack_id, r.name, h.millicpu, h.mem,
                                tuple(h.gpus))
                  for r in reports for h in r.held
                  if not (not h.owner.stack_id and h.session in mine)]
    held = [reservation_of(e) for e in reservations]
    return scheduling.live_free(declared, containers, held,  # type: ignore[arg-type]
                                {s for s in mine.values() if s}
                                | {f"session:{n}" for n in mine}, now)


def reservation_of(entry: Entry) -> Reservation:
    """A ledger entry as core.scheduling counts it (its stack, or its session name when it
    names no stack: ``session:NAME``)."""
    return Reservation(entry.session, (entry.stack_id or f"session:{entry.session}",),
                       entry.holder.describe() if entry.holder else "", entry.created,
                       entry.until, tuple(AgentHold(agent, h["cpu"], h["mem"],
                                                    tuple(h["gpus"]))
                                          for agent, h in entry.holds.items()))


def holds_of(plan: ClusterPlan, ports: Mapping[str, int] | None = None
             ) -> dict[str, dict[str, object]]:
    """What a plan takes, per agent (a reservation's content): cpu, memory, GPU ids, and the
    host ports chosen for main1's services."""
    out: dict[str, dict[str, object]] = {}
    res = plan.resources
    for c in plan.containers:
        cur = out.setdefault(c.agent or "", {"cpu": 0, "mem": 0, "gpus": [], "ports": []})
        cur["cpu"] = int(cur["cpu"]) + res.millicpu  # type: ignore[call-overload]
        cur["mem"] = int(cur["mem"]) + res.mem  # type: ignore[call-overload]
        cur["gpus"] = [*cur["gpus"], *c.gpus]  # type: ignore[misc]
    if ports and plan.containers[0].agent:
        out[plan.containers[0].agent]["ports"] = sorted(ports.values())
    return out


def reserved_ports(reservations: Sequence[Entry], exclude: Collection[str]) -> dict[str, set[int]]:
    """The host ports other ``up``s under way chose, by agent (``exclude``: the identities
    of the stacks being placed, core.ledger.identity)."""
    found: dict[str, set[int]] = {}
    for r in reservations:
        if r.identity in exclude:
            continue
        for agent, held in r.holds.items():
            found.setdefault(agent, set()).update(held.get("ports", []))
    return found


@dataclass(frozen=True)
class Placed:
    """Where the sessions go, and (with ``services``) the host ports chosen for them."""

    decided: Decided
    ports: Mapping[str, Mapping[str, int]]
    present: frozenset[str] = frozenset()  # sessions whose own containers are all there
    holders: str = ""  # who holds the agents (a pending reason names them)


def probe(pool: Pool) -> list[AgentReport]:
    reports = probe_pool(pool)
    if not all(r.ok for r in reports):
        raise PreflightError(pool, reports, " to read what the pool holds; nothing was "
                             "created")
    return reports


def mine_ids(mine: Mapping[str, str]) -> set[str]:
    """The identities (core.ledger.identity) of the stacks being placed."""
    return {ledger_core.identity(stack, name) for name, stack in mine.items()}


def present_sessions(reports: Sequence[AgentReport], kept: Mapping[str, KeptPlacement | None],
                     mine: Mapping[str, str]) -> frozenset[str]:
    """The sessions being placed whose own stack's containers are all there, on the agents
    their kept placement names (as many on each): they hold what they hold."""
    found = set()
    for name, stack in mine.items():
        recorded = kept.get(name)
        if recorded is None or not stack:
            continue
        want = Counter(slot.agent for slot in recorded.slots)
        have = Counter(r.name for r in reports for h in r.held
                       if h.session == name and h.owner.stack_id == stack)
        if want == have:
            found.add(name)
    return frozenset(found)


def holders_text(reports: Sequence[AgentReport], reservations: Sequence[Entry],
                 mine: Mapping[str, str]) -> str:
    """Who holds each agent now (others than the stacks being placed), as a pending reason
    names them: session and made-by for containers, the holder for a reservation."""
    ours = mine_ids(mine)
    holdings = [Holding(r.name, h.session, h.owner.made_by) for r in reports for h in r.held
                if ledger_core.identity(h.owner.stack_id, h.session) not in ours]
    holdings += [Holding(agent, e.session, f"{e.holder.user}@{e.holder.host}" if e.holder
                         else "", reserved=True)
                 for e in reservations if e.identity not in ours for agent in e.holds]
    return printable(scheduling.who_holds(holdings, [r.name for r in reports]))


def believed_priority(pool: Pool, entry: Entry) -> int:
    """A queue entry's priority as this reader believes it: its label, at most its project's
    ``max_priority`` (a marker anyone can make cannot jump the queue past what the pool grants
    its project; a project the pool does not list: 0)."""
    if entry.project != DEFAULT_PROJECT and entry.project not in pool.policies.projects:
        return 0
    return min(entry.priority, pool.policies.of(entry.project).max_priority)


def project_of(copies: Sequence[Session]) -> str:
    """The project the sessions being placed run under (one definition's: all the same)."""
    return copies[0].project or DEFAULT_PROJECT


def held_by_projects(reports: Sequence[AgentReport], reservations: Sequence[Entry]
                     ) -> list[governance.Held]:
    """What every session on the pool holds, by the project its labels name (core.ledger's
    strict parser read them: a project label that does not parse counts to none)."""
    held = [governance.Held(h.owner.project, ledger_core.identity(h.owner.stack_id, h.session),
                            h.millicpu, h.mem, len(h.gpus), 1, reserved=False)
            for r in reports for h in r.held]
    held += [governance.Held(e.project, e.identity,
                             sum(int(h["cpu"]) for h in e.holds.values()),
                             sum(int(h["mem"]) for h in e.holds.values()),
                             sum(len(h["gpus"]) for h in e.holds.values()), e.containers,
                             reserved=True)
             for e in reservations]
    return held


def quota_error(pool: Pool, copies: Sequence[Session], reports: Sequence[AgentReport],
                reservations: Sequence[Entry], mine: Mapping[str, str]) -> CommandError | None:
    """Pending (exit 3) when the sessions would take their project past its quota, every
    violated limit named (core.governance.quota_violations); call under the pool's lock."""
    project = project_of(copies)
    quota = pool.policies.of(project).quota
    holding = governance.held_by(project, held_by_projects(reports, reservations),
                                 mine_ids(mine))
    found = governance.quota_violations(project, quota, holding, governance.asked(copies))
    if not found:
        return None
    return CommandError(f"pending: {'; '.join(found)}; nothing was created; {WAIT_HINT}",
                        Exit.PENDING)


def place_live(pool: Pool, copies: Sequence[Session], kept: Mapping[str, KeptPlacement | None],
               ledger: Ledger, mine: Mapping[str, str], quota: bool = True) -> Placed:
    """The decision on what the engines show now (call under the pool's lock for ``up``):
    the project's quota (unless ``quota`` is false: a running, unchanged session keeps what
    it holds; pending: CommandError, exit 3), where the sessions go, then the host ports of
    their services. ``mine``: the sessions being placed and their stack ids, whose own
    holdings are left out."""
    reports = probe(pool)
    now = ledger.now()
    reservations = ledger.live("reservation", now)
    over = quota_error(pool, copies, reports, reservations, mine) if quota else None
    if over is not None:
        raise over
    return decide_on(pool, copies, kept, ledger, mine, reports, reservations, now)


def decide_on(pool: Pool, copies: Sequence[Session], kept: Mapping[str, KeptPlacement | None],
              ledger: Ledger, mine: Mapping[str, str], reports: Sequence[AgentReport],
              reservations: Sequence[Entry], now: float,
              gone: Mapping[str, str] | None = None) -> Placed:
    """Where the sessions go on what ``reports`` and ``reservations`` show (place_live's
    decision, once the quota was judged), and the host ports of their services; ``gone``:
    sessions (name -> stack id) counted as ended, as the stacks being placed are (the
    victims of a preemption)."""
    own_gpus: dict[str, dict[str, set[int]]] = {}
    for r in reports:
        for h in r.held:
            if h.session in mine and h.gpus and h.owner.stack_id in ("", mine[h.session]):
                own_gpus.setdefault(h.session, {}).setdefault(r.name, set()).update(h.gpus)
    present = present_sessions(reports, kept, mine)
    left_out = {**(gone or {}), **mine}
    decided = decide(copies, pool, live_free(reports, reservations, left_out, now), kept,
                     ledger.last_agent() if pool.scheduler.selector == "roundrobin" else None,
                     own_gpus, present)
    ports: Mapping[str, Mapping[str, int]] = {}
    if not any(p.pending for p in decided.plans) and any(p.services for p in decided.plans):
        ports = service_ports.choose(decided.plans, pool,
                                     reserved=reserved_ports(reservations, mine_ids(mine)))
    holders = (holders_text(reports, reservations, mine)
               if any(p.pending for p in decided.plans) else "")
    return Placed(decided, ports, present, holders)


WAIT_HINT = "`--wait [DURATION]` (up, run) queues for it, first come first served"


def pending_error(decided: Decided, holders: str = "") -> CommandError | None:
    pending = next((p for p in decided.plans if p.pending), None)
    if pending is None:
        return None
    who = f"; {holders}" if holders else ""
    return CommandError(f"pending: {pending.reason}{who}; nothing was created; {WAIT_HINT}",
                        Exit.PENDING)


def refuse_claims(pool: Pool, entries: Sequence[Entry], mine: Mapping[str, str],
                  before: Entry | None = None) -> None:
    """An ``up`` of a name another stack reserves (its ``up`` under way) or waits for in the
    queue (before us) is refused before placement, naming that stack (exit 2, as a name
    another stack's objects hold): two stacks of one name cannot both run on a pool."""
    found = ledger_core.claims(entries, mine, before)
    if not found:
        return
    lines = []
    for e in found:
        name = next(iter(sorted(e.sessions & set(mine))))
        what = "is being placed" if e.kind == "reservation" else "waits in the queue"
        lines.append(printable(f"session {name} {what} on pool {pool.name} by another stack "
                               f"({e.who()}); nothing was created"))
    lines.append("Give this session another name, or wait until that `up` ends and destroy "
                 "the other from its own stack and backend.")
    raise CommandError("\n".join(lines), Exit.INVALID)


def attempt(pool: Pool, copies: Sequence[Session], kept: Mapping[str, KeptPlacement | None],
            ledger: Ledger, mine: Mapping[str, str], ahead: Sequence[Entry]
            ) -> tuple[Placed | None, CommandError | None, bool]:
    """One try under the lock: the placement, or why it is pending (others queued ahead,
    no fit, no free service port, the quota), and whether it is pending for capacity alone
    with nobody queued ahead (what preemption may help: never the quota)."""
    waiting = CommandError(
        f"pending: {len(ahead)} session(s) wait in pool {pool.name}'s queue ahead (first: "
        f"{printable(ahead[0].session)}); nothing was created; {WAIT_HINT}",
        Exit.PENDING) if ahead else None
    if ahead:
        # small fits first (core.admission): those ahead may be passed by a smaller session
        # that fits now, until one of them has waited scheduler.backfill_for
        now = ledger.now()
        old = admission.waited_too_long(ahead, now, pool.scheduler.backfill_for)
        if old:
            return None, CommandError(
                f"pending: {printable(old[0].session)} waits in pool {pool.name}'s queue "
                f"ahead, {len(old)} of them longer than scheduler.backfill_for "
                f"({format_duration(pool.scheduler.backfill_for)}): nothing passes them; "
                f"nothing was created; {WAIT_HINT}", Exit.PENDING), False
        if admission.holding_back(ahead, governance.asked(copies), now,
                                  pool.scheduler.backfill_for):
            return None, waiting, False
    try:
        result = place_live(pool, copies, kept, ledger, mine)
    except CommandError as exc:
        if exc.code != Exit.PENDING:
            raise
        return None, waiting or exc, False  # over quota: preemption never helps
    error = pending_error(result.decided, result.holders)
    if error is not None:
        return None, waiting or error, waiting is None
    if ahead:
        _say(f"it fits now: placed ahead of {len(ahead)} waiting session(s) (small fits "
             f"first, for at most {format_duration(pool.scheduler.backfill_for)} of their "
             "wait)")
    return result, None, False


def queue_ahead(pool: Pool, ledger: Ledger, queue: Sequence[Entry], ours: Iterable[str],
                me: Entry | None) -> list[Entry]:
    """The queue's entries before ours (core.admission: priority, then the projects' dominant
    share of what they hold now, then arrival); without an entry of ours (``up`` without
    ``--wait``), every other one."""
    others = [e for e in queue if e.identity not in set(ours)]
    if me is None or not others:
        return ledger_core.ahead(queue, ours, None)
    held = held_by_projects(probe(pool), ledger.live("reservation"))
    share = admission.project_shares(pool, queue, held, [me.project])
    return admission.ahead(queue, ours, me, lambda e: believed_priority(pool, e),
                           lambda project: share.get(project, 0.0))


# --- preemption (issue 44, part 5) ------------------------------------------------------------


@dataclass(frozen=True)
class Preemption:
    """What :func:`placed` needs to end sessions for a higher priority (driver/stacks.py
    gives it): the pool's session stacks of this backend (driver/ending.py, read when a
    preemption is considered, under the lock), and how one is ended: its stack's own
    ``destroy``, which writes the record (raises CommandError when it fails)."""

    candidates: Callable[[], Sequence[Candidate]]
    end: Callable[[Candidate, Mapping[str, object]], None]


@dataclass(frozen=True)
class Victim:
    candidate: Candidate
    running: preemption.Running
    claim: str = ""  # its claim marker (agents/pool_ledger.py claim_reap), once made


def _epoch(stamp: str | None) -> float:
    from datetime import datetime

    if not stamp or stamp.startswith("0001-"):
        return 0.0
    day, _, rest = stamp.rstrip("Z").partition(".")
    try:
        return datetime.fromisoformat(f"{day}+00:00").timestamp()
    except ValueError:
        return 0.0


def running_sessions(reports: Sequence[AgentReport], reservations: Sequence[Entry],
                     found: Sequence[Candidate], mine: Mapping[str, str]
                     ) -> dict[str, tuple[Candidate, preemption.Running]]:
    """The backend's sessions on the pool that run now, by stack id, as core.preemption
    reads them: type, priority and ``preemptible`` from the stack's definition (its project's
    policy held it to ``max_priority``), what it holds from its containers' labels (of its
    stack id), its start from its youngest container. One whose ``up`` is under way (a live
    reservation of its stack) or that is being placed now is no candidate."""
    reserved = {e.identity for e in reservations}
    out = {}
    for c in found:
        if not c.stack_id or c.session in mine or c.stack_id in reserved:
            continue
        holds: dict[str, list] = {}
        started = 0.0
        for r in reports:
            for h in r.held:
                if h.owner.stack_id == c.stack_id and h.session == c.session:
                    cur = holds.setdefault(r.name, [0, 0, []])
                    cur[0] += h.millicpu
                    cur[1] += h.mem
                    cur[2] += list(h.gpus)
                    started = max(started, _epoch(h.started_at))
        if not holds:
            continue  # nothing of it runs: nothing to free
        out[c.stack_id] = (c, preemption.Running(
            c.session, c.priority, c.preemptible, c.session_type, started,
            tuple(preemption.Hold(a, cpu, mem, tuple(g)) for a, (cpu, mem, g) in holds.items()),
            key=c.stack_id))
    return out


def preempt_for(pool: Pool, copies: Sequence[Session], kept: Mapping[str, KeptPlacement | None],
                ledger: Ledger, mine: Mapping[str, str], found: Sequence[Candidate]
                ) -> tuple[Placed, list[Victim]] | None:
    """Under the pool's lock, for sessions pending for capacity alone: the victims
    (core.preemption ``choose_victims``) and the placement on what they hold, or None when
    no set of lower-priority preemptible batch sessions makes room."""
    reports = probe(pool)
    now = ledger.now()
    reservations = ledger.live("reservation", now)
    running = running_sessions(reports, reservations, found, mine)
    if not running:
        return None
    declared = [r.total or r.free for r in reports]
    free = live_free(reports, reservations, mine, now)

    def fits(freed: list[Free]) -> bool:
        return not any(p.pending for p in decide(copies, pool, freed, kept).plans)

    chosen = preemption.choose_victims(copies[0].priority, [r for _, r in running.values()],
                                       free, declared, fits)  # type: ignore[arg-type]
    if not chosen:
        return None
    gone = {v.name: v.key for v in chosen}
    result = decide_on(pool, copies, kept, ledger, mine, reports, reservations, now, gone)
    if any(p.pending for p in result.decided.plans):
        return None  # what the labels say did not add up: nobody is ended
    return result, [Victim(running[v.key][0], v) for v in chosen]


def claim_victims(ledger: Ledger, victims: Sequence[Victim], holder: Holder
                  ) -> list[Victim] | None:
    """Each victim claimed as ``pool reap`` claims a session it ends (one client ends it);
    None, with the claims made given back, when another client is ending one already."""
    claimed: list[Victim] = []
    for v in victims:
        claim = ledger.claim_reap(v.running.key, v.candidate.session, holder)
        if claim is None:
            for done in claimed:
                ledger.release_reap(done.claim)
            return None
        claimed.append(Victim(v.candidate, v.running, claim))
    return claimed


def end_victims(ledger: Ledger, victims: Sequence[Victim], names: Sequence[str],
                priority: int, end: Callable[[Candidate, Mapping[str, object]], None],
                say: Callable[[str], None]) -> None:
    """End each victim through its stack's ``destroy`` (the record written with it), the
    claims given back whatever happens. A destroy that fails stops here: CommandError naming
    the victim; the sessions being placed are not placed."""
    by = ", ".join(names)
    done: list[str] = []
    try:
        for v in victims:
            c, r = v.candidate, v.running
            why = preemption.reason(r, by, priority)
            say(printable(f"preempting {c.session} (priority {r.priority}, preemptible batch) "
                          f"for {by} (priority {priority}): destroy of stack {c.stack}"))
            try:
                end(c, {"at": int(time.time()), "by": by, "by_priority": priority,
                        "priority": r.priority, "session": c.session, "type": c.session_type,
                        "project": c.project or DEFAULT_PROJECT, "reason": why})
            except ClusterSessionsError as exc:
                ended = f"; already preempted: {', '.join(done)}" if done else ""
                raise CommandError(printable(
                    f"preemption of {c.session} (stack {c.stack}) for {by} failed: its "
                    f"destroy: {str(exc).splitlines()[0] if str(exc) else exc.code}{ended}; "
                    f"{by} was not placed, nothing of it was created"), Exit.ENGINE) from None
            done.append(c.session)
            say(printable(f"preempted {c.session}: {why}"))
    finally:
        for v in victims:
            ledger.release_reap(v.claim)


def _say(line: str) -> None:
    print(f"sessionctl up: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def placed(ledger: Ledger, copies: Sequence[Session],
           kept: Mapping[str, KeptPlacement | None], stack_ids: Mapping[str, str], *,
           reserve: bool, wait: float | None = None, say: Callable[[str], None] = _say,
           under_lock: Callable[[], None] = lambda: None,
           preempt: Preemption | None = None) -> Iterator[Placed]:
    """Decide where ``copies`` go on live capacity; with ``reserve`` (``up``), one decision at
    a time per pool and a reservation per session held until the block ends. ``wait``
    (seconds, ``inf``): queue instead of failing when they do not fit (first come, first
    served). Entries are per stack (core.ledger): a name another stack reserves or waits for
    is refused (exit 2). A running, unchanged session needs no decision: it keeps what it
    holds without the lock and whatever others reserve, queue or forge. Raises CommandError
    (exit 3) when pending; PoolBusy (exit 1) when the lock stays held; PreflightError (exit
    4) when an agent cannot be probed.

    ``preempt``, on a pool with ``policies.preemption``: sessions pending for capacity alone
    (not for their quota, nobody queued ahead) end lower-priority preemptible batch sessions
    to fit (core.preemption): decided and claimed under the lock with the reservation of what
    they are given, then each ended through its stack's destroy after the lock (as ``pool
    reap`` ends one: a destroy outlives the lock's lease); the reservation, counted beside the
    victims' containers until they are gone, keeps what they free for these sessions."""
    pool = ledger.pool
    names = [c.name for c in copies]
    mine = {n: stack_ids.get(n, "") for n in names}
    ours = mine_ids(mine)
    holder = Holder(", ".join(names))

    project = copies[0].project if copies else None

    def reserve_all(result: Placed, held: contextlib.ExitStack) -> None:
        for plan in result.decided.plans:
            held.enter_context(contextlib.closing(ledger.renewed(
                "reservation", plan.name, stack_ids.get(plan.name, ""), holder,
                RESERVATION_LEASE, holds_of(plan, result.ports.get(plan.name)),
                project=project, containers=len(plan.containers))))

    with contextlib.ExitStack() as held:
        if not reserve:  # preview: where it would go now, nothing held
            under_lock()
            yield place_live(pool, copies, kept, ledger, mine)
            return
        if all(kept.get(n) is not None for n in names):
            # running and unchanged: its containers hold what it needs, so no decision
            result = place_live(pool, copies, kept, ledger, mine, quota=False)
            if set(names) <= result.present and all(
                    result.decided.notes.get(n) == "kept" for n in names):
                under_lock()
                # a reservation all the same (what its containers hold, counted once with
                # them): an update that replaces a container keeps the capacity meanwhile
                reserve_all(result, held)
                yield result
                return
        # a name another stack reserves or waits for: refused before we queue or place
        refuse_claims(pool, [*ledger.live("reservation"), *ledger.live("queue")], mine)
        queued = None
        if wait is not None:
            need = governance.asked(copies)
            queued = ledger.renewed("queue", names[0], stack_ids.get(names[0], ""), holder,
                                    QUEUE_LEASE, project=project,
                                    priority=copies[0].priority,
                                    asks=(need.millicpu, need.mem, need.gpus))
            held.callback(queued.close)
        deadline = time.monotonic() + (wait or 0)
        shown = ""
        victims: list[Victim] = []
        while True:
            with ledger.locked(holder, on_wait=lambda who: say(
                    f"pool {pool.name} is deciding a placement for {who}; waiting")) as taken:
                under_lock()
                queue = ledger.live("queue")
                me = next((e for e in queue if e.identity in ours), None)
                if queued is not None and me is None:  # our marker between two renewals
                    me = Entry("queue", queued.current, "", names[0], mine[names[0]], None,
                               queued.arrival, QUEUE_LEASE, queued.arrival, {},
                               project=project or DEFAULT_PROJECT,
                               priority=copies[0].priority)
                refuse_claims(pool, [*ledger.live("reservation"), *queue], mine,
                              me if queued is not None else None)
                ahead = queue_ahead(pool, ledger, queue, ours,
                                    me if queued is not None else None)
                result, error, short = attempt(pool, copies, kept, ledger, mine, ahead)
                if error is None and not ledger.still_locked(taken):
                    continue  # the decision outlived the lock's lease: decide again
                if (error is not None and short and preempt is not None
                        and pool.policies.preemption and copies[0].priority > 0):
                    found = preempt_for(pool, copies, kept, ledger, mine, preempt.candidates())
                    if found is not None and not ledger.still_locked(taken):
                        continue  # reading the backend outlived the lease: decide again
                    claimed = claim_victims(ledger, found[1], holder) if found else None
                    if found is not None and claimed is not None:
                        result, error, victims = found[0], None, claimed
                if error is not None and queued is not None and not shown:
                    # the first look that would queue: the project's pending limit, counted
                    # on its sessions queued before this one (arrival order), under the lock
                    waiting = governance.waiting_before(queue, project_of(copies), ours, me)
                    full = governance.pending_violation(
                        project_of(copies), pool.policies.of(project_of(copies)).quota,
                        waiting)
                    if full is not None:
                        raise CommandError(f"pending: {full}: it may not wait in the queue; "
                                           "nothing was created", Exit.PENDING)
                if error is None:
                    assert result is not None
                    placed_anew = [p for p in result.decided.plans
                                   if result.decided.notes.get(p.name) != "kept"]
                    if placed_anew and pool.scheduler.selector == "roundrobin":
                        ledger.set_last_agent(placed_anew[-1].containers[0].agent or "")
                    try:
                        reserve_all(result, held)
                    except BaseException:
                        for v in victims:  # nobody is ended for a session not reserved
                            ledger.release_reap(v.claim)
                        raise
                    break
            if wait is None or time.monotonic() > deadline:
                raise error
            line = str(error).removeprefix("pending: ").removesuffix(f"; {WAIT_HINT}")
            if line != shown:
                say(f"queued in pool {pool.name}"
                    f"{f' behind {len(ahead)}' if ahead else ' (first)'}: {line}")
                shown = line
            time.sleep(WAIT_POLL)
        if queued is not None:
            queued.close()
        if victims:
            assert preempt is not None
            end_victims(ledger, victims, names, copies[0].priority, preempt.end, say)
        yield result
