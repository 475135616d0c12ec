"""``sessionctl render FILE [--pool POOLFILE] --out DIR``: each container's files, on disk.

Contract 3: ``DIR/<host>/`` holds one container's bundle (``entrypoint.sh``, ``cluster-env.sh``,
the ssh files, ...), ready to be bind-mounted read-only at
:data:`~cluster_sessions.render.BUNDLE_DIR` with ``entrypoint_argv()`` as the entrypoint.

The session keys are generated afresh on every run: this verb is for inspection, review and
running a session by hand. A Pulumi stack keeps its own keys (made once, stored as secrets),
so the files it uploads carry different keys from the ones written here. Private keys are
written 0600 inside a 0700 ``ssh/`` directory and never printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..keys import generate_session_keys
from ..plan import build_plan
from ..render import BUNDLE_DIR, RenderedFile, entrypoint_argv, render_session
from .cli import add_session_args
from .errors import CommandError, Exit

PRIVATE_DIR_MODE = 0o700  # a directory holding a secret file
DIR_MODE = 0o755


def write_bundle(files: Iterable[RenderedFile], directory: Path) -> list[Path]:
    """Write one container's files under ``directory`` with their modes; return the paths.

    Each file is written to a temporary name (created 0600) and renamed into place, so a file
    that holds a private key is never readable by others, not even for a moment, and a file
    left by an earlier run is replaced, not written through. A directory that holds a secret
    file is made 0700. Files of an earlier run that this one does not write are left alone.
    """
    directory.mkdir(parents=True, exist_ok=True)
    files = list(files)
    private_dirs = {Path(f.path).parent for f in files if f.secret} - {Path(".")}
    written = []
    for f in files:
        relative = Path(f.path)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"refusing to write outside the bundle: {f.path}")
        target = directory / relative
        for parent in reversed(relative.parents[:-1]):
            path = directory / parent
            path.mkdir(exist_ok=True)
            path.chmod(PRIVATE_DIR_MODE if parent in private_dirs else DIR_MODE)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
                out.write(f.content)
            os.chmod(temporary, f.mode)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        written.append(target)
    return written


def cmd_render(args: argparse.Namespace) -> int:
    from ..loader import load_session

    loaded = load_session(Path(args.file), Path(args.pool) if args.pool else None)
    plan = build_plan(loaded.session, loaded.pool)
    if plan.pending:
        raise CommandError(f"{args.file}: pending, nothing rendered: {plan.reason}", Exit.PENDING)
    keys = generate_session_keys(plan.hosts)
    out = Path(args.out)
    try:
        bundles = render_session(plan, keys)
        counts = {host: len(write_bundle(files, out / host)) for host, files in bundles.items()}
    except OSError as exc:
        raise CommandError(f"cannot write {exc.filename or out}: {exc.strerror}",
                           Exit.ENGINE) from None
    print(f"rendered session {plan.name} ({len(counts)} container(s)) into {out}/")
    for host, count in counts.items():
        print(f"  {out / host}/  {count} files")
    print("fresh session keys were generated for these files (private keys: ssh/*, mode 0600);"
          " a Pulumi stack keeps its own keys")
    print(f"run a container with DIR/<host> mounted read-only at {BUNDLE_DIR}, entrypoint "
          f"{' '.join(entrypoint_argv())}, the plan's env, hostname and network alias <host>")
    sys.stdout.flush()
    return Exit.OK


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "render", help="write each container's entrypoint, cluster env script and ssh files",
        description="Render the files each container runs (contract 3) into DIR/<host>/. "
        "Generates fresh session keys each time (a Pulumi stack keeps its own); private keys "
        "are written 0600 and never printed. Exit 3 when the session is pending.",
    )
    add_session_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    p.set_defaults(func=cmd_render)
