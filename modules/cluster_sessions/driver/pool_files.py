"""A pool named on the command line (``sessionctl pool VERB POOL``): found as a definition's
``pool:`` is, and loaded, for every pool verb (pool_verbs.py, reap_verb.py)."""

from __future__ import annotations

from pathlib import Path

from ..core.loader import load_pool_file
from ..core.spec import Pool
from .errors import CommandError, Exit


def pool_path(ref: str) -> Path:
    """A pool file: a file as written, or found as a definition's ``pool:`` is
    (:func:`cluster_sessions.core.loader.find_pool`, the one lookup rule)."""
    from ..core.loader import find_pool
    from .session_args import pool_dirs

    return find_pool(ref, given=True, allowed=pool_dirs())  # PoolNotFound: invalid input


def load_pool(ref: str) -> tuple[Pool, Path]:
    if not ref:
        raise CommandError("the pool must not be empty", Exit.INVALID)
    try:
        path = pool_path(ref)
    except (OSError, RuntimeError) as exc:  # a name too long, ~nosuchuser, cwd deleted, ...
        why = getattr(exc, "strerror", None) or str(exc)
        raise CommandError(f"cannot look up pool {ref!r}: {why}", Exit.INVALID) from None
    return load_pool_file(path), path  # DefinitionError -> exit 2 in cli.main
