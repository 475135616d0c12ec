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
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..agents.capacity import AgentReport, PreflightError, probe_pool
from ..agents.pool_ledger import (
    QUEUE_LEASE,
    RESERVATION_LEASE,
    Entry,
    Holder,
    Ledger,
)
from ..core import scheduling
from ..core.decisions import Decided, KeptPlacement, decide, read_placement
from ..core.names import PLACEMENT_KEY, config_key
from ..core.placement import Free
from ..core.plan import ClusterPlan
from ..core.scheduling import AgentHold, ContainerHold, Reservation
from ..core.spec import Pool, Session
from . import service_ports
from .errors import CommandError, Exit

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
        try:
            found[session] = read_placement(config.get(config_key(PLACEMENT_KEY)))
        except (ValueError, TypeError):
            print(f"sessionctl: {session}: the recorded placement is not one sessionctl wrote; "
                  "placing the session again", file=sys.stderr)
            found[session] = None
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
    """The host ports other ``up``s under way chose, by agent."""
    found: dict[str, set[int]] = {}
    for r in reservations:
        if r.session in exclude:
            continue
        for agent, held in r.holds.items():
            found.setdefault(agent, set()).update(held.get("ports", []))
    return found


@dataclass(frozen=True)
class Placed:
    """Where the sessions go, and (with ``services``) the host ports chosen for them."""

    decided: Decided
    ports: Mapping[str, Mapping[str, int]]


def probe(pool: Pool) -> list[AgentReport]:
    reports = probe_pool(pool)
    if not all(r.ok for r in reports):
        raise PreflightError(pool, reports, " to read what the pool holds; nothing was "
                             "created")
    return reports


def place_live(pool: Pool, copies: Sequence[Session], kept: Mapping[str, KeptPlacement | None],
               ledger: Ledger, mine: Mapping[str, str]) -> Placed:
    """The decision on what the engines show now (call under the pool's lock for ``up``):
    where the sessions go, then the host ports of their services. ``mine``: the sessions
    being placed and their stack ids, whose own holdings are left out."""
    reports = probe(pool)
    now = ledger.now()
    reservations = ledger.live("reservation", now)
    own_gpus: dict[str, dict[str, set[int]]] = {}
    for r in reports:
        for h in r.held:
            if h.session in mine and h.gpus:
                own_gpus.setdefault(h.session, {}).setdefault(r.name, set()).update(h.gpus)
    decided = decide(copies, pool, live_free(reports, reservations, mine, now), kept,
                     ledger.last_agent() if pool.scheduler.selector == "roundrobin" else None,
                     own_gpus)
    exclude = set(mine)
    ports: Mapping[str, Mapping[str, int]] = {}
    if not any(p.pending for p in decided.plans) and any(p.services for p in decided.plans):
        ports = service_ports.choose(decided.plans, pool,
                                     reserved=reserved_ports(reservations, exclude))
    return Placed(decided, ports)


def pending_error(decided: Decided) -> CommandError | None:
    pending = next((p for p in decided.plans if p.pending), None)
    if pending is None:
        return None
    return CommandError(f"pending: {pending.reason}; nothing was created", Exit.PENDING)


def attempt(pool: Pool, copies: Sequence[Session], kept: Mapping[str, KeptPlacement | None],
            ledger: Ledger, mine: Mapping[str, str], ahead: Sequence[Entry]
            ) -> tuple[Placed | None, CommandError | None]:
    """One try under the lock: the placement, or why it is pending (others queued ahead,
    no fit, no free service port)."""
    if ahead:
        return None, CommandError(
            f"pending: {len(ahead)} session(s) wait in pool {pool.name}'s queue ahead (first: "
            f"{ahead[0].session}); `sessionctl up FILE --wait` joins the queue; nothing was "
            "created", Exit.PENDING)
    try:
        result = place_live(pool, copies, kept, ledger, mine)
    except CommandError as exc:
        if exc.code != Exit.PENDING:
            raise
        return None, exc
    error = pending_error(result.decided)
    return (None, error) if error is not None else (result, None)


def _say(line: str) -> None:
    print(f"sessionctl up: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def placed(ledger: Ledger, copies: Sequence[Session],
           kept: Mapping[str, KeptPlacement | None], stack_ids: Mapping[str, str], *,
           reserve: bool, wait: float | None = None, say: Callable[[str], None] = _say,
           under_lock: Callable[[], None] = lambda: None) -> Iterator[Placed]:
    """Decide where ``copies`` go on live capacity; with ``reserve`` (``up``), one decision at
    a time per pool and a reservation per session held until the block ends. ``wait``
    (seconds, ``inf``): queue instead of failing when they do not fit (first come, first
    served). Raises CommandError (exit 3) when pending; PoolBusy (exit 1) when the lock stays
    held; PreflightError (exit 4) when an agent cannot be probed."""
    pool = ledger.pool
    names = [c.name for c in copies]
    mine = {n: stack_ids.get(n, "") for n in names}
    holder = Holder(", ".join(names))
    with contextlib.ExitStack() as held:
        if not reserve:  # preview: where it would go now, nothing held
            under_lock()
            yield place_live(pool, copies, kept, ledger, mine)
            return
        queued = None
        if wait is not None:
            queued = ledger.renewed("queue", names[0], stack_ids.get(names[0], ""), holder,
                                    QUEUE_LEASE)
            held.callback(queued.close)
        deadline = time.monotonic() + (wait or 0)
        shown = ""
        while True:
            with ledger.locked(holder, on_wait=lambda who: say(
                    f"pool {pool.name} is deciding a placement for {who}; waiting")) as taken:
                under_lock()
                queue = [e for e in ledger.live("queue") if e.session not in names]
                ahead = [e for e in queue if queued is None or e.arrival < queued.arrival
                         or (e.arrival == queued.arrival and e.name < queued.current)]
                result, error = attempt(pool, copies, kept, ledger, mine, ahead)
                if error is None and not ledger.still_locked(taken):
                    continue  # the decision outlived the lock's lease: decide again
                if error is None:
                    assert result is not None
                    placed_anew = [p for p in result.decided.plans
                                   if result.decided.notes.get(p.name) != "kept"]
                    if placed_anew and pool.scheduler.selector == "roundrobin":
                        ledger.set_last_agent(placed_anew[-1].containers[0].agent or "")
                    for plan in result.decided.plans:
                        held.enter_context(contextlib.closing(ledger.renewed(
                            "reservation", plan.name, stack_ids.get(plan.name, ""), holder,
                            RESERVATION_LEASE,
                            holds_of(plan, result.ports.get(plan.name)))))
                    break
            if wait is None or time.monotonic() > deadline:
                raise error
            line = str(error).removeprefix("pending: ")
            if line != shown:
                say(f"queued in pool {pool.name}"
                    f"{f' behind {len(ahead)}' if ahead else ' (first)'}: {line}")
                shown = line
            time.sleep(WAIT_POLL)
        if queued is not None:
            queued.close()
        yield result
