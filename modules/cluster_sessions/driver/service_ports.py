"""Choosing the host ports of main1's services at ``up`` (issue 23, item 1): what each agent's
engine publishes is read (agents.facts.PublishedPorts), and core.services decides. It runs
under the pool's lock (driver/placing.py), and the ports chosen are held in the session's
reservation on the pool's ledger until main1 exists, so two ``up``s on one pool, from any
machine, never choose the same free port; the engine refusing a taken port is the last guard
(a program run outside ``sessionctl``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..agents import facts
from ..agents.connectors import AgentError, connector_for
from ..agents.gathering import gather
from ..core.plan import ClusterPlan
from ..core.services import allocate
from ..core.spec import Agent, Pool
from .errors import CommandError, Exit

ReadPorts = Callable[[Agent], Sequence[facts.PublishedPort]]


def read_published(agent: Agent) -> tuple[facts.PublishedPort, ...]:
    """What ``agent``'s engine publishes now (every container, ours or not)."""
    with connector_for(agent) as conn:
        return gather(conn, facts.PublishedPorts())


def choose(plans: Sequence[ClusterPlan], pool: Pool, read: ReadPorts = read_published,
           reserved: Mapping[str, set[int]] | None = None) -> dict[str, dict[str, int]]:
    """Host ports by session, then service: each session's main1 keeps what it holds, and no
    port another container publishes, another ``up`` under way has reserved (``reserved``, by
    agent) or a session chosen before it here is given. Raises CommandError: exit 1 when an
    agent cannot be read, 3 (pending) when a range is full."""
    published: dict[str, tuple[facts.PublishedPort, ...]] = {}
    chosen: dict[str, dict[str, int]] = {}
    given: dict[str, set[int]] = {a: set(ports) for a, ports in (reserved or {}).items()}
    for plan in plans:
        if not plan.services or plan.pending:
            continue
        main = plan.containers[0]
        agent = main.agent or ""
        if agent not in published:
            try:
                published[agent] = tuple(read(pool.agent(agent)))
            except (AgentError, facts.FactError) as exc:
                raise CommandError(f"{plan.name}: could not read the ports agent {agent} "
                                   f"publishes, so no service port was chosen: {exc}; nothing "
                                   "was created", Exit.ENGINE) from None
        own = {p.internal: p.host_port for p in published[agent]
               if p.container == main.container_name and p.session == plan.name}
        taken = {p.host_port for p in published[agent]
                 if not (p.container == main.container_name and p.session == plan.name)}
        taken |= given.setdefault(agent, set())
        current = {s.name: own[s.port] for s in plan.services if s.port in own}
        result = allocate(plan.session.services, plan.services[0].port_range, taken, current,
                          agent)
        if not result.ok:
            raise CommandError(f"{plan.name}: pending: {result.reason}; nothing was sent to "
                               "the engine", Exit.PENDING)
        chosen[plan.name] = dict(result.ports)
        given[agent] |= set(result.ports.values())
    return chosen


def config_value(ports: Mapping[str, int]) -> str:
    """The stack config value the program reads (names.SERVICE_PORTS_KEY)."""
    import json

    return json.dumps(dict(ports), sort_keys=True, separators=(",", ":"))
