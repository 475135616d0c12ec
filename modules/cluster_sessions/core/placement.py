"""Which agent each container of a session runs on, and which GPUs it gets.

Pure and deterministic: the same session shape and the same free capacities always give the same
answer. Rules (Backend.AI's, plus what its code left out):

- single-node: every container on one agent, the one the pool's selector picks among those that
  hold them all (core.selectors); if none does, the session is pending and the reason names
  what each agent is short of.
- multi-node: if one agent can hold them all, they all go there (no cross-host traffic), the
  selector picking which; otherwise the fewest agents that together hold them, biggest first,
  main1 on the first (that rule, not the selector, decides a spread: fewest agents first).
- never more than an agent's cpu, memory or GPUs; GPU ids are handed out per container and an
  id is never given twice on one agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .capacity_types import Free, Request
from .selectors import DEFAULT_SELECTOR, Candidate, Criteria, select
from .units import format_size


@dataclass(frozen=True)
class Slot:
    agent: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Either ``slots`` (one per container, in host order) or a pending ``reason``."""

    slots: tuple[Slot, ...] = ()
    reason: str | None = None

    @property
    def pending(self) -> bool:
        return self.reason is not None

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.agent for s in self.slots))


def place(mode: str, size: int, req: Request, agents: Sequence[Free],
          selector: str = DEFAULT_SELECTOR, after: str | None = None) -> Placement:
    """``agents`` in pool order; ``after``: the agent the last decision chose (roundrobin)."""
    fits = [agent.fits(req) for agent in agents]
    candidates = [Candidate(i, agents[i]) for i, n in enumerate(fits) if n >= size]
    if candidates:
        position = next((i for i, a in enumerate(agents) if a.name == after), None)
        chosen = select(selector, candidates, Criteria(req, size, position))
        return Placement(_fill([(chosen.free, size)], req))
    if mode == "single-node" or size == 1:
        return Placement(reason=_single_node_reason(size, req, agents))
    order = sorted(range(len(agents)), key=lambda i: (-fits[i], i))
    chosen: list[tuple[Free, int]] = []
    left = size
    for i in order:
        if left == 0 or fits[i] == 0:
            break
        take = min(fits[i], left)
        chosen.append((agents[i], take))
        left -= take
    if left:
        held = size - left
        return Placement(reason=f"the pool holds only {held} of {size} containers "
                         f"({_describe(req)} each); short of {_short_overall(req, agents)}")
    return Placement(_fill(chosen, req))


def take(agents: Sequence[Free], placement: Placement, req: Request) -> list[Free]:
    """What the agents have left once ``placement`` is running: for planning several sessions
    together (``count``), each against what the ones before it left."""
    used: dict[str, list[Slot]] = {}
    for slot in placement.slots:
        used.setdefault(slot.agent, []).append(slot)
    left = []
    for agent in agents:
        slots = used.get(agent.name, [])
        gone = {g for s in slots for g in s.gpus}
        left.append(Free(agent.name, max(0, agent.millicpu - len(slots) * req.millicpu),
                         max(0, agent.mem - len(slots) * req.mem),
                         tuple(g for g in agent.gpus if g not in gone)))
    return left


def holds(agents: Sequence[Free], placement: Placement, req: Request) -> bool:
    """Whether ``agents`` can still give every slot of ``placement`` (its agents' cpu and
    memory, its very GPU ids): a kept placement is kept only where it still fits."""
    by_name = {a.name: a for a in agents}
    count: dict[str, int] = {}
    for slot in placement.slots:
        count[slot.agent] = count.get(slot.agent, 0) + 1
    for name, n in count.items():
        agent = by_name.get(name)
        if agent is None or n * req.millicpu > agent.millicpu or n * req.mem > agent.mem:
            return False
        wanted = [g for s in placement.slots if s.agent == name for g in s.gpus]
        if len(set(wanted)) != len(wanted) or not set(wanted) <= set(agent.gpus):
            return False
    return True


def _fill(chosen: list[tuple[Free, int]], req: Request) -> tuple[Slot, ...]:
    slots: list[Slot] = []
    for agent, count in chosen:
        for k in range(count):
            slots.append(Slot(agent.name, agent.gpus[k * req.gpus:(k + 1) * req.gpus]))
    return tuple(slots)


def _describe(req: Request) -> str:
    return f"cpu={req.millicpu / 1000:g}, mem={format_size(req.mem)}, gpu={req.gpus}"


def _single_node_reason(size: int, req: Request, agents: Sequence[Free]) -> str:
    shown = []
    for agent in agents[:5]:
        by = agent.fits_by(req)
        short = [k for k, n in by.items() if n < size]
        shown.append(f"{agent.name} holds {min(by.values())} (short of {', '.join(short)})")
    more = f", and {len(agents) - 5} more agents" if len(agents) > 5 else ""
    what = f"all {size} containers" if size > 1 else "the container"
    return (f"no single agent can hold {what} ({_describe(req)} each): "
            f"{'; '.join(shown)}{more}")


def _short_overall(req: Request, agents: Sequence[Free]) -> str:
    """The resources that limit the pool, judged by the most any agent can hold of each."""
    totals = {k: sum(a.fits_by(req)[k] for a in agents) for k in ("cpu", "mem", "gpu")}
    least = min(totals.values())
    return ", ".join(k for k, n in totals.items() if n == least)
