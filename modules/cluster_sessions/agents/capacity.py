"""What each agent of a pool is, holds and can still give; and the check before anything is made.

``probe_free(pool)`` is what ``sessionctl plan --probe`` plans against; ``preflight(pool,
agents)`` is what the engine verbs call before anything is created; ``probe_pool`` feeds
``sessionctl pool check``.

Decisions:

- Total capacity is the *declared* one (``capacity:`` is required in a pool; it is the
  operator's statement of what may be scheduled, and may deliberately overcommit a machine).
  The probe reads the machine (CPUs, memory, GPUs) to warn when the declaration exceeds it, and
  GPUs the machine does not have are never offered: a container asking for one would fail.
- What other sessions hold is read from our container labels (``cluster-sessions.cpu``,
  ``.mem``, ``.gpus``) on every container with a ``cluster-sessions.session`` label, in any
  state: a stopped container still belongs to a stack, and the next ``up`` starts it again.
  ``exclude_session`` leaves one session's own containers out (re-planning a running session),
  or several (the K sessions of a ``count``).
- An agent that cannot be reached, whose engine does not answer, or that is the same engine as
  another agent of the pool is an error that names the agent and the cause. For multi-agent
  (overlay) placements the swarm must be formed: the manager is a manager, every other agent
  is a ready node of *its* swarm; and ``network.encrypted`` needs a kernel that can build
  Docker's IPsec SAs (docs/encrypted-overlay.md).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..core import ledger as ledger_core
from ..core.placement import Free
from ..core.spec import Agent, Pool
from ..core.units import format_size
from . import facts, gathering
from .connectors import (
    DEFAULT_CONNECT_TIMEOUT,
    MISCONFIGURED,
    NOT_SWARM_READY,
    AgentError,
    Connector,
    connector_for,
)
from .errors import AgentsUnusable

MAX_PARALLEL = 16


@dataclass
class AgentReport:
    """One agent as probed. ``problems`` make it unusable; ``warnings`` do not."""

    name: str
    via: str = ""
    reachable: bool = False
    engine: facts.EngineInfo | None = None
    cpus: int | None = None  # the machine's, as probed
    mem: int | None = None
    gpus: facts.GpuProbe | None = None
    held: tuple[facts.HeldContainer, ...] = ()
    total: Free | None = None  # declared, less GPUs the machine lacks
    free: Free | None = None  # total less what other sessions hold
    encryption: facts.EncryptionSupport | None = None
    problems: list[AgentError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def docker_version(self) -> str | None:
        return self.engine.server_version if self.engine else None

    @property
    def swarm(self) -> facts.SwarmState | None:
        return self.engine.swarm if self.engine else None

    @property
    def swarm_role(self) -> str:
        return self.engine.swarm.role if self.engine else "-"

    @property
    def malformed(self) -> list[str]:
        """One line per container label not believed (core.ledger): the agent is suspect."""
        return [f"agent {self.name}: container {h.name} (session {h.session}): malformed "
                f"label {why}; it counts only what its engine limits enforce"
                for h in self.held for why in h.malformed]

    @property
    def sessions(self) -> list[str]:
        return sorted({h.session for h in self.held})

    def fail(self, cause: str, detail: str) -> None:
        self.problems.append(AgentError(self.name, cause, detail))


class PreflightError(AgentsUnusable):
    """Agents that cannot be used, one line each; ``reports`` has every probed agent. A
    missing prerequisite (:class:`~.errors.AgentsUnusable`)."""

    def __init__(self, pool: Pool, reports: Sequence[AgentReport], what: str = ""):
        self.reports = list(reports)
        failing = [r for r in reports if not r.ok]
        lines = [str(p) for r in failing for p in r.problems]
        head = (f"pool {pool.name}: {len(failing)} of {len(reports)} agent(s) cannot be used"
                + what)
        super().__init__("\n".join([head + ":", *(f"  {line}" for line in lines)]))


Excluded = str | Collection[str] | None


def excluded(sessions: Excluded) -> frozenset[str]:
    """The session names whose containers do not count as held."""
    if sessions is None:
        return frozenset()
    return frozenset((sessions,) if isinstance(sessions, str) else sessions)


def _effective(agent: Agent, report: AgentReport) -> None:
    cap = agent.capacity
    gpus = cap.gpus
    probe = report.gpus
    if probe is not None and gpus:
        if not probe.present:
            report.warnings.append(f"declares GPUs {_ids(gpus)} but nvidia-smi is not installed;"
                                   " no GPUs are offered")
            gpus = ()
        elif probe.error:
            report.warnings.append(f"declares GPUs {_ids(gpus)} but nvidia-smi failed "
                                   f"({probe.error}); no GPUs are offered")
            gpus = ()
        else:
            lacking = [g for g in gpus if g not in probe.ids]
            if lacking:
                report.warnings.append(f"declares GPUs {_ids(lacking)}, which nvidia-smi does not"
                                       f" list ({_ids(probe.ids) or 'none'}); not offered")
                gpus = tuple(g for g in gpus if g in probe.ids)
    if report.cpus is not None and cap.cpu > report.cpus:
        report.warnings.append(f"declares {cap.cpu:g} CPUs, the machine has {report.cpus} "
                               "(overcommitted)")
    if report.mem is not None and cap.mem > report.mem:
        report.warnings.append(f"declares {format_size(cap.mem)} memory, the machine has "
                               f"{_gib(report.mem)} (overcommitted)")
    report.total = Free(agent.name, cap.millicpu, cap.mem, tuple(gpus))


def _held_free(report: AgentReport) -> None:
    assert report.total is not None
    cpu = sum(h.millicpu for h in report.held)
    mem = sum(h.mem for h in report.held)
    taken = {g for h in report.held for g in h.gpus}
    total = report.total
    if cpu > total.millicpu or mem > total.mem:
        report.warnings.append(f"sessions hold more than declared (cpu {cpu / 1000:g}, mem "
                               f"{format_size(mem) if mem else 0})")
    report.free = Free(total.name, max(0, total.millicpu - cpu), max(0, total.mem - mem),
                       tuple(g for g in total.gpus if g not in taken))


def _ids(ids: Iterable[int]) -> str:
    return ",".join(map(str, ids))


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f}g"


def probe_agent(agent: Agent, *, exclude_session: Excluded = None, encryption: bool = False,
                host_keys: str = "strict", connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                connector: Connector | None = None) -> AgentReport:
    """Everything ``pool check`` shows about one agent. Never raises for the agent's faults:
    they are ``problems`` of the report."""
    report = AgentReport(agent.name)
    try:
        conn = connector or connector_for(agent, host_keys=host_keys,
                                          connect_timeout=connect_timeout)
    except AgentError as exc:
        report.problems.append(exc)
        return report
    report.via = conn.description
    wanted: list[gathering.Fact] = [facts.DockerInfo(), facts.SessionContainers(),
                                facts.CpuCount(), facts.MemTotal(), facts.Gpus()]
    if encryption:
        wanted.append(facts.EncryptedOverlaySupport())
    try:
        outcomes = gathering.gather_all(conn, wanted)
    except AgentError as exc:
        report.problems.append(exc)
        return report
    finally:
        if connector is None:
            conn.close()
    info, held, cpus, mem, gpus, *rest = outcomes
    report.reachable = conn.shell or info.ok  # an API-only agent is reached through Docker
    if not info.ok:
        report.problems.append(info.error)  # type: ignore[arg-type]
        return report
    report.engine = info.value
    if held.ok:
        now = time.time()
        report.held = tuple(h for h in held.value if h.session not in excluded(exclude_session)
                            and not ledger_core.gave_back(h.state, h.expires_at, now,
                                                          h.started_at))
    else:
        report.problems.append(held.error)  # type: ignore[arg-type]
    report.cpus = cpus.value if cpus.ok else None
    report.mem = mem.value if mem.ok else None
    if gpus.ok:
        report.gpus = gpus.value
    elif agent.capacity.gpus:
        report.warnings.append(f"GPUs not probed ({gpus.error.detail}); "  # type: ignore[union-attr]
                               "the declared ones are offered")
    for outcome in (cpus, mem):
        if not outcome.ok and conn.shell:
            report.warnings.append(str(outcome.error))
    if rest:
        enc = rest[0]
        report.encryption = enc.value if enc.ok else facts.EncryptionSupport(None, str(enc.error))
    _effective(agent, report)
    if held.ok:
        _held_free(report)
        report.warnings += [line.split(": ", 1)[1] for line in report.malformed]
    return report


def probe_pool(pool: Pool, names: Iterable[str] | None = None, *,
               exclude_session: Excluded = None, encryption: bool = False,
               host_keys: str = "strict",
               connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> list[AgentReport]:
    """Reports for the named agents (default: all), in pool order, probed in parallel."""
    wanted = set(names) if names is not None else None
    unknown = sorted(wanted - {a.name for a in pool.agents}) if wanted else []
    agents = [a for a in pool.agents if wanted is None or a.name in wanted]
    if not agents and not unknown:
        return []
    reports: list[AgentReport] = []
    if agents:
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(agents))) as pool_exec:
            reports = list(pool_exec.map(
                lambda a: probe_agent(a, exclude_session=exclude_session, encryption=encryption,
                                      host_keys=host_keys, connect_timeout=connect_timeout),
                agents))
    for name in unknown:
        report = AgentReport(name)
        report.fail(MISCONFIGURED, f"pool {pool.name!r} has no agent {name!r}")
        reports.append(report)
    _same_engine(reports)
    return reports


def _same_engine(reports: Sequence[AgentReport]) -> None:
    """Two agents that are one engine would double its capacity and break the swarm."""
    seen: dict[str, str] = {}
    for r in reports:
        eid = r.engine.engine_id if r.engine else ""
        if not eid:
            continue
        if eid in seen:
            r.fail(MISCONFIGURED, f"is the same Docker Engine as agent {seen[eid]} (engine ID "
                   f"{eid}); each agent needs its own engine")
        else:
            seen[eid] = r.name


def probe_free(pool: Pool, exclude_session: Excluded = None) -> list[Free]:
    """Live free capacity of every agent, in pool order (``sessionctl plan --probe``).

    Raises :class:`PreflightError` naming each agent that cannot be probed.
    """
    return free_of(pool, probe_pool(pool, exclude_session=exclude_session))


def free_of(pool: Pool, reports: Sequence[AgentReport]) -> list[Free]:
    """The free capacity in ``reports``; :class:`PreflightError` when an agent failed."""
    if not all(r.ok for r in reports):
        raise PreflightError(pool, reports, " to probe free capacity")
    return [r.free for r in reports if r.free is not None]


def swarm_unready(pool: Pool, reports: Sequence[AgentReport], names: Sequence[str],
                  pool_ref: str | None = None) -> tuple[str, list[AgentError]] | None:
    """Why a session across ``names`` cannot be placed now although the agents work (the swarm
    is not formed), with one error per problem; None when it can. The one answer ``pool check``
    and ``plan --probe`` give."""
    names = list(dict.fromkeys(names))
    if len(names) < 2:
        return None
    problems = check_swarm(pool, reports, names, pool_ref=pool_ref)
    if not problems:
        return None
    return (f"the swarm is not formed: multi-agent sessions cannot be placed until "
            f"`sessionctl pool up {pool_ref or pool.name}`", problems)


def preflight(pool: Pool, agent_names: Iterable[str], *, overlay: bool | None = None,
              exclude_session: Excluded = None,
              host_keys: str = "strict") -> list[AgentReport]:
    """Check, before anything is created, that the agents a plan uses can be used.

    ``agent_names``: the plan's agents (``plan.agents``). ``overlay``: the plan builds a swarm
    overlay (default: more than one agent); then the swarm manager is checked too, every agent
    must be a ready node of the manager's swarm, and ``network.encrypted`` must be supported.
    Returns the reports (with live ``free`` capacity); raises :class:`PreflightError` with one
    line per problem otherwise.
    """
    names = list(dict.fromkeys(agent_names))
    if overlay is None:
        overlay = len(names) > 1
    probe = list(names)
    manager = pool.swarm.manager if pool.swarm else None
    if overlay and manager and manager not in probe:
        probe.append(manager)
    encrypted = overlay and pool.network.encrypted
    reports = probe_pool(pool, probe, exclude_session=exclude_session, encryption=encrypted,
                         host_keys=host_keys)
    if overlay and reports:
        by_name = {r.name: r for r in reports}
        for problem in check_swarm(pool, reports, names):
            by_name.get(problem.agent, reports[0]).problems.append(problem)
    if encrypted:
        for r in reports:
            enc = r.encryption
            if enc is not None and enc.supported is False:
                r.fail(MISCONFIGURED, f"encrypted overlay networks cannot carry traffic between "
                       f"agents here: {enc.detail}; set network.encrypted: false in the pool, or"
                       " use other agents (docs/encrypted-overlay.md)")
            elif enc is not None and enc.supported is None and r.ok:
                r.warnings.append(f"encrypted overlay support unknown: {enc.detail}")
    if not all(r.ok for r in reports):
        raise PreflightError(pool, reports, "; nothing was created")
    return reports


def check_swarm(pool: Pool, reports: Sequence[AgentReport], names: Sequence[str],
                nodes: Sequence[facts.SwarmNode] | None = None,
                pool_ref: str | None = None) -> list[AgentError]:
    """Swarm problems of the named agents: the manager manages, the others are ready nodes of
    its swarm. Needs the manager's report among ``reports``; returns one error per problem.
    ``pool_ref``: how the hint names the pool (default its name)."""
    by_name = {r.name: r for r in reports}
    hint = f"run `sessionctl pool up {pool_ref or pool.name}`"
    if pool.swarm is None:
        first = names[0] if names else pool.name
        return [AgentError(first, NOT_SWARM_READY, f"pool {pool.name!r} has no swarm manager "
                           "(swarm.manager), which a session across agents needs")]
    mgr = by_name.get(pool.swarm.manager)
    if mgr is None or mgr.engine is None:
        return []  # its own problem is reported already
    if mgr.swarm_role != "manager":
        return [AgentError(mgr.name, NOT_SWARM_READY, f"is the pool's swarm manager but its "
                           f"swarm state is {mgr.swarm_role}; {hint}")]
    if nodes is None:
        try:
            with connector_for(pool.agent(mgr.name)) as conn:
                nodes = gathering.gather(conn, facts.SwarmNodes())
        except AgentError as exc:
            return [exc]
    members = {n.node_id: n for n in nodes}
    found = []
    for name in names:
        r = by_name.get(name)
        if r is None or r.engine is None or r is mgr:
            continue
        swarm = r.engine.swarm
        node = members.get(swarm.node_id)
        if swarm.state != "active" or node is None:
            where = (f"it is in another swarm (node {swarm.node_id})" if swarm.state == "active"
                     else f"its swarm state is {swarm.role}")
            found.append(AgentError(name, NOT_SWARM_READY, f"is not a node of the swarm managed "
                                    f"by {mgr.name} ({where}); {hint}"))
        elif not node.ready:
            found.append(AgentError(name, NOT_SWARM_READY, f"is a node of {mgr.name}'s swarm but "
                                    f"{node.status}"))
    return found
