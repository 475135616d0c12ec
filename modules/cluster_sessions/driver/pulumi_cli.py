"""How the driver runs the ``pulumi`` CLI: the Automation API's :class:`PulumiCommand`, with
Ctrl-C handled as the CLI itself expects it.

The SDK's ``PulumiCommand.run`` starts the CLI in the driver's process group and, on Ctrl-C,
leaves ``subprocess.Popen``'s block at once: it closes the CLI's pipes after 0.25 s and the
reader threads die with ``ValueError: I/O operation on closed file``. The CLI, still applying
changes, is killed by the broken pipe at its next line (Go exits on ``SIGPIPE`` on fd 1/2)
and leaves its plugins running, reparented to PID 1; signalled alone (``kill -INT`` to the
driver), the CLI is not told at all and applies the rest after the driver has gone
(docs/provider-fidelity.md, issue 42). Here the CLI runs in a process group of its own and the
driver passes each Ctrl-C on to that group, as a terminal does: the first makes the CLI cancel
(it finishes the operations under way, records them in the stack and stops its plugins), a
second ends it at once. The driver keeps reading its output meanwhile and raises
``KeyboardInterrupt`` once the CLI has exited, so that what follows (the "interrupted; its
agents hold" report) sees the engine's final state. A group of its own is out of reach of a
signal to the driver's group (``kill -9`` of a CI job's processes, a closed terminal), so the
CLI is told to cancel when its driver dies, however it dies (Linux's parent-death signal, set
by ``setpriv`` before it execs the CLI):
without it, it applied on unsupervised under the stack's lock, and its plugins outlived it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult, OnOutput, _fixup_path
from pulumi.automation.errors import create_command_error

# The CLI's parent-death signal: SIGINT when the thread that started it ends (it waits for the
# CLI, so: when the driver dies), set by util-linux's setpriv (Essential on Debian), which then
# execs the CLI. Not a ``preexec_fn``: Python code between fork and exec runs the fork handlers
# gRPC registers in the driver ("Other threads are currently calling into gRPC, skipping fork()
# handlers"), and an up failed on "epoll_wait error: Bad file descriptor".
CANCEL_WHEN_THE_DRIVER_DIES = (["setpriv", "--pdeathsig", "INT", "--"]
                               if shutil.which("setpriv") else [])

# how long a cancelling CLI may take to finish the operations under way before the driver
# stops waiting (a second Ctrl-C ends it at once)
CANCEL_WAIT = 300.0


class InterruptibleCommand(auto.PulumiCommand):
    """``PulumiCommand`` whose runs pass Ctrl-C on to the CLI and wait for it to cancel."""

    def run(self, args: list[str], cwd: str, additional_env: Mapping[str, str],
            on_output: OnOutput | None = None,
            on_error: OnOutput | None = None) -> CommandResult:
        # the SDK's run, line for line (pulumi/automation/_cmd.py PulumiCommand.run), but for
        # the process group, what Ctrl-C does and where the CLI's output goes
        sep = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:sep]:
            args.insert(0, "--non-interactive")
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        if os.path.isabs(self.command):
            env = _fixup_path(env, os.path.dirname(self.command))
        chunks: dict[str, list[str]] = {"out": [], "err": []}
        ended = threading.Event()
        with _output_file() as (out_w, out_r), _output_file() as (err_w, err_r):
            process = subprocess.Popen(
                [*CANCEL_WHEN_THE_DRIVER_DIES, self.command, *args], stdout=out_w,
                stderr=err_w, stdin=subprocess.DEVNULL, cwd=cwd, env=env, process_group=0)
            readers = [threading.Thread(target=_follow, args=(r, callback, into, ended),
                                        daemon=True)
                       for r, callback, into in ((out_r, on_output, chunks["out"]),
                                                 (err_r, on_error, chunks["err"]))]
            for reader in readers:
                reader.start()
            try:
                interrupted = wait_passing_interrupts(process)
            finally:
                ended.set()
                for reader in readers:
                    reader.join(5)
        result = CommandResult(stderr="\n".join(chunks["err"]),
                               stdout="\n".join(chunks["out"]), code=process.returncode)
        if interrupted:
            raise KeyboardInterrupt
        if result.code != 0:
            raise create_command_error(result)
        return result


def wait_passing_interrupts(process: subprocess.Popen, cancel_wait: float = CANCEL_WAIT
                            ) -> bool:
    """Wait for ``process``; each Ctrl-C meanwhile goes on to its process group (the first
    asks it to cancel, the next end it). True when it was interrupted."""
    interrupted = 0
    while True:
        try:
            process.wait(timeout=cancel_wait if interrupted else None)
            return interrupted > 0
        except KeyboardInterrupt:
            interrupted += 1
            _signal_group(process, signal.SIGINT if interrupted < 3 else signal.SIGKILL)
        except subprocess.TimeoutExpired:  # cancelling for too long: end it
            _signal_group(process, signal.SIGKILL)
            process.wait()
            return True


@contextlib.contextmanager
def _output_file():
    """Where the CLI writes one of its streams: a file with no name (the driver reads it
    through a second open of its own), not a pipe, so that the CLI outlives its reader: a
    write to a pipe nobody reads kills it (Go exits on ``SIGPIPE`` on fd 1/2) before it has
    finished cancelling, released the stack's lock and stopped its plugins."""
    import tempfile

    with tempfile.TemporaryFile() as writer, open(f"/proc/self/fd/{writer.fileno()}",
                                                  "rb") as reader:
        yield writer, reader


def _follow(reader: Any, callback: OnOutput | None, into: list[str],
            ended: threading.Event) -> None:
    """Each line the CLI writes, as it writes it, until it has ended and all is read."""
    partial = b""
    while True:
        finished = ended.is_set()  # (read before the data: what was written before is read)
        data = reader.read()
        lines = (partial + data).split(b"\n")
        partial = lines.pop()
        if finished and partial:
            lines.append(partial)
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if callback:
                callback(line)
            into.append(line)
        if finished:
            return
        if not data:
            ended.wait(0.05)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signum)

