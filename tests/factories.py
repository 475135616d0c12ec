"""Definitions for tests, built as data and written as YAML: one place that knows what a
minimal ClusterSession and AgentPool look like. Tests about YAML spellings themselves (the
loader's and the CLI's hostile-input tests) keep their text inline on purpose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LOCAL_ENGINE = "unix:///var/run/docker.sock"


def agent(name: str = "agent1", docker_host: str = LOCAL_ENGINE, *, cpu: float = 8,
          mem: str = "16g", gpus: tuple[int, ...] = (), **over: Any) -> dict:
    return {"name": name, "docker_host": docker_host,
            "capacity": {"cpu": cpu, "mem": mem, "gpus": list(gpus)}, **over}


def pool(name: str = "test", *agents: dict, **over: Any) -> dict:
    return {"kind": "AgentPool", "name": name, "agents": list(agents) or [agent()], **over}


def session(name: str = "train-demo", pool: str = "local", image: str = "img", *,
            size: int = 1, mode: str = "single-node", cpu: float = 1, mem: str = "1g",
            shmem: str = "64m", **over: Any) -> dict:
    return {"kind": "ClusterSession", "name": name, "pool": pool, "image": image,
            "cluster": {"mode": mode, "size": size},
            "resources": {"cpu": cpu, "mem": mem, "shmem": shmem}, **over}


def load_session(path: Path, pool: Path | None = None):
    """The loader as the driver calls it: with the operator's pool directories
    (``$CLUSTER_SESSIONS_POOLS``: conftest makes them the test's own)."""
    from cluster_sessions.core import loader
    from cluster_sessions.driver.session_args import pool_dirs

    return loader.load_session(path, pool, pool_dirs=pool_dirs())


def write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_pair(directory: Path, session_doc: dict, pool_doc: dict) -> Path:
    """A pool file and a session definition naming it; the definition's path."""
    pool_file = write(directory / "pool.yaml", pool_doc)
    return write(directory / f"{session_doc['name']}.yaml",
                 {**session_doc, "pool": str(pool_file)})
