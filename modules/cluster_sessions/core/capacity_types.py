"""What one container needs and what one agent can still give: the plain data that placement
(:mod:`core.placement`, where a session goes) and the selectors (:mod:`core.selectors`, which
agent of those that fit) both read. Below both, so neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass

UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Request:
    """What one container needs."""

    millicpu: int
    mem: int
    gpus: int


@dataclass(frozen=True)
class Free:
    """What one agent can still give, in pool order."""

    name: str
    millicpu: int
    mem: int
    gpus: tuple[int, ...] = ()

    def fits_by(self, req: Request) -> dict[str, int]:
        """How many containers fit, per resource."""
        return {
            "cpu": self.millicpu // req.millicpu,
            "mem": self.mem // req.mem,
            "gpu": len(self.gpus) // req.gpus if req.gpus else UNLIMITED,
        }

    def fits(self, req: Request) -> int:
        return min(self.fits_by(req).values())
