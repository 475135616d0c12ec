"""main1's probe loop (templates/wait-peers.bash.j2) run by this machine's bash against sockets
of the test's own on loopback: when a probe is started again, and what it takes as an answer.
The sessions' own runs are in tests/test_readiness.py."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cluster_sessions.core.keys import generate_session_keys
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.render import READINESS, TEMPLATES, render_container

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


HELLO = b"SSH-2.0-cluster-session-probe\r\n"
# SSH_MSG_DISCONNECT, reason 11, with the text: what sshd logs ("Received disconnect ...")
GO = HELLO + b"\0\0\0\x24\x04\x01\0\0\0\x0b\0\0\0\x12cluster-session-go" + b"\0" * 8
BYE = HELLO + b"\0\0\0\x24\x07\x01\0\0\0\x0b\0\0\0\x0freadiness probe" + b"\0" * 11


def eventually(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)
    return found


def listeners(count: int) -> tuple[list[socket.socket], int]:
    """Listeners on 127.0.0.1, 127.0.0.2, ... with one port number (the probes' one port)."""
    for _ in range(20):
        made = [socket.socket()]
        made[0].bind(("127.0.0.1", 0))
        port = made[0].getsockname()[1]
        try:
            for i in range(2, count + 1):
                made.append(socket.socket())
                made[-1].bind((f"127.0.0.{i}", port))
        except OSError:
            for listener in made:
                listener.close()
            continue
        return made, port
    raise AssertionError("no port free on every address")


def two_listeners() -> tuple[socket.socket, socket.socket, int]:
    (first, second), port = listeners(2)
    return first, second, port


class Peer:
    """A listener that sends a banner on each connection and keeps, per connection, when it
    was accepted, when its first byte came and what the client said until it closed."""

    def __init__(self, listener: socket.socket, close_first_after: float | None = None):
        self.listener, self.close_first_after = listener, close_first_after
        self.connections: list[dict] = []
        self.stop = threading.Event()

    def start(self) -> Peer:
        self.listener.listen(8)
        self.listener.settimeout(0.05)
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = {"accepted": time.monotonic(), "first": None, "said": b"", "done": False}
            self.connections.append(record)
            threading.Thread(target=self._serve, args=(conn, record), daemon=True).start()

    def _serve(self, conn: socket.socket, record: dict) -> None:
        with conn:
            conn.sendall(b"SSH-2.0-test\r\n")
            if self.close_first_after is not None and len(self.connections) == 1:
                time.sleep(self.close_first_after)
                record["done"] = True
                return  # closed without a word, as sshd at its LoginGraceTime
            conn.settimeout(30)
            with contextlib.suppress(OSError):
                while chunk := conn.recv(4096):
                    if record["first"] is None:
                        record["first"] = time.monotonic()
                    record["said"] += chunk
        record["done"] = True

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


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
        eventually(lambda: said)
        assert said == [GO], said  # the go on the probe's own connection
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


PEERS = 20


def test_each_probe_holds_its_connection_and_says_go_on_it_once_every_peer_answered(
        bash, tmp_path):
    """One accepted connection per peer (issue 35: no second sshd start-up for the go): the
    first 19 peers' probes say nothing until the last, which comes 0.8 s later, answered;
    then each hears the go at once on the connection it accepted first (a probe's pause ends
    when it is told, not when its second is up, whatever the others do)."""
    script = wait_peers_bash(tmp_path)
    made, port = listeners(PEERS)
    peers = [Peer(listener) for listener in made]
    for peer in peers[:-1]:
        peer.start()
    try:
        probe = subprocess.Popen([bash, str(script), str(port), "20", str(tmp_path / "missing"),
                                  *(f"127.0.0.{i}" for i in range(1, PEERS + 1))],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.8)
        assert (tmp_path / "missing").read_text() == f"127.0.0.{PEERS}\n"
        for peer in peers[:-1]:
            assert peer.connections and peer.connections[0]["first"] is None, peer.connections
        assert probe.poll() is None
        peers[-1].start()
        out, err = probe.communicate(timeout=30)
        assert probe.returncode == 0, out + err
        for peer in peers:
            eventually(lambda peer=peer: peer.connections and peer.connections[0]["done"])
            assert [c["said"] for c in peer.connections] == [GO], peer.connections
        came = peers[-1].connections[0]["accepted"]
        for peer in peers:
            assert 0 <= peer.connections[0]["first"] - came < 0.5, (came, peer.connections)
    finally:
        for peer in peers:
            peer.close()
        if probe.poll() is None:
            probe.kill()


def test_a_held_connection_that_sshd_closes_before_the_go_is_probed_anew(bash, tmp_path):
    """sshd closes a held probe (its LoginGraceTime, or the sub went away): the peer is missing
    again, and the go comes on the new probe's connection, not the lost one."""
    script = wait_peers_bash(tmp_path)
    first_l, second_l, port = two_listeners()
    first = Peer(first_l, close_first_after=0.3).start()
    second = Peer(second_l)
    try:
        probe = subprocess.Popen([bash, str(script), str(port), "20", str(tmp_path / "missing"),
                                  "127.0.0.1", "127.0.0.2"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # noticed within the probe's pause (a second), and probed again at once
        eventually(lambda: len(first.connections) == 2, timeout=2.5)
        time.sleep(0.3)
        assert len(first.connections) == 2, first.connections
        second.start()
        out, err = probe.communicate(timeout=30)
        assert probe.returncode == 0, out + err
        eventually(lambda: first.connections[-1]["done"] and second.connections
                   and second.connections[0]["done"])
        assert [c["said"] for c in first.connections] == [b"", GO], first.connections
        assert [c["said"] for c in second.connections] == [GO], second.connections
    finally:
        first.close()
        second.close()
        if probe.poll() is None:
            probe.kill()


def test_at_the_timeout_a_held_probe_leaves_without_a_go(bash, tmp_path):
    """The second peer never comes: after the timeout the missing one is printed (exit 1), and
    the first peer, which answered, hears the probe's polite leaving, not a go."""
    script = wait_peers_bash(tmp_path)
    first_l, second_l, port = two_listeners()
    second_l.close()
    first = Peer(first_l).start()
    try:
        done = subprocess.run([bash, str(script), str(port), "1", str(tmp_path / "missing"),
                               "127.0.0.1", "127.0.0.2"], capture_output=True, text=True,
                              timeout=30, check=False)
        assert (done.returncode, done.stdout) == (1, "127.0.0.2\n"), done.stderr
        eventually(lambda: first.connections and first.connections[0]["done"])
        assert [c["said"] for c in first.connections] == [BYE], first.connections
    finally:
        first.close()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_go_and_the_probe_s_leaving_are_written_once_and_say_these_bytes(shell):
    """The go's and the leaving's words come from render.py alone (``READINESS``): printf of
    each is the ssh client's leaving sshd logs as ``Received disconnect ... :11: TEXT``, and no
    template spells them, nor their texts."""
    found = shutil.which(shell)
    if found is None:
        pytest.skip(f"no {shell} here")
    for words, expected in ((READINESS.go, GO), (READINESS.bye, BYE)):
        said = subprocess.run([found, "-c", 'printf "$1"', shell, words], capture_output=True,
                              check=True).stdout
        assert said == expected, said
    for template in sorted(TEMPLATES.glob("*.j2")):
        text = template.read_text()
        for spelled in (READINESS.go_text, READINESS.probe_text, "\\044"):
            assert spelled not in text, (template.name, spelled)


def test_each_rule_of_the_readiness_table_names_tests_that_exist():
    """docs/design-notes.md, "The readiness protocol, in one table": the last column of each
    rule names, exactly, test functions of tests/ (``file.py::name``, ``::name`` for another of
    the same file)."""
    notes = (Path(__file__).resolve().parents[1] / "docs" / "design-notes.md").read_text()
    table = notes.split("### The readiness protocol, in one table", 1)[1]
    rows = [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(row.split("|")[1]) for row in rows] == list(range(1, len(rows) + 1))
    here = Path(__file__).resolve().parent
    for row in rows:
        named, module = re.findall(r"`([^`]*::[^`]+)`", row.rsplit(" | ", 1)[1]), None
        assert named, row
        for ref in named:
            file, name = ref.split("::")
            module = file or module
            assert module, ref
            source = (here / module).read_text()
            assert re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE), (module, name)
