"""Live free capacity of a shared pool, from what its engines show (issue 31).

The engines are the truth of what is held: every container carries its allocation in its
labels, and a session being placed holds a *reservation* every other client sees, from the
moment its placement is decided until its containers exist (or its lease runs out: a killed
``up`` holds nothing for long). Live free capacity is the declared capacity minus what
containers hold minus what the live reservations of the other stacks hold. Pure: the caller
reads the reports from the engines and passes the time.

A container belongs to a *stack* (its id is on every label, issue 31 item 7); a session of
the same name that another stack made still holds what it holds. A reservation is what one
decision placed: the stacks of a definition (one per session of its ``count``), their holds
per agent. A reservation and the containers of the stacks it covers count once, and
conservatively: on each agent the larger CPU and the larger memory of the two, and the union
of their GPU ids. That is sound because an ``up`` that places a definition again removes
*every* old container of its stacks before it creates a new one: Pulumi's delete-before-
replace is per container and replacements run side by side, so an old container of one
session (or host) could otherwise still hold what a new one of another was given
(tests/test_gpu_exclusivity.py shows both). A container without a stack id (made before stack
ids) is a holder of its own, by session name.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from .placement import Free, Placement, Request
from .units import format_size

HolderKey = tuple[str, str]
"""Who holds something on a pool: (stack id, ""), or ("", session) without a stack id."""


def _holder(stack_id: str, session: str) -> HolderKey:
    return (stack_id, "") if stack_id else ("", session)


@dataclass(frozen=True)
class AgentHold:
    """What a reservation holds on one agent."""

    agent: str
    millicpu: int
    mem: int
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class ContainerHold:
    """What one container holds, as its labels say. Stopped containers hold too: the session's
    next ``up`` starts them again where they are."""

    session: str
    stack_id: str
    agent: str
    millicpu: int
    mem: int
    gpus: tuple[int, ...] = ()

    @property
    def key(self) -> HolderKey:
        return _holder(self.stack_id, self.session)


@dataclass(frozen=True)
class Reservation:
    """What one decision placed, held until its containers exist, at most until
    ``lease_until`` (seconds since the epoch, as ``since``)."""

    session: str  # the definition's name (its sessions are NAME-1.. with a count)
    stack_ids: tuple[str, ...]  # the stacks it places: one per session of the definition
    holder: str  # who decided: host, pid (``pool usage`` shows it)
    since: float
    lease_until: float
    holds: tuple[AgentHold, ...]

    @property
    def key(self) -> HolderKey:
        return (self.stack_ids[0], "") if self.stack_ids else ("", self.session)

    def live(self, now: float) -> bool:
        return now < self.lease_until


def holds_of(placed: Iterable[tuple[Placement, Request]]) -> tuple[AgentHold, ...]:
    """What decided placements (each with its containers' request) hold per agent: a
    reservation's ``holds``."""
    per: dict[str, list] = {}
    for placement, req in placed:
        for slot in placement.slots:
            cpu_mem_gpus = per.setdefault(slot.agent, [0, 0, []])
            cpu_mem_gpus[0] += req.millicpu
            cpu_mem_gpus[1] += req.mem
            cpu_mem_gpus[2].extend(slot.gpus)
    return tuple(AgentHold(a, c, m, tuple(g)) for a, (c, m, g) in per.items())


@dataclass
class _Held:
    """What one holder holds on one agent, and the sessions it holds it for."""

    millicpu: int = 0
    mem: int = 0
    gpus: list[int] = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)

    def add(self, session: str, millicpu: int, mem: int, gpus: Iterable[int]) -> None:
        self.millicpu += millicpu
        self.mem += mem
        self.gpus.extend(gpus)
        self.sessions.add(session)


def _held(containers: Iterable[ContainerHold], reservations: Iterable[Reservation],
          now: float, exclude: Collection[str] = ()) -> dict[str, dict[HolderKey, _Held]]:
    """Per agent, per holder, what it holds: containers and live reservations merged."""
    live = [r for r in reservations
            if r.live(now) and not any(s in exclude for s in r.stack_ids)]
    covered: dict[str, HolderKey] = {}  # stack id -> the reservation it counts with
    for r in live:
        for stack in r.stack_ids:
            covered.setdefault(stack, r.key)
    built: dict[tuple[str, HolderKey], _Held] = defaultdict(_Held)
    for c in containers:
        if not (c.stack_id and c.stack_id in exclude):
            key = covered.get(c.stack_id, c.key) if c.stack_id else c.key
            built[(c.agent, key)].add(c.session, c.millicpu, c.mem, c.gpus)
    reserved: dict[tuple[str, HolderKey], _Held] = defaultdict(_Held)
    for r in live:
        for a in r.holds:
            reserved[(a.agent, r.key)].add(r.session, a.millicpu, a.mem, a.gpus)
    out: dict[str, dict[HolderKey, _Held]] = defaultdict(dict)
    for (agent, key), h in reserved.items():
        mine = built.get((agent, key))
        if mine is not None:
            have = set(mine.gpus)
            h = _Held(max(mine.millicpu, h.millicpu), max(mine.mem, h.mem),
                      mine.gpus + [g for g in h.gpus if g not in have],
                      mine.sessions | h.sessions)
        out[agent][key] = h
    for (agent, key), h in built.items():
        out[agent].setdefault(key, h)
    return out


def live_free(declared: Sequence[Free], containers: Iterable[ContainerHold],
              reservations: Iterable[Reservation], exclude_stacks: Collection[str],
              now: float) -> list[Free]:
    """What each agent of ``declared`` (the pool's capacity, in pool order) can still give:
    its capacity minus what containers and live reservations hold, those of
    ``exclude_stacks`` (the stack being placed: its own) left out. Never below zero."""
    held = _held(containers, reservations, now, set(exclude_stacks))
    free = []
    for d in declared:
        sessions = held.get(d.name, {}).values()
        gone = {g for h in sessions for g in h.gpus}
        free.append(Free(d.name, max(0, d.millicpu - sum(h.millicpu for h in sessions)),
                         max(0, d.mem - sum(h.mem for h in sessions)),
                         tuple(g for g in d.gpus if g not in gone)))
    return free


def _size(size: int) -> str:
    return format_size(size) if size else "0"


def over_commitments(declared: Sequence[Free], containers: Iterable[ContainerHold],
                     reservations: Iterable[Reservation], now: float) -> list[str]:
    """Each breach of the pool's invariant, as a line: an agent holding more CPU or memory
    than it declares, a GPU id held twice or not declared, an agent outside the pool holding
    anything. Empty when the pool is sound."""
    held = _held(containers, reservations, now)
    capacity = {d.name: d for d in declared}
    found = []
    for agent, sessions in held.items():
        who = ", ".join(sorted({n for h in sessions.values() for n in h.sessions}))
        d = capacity.get(agent)
        if d is None:
            found.append(f"{agent}: not an agent of the pool, held by {who}")
            continue
        cpu = sum(h.millicpu for h in sessions.values())
        mem = sum(h.mem for h in sessions.values())
        if cpu > d.millicpu:
            found.append(f"{agent}: cpu {cpu / 1000:g} held of {d.millicpu / 1000:g} "
                         f"declared, by {who}")
        if mem > d.mem:
            found.append(f"{agent}: mem {_size(mem)} held of {_size(d.mem)} declared, "
                         f"by {who}")
        count = Counter(g for h in sessions.values() for g in h.gpus)
        for gpu, n in sorted(count.items()):
            holders = ", ".join(sorted({n for h in sessions.values() if gpu in h.gpus
                                        for n in h.sessions}))
            if gpu not in d.gpus:
                found.append(f"{agent}: GPU {gpu} held but not declared, by {holders}")
            if n > 1:
                found.append(f"{agent}: GPU {gpu} held {n} times, by {holders}")
    return found


@dataclass(frozen=True)
class Holding:
    """Who holds something on an agent, as a pending reason names them (issue 41)."""

    agent: str
    session: str
    made_by: str  # "" when its labels do not say
    reserved: bool = False  # a reservation of an ``up`` under way, not containers


def who_holds(holdings: Iterable[Holding], agents: Sequence[str], most: int = 4) -> str:
    """``held on A by s1 (made by u@h), s2 (being placed); on B by ...``: who holds what
    each agent of ``agents`` lacks, at most ``most`` holders per agent; "" when nobody."""
    per: dict[str, dict[str, str]] = {}
    for h in holdings:
        how = ", ".join(filter(None, (f"made by {h.made_by}" if h.made_by else "",
                                      "being placed" if h.reserved else "")))
        per.setdefault(h.agent, {}).setdefault(h.session, how)
    parts = []
    for agent in agents:
        found = per.get(agent)
        if not found:
            continue
        names = [f"{s} ({how})" if how else s for s, how in sorted(found.items())]
        more = f" and {len(names) - most} more" if len(names) > most else ""
        parts.append(f"on {agent} by {', '.join(names[:most])}{more}")
    return f"held {'; '.join(parts)}" if parts else ""
