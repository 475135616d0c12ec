"""Exit codes and the one error type verbs raise to choose one."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    ENGINE = 1
    INVALID = 2
    PENDING = 3
    MISSING = 4


class CommandError(Exception):
    """A failure the user can act on; ``code`` is the exit code, the message says what to do."""

    def __init__(self, message: str, code: Exit = Exit.ENGINE):
        super().__init__(message)
        self.code = code
