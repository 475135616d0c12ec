"""The driver's per-stack lock and the DIY backend's stale lock files (no engine needed)."""

from __future__ import annotations

import json
import socket
import subprocess

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


def test_only_a_pulumi_lock_of_a_process_gone_from_this_host_is_stale(tmp_path):
    locks = tmp_path / ".pulumi" / "locks" / "organization" / "cluster-sessions" / "s1"
    locks.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    here = socket.gethostname()
    docs = {"dead.json": {"pid": dead.pid, "hostname": here},
            "alive.json": {"pid": 1, "hostname": here},
            "elsewhere.json": {"pid": dead.pid, "hostname": f"not-{here}"}}
    for file, doc in docs.items():
        (locks / file).write_text(json.dumps({**doc, "username": "u", "timestamp": "t"}))
    assert clear_stale_pulumi_locks(tmp_path, "s1") == [locks / "dead.json"]
    assert sorted(p.name for p in locks.iterdir()) == ["alive.json", "elsewhere.json"]
