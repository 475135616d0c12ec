"""Memory sizes as written in definitions (``512m``, ``4g``) and back.

Sizes are kept as whole bytes so that capacity arithmetic is exact; the suffixes are binary
(``1g`` is 1024**3 bytes), as Docker reads them. The arithmetic is exact too (fractions, not
floats): a float turns ``<400 nines>.5g`` into infinity and ``1.1g`` into a rounded guess.
"""

from __future__ import annotations

import re
from fractions import Fraction

_FACTORS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_WS = r"[ \t\n\r\f\v]"  # ASCII whitespace: what both Python and ECMA-262 regexes read alike
SIZE_PATTERN = (rf"{_WS}*(?P<num>[0-9]+(?:\.[0-9]+)?){_WS}*(?P<unit>[kKmMgGtT]?)"
                rf"(?:[iI][bB]|[bB]|[iI])?{_WS}*")
"""One spelling of a size, for the loader and (as ``^...$``) the schema: the same text."""
_SIZE = re.compile(SIZE_PATTERN)
MAX_BYTES = 2**63 - 1
"""Docker keeps memory as a signed 64-bit count of bytes."""


def size_json_schema(minimum: int = 1, maximum: int = MAX_BYTES) -> dict:
    """What :func:`parse_size` accepts within bounds, for ``sessionctl schema``: whole bytes
    in range, or a string of the same spelling (a string's range is the loader's to check:
    JSON Schema cannot compare ``4g`` with a number)."""
    return {
        "anyOf": [
            {"type": "string", "pattern": "^" + SIZE_PATTERN.replace("?P<num>", "")
             .replace("?P<unit>", "") + "$"},
            {"type": "integer", "minimum": minimum, "maximum": maximum},
        ],
        "description": "a size: a number with k, m, g or t (1024-based), e.g. 512m or 4g; "
                       "or whole bytes",
    }


_MAX_DIGITS = 40  # far beyond MAX_BYTES in any unit; keeps huge numbers out of the arithmetic


def parse_size(value: object, minimum: int = 1, maximum: int = MAX_BYTES) -> int:
    """Bytes from ``4g``, ``512m``, ``1.5g`` or a plain integer of bytes, within bounds."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512m or 4g, not a boolean")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if not match:
            raise ValueError(f"{value!r} is not a size; use a number with k, m, g or t (e.g. 4g)")
        if len(match["num"]) > _MAX_DIGITS:
            raise ValueError(f"is too large: at most {format_size(maximum)}")
        size = int(Fraction(match["num"]) * _FACTORS[match["unit"].lower()])
    else:
        raise ValueError("expected a size such as 512m or 4g")
    if size <= 0:
        raise ValueError("must be greater than zero")
    if size < minimum:
        raise ValueError(f"is {format_size(size)}, below the minimum of {format_size(minimum)}")
    if size > maximum:
        raise ValueError(f"is too large: at most {format_size(maximum)}")
    return size


def format_size(size: int) -> str:
    """The shortest exact spelling: ``4g``, ``1536m``, ``1000``; nothing is ``0`` (every unit
    divides it, and ``0t`` reads as a typo)."""
    if size == 0:
        return "0"
    for unit in ("t", "g", "m", "k"):
        factor = _FACTORS[unit]
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


_DURATION_FACTORS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_PATTERN = r"(?P<num>[0-9]{1,9})(?P<unit>[smhd])"
_DURATION = re.compile(DURATION_PATTERN)
MAX_DURATION = 366 * 86400  # a year and a day: far beyond any session's lifetime


def parse_duration(value: object, maximum: int = MAX_DURATION) -> int:
    """Whole seconds from ``90s``, ``30m``, ``8h``, ``2d`` or a plain integer of seconds
    (governance: lifetimes, idle timeouts, grace periods)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30m or 8h, not a boolean")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration; use whole seconds, or a number "
                             "with s, m, h or d (e.g. 30m, 8h)")
        seconds = int(match["num"]) * _DURATION_FACTORS[match["unit"]]
    else:
        raise ValueError("expected a duration such as 30m or 8h")
    if seconds <= 0:
        raise ValueError("must be greater than zero")
    if seconds > maximum:
        raise ValueError(f"is too long: at most {format_duration(maximum)}")
    return seconds


def format_duration(seconds: int) -> str:
    """``8h``, ``90m``, ``45s``: the largest unit (up to hours) that divides it."""
    for unit in ("h", "m"):
        if seconds and seconds % _DURATION_FACTORS[unit] == 0:
            return f"{seconds // _DURATION_FACTORS[unit]}{unit}"
    return f"{seconds}s"


def duration_json_schema(maximum: int = MAX_DURATION) -> dict:
    """What :func:`parse_duration` accepts, for ``sessionctl schema``."""
    return {
        "anyOf": [{"type": "string", "pattern": "^" + DURATION_PATTERN.replace("?P<num>", "")
                   .replace("?P<unit>", "") + "$"},
                  {"type": "integer", "minimum": 1, "maximum": maximum}],
        "description": "a duration: whole seconds, or a number with s, m, h or d (e.g. 8h)",
    }
