"""Governance (issue 44, DESIGN contract 8): which project a session runs under, what its
policy lets it ask (lifetime, priority), and whether its project's quota lets it run now.

All of it is plain data in, plain data out: the driver reads what the engines hold (under the
pool's lock, agents/pool_ledger.py) and passes it here; nothing here touches an engine.

Who may claim a project is the operator's decision, never the definition's alone:

- the operator's own word (``--project``, ``$CLUSTER_SESSIONS_PROJECT``: CI, which knows who
  asked) wins over whatever the definition says;
- otherwise a definition may claim a project only when its file, every link on the way
  resolved, lies in one of the directories the project's policy lists (``definitions``,
  relative to the pool file's folder): the repository layout a review protects;
- a definition that names no project runs under ``policies.default``.

Quotas follow Backend.AI's resource-policy validators: one small check per kind of limit, all
of them run, every violation named at once (``project vision: gpus 6 + 4 > 8``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .ledger import Entry
from .loader import Loaded, inside
from .problems import DefinitionError, Problem, did_you_mean
from .spec import DEFAULT_PROJECT, Policy, Pool, Quota, Session
from .units import format_duration, format_size

PROJECT_ENV = "CLUSTER_SESSIONS_PROJECT"
"""The operator's project for this run (``--project`` wins over it)."""


def operator_project(flag: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The project the operator grants this run: ``--project``, else the environment's."""
    return flag or environ.get(PROJECT_ENV) or None


def definition_dirs(pool_file: Path, policy: Policy) -> list[Path]:
    """Where a project's definitions may live: its ``definitions``, relative ones to the pool
    file's folder (the pool's own paths are read so)."""
    base = pool_file.parent
    return [Path(d).expanduser() if Path(d).expanduser().is_absolute() else base / d
            for d in policy.definitions]


def claim_problems(session: Session, session_file: Path, pool: Pool, pool_file: Path,
                   operator: str | None) -> tuple[str, list[Problem]]:
    """The project ``session`` runs under, and why it may not (problems at ``project``)."""
    file = str(session_file)
    listed = list(pool.policies.projects)
    known = f" (pool {pool.name} lists: {', '.join(listed) or 'no projects'})"
    if operator is not None:
        if operator != DEFAULT_PROJECT and operator not in pool.policies.projects:
            return operator, [Problem(file, "project", (
                f"{operator!r}, the operator's project (--project or ${PROJECT_ENV}), is not "
                f"a project of pool {pool.name}{did_you_mean(operator, listed)}{known}"))]
        return operator, []
    claimed = session.project
    if claimed is None or claimed == DEFAULT_PROJECT:
        return DEFAULT_PROJECT, []
    if claimed not in pool.policies.projects:
        return claimed, [Problem(file, "project", (
            f"{claimed!r} is not a project of pool {pool.name}"
            f"{did_you_mean(claimed, listed)}{known}"))]
    dirs = definition_dirs(pool_file, pool.policies.projects[claimed])
    if not dirs or not inside(session_file, dirs):
        where = ", ".join(str(d) for d in dirs) or "nowhere: the operator grants it"
        return claimed, [Problem(file, "project", (
            f"this definition may not claim project {claimed!r}: its file (links resolved) is "
            f"not in a directory the pool lets claim it ({where}); the operator grants a "
            f"project with --project or ${PROJECT_ENV}"))]
    return claimed, []


def lifetime_of(session: Session, policy: Policy) -> int | None:
    """Seconds a session of this policy lives from its ``up``, or None (no limit)."""
    if session.lifetime is not None:
        return session.lifetime
    return policy.default_lifetime or policy.max_lifetime


def policy_problems(session: Session, session_file: Path, project: str,
                    policy: Policy) -> list[Problem]:
    """What the session asks beyond its project's policy: a longer lifetime, a higher
    priority."""
    file = str(session_file)
    found = []
    if (session.lifetime is not None and policy.max_lifetime is not None
            and session.lifetime > policy.max_lifetime):
        found.append(Problem(file, "lifetime", (
            f"{format_duration(session.lifetime)} is longer than project {project}'s "
            f"max_lifetime ({format_duration(policy.max_lifetime)})")))
    if session.priority > policy.max_priority:
        found.append(Problem(file, "priority", (
            f"{session.priority} is above project {project}'s max_priority "
            f"({policy.max_priority})")))
    return found


def extension_problem(expires_at: float, now: float, more: int, started: float,
                      policy: Policy, project: str) -> str | None:
    """Why ``extend`` by ``more`` seconds is refused (its lifetime would pass the policy's
    max_lifetime counted from ``started``), or None."""
    if policy.max_lifetime is None:
        return None
    wanted = max(expires_at, now) + more
    if wanted - started > policy.max_lifetime:
        return (f"the session would live {format_duration(int(wanted - started))} from its "
                f"start, more than project {project}'s max_lifetime "
                f"({format_duration(policy.max_lifetime)})")
    return None


# --- quotas ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Use:
    """What sessions hold or ask, in a project's quota's terms."""

    millicpu: int = 0
    mem: int = 0
    gpus: int = 0
    containers: int = 0
    sessions: int = 0

    def __add__(self, other: Use) -> Use:
        return Use(self.millicpu + other.millicpu, self.mem + other.mem,
                   self.gpus + other.gpus, self.containers + other.containers,
                   self.sessions + other.sessions)


def asked(sessions: Iterable[Session]) -> Use:
    """What sessions being placed ask in all (each container the same resources)."""
    total = Use()
    for s in sessions:
        n = s.cluster.size
        total += Use(s.resources.millicpu * n, s.resources.mem * n, s.resources.gpu * n, n, 1)
    return total


@dataclass(frozen=True)
class Held:
    """One thing that holds capacity on the pool: a session's container (``container``) or a
    reservation of an ``up`` under way, with the project its labels name (core.ledger parsed
    them) and the stack it is of, so a session is counted once."""

    project: str
    identity: str  # core.ledger.identity: its stack (or its session name)
    millicpu: int
    mem: int
    gpus: int
    containers: int
    reserved: bool = False  # a reservation, not a container


def held_by(project: str, held: Sequence[Held], exclude: Iterable[str] = ()) -> Use:
    """What ``project``'s sessions hold now: containers and reservations, a session whose
    containers and reservation are both seen counted by the larger of the two (an update
    holds its reservation while its containers are replaced), ``exclude`` (the identities
    being placed) left out."""
    skip = set(exclude)
    containers: dict[str, Use] = {}
    reserved: dict[str, Use] = {}
    for h in held:
        if h.project != project or h.identity in skip:
            continue
        into = reserved if h.reserved else containers
        into[h.identity] = into.get(h.identity, Use()) + Use(h.millicpu, h.mem, h.gpus,
                                                                h.containers, 0)
    total = Use()
    for ident in set(containers) | set(reserved):
        a, b = containers.get(ident, Use()), reserved.get(ident, Use())
        total += Use(max(a.millicpu, b.millicpu), max(a.mem, b.mem), max(a.gpus, b.gpus),
                     max(a.containers, b.containers), 1)
    return total


def _cpu(millicpu: int) -> str:
    return f"{millicpu / 1000:g}"


LIMITS = (
    ("cpu", lambda u: u.millicpu, lambda q: None if q.cpu is None else round(q.cpu * 1000),
     _cpu),
    ("mem", lambda u: u.mem, lambda q: q.mem, format_size),
    ("gpus", lambda u: u.gpus, lambda q: q.gpus, str),
    ("containers", lambda u: u.containers, lambda q: q.containers, str),
    ("sessions", lambda u: u.sessions, lambda q: q.sessions, str),
)
"""Each kind of limit: its name, what a Use holds of it, the quota's limit, how it is shown."""


def quota_violations(project: str, quota: Quota, holding: Use, asking: Use) -> list[str]:
    """Every limit of ``project``'s quota that ``holding`` + ``asking`` passes, each as
    ``project vision: gpus 6 + 4 > 8`` (all of them: one check per kind, none stops early)."""
    found = []
    for name, of, limit_of, shown in LIMITS:
        limit = limit_of(quota)
        if limit is not None and of(asking) and of(holding) + of(asking) > limit:
            found.append(f"project {project}: {name} {shown(of(holding))} + "
                         f"{shown(of(asking))} > {shown(limit)}")
    return found


def waiting_before(queue: Sequence[Entry], project: str, mine: Iterable[str],
                   me: Entry | None) -> int:
    """How many of ``project``'s sessions wait in the queue before ``me`` (arrival order,
    core.ledger.order), ours (``mine``: identities) left out."""
    skip = set(mine)
    earlier = [e for e in queue if e.project == project and e.identity not in skip]
    if me is None:
        return len(earlier)
    key = (me.arrival, me.created, me.name)
    return sum(1 for e in earlier if (e.arrival, e.created, e.name) < key)


def pending_violation(project: str, quota: Quota, waiting: int) -> str | None:
    """Why one more session of ``project`` may not wait in the queue (``waiting`` of its
    sessions already do), or None."""
    if quota.pending is not None and waiting + 1 > quota.pending:
        return f"project {project}: pending {waiting} + 1 > {quota.pending}"
    return None


def governed(loaded: Loaded, operator: str | None) -> Loaded:
    """``loaded`` with its session's ``project`` the one it runs under (``None``: the default
    policy), or DefinitionError naming ``project``, ``lifetime``, ``priority``."""
    session = loaded.session
    project, problems = claim_problems(session, loaded.session_file, loaded.pool,
                                       loaded.pool_file, operator)
    if not problems:
        problems = policy_problems(session, loaded.session_file, project,
                                   loaded.pool.policies.of(project))
    if problems:
        raise DefinitionError(problems)
    chosen = None if project == DEFAULT_PROJECT else project
    if chosen == session.project:
        return loaded
    return replace(loaded, session=session.model_copy(update={"project": chosen}))
