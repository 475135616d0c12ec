"""Data folders: a pool's storage roots and the folders sessions mount from them.

A pool names storage roots (``storage: {data: /srv/vfolders}``), host directories present on
every agent (an NFS mount, say). A definition mounts ``{folder: mydata, target: ...}``: the
host path is ``<root>/<folder>``, made if missing, owned by the session user, and never
removed by ``destroy`` (Backend.AI's storage folders, as opposed to the container's own files,
which go with the session).

A folder is one name below its root, never a path: no ``/``, no ``..``, no leading ``.``. What
may already be at ``<root>/<folder>`` is judged by :func:`folder_verdict` from the engine's own
``lstat`` (agents/folders.py): a directory owned by the session user is used, nothing there is
made, anything else (a symbolic link above all, which the engine would follow when it binds the
folder) is refused.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .problems import did_you_mean

FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", re.ASCII)
"""A folder's name (an allowlist): one path component, not hidden, at most 64 characters."""
STORAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", re.ASCII)
FOLDER_MODE = 0o750
"""A new folder: the session user's, readable by its group, closed to others."""

# Go's os.FileMode bits, as the engine's archive stat reports them (X-Docker-Container-Path-Stat)
MODE_DIR = 1 << 31
MODE_SYMLINK = 1 << 27


def folder_name_problem(name: str) -> str | None:
    if FOLDER_NAME.fullmatch(name):
        return None
    return (f"{name!r} is not a folder name: one name of at most 64 letters, digits, '_', '.' "
            "or '-', not starting with '.' or '-' (a folder is a directory directly below the "
            "pool's storage root, never a path)")


def storage_of(storage: Mapping[str, str], wanted: str | None) -> tuple[str | None, str | None]:
    """(the storage name a folder mount uses, or None; the problem, or None). Without
    ``storage:`` the pool must have exactly one root: with several, naming one is required
    (a default among several would be a guess the definition cannot see)."""
    if wanted is None:
        if len(storage) == 1:
            return next(iter(storage)), None
        if not storage:
            return None, ("the pool has no storage roots (storage: {NAME: /host/dir}), so "
                          "sessions on it mount no folders; ask the pool's operator")
        return None, (f"the pool has several storage roots ({', '.join(storage)}): say which "
                      "with storage: NAME")
    if wanted in storage:
        return wanted, None
    have = ", ".join(storage) or "none"
    guess = did_you_mean(wanted, storage)
    return None, f"the pool has no storage {wanted!r} (it has: {have}){guess}"


def folder_path(root: str, folder: str) -> str:
    """``<root>/<folder>`` on every agent."""
    return root.rstrip("/") + "/" + folder


@dataclass(frozen=True)
class FolderStat:
    """What the engine says is at a folder's path, without following a link."""

    mode: int  # Go os.FileMode bits
    link_target: str
    uid: int | None = None
    gid: int | None = None


def folder_verdict(stat: FolderStat | None, uid: int) -> str | None:
    """None when the folder can be used (or made: ``stat`` None, nothing there), else why not.

    Refused: a symbolic link (the engine follows it when it binds the folder: a link to /etc
    would give the container the agent's /etc), anything not a directory, and a directory
    another uid owns (it is not this session user's folder; the group may differ)."""
    if stat is None:
        return None
    if stat.mode & MODE_SYMLINK or stat.link_target:
        return (f"is a symbolic link (to {stat.link_target!r}), which the engine would follow: "
                "a folder must be a plain directory; remove the link")
    if not stat.mode & MODE_DIR:
        return "exists and is not a directory"
    if stat.uid is not None and stat.uid != uid:
        return (f"is owned by uid {stat.uid}, not the session user's {uid}: it is another "
                "user's folder")
    return None


# --- host paths a container binds: what the engine resolves at every start ----------------------

MODE_WRITE_OTHERS = 0o022
"""Group or other write: whoever has it can swap an entry for a link between two starts."""


def path_prefixes(path: str) -> list[str]:
    """``/``, then each component of a clean absolute ``path`` down to itself:
    ``/srv/data`` -> ``["/", "/srv", "/srv/data"]``."""
    parts = [p for p in path.split("/") if p]
    return ["/", *("/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1))]


def bind_component_verdict(stat: FolderStat | None, *, last: bool,
                           root_only: bool = False) -> str | None:
    """None when one component of a bind source's path cannot be changed by anyone but root,
    else why not. The engine follows links in a bind source when the container starts, and
    again at every restart, so what a path resolves to is decided by the directories on its
    way: each of those (every component above the last, and the last too when ``root_only``)
    must be a directory owned by root that neither its group nor others can write, and no
    component may be a link. The last component (what is mounted) must not be a link nor
    writable by group or others, whoever owns it."""
    if stat is None:
        return "does not exist"
    if stat.mode & MODE_SYMLINK or stat.link_target:
        return (f"is a symbolic link (to {stat.link_target!r}), which the engine follows at "
                "every start: name the directory itself")
    perm = stat.mode & 0o777
    if perm & MODE_WRITE_OTHERS:
        who = ("group and others" if perm & MODE_WRITE_OTHERS == MODE_WRITE_OTHERS
               else "its group" if perm & 0o020 else "others")
        return (f"is writable by {who} (mode {perm:o}): whoever can write there can put a "
                "link in its place or on its way")
    if last and not root_only:
        return None
    if not stat.mode & MODE_DIR:
        return "is not a directory"
    if stat.uid is not None and stat.uid != 0:
        return (f"is owned by uid {stat.uid}, not root: that user can put a link on the "
                "way of the path")
    return None


# --- named volumes: the pool's, or the session's own --------------------------------------------


def volume_verdict(labels: Mapping[str, str] | None, session: str, label: str) -> str | None:
    """None when a session may mount a named volume the pool does not list, else why not.
    Missing (``labels`` None): the session's first container makes it, with the session's
    labels (core.plan.volume_labels). Present: it must carry ``label`` = ``session``, i.e. this
    session made it; any other volume belongs to another workload (a database, another
    session) and mounting it would hand its files to this one."""
    if labels is None or labels.get(label) == session:
        return None
    owner = labels.get(label)
    whose = f"session {owner}'s" if owner else "not made by a session"
    return (f"exists and is {whose} (a volume without {label}={session}): a session mounts "
            "only volumes it made or those the pool lists in volumes")
