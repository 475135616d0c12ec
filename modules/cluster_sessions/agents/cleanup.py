"""Find and remove what a session left on its agents, by label, and prove nothing is left.

Backend.AI once leaked overlay networks at session termination (its issue 11917). After
``pulumi destroy`` (or a failed ``up``), :func:`sweep` removes every container and network
labelled ``cluster-sessions.session=<name>`` on every agent of the pool, then checks until none
is seen anywhere:

1. containers first, on every agent (``docker rm -f -v``): a network cannot go while a
   container is attached;
2. then networks: local ones (bridges) on the agent that has them; swarm-scoped ones (overlays)
   through the swarm manager, the only node that can remove them. A worker only shows an
   overlay while a container of its own is attached, so it never has to remove one;
3. verify, for up to ``wait`` seconds (a worker drops its view of an overlay asynchronously).

:func:`find_leftovers` is the read-only part (``sessionctl pool sweep --dry-run``, tests).
A stack's own sweeps pass ``mine`` (its ``StackIdentity.owns``): another stack's objects of the
same session name are never removed (docs/design-notes.md, "A session name belongs to one
stack").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..core.spec import Agent, Pool
from . import engine, facts, gathering
from .connectors import COMMAND_FAILED, AgentError, Connector, connector_for
from .polling import poll_until

MAX_PARALLEL = 16


@dataclass(frozen=True)
class Leftover:
    agent: str
    kind: str  # container | network
    name: str
    object_id: str
    detail: str = ""  # container state, or network driver/scope
    owner: engine.Owner = engine.Owner()  # whose it is, by its labels

    def __str__(self) -> str:
        return f"{self.agent}: {self.kind} {self.name} ({self.detail})"


@dataclass
class SweepReport:
    session: str
    removed: list[Leftover] = field(default_factory=list)
    remaining: list[Leftover] = field(default_factory=list)
    errors: list[AgentError] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.remaining and not self.errors

    def summary(self) -> str:
        if self.clean:
            return (f"session {self.session}: nothing left on any agent"
                    + (f" (removed {len(self.removed)})" if self.removed else ""))
        lines = [f"session {self.session}: not clean"]
        lines += [f"  left: {item}" for item in self.remaining]
        lines += [f"  {err}" for err in self.errors]
        return "\n".join(lines)


def _agents(pool: Pool, names: Iterable[str] | None) -> list[Agent]:
    wanted = set(names) if names is not None else None
    return [a for a in pool.agents if wanted is None or a.name in wanted]


def _scan(agent: Agent, session: str | None) -> tuple[list[Leftover], AgentError | None]:
    try:
        with connector_for(agent) as conn:
            containers, networks = gathering.gather_all(
                conn, [facts.SessionContainers(session), facts.SessionNetworks(session)])
    except AgentError as exc:
        return [], exc
    found: list[Leftover] = []
    for outcome in (containers, networks):
        if not outcome.ok:
            return [], outcome.error
    found += [Leftover(agent.name, "container", c.name, c.container_id, c.state, c.owner)
              for c in containers.value]
    found += [Leftover(agent.name, "network", n.name, n.network_id, f"{n.driver}, {n.scope}",
                       n.owner)
              for n in networks.value]
    return found, None


def find_leftovers(pool: Pool, session: str | None = None,
                   agents: Iterable[str] | None = None) -> tuple[list[Leftover], list[AgentError]]:
    """Every labelled container and network (of ``session``, or of any session) on the agents,
    and the agents that could not be asked."""
    chosen = _agents(pool, agents)
    if not chosen:
        return [], []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(chosen))) as ex:
        results = list(ex.map(lambda a: _scan(a, session), chosen))
    found = [item for items, _ in results for item in items]
    errors = [err for _, err in results if err is not None]
    return found, errors


def _remove(conn: Connector, kind: engine.Kind, ids: Sequence[str]) -> None:
    if not ids:
        return
    if not conn.shell:
        import docker.errors

        client = conn.client()  # type: ignore[attr-defined]
        for object_id in ids:
            try:
                engine.remove(client, kind, object_id)
            except docker.errors.APIError as exc:
                raise AgentError(conn.agent, COMMAND_FAILED, f"removing {kind} {object_id}: "
                                 f"{exc.explanation or exc}") from None
        return
    cmd = engine.removal_command(kind, ids)
    rc, out, err = conn.run(cmd)
    if rc != 0 and not engine.gone_already(err):
        raise AgentError(conn.agent, COMMAND_FAILED, f"`{cmd}` exited {rc}: "
                         f"{(err.strip() or out.strip()).splitlines()[-1:]}")


Plan = dict[str, list[Leftover]]  # agent -> what to remove through it


def removal_plan(found: Iterable[Leftover], manager: str | None) -> tuple[Plan, Plan]:
    """Where each leftover is removed: containers on their own agent (first: a network cannot
    go while one is attached); networks once each, a swarm-scoped overlay through the swarm
    manager (the only node that can remove it; each worker lists it too), a bridge on its
    agent."""
    containers: Plan = {}
    networks: Plan = {}
    seen_networks: set[str] = set()
    for item in found:
        if item.kind == "container":
            containers.setdefault(item.agent, []).append(item)
        elif item.object_id not in seen_networks:
            seen_networks.add(item.object_id)
            swarm_scoped = item.detail.endswith("swarm")
            where = manager if swarm_scoped and manager else item.agent
            networks.setdefault(where, []).append(item)
    return containers, networks


def sweep(pool: Pool, session: str, *, agents: Iterable[str] | None = None,
          dry_run: bool = False, wait: float = 15.0, keep: Collection[str] = (),
          mine: Callable[[str], bool] | None = None) -> SweepReport:
    """Remove every container and network of ``session`` on the pool's agents; then verify.

    ``agents`` limits the sweep (default: every agent of the pool, since a session that was
    re-planned may have left things on agents it no longer uses). ``dry_run`` only reports.
    ``keep``: object IDs left alone (what a stack still holds, before an ``up``). ``mine``: the
    stack-id labels of the objects it may touch (``StackIdentity.owns``; None: any stack's,
    the operator's ``pool sweep``): another stack holding the same session name is left alone.
    """
    if not session:
        raise ValueError("sweep needs a session name")
    report = SweepReport(session)
    agents = list(agents) if agents is not None else None

    def scan() -> tuple[list[Leftover], list[AgentError]]:
        found, errors = find_leftovers(pool, session, agents)
        return [i for i in engine.of_stack(found, mine) if i.object_id not in keep], errors

    found, errors = scan()
    report.errors += errors
    if dry_run:
        report.remaining = found
        return report
    chosen = {a.name: a for a in _agents(pool, agents)}
    manager = pool.swarm.manager if pool.swarm else None

    def remove_on(name: str, kind: str, items: list[Leftover]) -> AgentError | None:
        agent = chosen.get(name) or pool.agent(name)
        try:
            with connector_for(agent) as conn:
                _remove(conn, kind, [i.object_id for i in items])
        except AgentError as exc:
            return exc
        report.removed.extend(items)
        return None

    def run_all(kind: str, by_agent: dict[str, list[Leftover]]) -> None:
        if not by_agent:
            return
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(by_agent))) as ex:
            failures = ex.map(lambda kv: remove_on(kv[0], kind, kv[1]), by_agent.items())
            report.errors.extend(e for e in failures if e is not None)

    containers, networks = removal_plan(found, manager)
    run_all("container", containers)
    run_all("network", networks)

    def retry(scan: tuple[list[Leftover], list[AgentError]]) -> None:
        """An overlay can only go once every agent has let go of it: retry what is still seen
        (overlays through the manager); an agent that cannot be asked is reported, not waited
        for."""
        by_agent: dict[str, dict[str, list[Leftover]]] = {}
        for item in scan[0]:
            if item.kind == "network" and item.detail.endswith("swarm") and manager:
                by_agent.setdefault(manager, {}).setdefault("network", []).append(item)
            elif item.kind == "container":
                by_agent.setdefault(item.agent, {}).setdefault("container", []).append(item)
        for name, kinds in by_agent.items():
            for kind in ("container", "network"):
                if kind in kinds:
                    remove_on(name, kind, kinds[kind])

    remaining, scan_errors = poll_until(scan,
                                        lambda scan: not scan[0], wait, interval=0.3,
                                        between=retry)
    report.remaining = remaining
    if remaining or scan_errors:
        report.errors = list({str(e): e for e in [*report.errors, *scan_errors]}.values())
    else:
        report.errors = []  # a removal that failed at first (e.g. endpoints still attached)
        #                     and succeeded on a retry is not an error
    # what was removed and then seen again is not "removed"
    left = {(i.agent, i.object_id) for i in remaining}
    report.removed = list({(i.agent, i.object_id): i for i in report.removed
                           if (i.agent, i.object_id) not in left}.values())
    return report
