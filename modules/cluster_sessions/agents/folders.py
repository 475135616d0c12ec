"""Data folders on an agent: look at ``<root>/<folder>`` without following links, and make it,
owned by the session user, when nothing is there (core/folders.py says what is acceptable).

The work is the engine's own, never a program's: a helper container is *created, never
started*, with the storage root bound at :data:`HELPER_ROOT`; the engine's archive API then
stats the folder (``HEAD /containers/ID/archive``, an ``lstat``: a link is reported as a link,
never followed) and, when it is missing, extracts a one-entry tar holding the directory with
the session user's uid, gid and mode (``PUT``), and the helper is removed. Nothing from the
definition runs: the image only has to be on the agent (the session's own, which its
containers need there anyway). Over SSH the agent's user needs only the docker group, as for
everything else; the engine, which runs as root, makes the folder.

A folder is never removed here or anywhere else: ``destroy`` removes containers and networks
(agents/cleanup.py ``docker rm -f -v`` drops anonymous volumes only, never a bind's directory).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import tarfile
import time
from collections.abc import Iterator
from typing import Any

from ..core.errors import InvalidInput
from ..core.folders import (
    FOLDER_MODE,
    MODE_DIR,
    FolderStat,
    bind_component_verdict,
    folder_verdict,
    path_prefixes,
    volume_verdict,
)
from ..core.names import FOLDER_HELPER_LABEL as HELPER_LABEL
from ..core.names import SESSION_LABEL

HELPER_ROOT = "/cluster-session-storage"
STAT_HEADER = "X-Docker-Container-Path-Stat"


class FolderRefused(InvalidInput):
    """What is at a folder's path is not a folder this session may use; nothing was made."""


def _stat(api: Any, container: str, path: str, owner: bool = True) -> FolderStat | None:
    import docker

    url = api._url("/containers/{0}/archive", container)
    res = api.head(url, params={"path": path})
    if res.status_code == 404:
        return None
    try:
        api._raise_for_status(res)
    except docker.errors.NotFound:
        return None
    info = json.loads(base64.b64decode(res.headers[STAT_HEADER]))
    mode = int(info.get("mode", 0))
    uid = gid = None
    if mode & MODE_DIR and owner:
        uid, gid = _owner(api, container, path)
    return FolderStat(mode=mode, link_target=info.get("linkTarget") or "", uid=uid, gid=gid)


def _owner(api: Any, container: str, path: str) -> tuple[int, int]:
    """The directory's own uid and gid: the first header of its archive (the rest of the
    stream, the folder's contents, is not read)."""
    stream, _ = api.get_archive(container, path, chunk_size=tarfile.BLOCKSIZE)
    head = b""
    try:
        for chunk in stream:
            head += chunk
            if len(head) >= tarfile.BLOCKSIZE:
                break
    finally:
        close = getattr(stream, "close", None)
        if close:
            close()
    info = tarfile.TarInfo.frombuf(head[:tarfile.BLOCKSIZE], "utf-8", "surrogateescape")
    return info.uid, info.gid


def _directory_tar(folder: str, uid: int, gid: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entry = tarfile.TarInfo(folder)
        entry.type = tarfile.DIRTYPE
        entry.mode = FOLDER_MODE
        entry.uid, entry.gid = uid, gid
        entry.mtime = int(time.time())
        tar.addfile(entry)
    return out.getvalue()


@contextlib.contextmanager
def _helper(api: Any, image: str, source: str, read_only: bool, label: str) -> Iterator[str]:
    """A container created (never started) with the agent's ``source`` bound at
    :data:`HELPER_ROOT`, for the archive API; removed afterwards."""
    from docker.types import Mount

    helper = api.create_container(
        image, command=["/nonexistent-never-started"], entrypoint=[],
        network_disabled=True, labels={HELPER_LABEL: label},
        host_config=api.create_host_config(
            mounts=[Mount(HELPER_ROOT, source, type="bind", read_only=read_only)],
            network_mode="none"))["Id"]
    try:
        yield helper
    finally:
        api.remove_container(helper, force=True)


def bind_refusal(client: Any, image: str, path: str, *, root_only: bool = False) -> str | None:
    """Why the agent's ``path`` may resolve to something else at a later start, or None: each
    component from ``/`` down is looked at with the engine's ``lstat`` (a helper binds the
    agent's ``/``; nothing runs), stopping at the first that fails
    (core.folders.bind_component_verdict). ``root_only``: the last component must be root's
    too (a storage root)."""
    api = client.api
    prefixes = path_prefixes(path)
    with _helper(api, image, "/", True, path) as helper:
        for i, prefix in enumerate(prefixes):
            last = i == len(prefixes) - 1
            found = _stat(api, helper, HELPER_ROOT + prefix.rstrip("/"), owner=not last
                          or root_only)
            if found is not None and found.link_target.startswith(HELPER_ROOT):
                # the engine resolves a link in the helper: say where it leads on the agent
                agent_path = found.link_target[len(HELPER_ROOT):] or "/"
                found = dataclasses.replace(found, link_target=agent_path)
            problem = bind_component_verdict(found, last=last, root_only=root_only)
            if problem:
                return f"{prefix} {problem}"
    return None


def ensure_folder(client: Any, image: str, root: str, folder: str, uid: int, gid: int,
                  *, create: bool = True) -> str:
    """``made``, ``kept`` (already this user's directory) or, with ``create`` False and nothing
    there, ``missing``; :class:`FolderRefused` when something else is there (nothing is made).
    ``client``: a Docker SDK client of the agent's engine (Connector.docker_client)."""
    import docker

    api = client.api
    try:
        with _helper(api, image, root, not create, folder) as helper:
            return _ensure(api, helper, root, folder, uid, gid, create)
    except docker.errors.APIError as exc:
        if "bind source path does not exist" in str(exc):
            raise FolderRefused(f"the storage root {root} does not exist on this agent: the "
                                "pool's storage must be present on every agent") from None
        raise


def _ensure(api: Any, helper: str, root: str, folder: str, uid: int, gid: int,
            create: bool) -> str:
    path = f"{HELPER_ROOT}/{folder}"
    found = _stat(api, helper, path)
    problem = folder_verdict(found, uid)
    if problem:
        raise FolderRefused(f"{root}/{folder} {problem}")
    if found is not None:
        return "kept"
    if not create:
        return "missing"
    api.put_archive(helper, HELPER_ROOT, _directory_tar(folder, uid, gid))
    made = _stat(api, helper, path)
    problem = folder_verdict(made, uid) if made is not None else "was not made"
    if problem:
        raise FolderRefused(f"{root}/{folder} {problem}")
    return "made"


@contextlib.contextmanager
def _checking(pool: Any, name: str, what: str) -> Iterator[Any]:
    """A Docker client of agent ``name`` for a read-only check of the session's ``what``; not
    reaching it (the image missing there, the engine gone since the preflight) is
    :class:`AgentsUnusable` naming both: nothing is made."""
    import docker

    from .connectors import AgentError, connector_for, short_error
    from .errors import AgentsUnusable

    try:
        with connector_for(pool.agent(name)) as conn:
            client = conn.docker_client()
            try:
                yield client
            finally:
                client.close()
    except (AgentError, docker.errors.DockerException) as exc:
        raise AgentsUnusable(f"agent {name}: could not check the session's {what}: "
                             f"{short_error(exc)}; nothing was created") from None


def folder_refusals(pool: Any, plan: Any) -> list[tuple[str, str]]:
    """``(dotted path, message)`` for each data folder of ``plan`` that some agent it uses
    refuses (a link, not a directory, another user's); read-only: nothing is made. The driver
    asks this before ``up`` so that a refused folder is invalid input (exit 2) and nothing of
    the session is created."""
    found: list[tuple[str, str]] = []
    if not plan.folders:
        return found
    index = {m.source: i for i, m in reversed(list(enumerate(plan.mounts)))}
    user = plan.session.user
    for name in plan.agents:
        with _checking(pool, name, "data folders") as client:
            for m in plan.folders:
                try:
                    ensure_folder(client, plan.session.image, m.root, m.folder,
                                  user.uid, user.gid, create=False)
                except FolderRefused as exc:
                    found.append((f"mounts.{index[m.source]}.folder", f"on agent {name}: {exc}"))
    return found


def bind_refusals(pool: Any, plan: Any) -> list[tuple[str, str]]:
    """``(dotted path, message)`` for each host path ``plan`` binds (``mounts.N.source``) that
    some agent it uses could later resolve elsewhere (:func:`bind_refusal`): a link on its way,
    a directory on its way that anyone but root can write, or nothing there. Read-only; the
    driver asks it before ``up``, like :func:`folder_refusals`."""
    binds = [(i, m.source) for i, m in enumerate(plan.mounts)
             if m.folder is None and m.type == "bind"]
    found: list[tuple[str, str]] = []
    for name in plan.agents if binds else ():
        with _checking(pool, name, "mount sources") as client:
            for i, source in binds:
                problem = bind_refusal(client, plan.session.image, source)
                if problem:
                    found.append((f"mounts.{i}.source", f"on agent {name}: {problem}"))
    return found


def volume_refusals(pool: Any, plan: Any) -> list[tuple[str, str]]:
    """``(dotted path, message)`` for each named volume ``plan`` mounts that the pool does not
    list and that some agent it uses already holds as another's (core.folders.volume_verdict);
    read-only. A missing one is made by the first container's mount, with the session's labels
    (container_args), so it is the session's own from then on."""
    from .engine import volume_labels

    own = [(i, m.source) for i, m in enumerate(plan.mounts) if m.made]
    found: list[tuple[str, str]] = []
    for name in plan.agents if own else ():
        with _checking(pool, name, "volumes") as client:
            for i, volume in own:
                problem = volume_verdict(volume_labels(client, volume), plan.name, SESSION_LABEL)
                if problem:
                    found.append((f"mounts.{i}.source",
                                  f"on agent {name}: volume {volume} {problem}"))
    return found
