"""How a batch session's job ended, kept after its containers are gone, for ``sessionctl ls``.

While a session's containers exist, ``ls`` reads everything from the engines (main1's
``State.StartedAt``/``FinishedAt``/``ExitCode``). ``sessionctl run`` destroys the session right
after its job, and ``destroy`` leaves an empty stack: nothing on an engine or in the stack says
any more how the job went. So when ``wait`` or ``run`` sees a job end, the driver writes one
small JSON record per stack (name, id, type, mode, size, agents, how it ended, exit code,
start and end): no environment, no keys, nothing from the definition beyond names.

Where: beside the state of a ``file://`` backend (``<backend dir>/sessionctl-history/``), else
in the project's ``.pulumi-state/sessionctl-history/<backend digest>/``, so a record never
describes a stack of another backend. A newer record replaces the older one (one per stack).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .stack_settings import STATE_DIR, EngineSettings

HISTORY_DIR = "sessionctl-history"
STATES = ("finished", "lost")


@dataclass(frozen=True)
class JobRecord:
    stack: str
    name: str
    session_id: str
    type: str
    mode: str
    size: int
    agents: tuple[str, ...]
    state: str  # finished (main1 exited: exit_code says how) | lost (see detail)
    detail: str
    exit_code: int | None
    started: str | None
    finished: str | None


def history_dir(settings: EngineSettings, project: Path) -> Path | None:
    """Where the records of this backend go; None for a ``file://`` backend that does not
    exist yet (it holds no stack, so there is nothing to remember for it)."""
    url = settings.backend_url
    if url.startswith("file://"):
        state = Path(url.removeprefix("file://")).expanduser()
        return state / HISTORY_DIR if state.is_dir() else None
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return project / STATE_DIR / HISTORY_DIR / digest


def _path(directory: Path, stack: str) -> Path:
    return directory / f"{quote(stack, safe='')}.json"


def write_record(directory: Path, record: JobRecord) -> Path:
    """Atomically: a reader sees the old record or the new one, never half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    target = _path(directory, record.stack)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".record-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(asdict(record), out, indent=2, ensure_ascii=False)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def read_record(directory: Path, stack: str) -> JobRecord | None:
    """The stack's record, or None when there is none or it cannot be read as one."""
    try:
        data: Any = json.loads(_path(directory, stack).read_text(encoding="utf-8"))
        wanted = {f.name for f in fields(JobRecord)}
        if (not isinstance(data, dict) or set(data) != wanted or data["state"] not in STATES
                or not isinstance(data["agents"], list)):
            return None
        data["agents"] = tuple(str(a) for a in data["agents"])
        return JobRecord(**data)
    except (OSError, ValueError, TypeError):
        return None
