"""main1's probe loop (templates/wait-peers.bash.j2) run by this machine's bash against sockets
of the test's own on loopback: when a probe is started again, and what it takes as an answer.
The sessions' own runs are in tests/test_readiness.py."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cluster_sessions.core.keys import generate_session_keys
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.render import render_container

from .test_render import POOL, by_path, make_session


def wait_peers_bash(directory: Path) -> Path:
    plan = build_plan(make_session(2), POOL)
    files = by_path(render_container(plan, plan.containers[0],
                                     generate_session_keys(plan.hosts)))
    path = directory / "wait-peers.bash"
    path.write_text(files["wait-peers.bash"].content)
    return path


def accepting(listener: socket.socket, stop: threading.Event, handle) -> None:
    """Accept connections in a thread until ``stop``, each handed to ``handle`` in turn."""
    def run() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by the test
                return
            with conn:
                handle(conn)

    threading.Thread(target=run, daemon=True).start()


def banner_then_listen(conn: socket.socket, banner: bytes = b"SSH-2.0-test\r\n") -> bytes:
    """As sshd does for a probe: its banner, then what the client says until it closes."""
    conn.sendall(banner)
    conn.settimeout(5)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := conn.recv(4096):
            data += chunk
    return data


@pytest.fixture
def bash() -> str:
    found = shutil.which("bash")
    assert found, "bash is part of the machine"
    return found


def test_a_probe_whose_connection_is_not_made_is_started_again_after_a_fifth_of_a_second(
        bash, tmp_path):
    """A listener whose accept queue is full drops new connections' first packets, as a
    network that is not up yet does; the kernel sends a dropped SYN again after 1 s, then 3 s.
    The queue is emptied at 1.3 s: a probe started again then connects at once, where the
    first probe's own retry would come at ~3 s."""
    script = wait_peers_bash(tmp_path)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # room for one connection not yet accepted
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))  # fills it
    stop = threading.Event()
    try:
        started = time.monotonic()
        probe = subprocess.Popen([bash, str(script), str(port), "20",
                                  str(tmp_path / "missing"), "127.0.0.1"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.3)
        held, _ = listener.accept()  # the queue has room again
        held.close()
        said: list[bytes] = []
        accepting(listener, stop, lambda conn: said.append(banner_then_listen(conn)))
        out, err = probe.communicate(timeout=30)
        took = time.monotonic() - started
        assert probe.returncode == 0, out + err
        assert took < 2.6, f"answered after {took:.2f} s"
        assert any(b"readiness probe" in s for s in said), said
        # the file it went by: the probe's pid, beside the status file
        assert (tmp_path / "probe-connected.127.0.0.1").read_text().strip().isdigit()
    finally:
        stop.set()
        filler.close()
        listener.close()
        if probe.poll() is None:
            probe.kill()


def test_a_connected_probe_is_given_its_three_seconds_to_answer(bash, tmp_path):
    """A peer that accepts at once but says its banner only after 1 s (a loaded sshd) is not
    dropped at 0.2 s: one connection, answered."""
    script = wait_peers_bash(tmp_path)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted: list[float] = []
    stop = threading.Event()

    def slow(conn: socket.socket) -> None:
        accepted.append(time.monotonic())
        time.sleep(1.0)
        banner_then_listen(conn, b"SSH-2.0-slow\r\n")

    accepting(listener, stop, slow)
    try:
        done = subprocess.run([bash, str(script), str(port), "20", str(tmp_path / "missing"),
                               "127.0.0.1"], capture_output=True, text=True, timeout=30,
                              check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert len(accepted) == 1, accepted
    finally:
        stop.set()
        listener.close()
