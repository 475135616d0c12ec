"""Which of the agents that can hold a session gets it: a pool's selector (Backend.AI's names).

Backend.AI's scheduler (``sokovan/scheduler/provisioner/selectors/``) first filters the agents
that fit, then asks one strategy to pick among them; so do we. :func:`core.placement.place`
filters (an agent is a candidate when it holds every container the session puts on one agent)
and each strategy below only picks, from plain data. As in Backend.AI:

- ``concentrated`` takes the fullest candidate (the least left free), ``dispersed`` the emptiest;
  both compare free GPUs first, then CPU, then memory (Backend.AI's default resource priority,
  cuda before cpu before mem), and both keep a session that asks for no GPU off agents with a
  free GPU when another candidate has none ("unutilized capabilities" come first in its keys).
- ``roundrobin`` takes the next candidate in pool order after the agent chosen last (Backend.AI
  keeps an index per resource group; we keep the agent's name, so an agent added to or removed
  from the pool file does not shift the turn). The caller keeps ``after`` between decisions.

Ties go to the agent first in pool order, so every choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from .capacity_types import Free, Request

Selector = Literal["concentrated", "dispersed", "roundrobin"]
SELECTORS: tuple[str, ...] = get_args(Selector)
DEFAULT_SELECTOR: Selector = "concentrated"
"""Why concentrated: docs/scheduling.md, "Selectors"."""


@dataclass(frozen=True)
class Candidate:
    """An agent that can hold what the session puts on one agent, with its place in the pool."""

    position: int
    free: Free


@dataclass(frozen=True)
class Criteria:
    """What the session asks of the agent chosen."""

    request: Request  # one container's
    count: int  # containers the agent must hold
    after: int | None = None  # roundrobin: the pool position of the agent chosen last


def _unutilized(c: Candidate, criteria: Criteria) -> int:
    """1 when the session asks for no GPU and the agent has one free (keep it for GPU work)."""
    return int(criteria.request.gpus == 0 and bool(c.free.gpus))


def concentrated(candidates: Sequence[Candidate], criteria: Criteria) -> Candidate:
    """The fullest: whole agents stay free for the sessions that need a whole agent."""
    return min(candidates, key=lambda c: (_unutilized(c, criteria), len(c.free.gpus),
                                          c.free.millicpu, c.free.mem, c.position))


def dispersed(candidates: Sequence[Candidate], criteria: Criteria) -> Candidate:
    """The emptiest: sessions share an agent only when the pool is busy."""
    return min(candidates, key=lambda c: (_unutilized(c, criteria), -len(c.free.gpus),
                                          -c.free.millicpu, -c.free.mem, c.position))


def roundrobin(candidates: Sequence[Candidate], criteria: Criteria) -> Candidate:
    """The first candidate after ``after`` in pool order, wrapping around; the first candidate
    when nothing was chosen before (or the agent chosen is gone from the pool)."""
    if criteria.after is None:
        return candidates[0]
    return next((c for c in candidates if c.position > criteria.after), candidates[0])


STRATEGIES: dict[str, Callable[[Sequence[Candidate], Criteria], Candidate]] = {
    "concentrated": concentrated,
    "dispersed": dispersed,
    "roundrobin": roundrobin,
}
assert tuple(STRATEGIES) == SELECTORS


def select(selector: str, candidates: Sequence[Candidate], criteria: Criteria) -> Candidate:
    """``candidates`` non-empty, in pool order, each able to hold ``criteria.count``."""
    return STRATEGIES[selector](candidates, criteria)
