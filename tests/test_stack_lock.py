"""The driver's per-stack lock and the DIY backend's stale lock files (no engine needed)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cluster_sessions.driver.stack_lock import (
    StackBusy,
    backend_dir,
    clear_stale_pulumi_locks,
    stack_lock,
)


def test_a_second_change_of_one_stack_is_refused_naming_the_first(tmp_path):
    url = f"file://{tmp_path}"
    with stack_lock(url, "s1", "up"):
        busy = pytest.raises(StackBusy, match=r"stack s1 is being changed by sessionctl up \(pid")
        with busy, stack_lock(url, "s1", "destroy"):
            pass
        with stack_lock(url, "s2", "up"):  # another stack is not held
            pass
    with stack_lock(url, "s1", "destroy"):  # released
        pass


def test_other_backends_take_no_lock_of_ours(tmp_path):
    assert backend_dir("s3://bucket/state") is None
    with stack_lock("s3://bucket/state", "s1", "up"), stack_lock("s3://bucket/state", "s1", "up"):
        pass


def write_locks(base, docs: dict) -> Path:
    locks = base / ".pulumi" / "locks" / "organization" / "cluster-sessions" / "s1"
    locks.mkdir(parents=True, exist_ok=True)
    for file, doc in docs.items():
        (locks / file).write_text(json.dumps({**doc, "username": "u", "timestamp": "t"}))
    return locks


def a_pulumi(tmp_path, seconds: float) -> subprocess.Popen:
    """A process named ``pulumi`` (``sleep`` under that name) for ``seconds``."""
    named = tmp_path / "bin" / "pulumi"
    named.parent.mkdir(exist_ok=True)
    shutil.copy(shutil.which("sleep"), named)
    return subprocess.Popen([str(named), str(seconds)])


def test_only_a_pulumi_lock_of_a_process_gone_from_this_host_is_stale(tmp_path):
    """Gone, or its pid now another program's: stale. Written on another host: not ours to
    judge. A ``pulumi`` still running under it: left (waited for, below)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    other = subprocess.Popen(["sleep", "30"])
    running = a_pulumi(tmp_path, 30)
    here = socket.gethostname()
    try:
        locks = write_locks(tmp_path, {
            "dead.json": {"pid": dead.pid, "hostname": here},
            "reused.json": {"pid": other.pid, "hostname": here},
            "running.json": {"pid": running.pid, "hostname": here},
            "elsewhere.json": {"pid": dead.pid, "hostname": f"not-{here}"}})
        assert clear_stale_pulumi_locks(tmp_path, "s1", wait=0.2) == [
            locks / "dead.json", locks / "reused.json"]
        assert sorted(p.name for p in locks.iterdir()) == ["elsewhere.json", "running.json"]
    finally:
        for process in (other, running):
            process.kill()
            process.wait()


def test_a_killed_runs_cli_still_cancelling_is_waited_for_saying_so(tmp_path, capsys):
    """The CLI a killed driver left, finishing its cancel: the next run waits for it (not
    fail on its lock), then removes the lock it could not release."""
    cli = a_pulumi(tmp_path, 1)
    locks = write_locks(tmp_path, {"cli.json": {"pid": cli.pid, "hostname": socket.gethostname()}})
    threading.Thread(target=cli.wait, daemon=True).start()  # (reaped as it ends: no zombie)
    started = time.monotonic()
    assert clear_stale_pulumi_locks(tmp_path, "s1", wait=30) == [locks / "cli.json"]
    assert 0.5 < time.monotonic() - started < 20
    err = capsys.readouterr().err
    assert f"waiting for pulumi (pid {cli.pid}), left running on stack s1" in err, err
