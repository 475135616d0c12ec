"""A session's containers as its agents' engines describe them, for ``status``, ``logs``,
``wait``, ``run`` and ``ls``.

They find a session's containers by the labels the component puts on them
(:func:`cluster_sessions.core.plan.container_labels`: ``cluster-sessions.session``, ``.host``,
``.role``), on each agent with the Docker SDK through the agent's connector (over SSH with the
pool's key and known_hosts when the agent has an ``ssh`` block); none needs the
Pulumi CLI or the stack's state, so they also show what Pulumi does not know about (a
container left behind by an interrupted ``up``, or one from before the session shrank).

Whose: only the objects of the session's stack in the configured backend (their stack-id
label, :mod:`.stack_identity`), so another stack holding the same session name on the pool is
never shown or touched as this one. Without the ``pulumi`` CLI the stack cannot be read: then
every stack's objects of that name are shown, as before stack ids (these verbs work without
the CLI), and a note says so when several stacks' are found.

Which agents are asked: the ones the plan places containers on, plus the one holding the
network; when the plan is pending (nothing fits now), every agent of the pool, since leftovers
may be anywhere. An agent that does not answer is reported with its cause, and the others are
still asked.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agents.engine import (
    close_client,
    container_facts,
    network_facts,
    open_client,
    session_containers,
)
from ..agents.facts import published_ports
from ..core.loader import Loaded
from ..core.placement import Placement, Slot
from ..core.plan import ClusterPlan, plan_placed
from ..core.spec import Agent
from ..core.terminal import printable
from .errors import CommandError, Exit
from .session_args import Selected

DOCKER_TIMEOUT = 15


@dataclass(frozen=True)
class Found:
    """One of the session's containers, as an agent's engine describes it."""

    agent: str
    id: str
    name: str
    host: str | None
    role: str | None
    state: str  # created | running | paused | restarting | removing | exited | dead
    health: str | None  # healthy | unhealthy | starting, when the container has a healthcheck
    started_at: str | None
    exit_code: int | None
    image: str
    finished_at: str | None = None
    # (container port, host address, host port) the engine publishes
    ports: tuple[tuple[int, str, int], ...] = ()


def found_from_attrs(agent: str, attrs: Mapping[str, Any]) -> Found:
    """A container from ``docker inspect`` attributes (read by the engine room)."""
    c = container_facts(attrs)
    return Found(agent=agent, id=c.container_id[:12], name=c.name, host=c.host, role=c.role,
                 state=c.state or "unknown", health=c.health, started_at=c.started_at,
                 exit_code=c.exit_code, image=c.image, finished_at=c.finished_at,
                 ports=tuple((p.internal, p.host_ip, p.host_port)
                             for p in published_ports(attrs)))


@dataclass(frozen=True)
class NetworkState:
    name: str
    agent: str | None
    driver: str  # planned
    state: str  # present | missing | unknown
    id: str | None = None
    actual_driver: str | None = None
    containers: int | None = None  # attached containers the agent sees
    note: str | None = None


def agents_to_ask(plan: ClusterPlan, loaded: Loaded) -> tuple[str, ...]:
    """Every agent of the pool: ``up`` places a session on the pool's live free capacity (and
    keeps that placement), so the definition alone does not say where it runs; the engines
    do (:func:`placed_as_found`)."""
    return tuple(a.name for a in loaded.pool.agents)


def placed_as_found(plan: ClusterPlan, loaded: Loaded, found: Sequence[Found]) -> ClusterPlan:
    """``plan`` placed where the engines show its containers (each found host on its agent),
    so its network and its rows are looked for where the session runs; hosts not found keep
    the offline plan's agent. A pending offline plan with every host found is placed too."""
    where = {f.host: f.agent for f in found if f.host}
    if not any(c.host in where for c in plan.containers):
        return plan
    if plan.pending and not all(c.host in where for c in plan.containers):
        return plan
    slots = tuple(Slot(where.get(c.host) or c.agent or "", c.gpus) for c in plan.containers)
    if len({s.agent for s in slots}) > 1 and loaded.pool.swarm is None:
        return plan  # found spread over agents of a pool without a swarm: as the plan says
    return plan_placed(plan.session, loaded.pool, Placement(slots))


Connect = Callable[[Agent], Any]


def connect(agent: Agent) -> Any:
    """A Docker client for the agent (:func:`cluster_sessions.agents.engine.open_client`);
    ``close()`` on the result closes the connection too (:meth:`Survey.close`)."""
    return open_client(agent, DOCKER_TIMEOUT)


disconnect = close_client


@dataclass
class Survey:
    """The session's containers on each agent that answered, with the container objects."""

    found: list[Found]
    containers: dict[str, list[Any]]  # host label -> docker Container objects
    clients: dict[str, Any]
    unreachable: dict[str, str]
    # the stack-id labels that are this stack's (None: any, the CLI being missing)
    mine: Callable[[str], bool] | None = None

    def close(self) -> None:
        for client in self.clients.values():
            disconnect(client)


def unreachable_cause(agent: Agent, exc: BaseException) -> str:
    """One line: what did not answer, where, and the useful end of the error; an agent that
    could not be reached at all (its known_hosts or key file, SSH) says so in its own words."""
    from ..agents.connectors import DOCKER_NOT_ANSWERING, AgentError, short_error
    from ..agents.reach import reach_of

    if isinstance(exc, AgentError):
        return printable(f"{exc.cause}: {exc.detail}")
    where = reach_of(agent).endpoint  # an ssh agent's socket is on it: say where, and how
    return f"{DOCKER_NOT_ANSWERING} at {where}: {printable(short_error(exc))}"


Mine = Callable[[str], bool]


def own_objects(stack: str, definition: Path) -> Mine | None:
    """Which stack-id labels are ``stack``'s (``StackIdentity.owns``), read from the backend;
    none when the backend has no such stack; None (any) without the ``pulumi`` CLI."""
    from .stack_records import read_identity
    from .stack_settings import project_starts

    try:
        identity = read_identity(stack, project_starts(definition))
    except CommandError as exc:
        if exc.code == Exit.MISSING:
            return None
        raise
    return identity.owns if identity is not None else (lambda label: False)


def survey(plan: ClusterPlan, loaded: Loaded, agents: Sequence[str],
           connect: Connect = connect, stack: str | None = None) -> Survey:
    """The session's containers on ``agents``: those of its stack (``stack``, default the
    session's name) in the configured backend."""
    mine = own_objects(stack or plan.name, loaded.session_file)
    result = Survey([], {}, {}, {}, mine)
    stacks_seen: set[str] = set()
    for name in agents:
        agent = loaded.pool.agent(name)
        try:
            client = connect(agent)
        except Exception as exc:  # any failure to reach it: report it, go on with the others
            result.unreachable[name] = unreachable_cause(agent, exc)
            continue
        result.clients[name] = client
        try:
            listed = session_containers(client, plan.name)
        except Exception as exc:
            result.unreachable[name] = unreachable_cause(agent, exc)
            continue
        owners = [container_facts(c.attrs).owner.stack_id for c in listed]
        stacks_seen.update(owners)
        listed = [c for c, owner in zip(listed, owners, strict=True)
                  if mine is None or mine(owner)]
        for container in listed:
            found = found_from_attrs(name, container.attrs)
            result.found.append(found)
            result.containers.setdefault(found.host or found.name, []).append(container)
    # Every agent is asked (the definition alone does not say where `up` placed the session):
    # one that did not answer matters only when a host of the session was not found elsewhere.
    seen = {f.host for f in result.found}
    if all(c.host in seen for c in plan.containers):
        result.unreachable.clear()
    if mine is None and len(stacks_seen) > 1:
        print(f"sessionctl: note: containers of {len(stacks_seen)} stacks carry session name "
              f"{plan.name}; without the pulumi CLI this stack cannot be read, so all are "
              "shown", file=sys.stderr)
    return result


def network_state(plan: ClusterPlan, clients: Mapping[str, Any],
                  unreachable: Mapping[str, str], mine: Mine | None = None) -> NetworkState:
    net = plan.network
    base = {"name": net.name, "agent": net.agent, "driver": net.driver}
    if net.agent is None:
        return NetworkState(**base, state="unknown", note="no agent: the plan is pending")
    client = clients.get(net.agent)
    if client is None:
        return NetworkState(**base, state="unknown",
                            note=(f"agent {net.agent} did not answer"
                                  if net.agent in unreachable else "agent not asked"))
    import docker

    try:
        found = client.networks.get(net.name)
    except docker.errors.NotFound:
        return NetworkState(**base, state="missing")
    except Exception as exc:
        return NetworkState(**base, state="unknown", note=f"{type(exc).__name__}: {exc}")
    facts = network_facts(found.attrs)
    if mine is not None and not mine(facts.owner.stack_id):
        return NetworkState(**base, state="missing",
                            note=f"{net.name} on {net.agent} is another stack's")
    return NetworkState(**base, state="present", id=facts.network_id[:12],
                        actual_driver=facts.driver, containers=facts.containers)


def label_for(sel: Selected, plan: ClusterPlan, host: str) -> str:
    """How a host is named in prefixed output: ``sub1``, or ``train-2/sub1`` for one of K."""
    return f"{plan.name}/{host}" if len(sel.chosen) > 1 else host
