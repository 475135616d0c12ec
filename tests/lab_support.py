"""The netns lab as the lab test modules use it: a pool of N agents brought up for a module
and torn down after it, its engines reached the way a real pool is (SSH as the pool's user,
``docker system dial-stdio``), and the pool's swarm made by ``sessionctl pool up`` through
the real engine and left again.

Each module keeps its own lab prefix and subnet (``PREFIX, SUBNET`` at its top, none used
twice), so two modules run at once never share a lab.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster_sessions.agents.connectors import connector_for
from cluster_sessions.core.loader import load_file
from cluster_sessions.driver.stacks import find_pulumi
from cluster_sessions.lab import netns
from cluster_sessions.lab.image import ensure_images
from cluster_sessions.lab.layout import LabInfo
from cluster_sessions.lab.processes import LabError

from .conftest import (
    ENGINE_PATH,
    PROJECT,
    SESSIONCTL,
    STACKS,
    backend_env,
    clear_stale_lab,
    require_lab,
    skip_or_fail,
)


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


@dataclass
class PoolStack:
    """The pool stack (``pool-<name>``) as ``sessionctl pool up`` makes it: the installed
    ``sessionctl`` through the real ``pulumi`` CLI, on a file backend of its own; its outputs
    and resources read back from the CLI."""

    pool_file: Path
    stack: str
    state: Path
    pulumi: Path
    left: bool = False  # `pool destroy` ran

    @property
    def env(self) -> dict[str, str]:
        return backend_env(self.state)

    def sessionctl(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([SESSIONCTL, *argv],
                              cwd=PROJECT, env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=900)

    def cli(self, *args: str, stack: str | None = None) -> str:
        """``pulumi ARGS -s STACK`` (this pool stack unless another of the backend's is
        named)."""
        from cluster_sessions.driver.stack_settings import engine_settings

        env = {**self.env, **engine_settings(self.env, PROJECT).env}  # as sessionctl runs it
        done = subprocess.run([str(self.pulumi), "--non-interactive", *args, "-s",
                               stack or self.stack],
                              cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"pulumi {' '.join(args)}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def up(self) -> subprocess.CompletedProcess:
        done = self.sessionctl("pool", "up", str(self.pool_file), "--yes")
        assert done.returncode == 0, done.stderr
        return done

    @property
    def outputs(self) -> dict[str, Any]:
        """The stack's outputs as ``pulumi stack output --json`` prints them (secrets hidden)."""
        return json.loads(self.cli("stack", "output", "--json"))

    def resources(self, stack: str | None = None) -> list[dict[str, Any]]:
        """The stack's resources as its checkpoint holds them (``pulumi stack export``)."""
        return json.loads(self.cli("stack", "export", stack=stack))["deployment"].get(
            "resources") or []

    def docker_hosts(self, stack: str) -> dict[str, str]:
        """Each container of a session stack: the ``host`` of the docker provider the real
        engine created it through (its checkpoint's provider reference, ``urn::id``)."""
        resources = self.resources(stack)
        hosts = {f"{r['urn']}::{r['id']}": r.get("inputs", {}).get("host", "")
                 for r in resources if r["type"] == "pulumi:providers:docker"}
        return {r["inputs"]["name"]: hosts[r["provider"]] for r in resources
                if r["type"] == "docker:index/container:Container"}

    def down(self) -> subprocess.CompletedProcess:
        """``sessionctl pool destroy``: the workers leave, then the manager."""
        return self.sessionctl("pool", "destroy", str(self.pool_file), "--yes")


@contextlib.contextmanager
def pool_swarm(pool_file: Path, stack: str) -> Iterator[PoolStack]:
    """The pool's swarm, made by ``sessionctl pool up`` through the real engine; left again at
    the end (``pool destroy``; what fails is left for the lab's teardown)."""
    pulumi = find_pulumi({**os.environ, **ENGINE_PATH})
    if pulumi is None:
        skip_or_fail("the pulumi CLI is not installed: bash scripts/setup.sh --install-pulumi")
    made = PoolStack(pool_file, stack, Path(tempfile.mkdtemp(prefix=f"{stack}-state-")), pulumi)
    try:
        made.up()
        yield made
    finally:
        leave_swarm(made)
        shutil.rmtree(made.state, ignore_errors=True)
        (STACKS / f"Pulumi.{stack}.yaml").unlink(missing_ok=True)


def leave_swarm(made: PoolStack) -> None:
    """What ``pool destroy`` does, once (a test may have done it already: then it is a no-op);
    what fails is left for the lab's teardown."""
    if not made.left:
        made.left = True
        made.down()
