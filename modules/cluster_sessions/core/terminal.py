"""Text that reaches a terminal: one line per item, and no control byte.

A definition may hold any text in an env value (values are kept byte for byte), and a key or
a file name may hold a newline or an escape sequence. Printed raw, a newline forges a second
problem line and an escape sequence rewrites what the reader sees. Everything the offline
verbs print goes through :func:`printable` (a line) or :func:`dumps` (JSON), which spell such
characters as escapes instead.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence

# Controls (C0, DEL, C1), format characters (bidi overrides, zero-width joiners) and the two
# Unicode line breaks: what a terminal acts on or a reader cannot see.
_HIDDEN = ("Cc", "Cf", "Zl", "Zp")
_SPECIAL = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def is_hidden(char: str) -> bool:
    return unicodedata.category(char) in _HIDDEN


def _escape(char: str) -> str:
    if char in _SPECIAL:
        return _SPECIAL[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: object) -> str:
    """``text`` on one line: controls, format characters and line breaks as escapes."""
    text = str(text)
    if all(c.isprintable() for c in text):  # the common case, and fast
        return text
    return "".join(_escape(c) if is_hidden(c) else c for c in text)


def _json_escape(match: re.Match[str]) -> str:
    char = match[0]
    if not is_hidden(char):
        return char
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


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
