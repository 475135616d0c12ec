"""Memory sizes as written in definitions (``512m``, ``4g``) and back.

Sizes are kept as whole bytes so that capacity arithmetic is exact; the suffixes are binary
(``1g`` is 1024**3 bytes), as Docker reads them.
"""

from __future__ import annotations

import re

_FACTORS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]?)(?:ib|b|i)?", re.IGNORECASE)


def parse_size(value: object) -> int:
    """Bytes from ``4g``, ``512m``, ``1.5g`` or a plain integer of bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512m or 4g, not a boolean")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        if not match:
            raise ValueError(f"{value!r} is not a size; use a number with k, m, g or t (e.g. 4g)")
        number = float(match["num"]) if "." in match["num"] else int(match["num"])
        size = int(number * _FACTORS[match["unit"].lower()])
    else:
        raise ValueError("expected a size such as 512m or 4g")
    if size <= 0:
        raise ValueError("must be greater than zero")
    return size


def format_size(size: int) -> str:
    """The shortest exact spelling: ``4g``, ``1536m``, ``1000``."""
    for unit in ("t", "g", "m", "k"):
        factor = _FACTORS[unit]
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)
