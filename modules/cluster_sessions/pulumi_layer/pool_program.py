"""The Pulumi program of a *pool* stack: the pool's Docker Swarm (manager and workers).

A pool stack (``sessionctl pool up POOL``, stack ``pool-<name>``) sets
``cluster-sessions:pool-definition`` to the AgentPool file (relative to ``stacks/`` or
absolute); ``__main__.py`` runs this program instead of the session program when that key is
set (:func:`is_pool_stack`). Session stacks then find the swarm through the same pool: the
overlay is created through ``pool.swarm.manager``, and ``preflight`` checks that every agent a
session spans is a ready node of that manager's swarm.

Outputs: ``pool`` (name, definition) and ``swarm`` (manager, manager_addr, cluster_id, nodes).
The worker join token stays inside the state, as a secret; it is not exported.
"""

from __future__ import annotations

from pathlib import Path

import pulumi

from ..core.errors import InvalidInput
from ..core.loader import load_pool_file
from ..core.names import CONFIG_NAMESPACE, POOL_DEFINITION_KEY, STACKS_DIR
from ..core.problems import DefinitionError
from ..core.spec import Pool
from .program import resolve
from .swarm import PoolSwarm


class InvalidPool(pulumi.RunError, InvalidInput):
    """The pool definition is invalid or has no swarm; one ``FILE: path: message`` per line."""


def is_pool_stack(config: pulumi.Config | None = None) -> bool:
    """Whether this stack is a pool stack (``cluster-sessions:pool-definition`` is set)."""
    return bool((config or pulumi.Config(CONFIG_NAMESPACE)).get(POOL_DEFINITION_KEY))


def load(project_dir: Path, config: pulumi.Config | None = None) -> tuple[Pool, Path]:
    config = config or pulumi.Config(CONFIG_NAMESPACE)
    path = resolve(config.require(POOL_DEFINITION_KEY), project_dir / STACKS_DIR)
    try:
        pool = load_pool_file(path)
    except DefinitionError as exc:
        raise InvalidPool(f"invalid pool definition:\n{exc}") from None
    assert isinstance(pool, Pool)
    if pool.swarm is None:
        raise InvalidPool(f"{path}: swarm.manager: required for a pool stack (the pool's swarm "
                          "is all it builds)")
    return pool, path


def run(project_dir: Path) -> PoolSwarm:
    """Build this pool stack's swarm and export where it is."""
    pool, path = load(project_dir)
    swarm = PoolSwarm(f"{pool.name}-swarm", pool)
    try:
        shown = str(path.resolve().relative_to(project_dir.resolve()))
    except ValueError:
        shown = str(path)
    pulumi.export("pool", {"name": pool.name, "definition": shown,
                           "agents": [a.name for a in pool.agents]})
    pulumi.export("swarm", {
        "manager": swarm.manager,
        "manager_addr": swarm.manager_addr,
        "cluster_id": swarm.cluster_id,
        "nodes": swarm.nodes,
    })
    return swarm
