"""The error a verb raises to choose an exit code, and the one place that turns any error of
ours into an exit code and the lines to print (:func:`outcome`). The tree itself is
:mod:`cluster_sessions.core.errors`."""

from __future__ import annotations

from ..core.errors import INTERRUPTED, ClusterSessionsError, Exit
from ..core.problems import DefinitionError
from ..core.terminal import printable

__all__ = ["INTERRUPTED", "ClusterSessionsError", "CommandError", "Exit", "outcome"]


class CommandError(ClusterSessionsError):
    """A failure the user can act on; ``code`` is the exit code, the message says what to do."""

    def __init__(self, message: str, code: Exit = Exit.ENGINE):
        super().__init__(message)
        self.code = Exit(code)


def outcome(verb: str, exc: ClusterSessionsError) -> tuple[int, list[str]]:
    """The exit code and the lines for stderr: a definition's problems one per line, as
    ``FILE: dotted.path: message``; any other error ``sessionctl VERB: message``, a message
    that spans lines (install instructions) as its lines, each made printable (the names they
    quote are validated to hold no control characters)."""
    if isinstance(exc, DefinitionError):
        return exc.code, [str(p) for p in exc.problems]
    first, *rest = str(exc).split("\n")
    return exc.code, [f"sessionctl {verb}: {printable(first)}", *map(printable, rest)]
