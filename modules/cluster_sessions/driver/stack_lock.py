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
  stack, so a Pulumi lock written on this host by a process that no longer exists is stale:
  it is removed, and the removal is said.

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_stale_pulumi_locks(base: Path, stack: str) -> list[Path]:
    """Remove the DIY backend's lock files of ``stack`` written on this host by processes that
    are gone (call only while holding :func:`stack_lock`); the paths removed."""
    roots = [base / ".pulumi" / "locks" / "organization" / PROJECT_NAME / stack,
             base / ".pulumi" / "locks" / stack]  # the layout before project-scoped stacks
    removed = []
    for path in [p for root in roots for p in sorted(root.glob("*.json"))]:
        try:
            doc = json.loads(path.read_text())
            pid, host = int(doc["pid"]), str(doc["hostname"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host == socket.gethostname() and not _alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path)
            print(f"sessionctl: removed a stale Pulumi lock of stack {stack} (pid {pid} on "
                  f"{host} is gone): {path}", file=sys.stderr)
    return removed
