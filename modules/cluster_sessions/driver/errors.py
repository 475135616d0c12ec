"""Exit codes and the one error type verbs raise to choose one."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    ENGINE = 1
    CHANGES = 1  # `diff --exit-code`: there are changes (as `git diff --exit-code`)
    INVALID = 2
    PENDING = 3
    MISSING = 4
    JOB_FAILED = 5  # the batch job ended with a non-zero exit code
    JOB_LOST = 6  # the wait timed out, or a container died before the job ended


class CommandError(Exception):
    """A failure the user can act on; ``code`` is the exit code, the message says what to do."""

    def __init__(self, message: str, code: Exit = Exit.ENGINE):
        super().__init__(message)
        self.code = code
