"""A pool's Docker Swarm as Pulumi dynamic resources: init on the manager, join on the others.

- :class:`SwarmManager`: ``docker swarm init --advertise-addr <address>`` on the pool's manager
  (an agent that already manages a swarm is adopted as is). Outputs the node and cluster IDs,
  ``manager_addr`` (``ADDR:2377``) and the worker join token, a secret.
- :class:`SwarmWorker`: ``docker swarm join`` on another agent (an agent already in the
  manager's swarm is adopted). Delete: ``docker swarm leave --force`` on the agent, then
  ``docker node rm --force`` on the manager so that the node list stays clean.
- :class:`PoolSwarm`: the component with one manager and a worker per other agent; the pool
  program (:mod:`cluster_sessions.pulumi_layer.pool_program`) builds it.

Delete undoes only what create did: a swarm that was initialized (or joined) by this resource
is left; an adopted one is left alone (it may serve other things).

The providers are pickled (dill) into the state and run in Pulumi's dynamic provider host; they
hold only plain data. Every connection (paramiko) opens inside ``create``/``update``/``delete``/
``read`` and closes before it returns; nothing is opened at import. The class is pickled by
reference, so the project must be importable where ``pulumi`` runs (``pip install -e .``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, UpdateResult

from ..agents import facts, gathering
from ..agents.connectors import (
    NOT_SWARM_READY,
    AgentError,
    Connector,
    agent_props,
)
from ..agents.polling import poll_until
from ..core.spec import Agent, Pool, agent_address
from .engine_resource import EngineResourceProvider, tolerating_gone, unknown

SWARM_PORT = 2377
COMMAND_TIMEOUT = 120.0
SECRET_OUTPUTS = ["worker_token"]


def advertise_address(agent: Agent) -> str | None:
    """The address other nodes reach this agent at (None for a local unix socket: Docker
    chooses, and says so if it cannot)."""
    return agent_address(agent)


def _identity(props: Mapping[str, Any]) -> tuple[str, str]:
    agent = props.get("agent") or {}
    return str(agent.get("name")), str(agent.get("docker_host"))


def _check_agent(props: Mapping[str, Any], key: str = "agent") -> list[CheckFailure]:
    agent = props.get(key)
    if unknown(agent):
        return []
    if not isinstance(agent, Mapping) or not agent.get("name") or not agent.get("docker_host"):
        return [CheckFailure(key, "must describe an agent (name, docker_host, ssh)")]
    return []


def _swarm(conn: Connector) -> facts.SwarmState:
    return gathering.gather(conn, facts.SwarmInfo())


def _wait_active(conn: Connector, seconds: float = 30) -> facts.SwarmState:
    """The swarm state once it is no longer ``pending`` (join and init settle asynchronously)."""
    return poll_until(lambda: _swarm(conn), lambda state: state.state != "pending", seconds)


class _SwarmNodeProvider(EngineResourceProvider):
    """What the manager and a worker share: another engine (the agent's name or docker_host)
    is another node, replaced, and a node goes before its replacement comes (one per agent)."""

    DELETE_BEFORE_REPLACE = True
    COMMAND_TIMEOUT = COMMAND_TIMEOUT

    def replaces(self, changed: list[str], olds: Mapping[str, Any],
                 news: Mapping[str, Any]) -> list[str]:
        replaces = super().replaces(changed, olds, news)
        if _identity(olds) != _identity(news):
            replaces.append("agent")
        return replaces


class SwarmManagerProvider(_SwarmNodeProvider):
    """``docker swarm init`` on one agent. Stateless and picklable."""

    INPUTS = ("agent", "advertise_addr")
    # Inputs whose change means another swarm: replace. Others (how the agent is reached) update.
    REPLACES = ("advertise_addr",)

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = _check_agent(news)
        addr = news.get("advertise_addr")
        if addr is not None and not unknown(addr) and (
                not isinstance(addr, str) or not addr or " " in addr):
            failures.append(CheckFailure("advertise_addr", "must be an address or None"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._ensure(props)
        return CreateResult(outs["cluster_id"], outs)

    def _ensure(self, props: Mapping[str, Any], initialized: bool = False) -> dict[str, Any]:
        name = props["agent"]["name"]
        addr = props.get("advertise_addr")
        with self.connect(props) as conn:
            state = _swarm(conn)
            if state.state == "active" and not state.control_available:
                raise AgentError(name, NOT_SWARM_READY, f"is a worker of another swarm (managers "
                                 f"{', '.join(state.remote_managers) or 'unknown'}); run `docker "
                                 "swarm leave` there first, or make that swarm's manager the "
                                 "pool's swarm.manager")
            if state.state in ("pending", "error", "locked"):
                raise AgentError(name, NOT_SWARM_READY, f"swarm state is {state.state}"
                                 + (f" ({state.error})" if state.error else "")
                                 + "; fix it (e.g. `docker swarm leave --force`) and retry")
            if state.state != "active":
                cmd = "docker swarm init" + (f" --advertise-addr {shlex.quote(addr)}"
                                             if addr else "")
                conn.check(cmd, timeout=COMMAND_TIMEOUT)
                initialized = True
                state = _wait_active(conn)
            if not (state.state == "active" and state.control_available):
                raise AgentError(name, NOT_SWARM_READY, f"swarm init left the state "
                                 f"{state.role}: {state.error or 'no error reported'}")
            token = gathering.gather(conn, facts.SwarmJoinToken())
        node_addr = state.node_addr or addr or ""
        return {
            **{k: props.get(k) for k in self.INPUTS},
            "node_id": state.node_id,
            "cluster_id": state.cluster_id or state.node_id,
            "manager_addr": f"{node_addr}:{SWARM_PORT}",
            "worker_token": token,
            "initialized": initialized,
        }

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only how the agent is reached changed; re-read the swarm through the new way.
        return UpdateResult(self._ensure(news, bool(olds.get("initialized"))))

    def look(self, id_: str, props: dict[str, Any]) -> dict[str, Any] | None:
        with self.connect(props) as conn:
            state = _swarm(conn)
            if not (state.state == "active" and state.control_available
                    and (state.cluster_id or state.node_id) == id_):
                return None  # gone: the next up creates it again
            token = gathering.gather(conn, facts.SwarmJoinToken())
        return {**props, "node_id": state.node_id, "worker_token": token}

    def remove(self, _id: str, props: dict[str, Any]) -> None:
        if not props.get("initialized"):
            return  # adopted: not ours to tear down
        with self.connect(props) as conn:
            state = _swarm(conn)
            if state.state != "inactive":
                conn.check("docker swarm leave --force", timeout=COMMAND_TIMEOUT)


class SwarmWorkerProvider(_SwarmNodeProvider):
    """``docker swarm join`` on one agent; ``leave`` (and ``node rm`` on the manager) on delete.

    Inputs: ``agent``, ``manager`` (the manager agent, to check membership and remove the node),
    ``manager_addr``, ``join_token`` (secret), ``advertise_addr``.
    """

    INPUTS = ("agent", "manager", "manager_addr", "join_token", "advertise_addr")
    REPLACES = ("manager_addr", "advertise_addr")

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = _check_agent(news) + _check_agent(news, "manager")
        # In a preview the manager's address and join token are not known yet: fine.
        addr, token = news.get("manager_addr"), news.get("join_token")
        if not unknown(addr) and (not isinstance(addr, str) or ":" not in addr):
            failures.append(CheckFailure("manager_addr", "must be ADDR:PORT"))
        if not unknown(token) and (not isinstance(token, str) or not token):
            failures.append(CheckFailure("join_token", "must be the swarm's worker token"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._ensure(props)
        return CreateResult(outs["node_id"], outs)

    def _members(self, props: Mapping[str, Any]) -> dict[str, facts.SwarmNode]:
        with self.connect(props, "manager") as mgr:
            return {n.node_id: n for n in gathering.gather(mgr, facts.SwarmNodes())}

    def _ensure(self, props: Mapping[str, Any], joined: bool = False) -> dict[str, Any]:
        name = props["agent"]["name"]
        manager = props["manager"]["name"]
        with self.connect(props) as conn:
            state = _swarm(conn)
            if state.state == "active":
                if state.node_id not in self._members(props):
                    raise AgentError(name, NOT_SWARM_READY, f"is already in another swarm "
                                     f"(node {state.node_id}, managers "
                                     f"{', '.join(state.remote_managers) or 'unknown'}), not "
                                     f"{manager}'s; run `docker swarm leave --force` there first")
            elif state.state in ("pending", "error", "locked"):
                raise AgentError(name, NOT_SWARM_READY, f"swarm state is {state.state}"
                                 + (f" ({state.error})" if state.error else "")
                                 + "; fix it (e.g. `docker swarm leave --force`) and retry")
            else:
                addr = props.get("advertise_addr")
                extra = f" --advertise-addr {shlex.quote(addr)}" if addr else ""
                target = shlex.quote(props["manager_addr"])
                token = shlex.quote(props["join_token"])
                conn.check(f"docker swarm join --token {token}{extra} {target}",
                           timeout=COMMAND_TIMEOUT,
                           shown=f"docker swarm join --token ***{extra} {target}")
                joined = True
                state = _wait_active(conn)
                if state.state != "active":
                    raise AgentError(name, NOT_SWARM_READY, f"swarm join left the state "
                                     f"{state.role}: {state.error or 'no error reported'}")
        self._wait_ready(props, state.node_id)
        return {**{k: props.get(k) for k in self.INPUTS}, "node_id": state.node_id,
                "joined": joined}

    def _wait_ready(self, props: Mapping[str, Any], node_id: str, seconds: float = 30) -> None:
        node = poll_until(lambda: self._members(props).get(node_id),
                          lambda node: node is not None and node.ready, seconds)
        if node is None or not node.ready:
            raise AgentError(props["agent"]["name"], NOT_SWARM_READY,
                             f"joined, but the manager {props['manager']['name']} lists node "
                             f"{node_id} as {node.status if node else 'absent'}")

    def diffed(self) -> tuple[str, ...]:
        # A rotated join token changes nothing for a node that has joined.
        return tuple(k for k in self.INPUTS if k != "join_token")

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self._ensure(news, bool(olds.get("joined"))))

    def look(self, id_: str, props: dict[str, Any]) -> dict[str, Any] | None:
        with self.connect(props) as conn:
            state = _swarm(conn)
        if state.state != "active" or state.node_id != id_ or id_ not in self._members(props):
            return None
        return props

    def remove(self, id_: str, props: dict[str, Any]) -> None:
        if not props.get("joined"):
            return  # adopted: not ours to take out of its swarm
        with self.connect(props) as conn:
            state = _swarm(conn)
            if state.state != "inactive" and state.node_id == id_:
                conn.check("docker swarm leave --force", timeout=COMMAND_TIMEOUT)
        with tolerating_gone("not found", "No such node"), self.connect(props, "manager") as mgr:
            if _swarm(mgr).control_available:
                # a node that just left shows as Down for a moment; rm --force takes it
                mgr.check(f"docker node rm --force {shlex.quote(id_)}", timeout=COMMAND_TIMEOUT)


class SwarmManager(pulumi.dynamic.Resource, module="cluster-sessions", name="SwarmManager"):
    """The pool's swarm manager. Type ``pulumi-python:dynamic/cluster-sessions:SwarmManager``."""

    node_id: pulumi.Output[str]
    cluster_id: pulumi.Output[str]
    manager_addr: pulumi.Output[str]
    worker_token: pulumi.Output[str]
    initialized: pulumi.Output[bool]

    def __init__(self, name: str, agent: Agent, opts: pulumi.ResourceOptions | None = None):
        props = {
            "agent": agent_props(agent),
            "advertise_addr": advertise_address(agent),
            "node_id": None,
            "cluster_id": None,
            "manager_addr": None,
            "worker_token": None,
            "initialized": None,
        }
        secret = pulumi.ResourceOptions(additional_secret_outputs=SECRET_OUTPUTS)
        super().__init__(SwarmManagerProvider(), name, props,
                         pulumi.ResourceOptions.merge(opts, secret))


class SwarmWorker(pulumi.dynamic.Resource, module="cluster-sessions", name="SwarmWorker"):
    """One agent joined to the manager's swarm. Type ``...:SwarmWorker``."""

    node_id: pulumi.Output[str]
    joined: pulumi.Output[bool]

    def __init__(self, name: str, agent: Agent, manager_agent: Agent, manager: SwarmManager,
                 opts: pulumi.ResourceOptions | None = None):
        props = {
            "agent": agent_props(agent),
            "manager": agent_props(manager_agent),
            "manager_addr": manager.manager_addr,
            "join_token": manager.worker_token,
            "advertise_addr": advertise_address(agent),
            "node_id": None,
            "joined": None,
        }
        super().__init__(SwarmWorkerProvider(), name, props,
                         pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                             depends_on=[manager])))


class PoolSwarm(pulumi.ComponentResource):
    """A pool's swarm: the manager and one worker per other agent, in pool order.

    Type token ``cluster-sessions:index:PoolSwarm``. Outputs: ``manager`` (agent name),
    ``manager_addr``, ``cluster_id`` and ``nodes`` (agent name -> swarm node ID).
    """

    manager: pulumi.Output[str]
    manager_addr: pulumi.Output[str]
    cluster_id: pulumi.Output[str]
    nodes: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, pool: Pool, opts: pulumi.ResourceOptions | None = None):
        super().__init__("cluster-sessions:index:PoolSwarm", name, None, opts)
        if pool.swarm is None:
            raise ValueError(f"pool {pool.name!r} has no swarm.manager")
        child = pulumi.ResourceOptions(parent=self)
        mgr_agent = pool.agent(pool.swarm.manager)
        self.manager_resource = SwarmManager(f"{name}-{mgr_agent.name}", mgr_agent, child)
        self.workers = {
            a.name: SwarmWorker(f"{name}-{a.name}", a, mgr_agent, self.manager_resource, child)
            for a in pool.agents if a.name != mgr_agent.name
        }
        self.manager = pulumi.Output.from_input(mgr_agent.name)
        self.manager_addr = self.manager_resource.manager_addr
        self.cluster_id = self.manager_resource.cluster_id
        ids = {mgr_agent.name: self.manager_resource.node_id,
               **{n: w.node_id for n, w in self.workers.items()}}
        self.nodes = pulumi.Output.all(**ids)
        self.register_outputs({"manager": self.manager, "manager_addr": self.manager_addr,
                               "cluster_id": self.cluster_id, "nodes": self.nodes})
