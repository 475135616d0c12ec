"""Allocated against declared capacity, per agent: what running sessions hold where.

``sessionctl pool usage`` and the summary under ``sessionctl ls`` both come from here. The
input is what our container labels say each container holds (``cluster-sessions.cpu``, ``.mem``,
``.gpus``; :class:`cluster_sessions.agents.facts.HeldContainer`); *allocated* counts the
containers that hold the machine now (running, restarting, paused), Backend.AI's "allocated"
of a running session. Stopped containers are counted apart: placement still reserves them
(the next ``up`` starts them again), but they use nothing now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .spec import Capacity
from .units import format_size

ALLOCATING = frozenset({"running", "restarting", "paused"})


class Holding(Protocol):
    session: str
    state: str
    millicpu: int
    mem: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Usage:
    agent: str
    declared_millicpu: int
    declared_mem: int
    declared_gpus: tuple[int, ...]
    millicpu: int  # allocated now
    mem: int
    gpus: tuple[int, ...]
    containers: int
    sessions: tuple[str, ...]
    stopped: int  # containers not running: reserved by placement, using nothing

    @property
    def over(self) -> bool:
        """More allocated than declared (an overcommitted declaration, or a hand-made
        container carrying our labels)."""
        return (self.millicpu > self.declared_millicpu or self.mem > self.declared_mem
                or bool(set(self.gpus) - set(self.declared_gpus)))


def agent_usage(agent: str, capacity: Capacity | None, held: Iterable[Holding]) -> Usage:
    """One agent's usage; ``capacity`` None when the declaration is not known (0 declared)."""
    active = list(held)
    running = [h for h in active if h.state in ALLOCATING]
    gpus = sorted({g for h in running for g in h.gpus})
    return Usage(
        agent=agent,
        declared_millicpu=capacity.millicpu if capacity else 0,
        declared_mem=capacity.mem if capacity else 0,
        declared_gpus=tuple(capacity.gpus) if capacity else (),
        millicpu=sum(h.millicpu for h in running),
        mem=sum(h.mem for h in running),
        gpus=tuple(gpus),
        containers=len(running),
        sessions=tuple(sorted({h.session for h in running})),
        stopped=len(active) - len(running),
    )


def _size(size: int) -> str:
    return format_size(size) if size else "0"


def usage_text(u: Usage) -> str:
    """``agent1: cpu 1.5/32, mem 3g/256g, gpus 1/4, 3 containers of 2 sessions``."""
    text = (f"{u.agent}: cpu {u.millicpu / 1000:g}/{u.declared_millicpu / 1000:g}, "
            f"mem {_size(u.mem)}/{_size(u.declared_mem)}, "
            f"gpus {len(u.gpus)}/{len(u.declared_gpus)}, "
            f"{u.containers} container{'s' if u.containers != 1 else ''} of "
            f"{len(u.sessions)} session{'s' if len(u.sessions) != 1 else ''}")
    if u.stopped:
        text += f" ({u.stopped} stopped)"
    return text + (" - over the declared capacity" if u.over else "")


def usage_to_dict(u: Usage) -> dict[str, Any]:
    return {
        "agent": u.agent,
        "declared": {"cpu": u.declared_millicpu / 1000, "mem": u.declared_mem,
                     "gpus": list(u.declared_gpus)},
        "allocated": {"cpu": u.millicpu / 1000, "mem": u.mem, "gpus": list(u.gpus),
                      "containers": u.containers},
        "sessions": list(u.sessions),
        "stopped_containers": u.stopped,
        "over": u.over,
    }
