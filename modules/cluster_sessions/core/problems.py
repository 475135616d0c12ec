"""Problems found in definitions, as values with a path, until the CLI prints them.

Keeping them as data (not exceptions raised mid-way) lets ``validate`` report every problem of
every file at once, and lets the CLI alone decide exit codes.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import InvalidInput
from .terminal import printable


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """``"; did you mean 'local'?"`` for the closest of ``names`` (a typo is the usual cause of
    an unknown name), else ``""``: one spelling for every such hint."""
    close = difflib.get_close_matches(word, list(names))  # best first
    return f"; did you mean {close[0]!r}?" if close else ""


WHOLE_FILE = "(whole file)"
"""The path of a problem that is about the file itself (unreadable, not YAML, too large)."""


@dataclass(frozen=True, order=True)
class Problem:
    file: str
    path: str  # dotted, e.g. ``resources.shmem`` or ``agents.1.name``; WHOLE_FILE for the file
    message: str

    def __str__(self) -> str:
        """One line, whatever the file name, key or message holds (see :mod:`.terminal`)."""
        return f"{printable(self.file)}: {printable(self.path or WHOLE_FILE)}: " \
               f"{printable(self.message)}"


class DefinitionError(InvalidInput):
    """One or more problems that make a definition unusable."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(dict.fromkeys(problems))
        super().__init__("\n".join(str(p) for p in self.problems))


def dotted(loc: tuple[object, ...]) -> str:
    return ".".join(str(part) for part in loc)
