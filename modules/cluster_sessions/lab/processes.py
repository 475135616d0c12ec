"""The lab's processes: daemons started so that they outlive the caller, found again by pid,
network namespace or cgroup, and stopped (SIGTERM, then SIGKILL); mounts left under a
directory. Linux only; root for the namespaces and cgroups."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

from ..agents.polling import poll_until
from ..core.errors import EngineFailure

CGROUP_ROOT = Path("/sys/fs/cgroup")


class LabError(EngineFailure, RuntimeError):
    """The lab cannot be brought up, inspected or torn down; the message says why."""


def run(cmd: list[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise LabError(f"{cmd[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip()
        raise LabError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {msg}")
    return proc


_CHILDREN: dict[int, subprocess.Popen] = {}
_CHILDREN_LOCK = threading.Lock()


def spawn(cmd: list[str], log: Path) -> int:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the caller, unaffected by its Ctrl-C
            close_fds=True,
        )
    with _CHILDREN_LOCK:
        _CHILDREN[proc.pid] = proc
    return proc.pid


def alive(pid: int) -> bool:
    with _CHILDREN_LOCK:
        proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is None:
            return True
        with _CHILDREN_LOCK:
            _CHILDREN.pop(pid, None)
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def pid_matching(pid: int | None, marker: str) -> int | None:
    """``pid`` if it is alive and its command line mentions ``marker`` (guards pid reuse)."""
    if not pid or not alive(pid):
        return None
    return pid if any(marker in arg for arg in cmdline(pid)) else None


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def terminate(pids: Iterable[int], timeout: float) -> None:
    pids = {p for p in pids if p and alive(p)}
    for pid in pids:
        kill(pid, signal.SIGTERM)
    pids = poll_until(lambda: {p for p in pids if alive(p)}, lambda left: not left, timeout,
                      interval=0.05)
    for pid in pids:
        kill(pid, signal.SIGKILL)
    poll_until(lambda: {p for p in pids if alive(p)}, lambda left: not left, 5, interval=0.05)


def pids_in_netns(path: Path) -> set[int]:
    try:
        ino = path.stat().st_ino
    except OSError:
        return set()
    want = f"net:[{ino}]"
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns/net") == want:
                found.add(int(entry.name))
        except OSError:
            continue
    found.discard(os.getpid())
    return {p for p in found if alive(p)}


def cgroup_dirs(name: str) -> list[Path]:
    """Every cgroup directory called ``name`` directly under a hierarchy root."""
    dirs = []
    if (CGROUP_ROOT / name).is_dir():
        dirs.append(CGROUP_ROOT / name)
    with contextlib.suppress(OSError):
        for hier in CGROUP_ROOT.iterdir():
            if (hier / name).is_dir():
                dirs.append(hier / name)
    return dirs


def pids_in_cgroups(name: str) -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs(name):
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    pids.update(
                        int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()
                    )
    pids.discard(os.getpid())
    return {p for p in pids if alive(p)}


def remove_cgroups(name: str) -> None:
    for top in cgroup_dirs(name):
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def unmount_under(roots: Iterable[Path]) -> None:
    roots = [str(r).rstrip("/") for r in roots]
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    points = []
    for line in lines:
        mp = line.split()[4]
        mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), mp)
        if any(mp == r or mp.startswith(r + "/") for r in roots):
            points.append(mp)
    for mp in sorted(set(points), key=lambda p: p.count("/"), reverse=True):
        run(["umount", "-l", mp], check=False)


# --------------------------------------------------------------------------- the engine API
