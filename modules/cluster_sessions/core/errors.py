"""The error tree: one base, one class per exit code's meaning (contracts 4 and 6).

Every error of ours that can reach the command line derives from :class:`ClusterSessionsError`
through the class that says what happened; its ``code`` is the exit code. The command line
turns any of them into an exit code and a message in one place
(:func:`cluster_sessions.driver.errors.outcome`). A layer below the driver raises by meaning
and never picks a number itself.
"""

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


INTERRUPTED = 128 + 2
"""Ctrl-C (SIGINT): what a shell reports for a program the signal ended. Every verb exits with
it when interrupted (``run`` too, after it destroyed or kept the session), never 0-6: those say
how the work ended, and it did not."""


class ClusterSessionsError(Exception):
    """Something the user can act on; the message says what (and what to do)."""

    code: Exit = Exit.ENGINE


class EngineFailure(ClusterSessionsError):
    """An engine, an agent or the state backend failed or did not answer (exit 1)."""

    code = Exit.ENGINE


class InvalidInput(ClusterSessionsError):
    """A definition, a pool, an argument or a file given is wrong (exit 2)."""

    code = Exit.INVALID


class Pending(ClusterSessionsError):
    """The session does not fit the pool now (exit 3)."""

    code = Exit.PENDING


class MissingPrerequisite(ClusterSessionsError):
    """Something the verb needs is not there: the pulumi CLI, root, a usable agent (exit 4)."""

    code = Exit.MISSING


class JobFailed(ClusterSessionsError):
    """The batch job ended with a non-zero exit code (exit 5)."""

    code = Exit.JOB_FAILED


class JobLost(ClusterSessionsError):
    """The batch job timed out, or a container died before it ended (exit 6)."""

    code = Exit.JOB_LOST


BY_CODE: dict[int, type[ClusterSessionsError]] = {
    cls.code: cls for cls in (EngineFailure, InvalidInput, Pending, MissingPrerequisite,
                              JobFailed, JobLost)}
"""The class that means an exit code (each code has exactly one)."""
