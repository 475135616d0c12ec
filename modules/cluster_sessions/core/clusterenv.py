"""The static cluster environment of each container: the one place that computes it.

Only values known before any container starts live here. ``MASTER_ADDR``, ``MASTER_PORT``,
``TF_CONFIG`` and torchrun's ``PET_*`` are derived at start-up by ``cluster-env.sh`` instead, so
that a value set by the user or the image wins (Backend.AI docs, "Distributed Training
Environment Variables"). ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` are never set: torchrun
sets them per process.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Kernel ids are UUIDv5 of the session name and host, so they stay the same on every ``up``
# of the same definition; main1's kernel id is the session id, as in Backend.AI.
ID_NAMESPACE = uuid.UUID("5b0f6f4e-4a39-4c84-9a43-2f1b7c1d7a10")


@dataclass(frozen=True)
class Member:
    """One container's place in the session."""

    host: str
    role: str
    idx: int  # 1-based within the role
    local_rank: int  # 0-based across the session


# Names that the dynamic loader, the C library or a shell reads when a program starts (glibc's
# list of variables it ignores for set-uid programs, plus the shells' start-up and option
# variables). No definition value is ever in the container's env (static_envs); these are
# moreover never assigned by a shell of ours, not even one running as the user (IFS or
# SHELLOPTS would change that shell, LD_PRELOAD every program it starts): exec-env.sh puts them
# on the exec of the user's program only.
STARTUP_NAMES = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
    "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_CHECK_", "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_", "MALLOC_PERTURB_", "MALLOC_TOP_PAD_", "MALLOC_TRACE",
    "MALLOC_TRIM_THRESHOLD_", "MUSL_LOCPATH", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF",
    "RES_OPTIONS", "TMPDIR", "TZDIR",
    "BASHOPTS", "CDPATH", "ENV", "EXECIGNORE", "FPATH", "GLOBIGNORE", "IFS", "POSIXLY_CORRECT",
    "PROMPT_COMMAND", "PS4", "SHELLOPTS",
    # bash's read-only variables: assigning one stops a POSIX-mode bash (/bin/sh in some images)
    "EUID", "PPID", "UID",
})
# Prefixes of such names: the dynamic loader's LD_* and bash's own BASH_* (BASH_ENV,
# BASH_XTRACEFD, BASH_COMPAT, BASH_LOADABLES_PATH, ...).
STARTUP_PREFIXES = ("LD_", "BASH_")
# Locale variables: a value with a '/' is a path the C library loads locale data from.
LOCALE_NAMES = frozenset({"LANG", "LANGUAGE", "LC_ALL", "LC_ADDRESS", "LC_COLLATE", "LC_CTYPE",
                          "LC_IDENTIFICATION", "LC_MEASUREMENT", "LC_MESSAGES", "LC_MONETARY",
                          "LC_NAME", "LC_NUMERIC", "LC_PAPER", "LC_TELEPHONE", "LC_TIME"})


def read_at_startup(name: str, value: str) -> bool:
    """True for a variable that must never be in effect for a root process (see above)."""
    return (name.startswith(STARTUP_PREFIXES) or name in STARTUP_NAMES
            or (name in LOCALE_NAMES and "/" in value))


def split_user_env(user_env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(what the user's own shell assigns, user-env.sh; what is put on the exec of the user's
    program only, exec-env.sh). Neither is ever in the container's env."""
    ordinary = {k: v for k, v in user_env.items() if not read_at_startup(k, v)}
    at_exec = {k: v for k, v in user_env.items() if read_at_startup(k, v)}
    return ordinary, at_exec


def members(size: int) -> tuple[Member, ...]:
    """main1 first, then sub1..sub<size-1>: the one order used everywhere."""
    subs = (Member(f"sub{i}", "sub", i, i) for i in range(1, size))
    return (Member("main1", "main", 1, 0), *subs)


def kernel_id(session_name: str, host: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, f"{session_name}/{host}"))


def replicas(size: int) -> str:
    return f"main:1,sub:{size - 1}" if size > 1 else "main:1"


def static_envs(
    session_name: str,
    mode: str,
    group: Sequence[Member],
    master_port: int | None,
) -> list[dict[str, str]]:
    """The env each container is created with, in host order: values the session decides,
    never one of the definition's. Everything Docker starts in the container sees it, root's
    ``docker exec`` included; the definition's ``env`` reaches only the session user's
    processes, through the bundle (user-env.sh, exec-env.sh).
    """
    hosts = ",".join(m.host for m in group)  # one string shared by every container
    shared = {
        "BACKENDAI_SESSION_NAME": session_name,
        "BACKENDAI_SESSION_ID": kernel_id(session_name, group[0].host),
        "BACKENDAI_CLUSTER_MODE": mode,
        "BACKENDAI_CLUSTER_SIZE": str(len(group)),
        "BACKENDAI_CLUSTER_HOSTS": hosts,
        "BACKENDAI_CLUSTER_REPLICAS": replicas(len(group)),
    }
    if master_port is not None:
        shared["BACKENDAI_DIST_MASTER_PORT"] = str(master_port)
    return [
        {
            **shared,
            "BACKENDAI_KERNEL_ID": kernel_id(session_name, m.host),
            "BACKENDAI_CLUSTER_HOST": m.host,
            "BACKENDAI_CLUSTER_ROLE": m.role,
            "BACKENDAI_CLUSTER_IDX": str(m.idx),
            "BACKENDAI_CLUSTER_LOCAL_RANK": str(m.local_rank),
        }
        for m in group
    ]
