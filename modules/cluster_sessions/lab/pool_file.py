"""The pool file ``lab up`` writes: the lab as an AgentPool (DESIGN contract 0), every agent
reached over SSH as ``csl-ops``, with a header by which ``lab down`` knows the file is its own."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from .layout import LabInfo, write_private

POOL_FILE_HEADER = "# Written by `sessionctl lab up`"  # how lab_down knows the file is its own


def machine_capacity() -> dict:
    cpu = len(os.sched_getaffinity(0))
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {"cpu": cpu, "mem": f"{mem_kb // 1024}m", "gpus": []}


def pool_document(info: LabInfo, name: str = "lab") -> dict:
    """The AgentPool (DESIGN contract 0) describing the lab's agents."""
    return {
        "kind": "AgentPool",
        "name": name,
        "agents": [
            {
                "name": a.name,
                "docker_host": a.docker_host,
                "address": a.address,
                "ssh": {
                    "host": a.address,
                    "port": 22,
                    "user": info.user,
                    "key_file": str(info.key_file),
                    "known_hosts": str(info.known_hosts),
                },
                "capacity": machine_capacity(),
            }
            for a in info.agents
        ],
        "swarm": {"manager": info.agents[0].name},
        "network": {"mtu": 1450, "encrypted": False},
        # one host directory, seen by every agent's engine (they share this machine's
        # filesystem, as agents share an NFS mount): the data folders' root
        "storage": {"data": str(storage_root(info.state_dir))},
        # the bundles' directory (issue 45): the agents' one filesystem, the SSH user's
        "scratch": str(scratch_root(info.state_dir)),
    }


def storage_root(state_dir: Path) -> Path:
    """The lab's storage root for data folders (core/folders.py): root's, 0755, so that only
    the engines (through the archive API) make folders in it, never a session user."""
    return Path(state_dir) / "storage"


LAB_SCRATCH_PARENT = Path("/var/lib/cluster-sessions-lab")


def scratch_root(state_dir: Path) -> Path:
    """The lab's scratch root (core/bundles.py): the pool's SSH user's, 0700, made here as
    root would on a real agent (the SSH user cannot make a directory in a root's one). Not in
    the state directory, which the SSH user may not be able to reach (a test's is under
    pytest's 0700 directory): in a root's 0755 directory of its own, one per lab."""
    import hashlib

    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:12]
    return LAB_SCRATCH_PARENT / digest


def make_scratch(state_dir: Path, user: str) -> None:
    import pwd

    root = scratch_root(state_dir)
    LAB_SCRATCH_PARENT.mkdir(mode=0o755, exist_ok=True)
    os.chmod(LAB_SCRATCH_PARENT, 0o755)
    root.mkdir(mode=0o700, exist_ok=True)
    entry = pwd.getpwnam(user)
    os.chown(root, entry.pw_uid, entry.pw_gid)
    os.chmod(root, 0o700)


def write_pool(info: LabInfo) -> None:
    make_scratch(info.state_dir, info.user)  # the agents' one, whoever writes the pool file
    if info.pool_file is None:
        return
    storage_root(info.state_dir).mkdir(mode=0o755, exist_ok=True)
    doc = pool_document(info, info.pool_file.stem)
    text = (
        f"{POOL_FILE_HEADER} (cluster_sessions.lab.netns), rewritten on each up.\n"
        "# Every agent reports the whole machine as its capacity: they share it.\n"
        + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    )
    info.pool_file.parent.mkdir(parents=True, exist_ok=True)
    write_private(info.pool_file, text)
