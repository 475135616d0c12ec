"""How busy the machine is: the benchmarks wait for it to be quiet and say how quiet it was.

Other work on a 2-core machine (someone's tests, a previous run's clean-up) lands straight in
a measurement; these helpers let a benchmark wait for a quiet moment and report the busy
fraction it saw, so a noisy figure can be recognised as such.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat (zeros where unreadable)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0]
    except OSError:
        return 0, 0
    fields = [int(x) for x in first.split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])
    return total - idle, total


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The fraction of all CPUs that was busy between two :func:`machine_cpu` readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return busy / total if total else 0.0


def settle(limit: float, threshold: float = 0.25, window: float = 0.5) -> float:
    """Wait (at most ``limit`` s) until the machine is mostly idle; return the last busy fraction.

    The fraction is of all CPUs over ``window`` seconds; ``threshold`` 0.25 on 2 CPUs means
    "less than half a core busy".
    """
    deadline = time.monotonic() + limit
    while True:
        before = machine_cpu()
        time.sleep(window)
        fraction = busy_fraction(before, machine_cpu())
        if fraction < threshold or time.monotonic() > deadline:
            return fraction


def describe() -> str:
    """One line about the machine for a benchmark's header."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} CPUs, load average {load:.2f}"
