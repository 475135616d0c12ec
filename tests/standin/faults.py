"""Test support: a fault at one named point of a stand-in run, for the reliability tests that
interrupt a driver process there (the DockerBuilder's docker objects, the engine's dynamic
resources: the session network)."""

from __future__ import annotations

import os
import signal
import threading
import time

# "<object name>:<before|created|delete>:<INT|KILL|PAUSE=seconds>": a fault at one point of a
# run (before an object is created or deleted; or, for a container, created but not started),
# for the
# reliability tests that interrupt a driver process there
FAULT_ENV = "CLUSTER_SESSIONS_EMULATION_FAULT"


def fault_point(name: str, phase: str) -> None:
    """Interrupt (SIGINT, SIGKILL) this process, or pause, where ``FAULT_ENV`` says."""
    spec = os.environ.get(FAULT_ENV, "")
    want, _, rest = spec.partition(":")
    at, _, action = rest.partition(":")
    if (want, at) != (name, phase):
        return
    if action.startswith("PAUSE="):
        time.sleep(float(action.removeprefix("PAUSE=")))
        return
    os.kill(os.getpid(), getattr(signal, f"SIG{action}"))
    threading.Event().wait()  # nothing more happens on this thread
