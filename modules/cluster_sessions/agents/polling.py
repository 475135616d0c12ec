"""One way to wait for something that settles asynchronously (a swarm join, a daemon's
socket, processes that exit, an overlay that workers let go of)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(probe: Callable[[], T], done: Callable[[T], bool], timeout: float,
               interval: float = 0.2, between: Callable[[T], None] | None = None) -> T:
    """Call ``probe`` until ``done(result)`` or ``timeout`` seconds passed; the last result
    either way (the caller says what a timeout means). ``probe`` runs at least once;
    ``between(result)``, when given, runs after each probe that is not the last (a retry)."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if done(result) or time.monotonic() >= deadline:
            return result
        if between is not None:
            between(result)
        time.sleep(interval)
