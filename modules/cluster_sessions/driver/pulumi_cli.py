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
agents hold" report) sees the engine's final state.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult, OnOutput, _fixup_path
from pulumi.automation.errors import create_command_error

# how long a cancelling CLI may take to finish the operations under way before the driver
# stops waiting (a second Ctrl-C ends it at once)
CANCEL_WAIT = 300.0


class InterruptibleCommand(auto.PulumiCommand):
    """``PulumiCommand`` whose runs pass Ctrl-C on to the CLI and wait for it to cancel."""

    def run(self, args: list[str], cwd: str, additional_env: Mapping[str, str],
            on_output: OnOutput | None = None,
            on_error: OnOutput | None = None) -> CommandResult:
        # the SDK's run, line for line (pulumi/automation/_cmd.py PulumiCommand.run), but for
        # the process group and what Ctrl-C does
        sep = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:sep]:
            args.insert(0, "--non-interactive")
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        if os.path.isabs(self.command):
            env = _fixup_path(env, os.path.dirname(self.command))
        chunks: dict[str, list[str]] = {"out": [], "err": []}

        def consumer(stream: Any, callback: OnOutput | None, into: list[str]) -> None:
            for line in iter(stream.readline, ""):
                stripped = line.rstrip()
                if callback:
                    callback(stripped)
                into.append(stripped)
            stream.close()

        process = subprocess.Popen([self.command, *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=cwd,
                                   env=env, encoding="utf-8", process_group=0)
        readers = [threading.Thread(target=consumer, args=(process.stdout, on_output,
                                                           chunks["out"]), daemon=True),
                   threading.Thread(target=consumer, args=(process.stderr, on_error,
                                                           chunks["err"]), daemon=True)]
        for reader in readers:
            reader.start()
        interrupted = wait_passing_interrupts(process)
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


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signum)

