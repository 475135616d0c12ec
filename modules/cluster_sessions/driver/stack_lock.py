"""One change at a time per stack: ``sessionctl``'s own lock, and the DIY backend's stale ones.

Pulumi's file backend takes a lock file per stack for every update
(``.pulumi/locks/organization/<project>/<stack>/<uuid>.json``, always on since pulumi 3.20) and
refuses a second update meanwhile ("the stack is currently locked by 1 lock(s)"). Two things it
does not do, which this module adds for file backends:

- a second ``sessionctl up``/``destroy``/``refresh`` of the same stack is refused *before* it
  touches the stack (before its checks scan the agents), naming the run that holds it: an
  ``flock`` beside the state, which the kernel releases when its holder dies, however it dies;
- a lock file left by a run that was killed (``kill -9``, a cancelled CI job) blocks the stack
  until ``pulumi cancel``. While we hold our own lock, no other ``sessionctl`` runs on the
  stack, so a Pulumi lock written on this host by a process that no longer exists (or whose
  pid is now another program's) is stale: it is removed, and the removal is said. A ``pulumi``
  still running under such a lock is a killed driver's CLI winding down (it is told to cancel
  when its driver dies, driver/pulumi_cli.py): the next run waits for it, saying so, rather
  than failing on its lock.

Other backends (Pulumi Cloud, S3, ...) refuse concurrent updates themselves; nothing is added.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ..core.errors import EngineFailure
from ..core.names import PROJECT as PROJECT_NAME

LOCK_DIR = ".sessionctl-locks"


class StackBusy(EngineFailure):
    """Another run holds the stack; the message names it."""


def backend_dir(backend_url: str) -> Path | None:
    """The directory of a ``file://`` backend, else ``None``."""
    if not backend_url.startswith("file://"):
        return None
    return Path(backend_url.removeprefix("file://").split("?", 1)[0]).expanduser()


@contextlib.contextmanager
def stack_lock(backend_url: str, stack: str, verb: str) -> Iterator[None]:
    """Hold the stack for one verb, or raise :class:`StackBusy` at once."""
    base = backend_dir(backend_url)
    if base is None:
        yield
        return
    path = base / LOCK_DIR / f"{stack}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another run"
            raise StackBusy(f"stack {stack} is being changed by {holder}; nothing was done. "
                            "Run this again when it has finished.") from None
        try:
            handle.truncate(0)
            handle.write(f"sessionctl {verb} (pid {os.getpid()}, since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')})")
            handle.flush()
            clear_stale_pulumi_locks(base, stack)
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


# how long the next run waits for a killed run's CLI to finish cancelling (it finishes the
# operations under way first; driver/pulumi_cli.py gives an interrupted one as long)
ORPHAN_WAIT = 300.0


def _pulumi_running(pid: int) -> bool:
    """Whether ``pid`` is a live ``pulumi`` process (not gone, not a zombie, not a pid reused
    by another program)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv0 = cmdline.read().split(b"\0", 1)[0]
    except (OSError, IndexError):
        return False
    return os.path.basename(argv0.decode(errors="replace")) == "pulumi"


def clear_stale_pulumi_locks(base: Path, stack: str, wait: float = ORPHAN_WAIT) -> list[Path]:
    """Remove the DIY backend's lock files of ``stack`` written on this host by processes that
    are gone, waiting up to ``wait`` seconds for a ``pulumi`` still running under one (call
    only while holding :func:`stack_lock`); the paths removed."""
    roots = [base / ".pulumi" / "locks" / "organization" / PROJECT_NAME / stack,
             base / ".pulumi" / "locks" / stack]  # the layout before project-scoped stacks
    removed = []
    deadline = time.monotonic() + wait
    for path in [p for root in roots for p in sorted(root.glob("*.json"))]:
        try:
            doc = json.loads(path.read_text())
            pid, host = int(doc["pid"]), str(doc["hostname"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host != socket.gethostname():
            continue
        if _pulumi_running(pid):
            print(f"sessionctl: waiting for pulumi (pid {pid}), left running on stack {stack} "
                  "by a run that was killed, to finish", file=sys.stderr)
            while _pulumi_running(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _pulumi_running(pid):
                continue  # (the CLI then says the stack is locked, naming the lock)
        path.unlink(missing_ok=True)
        removed.append(path)
        print(f"sessionctl: removed a stale Pulumi lock of stack {stack} (pid {pid} on "
              f"{host} is gone): {path}", file=sys.stderr)
    return removed
