"""Text that reaches a terminal: one line per item, and no control byte.

A definition may hold any text in an env value (values are kept byte for byte), and a key or
a file name may hold a newline or an escape sequence. Printed raw, a newline forges a second
problem line and an escape sequence rewrites what the reader sees. Everything the offline
verbs print goes through :func:`printable` (a line) or :func:`dumps` (JSON), which spell such
characters as escapes instead; text a container wrote (its logs, its state) too, keeping tabs.

Whatever is missed there, :func:`guarded` catches: ``sessionctl`` writes through a
:class:`TerminalGuard` that escapes every control character but newline, tab and an SGR colour
sequence (the engine's colours; they cannot move the cursor, erase or retitle the terminal),
and that spells what the output's encoding cannot hold (``PYTHONIOENCODING=latin-1``, an ASCII
locale) as ``\\u2192`` instead of failing with a ``UnicodeEncodeError``.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

# Controls (C0, DEL, C1), format characters (bidi overrides, zero-width joiners), the two
# Unicode line breaks and lone surrogates (undecodable bytes of a file name): what a terminal
# acts on, a reader cannot see, or an encoder cannot write.
_HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs")


def is_hidden(char: str) -> bool:
    return unicodedata.category(char) in _HIDDEN


def _escape(char: str) -> str:
    """A hidden character as ``repr`` spells it (no hidden character is printable):
    ``\\n``, ``\\x1b``, ``\\u202e``, ``\\U000e0041``."""
    return repr(char)[1:-1]


def printable(text: object, keep: str = "") -> str:
    """``text`` on one line: controls, format characters and line breaks as escapes; the
    characters in ``keep`` (a tab, in log lines) stay as they are."""
    text = str(text)
    if text.isprintable():  # the common case, and fast
        return text
    return "".join(_escape(c) if is_hidden(c) and c not in keep else c for c in text)


_PROGRESS_LOCK = threading.Lock()


def progress(message: str, prefix: str = "") -> None:
    """A progress line on stderr, flushed at once, so a command's stdout stays
    machine-readable (the lab, image builds). One write per line under a lock: threads (the
    lab's parallel image imports) never splice their lines together."""
    line = f"{prefix}{message}\n"
    with _PROGRESS_LOCK:
        sys.stderr.write(line)
        sys.stderr.flush()


def _json_escape(match: re.Match[str]) -> str:
    char = match[0]
    # json's own escape of a non-ASCII character (ensure_ascii, its default): \u202e, and a
    # surrogate pair above U+FFFF
    return json.dumps(char)[1:-1] if is_hidden(char) else char


_NOT_ASCII = re.compile("[\x7f-\U0010ffff]")  # the candidates; json escapes C0 itself


def dumps(obj: object, **kwargs: object) -> str:
    """JSON as ``json.dumps(..., ensure_ascii=False)``, but with every character that
    :func:`printable` escapes written as ``\\uXXXX`` (the same value to a JSON reader).

    json escapes C0 controls itself; DEL, C1 controls and format characters it leaves raw.
    They can only occur inside strings, so escaping them keeps the document valid.
    """
    text = json.dumps(obj, ensure_ascii=False, **kwargs)  # type: ignore[arg-type]
    if text.isascii() and "\x7f" not in text:  # the common case, at memory speed
        return text
    return _NOT_ASCII.sub(_json_escape, text)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, each line made printable; every
    table the verbs print (plan, status, ls, pool check) is made here."""
    cells = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [printable("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
            for row in cells]


_HOME = "\x1b[H"  # the cursor to the top left corner
_ERASE_LINE = "\x1b[K"  # the rest of the line
_ERASE_BELOW = "\x1b[J"  # the rest of the screen


def redraw(lines: Sequence[str], stream: TextIO | None = None) -> None:
    """``lines`` drawn again from the terminal's top left corner, each line's old rest and
    what was below erased (``sessionctl top``'s refresh in place). The three cursor
    sequences are the only ones written and are fixed here; the lines themselves go through
    the guard (:func:`printable` them first), so no data moves the cursor."""
    out = stream or sys.stdout
    raw = out.stream if isinstance(out, TerminalGuard) else out
    raw.write(_HOME)
    for line in lines:
        out.write(line)
        raw.write(_ERASE_LINE)
        out.write("\n")
    raw.write(_ERASE_BELOW)
    out.flush()


_SGR = "\x1b\\[[0-9;]*m"
_SUSPECT = re.compile(f"{_SGR}|[^\n\t\x20-\x7e]")  # what may need escaping, and colours


def _guard_char(match: re.Match[str]) -> str:
    text = match[0]
    return _escape(text) if len(text) == 1 and is_hidden(text) else text  # or a colour


class TerminalGuard:
    """A text stream in front of ``stream`` that writes no control character but newline, tab
    and SGR colours, and degrades what the stream's encoding cannot hold to escapes."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.written = 0  # characters written through it (a --json verb's document, or none)

    def write(self, text: str) -> int:
        self.written += len(text)
        safe = _SUSPECT.sub(_guard_char, text)
        try:
            self.stream.write(safe)
        except UnicodeEncodeError:  # nothing was written: the whole text is encoded first
            encoding = getattr(self.stream, "encoding", None) or "ascii"
            self.stream.write(safe.encode(encoding, "backslashreplace").decode(encoding))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, buffer, ...
        return getattr(self.stream, name)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` behind a :class:`TerminalGuard` while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if isinstance(s, TerminalGuard) else TerminalGuard(s)
                              for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
