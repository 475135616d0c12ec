"""``sessionctl render FILE [--pool POOLFILE] --out DIR``: each container's files, on disk.

Contract 3: ``DIR/<host>/`` holds one container's bundle (``entrypoint.sh``, ``cluster-env.sh``,
the ssh files, ...), ready to be bind-mounted read-only at
:data:`~cluster_sessions.core.render.BUNDLE_DIR` with ``entrypoint_argv()`` as the entrypoint.

The session keys are generated afresh on every run: this verb is for inspection, review and
running a session by hand. A Pulumi stack keeps its own keys (made once, stored as secrets),
so the files it uploads carry different keys from the ones written here. Private keys are
written 0600 inside a 0700 ``ssh/`` directory and never printed.

DIR may hold links planted by someone else (``DIR/main1/ssh -> ~victim/.ssh``): each host's
folder is built afresh in a private directory and renamed into place, so no file is ever
written, and no mode changed, through a link this verb did not make. Folders of hosts an
earlier, bigger render left (``sub7/`` after the session shrank) are removed. One container's
files are in memory at a time, so a large session renders in constant memory.

DIR may also be a directory of the user's (``--out .``) that holds a ``main1/`` of their own:
this verb only ever removes or replaces what it wrote. Each host folder it writes carries a
mark (:data:`MARK`, a regular file in a real directory); anything else in the way of a host
folder (a directory without the mark, a file, a link, even one to a marked folder) is refused
with exit 2 before anything is written, and a left-over host folder without the mark is kept.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..core.keys import generate_session_keys
from ..core.plan import ClusterPlan
from ..core.render import BUNDLE_DIR, RenderedFile, entrypoint_argv, render_container
from .errors import CommandError, Exit
from .session_args import add_session_args, selected

PRIVATE_DIR_MODE = 0o700  # a directory holding a secret file
DIR_MODE = 0o755
HOST_DIR = re.compile(r"(main|sub)[1-9][0-9]*")  # what an earlier render may have left
MARK = ".sessionctl-render"  # in every host folder this verb writes: it may replace the folder
MARK_HEADER = "written by `sessionctl render`; the folder is replaced by the next render\n"


def _mark(plan_name: str, host: str) -> RenderedFile:
    return RenderedFile(MARK, f"{MARK_HEADER}session {plan_name}\nhost {host}\n", 0o644)


def is_ours(path: Path) -> bool:
    """Whether ``path`` is a host folder this verb wrote: a real directory (not a link) holding
    the mark as a regular file. Nothing is followed, so a link to a marked folder is not ours."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        fd = os.open(path / MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return False
        return f.read(len(MARK_HEADER) + 1).decode(errors="replace").startswith(MARK_HEADER)


def _not_ours(path: Path) -> CommandError:
    what = ("a symbolic link" if path.is_symlink() else
            "a directory" if path.is_dir() else "a file")
    return CommandError(f"{path}: is {what} that `sessionctl render` did not write (no {MARK}); "
                        "move it away or choose another --out", Exit.INVALID)


def check_free(paths: Iterable[Path]) -> None:
    """Refuse, before anything is written, when a host folder to write is in the way of
    something this verb did not write."""
    for path in paths:
        if os.path.lexists(path) and not is_ours(path):
            raise _not_ours(path)


def _build(files: Iterable[RenderedFile], directory: Path) -> int:
    """Write one container's files into ``directory``, which this process has just made (0700)
    and nobody else can write into: nothing here can follow a link it did not create."""
    files = list(files)
    private_dirs = {Path(f.path).parent for f in files if f.secret} - {Path(".")}
    for f in files:
        relative = Path(f.path)
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"refusing to write outside the bundle: {f.path}")
        for parent in reversed(relative.parents[:-1]):
            path = directory / parent
            path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
            path.chmod(PRIVATE_DIR_MODE if parent in private_dirs else DIR_MODE)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(directory / relative, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(f.content)
        os.chmod(directory / relative, f.mode)
    directory.chmod(DIR_MODE)
    return len(files)


def _remove(path: Path) -> None:
    """Remove what is at ``path`` without following it: a link is unlinked, never its target."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def write_bundle(files: Iterable[RenderedFile], directory: Path) -> int:
    """Put one container's files at ``directory``; return how many were written.

    They are written into a fresh private directory beside it and renamed into place. What
    stood at ``directory`` before must be a folder an earlier render wrote (:func:`is_ours`,
    checked again once it is moved aside, so a swap in between is caught); it is removed without
    following any link in it. Anything else there is refused (exit 2) and left as it was. A
    private key is never readable by others, not even for a moment, and no write goes through
    a link this process did not create.
    """
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    check_free([directory])
    fresh = Path(tempfile.mkdtemp(dir=parent, prefix=f".{directory.name}.new-"))
    try:
        count = _build(files, fresh)
        if os.path.lexists(directory):
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{directory.name}.old-"))
            os.replace(directory, old / "x")  # renames the entry itself, link or not
            if not is_ours(old / "x"):  # swapped since the check: put it back untouched
                os.rename(old / "x", directory)
                old.rmdir()
                raise _not_ours(directory)
            os.rename(fresh, directory)
            _remove(old / "x")
            old.rmdir()
        else:
            os.rename(fresh, directory)
    except BaseException:
        if fresh.exists():
            shutil.rmtree(fresh)
        raise
    return count


def _out_dir(text: str) -> Path:
    """The --out directory (made later, if missing): never an empty name or a link."""
    if not text:
        raise CommandError("--out: an empty directory name; give the directory to write into",
                           Exit.INVALID)
    out = Path(text)
    if out.is_symlink():
        raise CommandError(f"--out {text}: is a symbolic link; give the real directory",
                           Exit.INVALID)
    return out


def cmd_render(args: argparse.Namespace) -> int:
    out = _out_dir(args.out)
    sel = selected(args)
    if sel.pending is not None:
        raise CommandError(f"{args.file}: pending, nothing rendered: {sel.pending.reason}",
                           Exit.PENDING)
    each = sel.all_of_count  # DIR/<session>/<host>/ for each of the K
    targets = [(plan, out / plan.name if each else out) for _, plan in sel.chosen]
    for plan, where in targets:  # every session's folders, before any is written
        if where.is_symlink():
            raise CommandError(f"{where}: is a symbolic link; give the real directory",
                               Exit.INVALID)
        check_free(where / host for host in plan.hosts)
    for plan, where in targets:
        render_session(plan, where)
    print("fresh session keys were generated for these files (private keys: ssh/*, mode 0600);"
          " a Pulumi stack keeps its own keys")
    print(f"run a container with DIR/<host> mounted read-only at {BUNDLE_DIR}, entrypoint "
          f"{' '.join(entrypoint_argv())}, the plan's env, hostname and network alias <host>")
    sys.stdout.flush()
    return Exit.OK


def render_session(plan: ClusterPlan, out: Path) -> None:
    """One session's files into ``out/<host>/``; folders an earlier render wrote for hosts the
    session no longer has go, any other folder stays."""
    keys = generate_session_keys(plan.hosts)
    hosts = set(plan.hosts)
    counts: dict[str, int] = {}
    try:
        if out.is_symlink():
            raise CommandError(f"{out}: is a symbolic link; give the real directory",
                               Exit.INVALID)
        check_free(out / host for host in plan.hosts)
        out.mkdir(parents=True, exist_ok=True)
        for container in plan.containers:  # one container's files in memory at a time
            files = [*render_container(plan, container, keys, directory=True),
                     _mark(plan.name, container.host)]
            counts[container.host] = write_bundle(files, out / container.host)
        stale = sorted(p.name for p in out.iterdir()
                       if HOST_DIR.fullmatch(p.name) and p.name not in hosts and is_ours(p))
        for name in stale:
            _remove(out / name)
    except OSError as exc:
        raise CommandError(f"cannot write {exc.filename or out}: {exc.strerror}",
                           Exit.ENGINE) from None
    print(f"rendered session {plan.name} ({len(counts)} container(s)) into {out}/")
    shown = list(counts.items())
    for host, count in shown[:8]:
        print(f"  {out / host}/  {count} files")
    if len(shown) > 8:
        print(f"  ... and {len(shown) - 8} more")
    if stale:
        print(f"removed the folders of hosts this session no longer has: {', '.join(stale)}")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "render", help="write each container's entrypoint, cluster env script and ssh files",
        description="Render the files each container runs into DIR/<host>/ (entrypoint.sh, "
        "cluster-env.sh, the ssh files); with `count: K`, DIR/<name>-<i>/<host>/ for each "
        "session (DIR/<host>/ with --index). Only host folders an earlier render wrote "
        f"(they hold {MARK}) are replaced or removed; anything else in the way is refused "
        "(exit 2). "
        "Generates fresh session keys each time (a Pulumi stack keeps its own); private keys "
        "are written 0600 and never printed. Exit 3 when the session is pending.",
    )
    add_session_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    p.set_defaults(func=cmd_render)
