"""The netns lab as the lab test modules use it: a pool of N agents brought up for a module
and torn down after it, its engines reached the way a real pool is (SSH as the pool's user,
``docker system dial-stdio``), and the pool's swarm made by the pool program and left again.

Each module keeps its own lab prefix and subnet (``PREFIX, SUBNET`` at its top, none used
twice), so two modules run at once never share a lab.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster_sessions.agents.connectors import connector_for
from cluster_sessions.core.loader import load_file
from cluster_sessions.lab import netns
from cluster_sessions.lab.image import ensure_images
from cluster_sessions.lab.layout import LabInfo
from cluster_sessions.lab.processes import LabError
from tests.standin.engine import Engine, run_program

from .conftest import PROJECT, clear_stale_lab, require_lab


@dataclass
class LabPool:
    """A lab's pool: its file, the image its agents have, and each agent's engine as the pool
    reaches it (cached; :meth:`forget` drops one whose engine restarted)."""

    info: LabInfo
    pool_file: Path
    image: str
    connect_timeout: float = 120.0
    clients: dict = field(default_factory=dict)
    connectors: dict = field(default_factory=dict)

    @property
    def pool(self):
        return load_file(self.pool_file, expect="AgentPool")

    def client(self, agent: str):
        """The agent's engine reached as the pool says, like any remote agent: SSH as the
        pool's user, ``docker system dial-stdio`` there (the lab's sockets are not used)."""
        if agent not in self.clients:
            conn = connector_for(self.pool.agent(agent), timeout=self.connect_timeout)
            self.connectors[agent] = conn
            self.clients[agent] = conn.docker_client()
        return self.clients[agent]

    def forget(self, agent: str) -> None:
        """Drop a cached client (its engine restarted)."""
        for cache in (self.clients, self.connectors):
            with contextlib.suppress(Exception):
                cache.pop(agent).close()

    def close(self) -> None:
        for agent in list(self.connectors):
            self.forget(agent)


@contextlib.contextmanager
def lab_pool(tmp_path_factory, prefix: str, subnet: str, agents: int, *,
             name: str | None = None,
             capacity: Mapping[str, Any] | Callable[[str], Mapping[str, Any]] | None = None,
             flavour: str = "sshd", kind: type[LabPool] = LabPool,
             connect_timeout: float = 120.0, **pool_fields: Any) -> Iterator[LabPool]:
    """A lab of ``agents`` agents with the session image imported into each (through the lab's
    local sockets, as ``sessionctl lab up`` does); its pool renamed ``name``, with
    ``capacity`` (one for all, or per agent name) and ``pool_fields`` written in when given.
    Everything the lab made is removed at the end, whatever the test did."""
    import docker

    require_lab()
    clear_stale_lab(prefix)
    state = tmp_path_factory.mktemp(prefix)
    try:
        info = netns.lab_up(agents, state, state / "lab.yaml", prefix=prefix, subnet=subnet)
    except LabError as exc:  # lab_up removes what it created
        pytest.fail(f"lab_up failed: {exc}")
    local: list = []
    built: LabPool | None = None
    try:
        pool_file = info.pool_file
        if name or capacity or pool_fields:
            doc = yaml.safe_load(info.pool_file.read_text())
            doc["name"] = name or doc["name"]
            for a in doc["agents"]:
                if capacity is not None:  # a copy each: yaml would write one as an alias
                    a["capacity"] = copy.deepcopy(capacity(a["name"]) if callable(capacity)
                                                  else capacity)
            doc.update(pool_fields)
            pool_file = state / f"{doc['name']}.yaml"
            pool_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        local = [docker.DockerClient(base_url=f"unix://{a.socket}", timeout=600)
                 for a in info.agents]
        image = ensure_images(local, progress=lambda _m: None, flavour=flavour)
        built = kind(info, pool_file, image, connect_timeout=connect_timeout)
        yield built
    finally:
        for c in local:
            c.close()
        if built is not None:
            built.close()
        netns.lab_down(state)


@contextlib.contextmanager
def pool_swarm(pool_file: Path, stack: str) -> Iterator[tuple[Engine, dict, dict]]:
    """The pool's swarm, made by the pool program (``sessionctl pool up``) under the mock
    engine, its dynamic resources run for real against the lab; left again at the end.
    Yields the engine, the program's outputs and its config."""
    from cluster_sessions.pulumi_layer import pool_program

    engine = Engine()
    config = {"cluster-sessions:pool-definition": str(pool_file)}
    try:
        outputs = run_program(engine, stack, config, program=lambda: pool_program.run(PROJECT))
        yield engine, outputs, config
    finally:
        leave_swarm(engine)


def leave_swarm(engine: Engine) -> None:
    """What ``pool destroy`` does: each dynamic resource's delete, workers before the manager
    (the engine's order); each only leaves what the program made. What fails is left for the
    lab's teardown."""
    engine.delete_resources(list(engine.state), go_on=True)
