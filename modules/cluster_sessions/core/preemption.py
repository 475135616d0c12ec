"""Which running sessions a higher-priority session may end to make room (issue 44, part 5):
plain data in, plain data out. The driver reads what runs and what is free under the pool's
lock (driver/placing.py ``placed``) and asks here; ending the victims is the shell's.

The rules:

- **Who may be a victim**: a batch session (``type: batch``) that declared
  ``preemptible: true``, of a priority *strictly lower* than the pending session's. Never an
  interactive session, never one that did not declare it, never one of the same priority.
- **Only when it makes the pending session fit**: with every eligible victim ended it must
  fit (``fits``, the caller's placement rule on the freed capacity), else nobody is ended.
- **Which ones**: the eligible sessions are taken in the order *lowest priority first, then
  the youngest (most recently started), then by name*, until the pending session fits; then
  every victim whose capacity is not needed is given back, the last taken first. The result
  is **inclusion-minimal**: leaving out any one of the victims, the session would not fit
  (a smallest set overall is a bin-packing problem; this one is found in linear passes and
  prefers the sessions the order puts first).
- What an ended victim frees is added to what is free on its agents, never beyond what the
  agent declares (a label that says more cannot make room that is not there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .capacity_types import Free


@dataclass(frozen=True)
class Hold:
    """What a running session holds on one agent."""

    agent: str
    millicpu: int
    mem: int
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Running:
    """A session that runs on the pool now, as the driver read it (its stack's definition for
    its type, priority and ``preemptible``; its containers' labels for what it holds)."""

    name: str
    priority: int
    preemptible: bool
    type: str  # interactive | batch
    started: float  # epoch seconds: when its latest container started (youngest: largest)
    holds: tuple[Hold, ...]
    key: str = ""  # its stack (or name): what the caller knows it by


def eligible(priority: int, running: Sequence[Running]) -> list[Running]:
    """The sessions a session of ``priority`` may end, in the order victims are taken:
    lowest priority first, then the youngest, then by name."""
    found = [r for r in running
             if r.preemptible and r.type == "batch" and r.priority < priority]
    return sorted(found, key=lambda r: (r.priority, -r.started, r.name, r.key))


def freed(free: Sequence[Free], declared: Mapping[str, Free], victims: Sequence[Running]
          ) -> list[Free]:
    """``free`` (in pool order) with what ``victims`` hold given back, capped at what each
    agent declares (its cpu, memory and GPU ids)."""
    out = []
    for f in free:
        cpu, mem, gpus = f.millicpu, f.mem, list(f.gpus)
        for v in victims:
            for h in v.holds:
                if h.agent == f.name:
                    cpu, mem = cpu + h.millicpu, mem + h.mem
                    gpus += [g for g in h.gpus if g not in gpus]
        top = declared.get(f.name, f)
        out.append(Free(f.name, min(cpu, top.millicpu), min(mem, top.mem),
                        tuple(g for g in top.gpus if g in gpus)))
    return out


def choose_victims(priority: int, running: Sequence[Running], free: Sequence[Free],
                   declared: Sequence[Free], fits: Callable[[list[Free]], bool]
                   ) -> list[Running] | None:
    """The sessions to end so that a session of ``priority`` fits (``fits`` of what would be
    free), in the order they were chosen; ``[]`` when it fits already; None when ending every
    eligible session would still not make it fit (then nobody is ended)."""
    if fits(list(free)):
        return []
    top = {d.name: d for d in declared}
    order = eligible(priority, running)
    chosen: list[Running] = []
    for candidate in order:
        chosen.append(candidate)
        if fits(freed(free, top, chosen)):
            break
    else:
        return None
    for candidate in reversed(chosen[:-1]):  # the last one taken is needed: it made it fit
        rest = [c for c in chosen if c is not candidate]
        if fits(freed(free, top, rest)):
            chosen = rest
    return chosen


def reason(victim: Running, by: str, by_priority: int) -> str:
    """What a victim's record says: by whom, and the two priorities."""
    return (f"preempted by {by} (priority {by_priority} > its {victim.priority}): the pool's "
            "policies.preemption ends preemptible batch sessions of a lower priority")
