"""The queue's order and who may pass whom (issue 44, part 5): plain data in, plain data out.
The driver reads the queue and what each project holds under the pool's lock
(driver/placing.py ``attempt``) and asks here.

- **Order**: a higher priority first; within a priority the project holding the smaller
  *dominant share* of the pool now (Backend.AI's DRF: of cpu, memory and GPUs, the largest
  fraction of the pool's declared total its sessions hold, containers and reservations);
  then arrival (first come, first served).
- **Small fits first, without starving the large**: a session with others ahead of it in that
  order may still be placed when it fits now and is *smaller* than each of them (asks no more
  cpu, memory and GPUs than it, and less of one: :func:`smaller`; an entry whose size is not
  known is passed by nobody), unless one of them has waited ``backfill_for`` (the pool's
  ``scheduler.backfill_for``, 10 minutes by default) or longer: from then on that one holds
  back every session behind it, so what it waits for is freed for it and nothing fills it. A
  large session is passed for at most ``backfill_for``, whatever keeps arriving; one of the
  same size is never passed (the order decides between them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from .governance import Held, Use, held_by
from .ledger import Entry
from .spec import Pool

Share = Callable[[str], float]


def pool_total(pool: Pool) -> Use:
    """What the pool declares in all (a Use's cpu, mem and GPUs)."""
    return Use(millicpu=sum(a.capacity.millicpu for a in pool.agents),
               mem=sum(a.capacity.mem for a in pool.agents),
               gpus=sum(len(a.capacity.gpus) for a in pool.agents))


def dominant_share(use: Use, total: Use) -> float:
    """The largest fraction of the pool's total that ``use`` holds (resources the pool does
    not declare left out)."""
    parts = [(use.millicpu, total.millicpu), (use.mem, total.mem), (use.gpus, total.gpus)]
    return max((held / whole for held, whole in parts if whole), default=0.0)


def shares(projects: Iterable[str], held: Sequence[Held], total: Use) -> dict[str, float]:
    """Each project's dominant share of the pool now."""
    return {p: dominant_share(held_by(p, held), total) for p in set(projects)}


def key(entry: Entry, priority: Callable[[Entry], int], share: Share) -> tuple:
    """The queue's order; total: two stacks' entries alike in all else go by identity."""
    return (-priority(entry), share(entry.project), entry.arrival, entry.created, entry.name,
            entry.identity)


def ahead(queue: Sequence[Entry], mine: Iterable[str], me: Entry,
          priority: Callable[[Entry], int], share: Share) -> list[Entry]:
    """The entries of other stacks (``mine``: our identities) before ``me`` in the order:
    priority, then dominant share, then arrival."""
    ours = set(mine)
    mine_key = key(me, priority, share)
    return [e for e in queue if e.identity not in ours and key(e, priority, share) < mine_key]


def smaller(mine: Use, theirs: tuple[int, int, int] | None) -> bool:
    """``mine`` asks no more cpu, memory or GPUs than ``theirs`` (millicpu, mem, GPUs) and
    less of one; an unknown size (None) is never smaller-than."""
    if theirs is None:
        return False
    pairs = ((mine.millicpu, theirs[0]), (mine.mem, theirs[1]), (mine.gpus, theirs[2]))
    return all(m <= t for m, t in pairs) and any(m < t for m, t in pairs)


def waited_too_long(before: Sequence[Entry], now: float, backfill_for: float) -> list[Entry]:
    """Of the entries ``before`` a session, the ones that have waited ``backfill_for`` seconds
    or longer (the engine's clock): nobody passes them any more."""
    return [e for e in before if now - e.arrival >= backfill_for]


def holding_back(before: Sequence[Entry], mine: Use, now: float,
                 backfill_for: float) -> list[Entry]:
    """Of the entries ``before`` a session asking ``mine``, those it may not pass even if it
    fits now: those not larger than it, and those that waited ``backfill_for``."""
    old = waited_too_long(before, now, backfill_for)
    return old + [e for e in before if e not in old and not smaller(mine, e.asks)]


def project_shares(pool: Pool, queue: Sequence[Entry], held: Sequence[Held],
                   extra: Iterable[str] = ()) -> Mapping[str, float]:
    """The shares of the projects in ``queue`` (and ``extra``), for :func:`ahead`."""
    return shares([*(e.project for e in queue), *extra], held, pool_total(pool))
