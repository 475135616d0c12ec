"""How facts are asked: a fact is a command and a parser of its output (pyinfra's shape);
this module runs them on a connector, one at a time or many in one round trip, and turns a
failure into an error that names the agent and the cause. What is asked is
:mod:`.facts`.

A fact never changes anything. ``command`` is run by a connector (:mod:`.connectors`);
``parse(rc, stdout, stderr)`` turns the result into a value or raises :class:`FactError`;
``process(stdout)`` is the parser proper, tested on captured output
(tests/test_agents_facts.py). ``from_api(client)`` answers the same fact from the Docker API
for agents reached only that way (``tcp://``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ..core.errors import EngineFailure
from .connectors import (
    COMMAND_FAILED,
    MISCONFIGURED,
    AgentError,
    Connector,
)

T = TypeVar("T")


class FactError(EngineFailure):
    """The output says the fact cannot be known; ``cause`` is one of the connector causes."""

    def __init__(self, cause: str, detail: str):
        self.cause = cause
        self.detail = detail
        super().__init__(f"{cause}: {detail}")


class FactUnavailable(FactError):
    """The agent is reached in a way that cannot answer this fact (no shell)."""

    def __init__(self, detail: str):
        super().__init__(MISCONFIGURED, detail)


class Fact(Generic[T]):
    """``command``: POSIX sh run on the agent. Subclasses implement ``process``."""

    command: ClassVar[str] = ""
    #: how the fact names itself in messages
    what: ClassVar[str] = ""

    def cmd(self) -> str:
        return self.command

    def parse(self, rc: int, out: str, err: str) -> T:
        if rc == 127 or "command not found" in err or ": not found" in err:
            raise FactError(MISCONFIGURED, f"{self.what or self.cmd()}: a program is missing on "
                            f"the agent ({last_line(err)})")
        if rc != 0:
            raise FactError(COMMAND_FAILED, f"`{self.cmd()}` exited {rc}: "
                            f"{last_line(err) or last_line(out) or 'no output'}")
        return self.process(out)

    def process(self, output: str) -> T:
        raise NotImplementedError

    def from_api(self, client: Any) -> T:
        raise FactUnavailable(f"{self.what or type(self).__name__} needs a shell on the agent")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- running facts --------------------------------------------------------------------------


def gather(conn: Connector, fact: Fact[T]) -> T:
    """Run one fact on one agent; any failure is an AgentError naming the agent."""
    try:
        if not conn.shell:
            return fact.from_api(conn.client())  # type: ignore[attr-defined]
        rc, out, err = conn.run(fact.cmd())
        return fact.parse(rc, out, err)
    except FactError as exc:
        raise AgentError(conn.agent, exc.cause, f"{conn.description}: {exc.detail}") from None


def batch_script(commands: Sequence[str], marker: str) -> str:
    """One POSIX sh script that runs every command and prints, per command, its stdout, its
    stderr and its exit status between ``marker`` lines (one SSH round trip for many facts)."""
    parts = ['d=$(mktemp -d) || exit 1']
    for i, cmd in enumerate(commands):
        parts.append(
            f'( {cmd}\n) >"$d/o" 2>"$d/e" </dev/null; rc=$?; '
            f'printf \'%s out {i}\\n\' {marker}; cat "$d/o"; '
            f'printf \'\\n%s err {i}\\n\' {marker}; cat "$d/e"; '
            f'printf \'\\n%s rc {i} %s\\n\' {marker} "$rc"'
        )
    parts.append('rm -rf "$d"')
    return "\n".join(parts) + "\n"


def split_batch(output: str, marker: str, count: int) -> list[tuple[int, str, str]]:
    """The ``(rc, stdout, stderr)`` of each command of a :func:`batch_script` run."""
    results: list[tuple[int, str, str]] = []
    pattern = re.compile(rf"^{re.escape(marker)} out (\d+)\n(.*?)\n{re.escape(marker)} err \1\n"
                         rf"(.*?)\n{re.escape(marker)} rc \1 (-?\d+)$", re.DOTALL | re.MULTILINE)
    found = {int(m[1]): (int(m[4]), m[2], m[3]) for m in pattern.finditer(output)}
    for i in range(count):
        results.append(found.get(i, (-1, "", "the batch stopped before this command ran")))
    return results


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One fact's value, or the AgentError that says why it is not known."""

    value: T | None
    error: AgentError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def gather_all(conn: Connector, facts: Sequence[Fact[Any]]) -> list[Outcome[Any]]:
    """Several facts of one agent in one round trip. A failure to reach the agent at all
    raises AgentError; a fact that fails on its own gives an Outcome with the error."""
    if not conn.shell:
        outcomes: list[Outcome[Any]] = []
        for fact in facts:
            try:
                outcomes.append(Outcome(gather(conn, fact)))
            except AgentError as exc:
                outcomes.append(Outcome(None, exc))
        return outcomes
    marker = f"@@csl-{secrets.token_hex(8)}"
    rc, out, err = conn.run(batch_script([f.cmd() for f in facts], marker))
    if rc != 0 and marker not in out:
        raise AgentError(conn.agent, COMMAND_FAILED, f"{conn.description}: the probe script "
                         f"exited {rc}: {last_line(err) or last_line(out) or 'no output'}")
    outcomes = []
    for fact, (frc, fout, ferr) in zip(facts, split_batch(out, marker, len(facts)), strict=True):
        try:
            outcomes.append(Outcome(fact.parse(frc, fout, ferr)))
        except FactError as exc:
            outcomes.append(Outcome(None, AgentError(conn.agent, exc.cause,
                                                     f"{conn.description}: {exc.detail}")))
    return outcomes
