"""How each container's bundle reaches it (issue 45): decided once, here, per agent.

- ``scratch``: the agent's bundles are written once per ``up`` (one archive over the agent's
  SSH, or locally for the local engine) into ``<scratch>/<stack id>/<host>/`` on the agent,
  and each container bind-mounts its own directory read-only at ``BUNDLE_DIR``, where the pack
  entrypoint finds ``bundle.pack`` (render.pack_entrypoint_argv): no per-container upload
  between the container's create and its start.
- ``upload``: the docker provider's upload of ``bundle.pack`` into each container, for agents
  with no file access (``tcp://`` with TLS: only the Docker API), and for a pool whose
  sessions' root may not read a file it does not own (``DAC_OVERRIDE`` dropped: the bundle
  files on the agent belong to the pool's SSH user, mode 0000, see below).

On the agent (agents/bundles.py): the scratch root is the SSH user's, 0700 (only that user and
root enter it); ``<stack id>/`` 0700; ``<host>/`` 0500; ``bundle.pack`` mode 0000. The pack holds
the private keys: with 0000 no process on the agent but root reads it, and neither does a
session user whose uid happens to equal the SSH user's (the container's own bind mount is
read-only, so nobody in it can chmod it back); the container's root reads it with
``DAC_OVERRIDE``, as the entrypoint runs as root. The files of the bundle keep their own modes
inside the pack (render.pack recreates each with its mode in the container's tmpfs).

Pure: no I/O.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import Agent, Pool

SCRATCH, UPLOAD = "scratch", "upload"
BUNDLE_FILE = "bundle.pack"
# what the sessions' root needs to read a file the SSH user owns with mode 0000
READ_CAPABILITY = "DAC_OVERRIDE"
HOST_DIR_MODE = 0o500
BUNDLE_FILE_MODE = 0o000
# names in <scratch>/<stack id>/ that are never a host (host names are the plan's, which start
# with a letter): a delivery being written, an old one being removed
PARTIAL_PREFIX = ".new-"
OLD_PREFIX = ".old-"


def delivery_of(agent: Agent, pool: Pool) -> str:
    """``scratch`` where the agent's files can be written (an ``ssh`` block, an ``ssh://`` or a
    local ``unix://`` docker_host) and the sessions' root may read them, else ``upload``."""
    if agent.docker_host.startswith("tcp://"):
        return UPLOAD
    if READ_CAPABILITY not in pool.privileges.capabilities:
        return UPLOAD
    return SCRATCH


def delivery_reason(agent: Agent, pool: Pool) -> str:
    """Why :func:`delivery_of` chose what it chose, in a few words (``plan`` shows it)."""
    if agent.docker_host.startswith("tcp://"):
        return "tcp:// agent: no file access, the provider uploads each container's bundle"
    if READ_CAPABILITY not in pool.privileges.capabilities:
        return (f"the pool drops {READ_CAPABILITY}: the sessions' root could not read a bundle "
                "file of the SSH user's")
    return "one archive per up into the agent's scratch root, bind-mounted read-only"


def stack_dir(scratch: str, stack_id: str) -> str:
    return posixpath.join(scratch, stack_id)


def host_dir(scratch: str, stack_id: str, host: str) -> str:
    """``<scratch>/<stack id>/<host>``: what the container of ``host`` bind-mounts."""
    return posixpath.join(scratch, stack_id, host)


def archive(bundles: Mapping[str, str]) -> bytes:
    """Every host's bundle in one gzipped tar: ``<host>/`` (0700) holding ``bundle.pack``
    (0000), in host order, with fixed owner and time (the same bundles make the same bytes)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for host in bundles:
            data = bundles[host].encode()
            info = tarfile.TarInfo(f"{host}/{BUNDLE_FILE}")
            info.size, info.mode, info.mtime = len(data), BUNDLE_FILE_MODE, 0
            d = tarfile.TarInfo(host)
            # 0700 while it is moved into place (renaming a directory into another one needs
            # write permission on it, for its ``..``, unless one is root); HOST_DIR_MODE after
            d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o700, 0
            tar.addfile(d)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
