"""``sessionctl ls``: the sessions in the state backend, each with what its engines say now.

The stacks come from the backend (the Automation API's ``list_stacks``, so the same backend the
engine verbs use); what each session is (name, type, mode, hosts, agents and their
``docker_host``) from its stack outputs, so ``ls`` needs no definition file. The status is read
from the agents' engines by label, as ``status`` does, and judged by the same function
(:func:`~.status.host_faults`). Each session has a fine ``state`` and, from it, a ``phase``
(the tabs of Backend.AI's session list); :data:`PHASE_OF` is the one mapping:

- ``running`` (RUNNING): every host's container runs;
- ``finished`` (FINISHED): a batch job's main1 has exited: exit code, start, end, duration;
  after its containers are gone, from the record ``wait``/``run`` wrote (:mod:`.history`);
- ``degraded`` (ERROR): some host is missing, exited, restarting or dead: ``status``'s faults;
- ``down`` (ERROR): the stack holds the session but no container of it is found;
- ``lost`` (ERROR): recorded: a container died, or main1 vanished, before the job ended;
- ``unreachable`` (UNKNOWN): an agent did not answer (named, with the cause);
- ``leftover`` (ERROR): the stack holds nothing but its agents hold containers or networks
  labelled with the session (an ``up`` interrupted before the stack recorded them): named, with
  what to run (``up`` again converges, ``destroy`` removes them);
- ``empty`` (EMPTY): the stack holds nothing, its agents hold nothing of it, and no job was
  recorded (destroyed, or never up: a pending session creates nothing);
- ``expired`` (EXPIRED): its lifetime ended (:func:`expired_state`);
- ``preempted`` (PREEMPTED): a higher-priority session's ``up`` ended it through its stack's
  destroy, which recorded by whom and the priorities on the stack (:func:`preempted_row`).

A pool stack (``sessionctl pool up``: its config names a pool file) is not a session: never a
row, whether or not its swarm is formed.

Under the table, per pool, what the listed running sessions hold on each agent against its
declared capacity (:mod:`cluster_sessions.core.usage`); ``pool usage`` counts every session's
containers on the agents, these count the ones of this backend.

Exit 0 when the list was read (``ls`` describes; ``status`` judges), 2 for a bad ``--state``,
4 without the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..agents.engine import session_containers
from ..agents.facts import HeldContainer, held_from_inspect
from ..core.decisions import stack_identity
from ..core.loader import load_file
from ..core.names import STACK_ID_KEY, STACKS_DIR, config_key
from ..core.problems import did_you_mean
from ..core.render import LIFETIME_GRACE
from ..core.services import ALL_ADDRESSES, LOOPBACK, service_url
from ..core.spec import Agent, Pool
from ..core.terminal import printable, table
from ..core.usage import Usage, agent_usage, usage_text, usage_to_dict
from . import ending, history, stack_settings, stacks
from .errors import ClusterSessionsError, CommandError, Exit
from .observe import Connect, Found, connect, disconnect, found_from_attrs, unreachable_cause
from .session_args import needs_pulumi, verb_parser
from .stack_records import unfinished_text
from .status import Planned, host_faults, planned_rows, short_time

PHASE_OF = {
    "running": "running",
    "finished": "finished",
    "degraded": "error",
    "down": "error",
    "lost": "error",
    "leftover": "error",
    "unreachable": "unknown",
    "empty": "empty",
    "queued": "pending",  # waiting in its pool's queue (`up --wait`)
    "placing": "pending",  # an `up` holds a reservation for it: its containers are coming
    # its lifetime ended (core/governance.py): its containers ended their command by
    # themselves and hold nothing; the next `up` starts it again, `destroy` removes it
    "expired": "expired",
    # ended by a higher priority on a pool with policies.preemption (core/preemption.py): its
    # stack's destroy wrote why (driver/ending.py); the next `up` starts it again
    "preempted": "preempted",
}
PHASES = tuple(dict.fromkeys(PHASE_OF.values()))


@dataclass(frozen=True)
class Listed:
    stack: str
    name: str
    type: str
    mode: str
    size: int
    agents: tuple[str, ...]
    state: str  # a key of PHASE_OF
    detail: str = ""
    exit_code: int | None = None
    phase: str = ""  # PHASE_OF[state]
    started: str | None = None  # main1's start (running or finished)
    finished: str | None = None  # main1's end (finished)
    duration_s: float | None = None  # finished - started
    faults: tuple[str, ...] = ()  # status's faults (error)
    recorded: bool = False  # read from the record of the job's end, not from the engines
    # per service of main1: name, agent, bind, host_port (as main1's engine publishes it when
    # it answered, else as the stack recorded it) and url
    services: tuple[dict[str, Any], ...] = ()
    # what its containers are created from: the pinned image (``repo@sha256:…`` or an image
    # ID, issue 33) as the stack's outputs say; "" when not known
    image: str = ""
    # `ls --sample` (issue 43): the mean cpu % and GPU % of its containers now, and since when
    # an idle session was last used (main1's start or last login), epoch seconds
    used: dict[str, Any] | None = None
    idle_since: float | None = None
    # governance (contract 8): its project ("default": the pool's default policy), priority,
    # and when its lifetime ends (epoch seconds, None: none)
    project: str = "default"
    priority: int = 0
    expires_at: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", PHASE_OF[self.state])


@dataclass(frozen=True)
class Observed:
    """What one session's engines say, judged."""

    state: str
    detail: str = ""
    exit_code: int | None = None
    started: str | None = None
    finished: str | None = None
    faults: tuple[str, ...] = ()


def parse_stamp(stamp: str | None) -> datetime | None:
    """A Docker timestamp (``2025-01-02T03:04:05.123456789Z``, nanoseconds) as a datetime."""
    if not stamp:
        return None
    day, _, rest = stamp.rstrip("Z").partition(".")
    frac = "".join(ch for ch in rest if ch.isdigit())[:6].ljust(6, "0")
    try:
        return datetime.fromisoformat(f"{day}.{frac}+00:00")
    except ValueError:
        return None


def duration_s(started: str | None, finished: str | None) -> float | None:
    start, end = parse_stamp(started), parse_stamp(finished)
    if start is None or end is None or end < start:
        return None
    return round((end - start).total_seconds(), 3)


def format_duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h01m``: enough to read at a glance."""
    if seconds is None:
        return "-"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def session_state(kind: str, planned: Sequence[Planned], found: Sequence[Found],
                  unreachable: Mapping[str, str]) -> Observed:
    """The state of one session from what its agents hold (the rows ``status`` shows)."""
    if unreachable:
        return Observed("unreachable", "; ".join(f"{a}: {why}" for a, why in unreachable.items()))
    rows = planned_rows(planned, found, unreachable)
    faults = tuple(host_faults(kind, rows))
    if not found:
        return Observed("down", "no container of it on its agents", faults=faults)
    main_host = planned[0].host if planned else None
    main = next((f for f in found if f.host == main_host), None)
    started = main.started_at if main else None
    if kind == "batch" and main is not None and main.state in ("exited", "dead"):
        return Observed("finished", f"exit code {main.exit_code}", main.exit_code, started,
                        main.finished_at)
    if faults:
        return Observed("degraded", "; ".join(faults), started=started, faults=faults)
    return Observed("running", started=started)


def planned_from_outputs(name: str, hosts: Sequence[str],
                         agents: Mapping[str, Mapping[str, Any]]) -> list[Planned]:
    """The containers a stack says its session has, in host order."""
    where = {h: a for a, info in agents.items() for h in (info.get("hosts") or ())}
    return [Planned(h, "main" if i == 0 else "sub", where.get(h), f"{name}-{h}")
            for i, h in enumerate(hosts)]


def session_pool(session: Mapping[str, Any], project: Path) -> Pool | None:
    """The session's pool file as it is now, when it is still there."""
    with contextlib.suppress(Exception):  # moved or changed since: fall back to the stack's
        found = load_file(project / str(session.get("pool", "")), expect="AgentPool")
        return found if isinstance(found, Pool) else None
    return None


def stack_agents(session: Mapping[str, Any], agents: Mapping[str, Mapping[str, Any]],
                 project: Path) -> dict[str, Agent]:
    """The session's agents as its pool file describes them (with their SSH settings) when
    that file is still there, else as the stack recorded them (their docker_host)."""
    pool = session_pool(session, project)
    known = {a.name: a for a in pool.agents} if pool is not None else {}
    return {name: known.get(name) or Agent.model_validate(
                {"name": name, "docker_host": str(info["docker_host"]),
                 "capacity": {"cpu": 1, "mem": "1g"}})  # capacity is not used here
            for name, info in agents.items()}


@dataclass
class Holdings:
    """What the listed sessions hold, per pool and agent, for the summary under the table."""

    pools: dict[str, Pool | None] = field(default_factory=dict)  # shown name -> pool file
    held: dict[str, dict[str, list[HeldContainer]]] = field(default_factory=dict)

    def add(self, pool_name: str, pool: Pool | None, agent: str,
            held: Sequence[HeldContainer]) -> None:
        self.pools.setdefault(pool_name, pool)
        self.held.setdefault(pool_name, {}).setdefault(agent, []).extend(held)

    def usage(self) -> list[tuple[str, list[Usage]]]:
        out = []
        for name, by_agent in sorted(self.held.items()):
            pool = self.pools.get(name)
            capacity = {a.name: a.capacity for a in pool.agents} if pool else {}
            order = [a.name for a in pool.agents] if pool else []
            agents = sorted(by_agent, key=lambda a: (a not in order,
                                                     order.index(a) if a in order else 0, a))
            out.append((name, [agent_usage(a, capacity.get(a), by_agent[a]) for a in agents]))
        return out


def listed(stack: str, outputs: Mapping[str, Any], project: Path, connect: Connect,
           records: Path | None = None, holdings: Holdings | None = None) -> Listed:
    def value(key: str) -> Any:
        out = outputs.get(key)
        return getattr(out, "value", out)

    session = value("session") or {}
    record = history.read_record(records, stack) if records is not None else None
    if not session:
        if record is not None:
            return from_record(record, "the stack is empty")
        return Listed(stack, stack, "-", "-", 0, (), "empty", "no resources in the stack")
    hosts = list(value("hosts") or [])
    agent_info = value("agents") or {}
    agents = stack_agents(session, agent_info, project)
    found: list[Found] = []
    held: dict[str, list[HeldContainer]] = {}
    unreachable: dict[str, str] = {}
    for name, agent in agents.items():
        try:
            client = connect(agent)
        except Exception as exc:  # any failure to reach it: say so, go on with the others
            unreachable[name] = unreachable_cause(agent, exc)
            continue
        try:
            for c in session_containers(client, session["name"], own_objects(stack, session)):
                found.append(found_from_attrs(name, c.attrs))
                held.setdefault(name, []).append(held_from_inspect(c.attrs))
        except Exception as exc:
            unreachable[name] = unreachable_cause(agent, exc)
        finally:
            disconnect(client)
    kind = session.get("type", "interactive")
    seen = session_state(kind, planned_from_outputs(session["name"], hosts, agent_info), found,
                         unreachable)
    expires_at = session.get("expires_at")
    expires_at = expires_at if isinstance(expires_at, int) and expires_at >= 0 else None
    seen = expired_state(seen, expires_at, time.time())
    if (seen.state == "down" and record is not None
            and record.session_id == session.get("id")):
        return from_record(record, "its containers are gone")
    if holdings is not None:
        pool = session_pool(session, project)
        pool_name = pool.name if pool is not None else str(session.get("pool", "-"))
        for name in agents:
            holdings.add(pool_name, pool, name, held.get(name, []))
    return Listed(stack, session["name"], kind, session.get("mode", "-"), len(hosts),
                  tuple(agents), seen.state, seen.detail, seen.exit_code,
                  started=seen.started, finished=seen.finished,
                  duration_s=duration_s(seen.started, seen.finished), faults=seen.faults,
                  services=listed_services(value("services") or {}, found,
                                           hosts[0] if hosts else ""),
                  image=str(session.get("image") or ""),
                  project=str(session.get("project") or "default"),
                  priority=int(session.get("priority") or 0), expires_at=expires_at)


def expired_state(seen: Observed, expires_at: int | None, now: float) -> Observed:
    """A session past its lifetime whose containers do not run is EXPIRED, with its reason
    (its containers ended their command by themselves: templates/lifetime.sh). A restart
    policy starts them again, to exit at once: a main1 "running" since after the expiry, or
    anything after the grace, is that restart, not the session's command."""
    if expires_at is None or now < expires_at or seen.state == "unreachable":
        return seen
    start = parse_stamp(seen.started)
    restarted = start is not None and start.timestamp() >= expires_at
    if seen.state == "running" and not restarted and now < expires_at + LIFETIME_GRACE + 5:
        return seen
    when = datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return replace(seen, state="expired", detail=f"its lifetime ended at {when}: its "
                   "containers ended the command; `up` starts it again, `destroy` removes it")


def preempted_row(row: Listed, config: Mapping[str, Any]) -> Listed | None:
    """An empty stack whose session was preempted (its destroy recorded it on the stack:
    driver/ending.py): PREEMPTED, with the reason (by whom, the two priorities); None when
    there is no record."""
    record = ending.read_preempted(config.get(config_key(ending.PREEMPTED_KEY)))
    if record is None:
        return None
    return replace(row, name=record["session"], type=record["type"], state="preempted",
                   phase="", detail=ending.preempted_text(record), project=record["project"],
                   priority=record["priority"])


def time_left(row: Listed, now: float) -> str:
    """What is left of a session's lifetime, for the table: ``3h12m``, ``40s``, ``EXPIRED``,
    ``-`` (no lifetime)."""
    if row.expires_at is None:
        return "-"
    left = int(row.expires_at - now)
    if left <= 0:
        return "EXPIRED"
    hours, rest = divmod(left, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{seconds:02d}s" if minutes
                                                   else f"{seconds}s")


def shown_path(path: Path) -> Path:
    """``path`` as the user can type it from here: relative when under the current directory."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path.resolve()


def left_behind(row: Listed, config: Mapping[str, str], project: Path,
                resources: int = 0) -> Listed | None:
    """A session stack that holds nothing, as its agents see it: what is labelled with the
    session there (an ``up`` interrupted before the stack recorded it) is a ``leftover`` row
    naming it and what to run; an agent that does not answer makes it ``unreachable``. None
    when the definition cannot be read (the row stays ``empty``, as the stack says)."""
    from ..agents.cleanup import find_leftovers
    from ..core.plan import session_copies
    from .session_args import load_definition

    definition = config.get(stack_settings.CONFIG_DEFINITION)
    if not definition:
        return None
    stacks_dir = project / STACKS_DIR
    path = stacks_dir / definition
    pool = config.get(stack_settings.CONFIG_POOL)
    try:
        loaded = load_definition(path, stacks_dir / pool if pool else None)
        copies = session_copies(loaded.session)
        index = int(config.get(stack_settings.CONFIG_INDEX) or 0)
        session = copies[index - 1] if index else copies[0]
    except (ClusterSessionsError, ValueError, IndexError):
        return None
    found, errors = find_leftovers(loaded.pool, session.name)
    agents = tuple(dict.fromkeys(item.agent for item in found))
    shown = printable(shlex.join([str(shown_path(path)),
                                  *(["--pool", str(shown_path(stacks_dir / pool))] if pool else []),
                                  *(["--index", str(index)] if index else [])]))
    holds = (unfinished_text(resources) if resources
             else "the stack holds nothing (left by an interrupted up)")
    if found:
        detail = (f"{holds}; its agents hold " + ", ".join(map(str, found))
                  + f": `sessionctl up {shown}` converges, "
                  f"`sessionctl destroy {shown}` removes them")
        return dataclasses.replace(row, name=session.name, type=session.type, agents=agents,
                                   state="leftover", detail=detail, phase="")
    if errors:
        return dataclasses.replace(row, state="unreachable", phase="", detail="the stack "
                                   "holds nothing; leftovers could not be looked for: "
                                   + "; ".join(map(str, errors)))
    if resources:  # what the agents hold is all the stack's, but the up never finished
        return dataclasses.replace(row, name=session.name, type=session.type,
                                   state="leftover", phase="", detail=f"{holds}: `sessionctl "
                                   f"up {shown}` converges, `sessionctl destroy {shown}` "
                                   "removes it")
    return None


def own_objects(stack: str, session: Mapping[str, Any]) -> Callable[[str], bool]:
    """Which stack-id labels are this stack's, from its ``session`` output (the id its last
    ``up`` put on every label); an output from before stack ids: the id the program derives,
    and the objects without one. A value we did not write: none."""
    try:
        return stack_identity(stack, {STACK_ID_KEY: session.get("stack_id") or None}).owns
    except ValueError:
        return lambda label: False


def from_record(record: history.JobRecord, why: str) -> Listed:
    """A session whose containers are gone, as its job's end was recorded."""
    return Listed(record.stack, record.name, record.type, record.mode, record.size,
                  record.agents, record.state, f"{record.detail} (recorded; {why})",
                  record.exit_code, started=record.started, finished=record.finished,
                  duration_s=duration_s(record.started, record.finished),
                  faults=(record.detail,) if record.state == "lost" else (), recorded=True)


def listed_services(recorded: Mapping[str, Any], found: Sequence[Found],
                    main_host: str) -> tuple[dict[str, Any], ...]:
    """The stack's ``services`` output, each host port as main1's engine publishes it now."""
    main = next((f for f in found if f.host == main_host), None)
    out = []
    for name, info in sorted(recorded.items()):
        info = dict(getattr(info, "value", info))
        bind = str(info.get("bind") or LOOPBACK)
        port = info.get("host_port")
        if main is not None:
            port = next((h for p, ip, h in main.ports if p == info.get("port") and ip == bind),
                        None)
        reach = LOOPBACK if bind == ALL_ADDRESSES else bind
        out.append({"name": name, "agent": info.get("agent"), "port": info.get("port"),
                    "public": bool(info.get("public")), "bind": bind, "host_port": port,
                    "url": service_url(str(info.get("protocol") or "tcp"), reach, int(port))
                    if port else None})
    return tuple(out)


def with_waiting(rows: list[Listed], pools: Mapping[str, Pool]) -> list[Listed]:
    """``rows``, and the sessions waiting on the listed sessions' pools (their ledgers,
    agents.pool_ledger): one queued (``up --wait``) or being placed (a reservation) is PENDING,
    as a row of its own when its stack holds nothing yet (a first ``up``)."""
    from ..agents.pool_ledger import Ledger

    waiting: dict[str, tuple[str, str]] = {}
    for pool in pools.values():
        try:
            with Ledger.open(pool, timeout=10) as ledger:
                now = ledger.now()
                for kind, state in (("reservation", "placing"), ("queue", "queued")):
                    for i, e in enumerate(ledger.live(kind, now), 1):
                        where = (f"#{i} in pool {pool.name}'s queue" if kind == "queue"
                                 else f"placed on pool {pool.name}, its containers coming")
                        who = e.holder.describe() if e.holder else "?"
                        waiting.setdefault(e.session, (state, f"{where}, since "
                                                       f"{now - e.arrival:.0f}s ({who})"))
        except Exception as exc:  # a ledger agent down: the rows stand as the engines say
            print(printable(f"sessionctl ls: warning: pool {pool.name}'s queue not read: {exc}"),
                  file=sys.stderr)
    out = []
    for row in rows:
        state, detail = waiting.pop(row.name, (None, ""))
        out.append(replace(row, state=state, detail=detail)
                   if state and row.state in ("empty", "leftover") else row)
    out += [Listed("-", name, "-", "-", 0, (), state, detail)
            for name, (state, detail) in sorted(waiting.items())]
    return out


def listing_table(rows: Sequence[Listed], sampled: bool = False) -> str:
    from .top import idle_cell, used_cell

    extra = ("USED", "IDLE-SINCE") if sampled else ()
    now = time.time()
    return "\n".join(table(
        ("NAME", "TYPE", "MODE", "SIZE", "AGENTS", "STATE", "PROJECT", "PRIO", "LEFT",
         "STARTED", "ENDED", "DURATION", *extra, "DETAIL"),
        ((r.name, r.type, r.mode, str(r.size), ",".join(r.agents) or "-", r.phase.upper(),
          r.project, str(r.priority), time_left(r, now),
          short_time(r.started), short_time(r.finished), format_duration(r.duration_s),
          *((used_cell(r.used), idle_cell(r)) if sampled else ()),
          (f"{r.state}: {r.detail}" if r.detail else r.state))
         for r in rows)))


def usage_lines(usage: Sequence[tuple[str, Sequence[Usage]]]) -> list[str]:
    """One line per pool: allocated/declared on each agent, for the sessions listed."""
    return [printable(f"pool {pool}: " + "; ".join(usage_text(u) for u in agents))
            for pool, agents in usage]


def parse_states(value: str) -> tuple[str, ...]:
    """``--state running,finished``: phases (any case), comma-separated."""
    wanted = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",")))
    bad = [v for v in wanted if v not in PHASES]
    if bad or not wanted:
        raise argparse.ArgumentTypeError(
            f"invalid value {', '.join(map(repr, bad)) or repr(value)}: use one or more of "
            f"{', '.join(PHASES)}, comma-separated{did_you_mean(bad[0], PHASES) if bad else ''}")
    return wanted


def cmd_ls(args: argparse.Namespace, connect: Connect = connect) -> int:
    project, settings, pulumi = stacks.project_engine(
        [Path.cwd(), Path(__file__).resolve().parent],
        f"no Pulumi project {stacks.PROJECT_NAME!r} (Pulumi.yaml) found above the current "
        "directory or the installed package")
    workspace: Any = None
    summaries: list[Any] = []
    if settings.state_dir is None or settings.state_dir.exists():  # else: before the first up
        from pulumi import automation as auto

        workspace = stacks.open_workspace(project, settings, pulumi)
        try:
            summaries = workspace.list_stacks()
        except auto.errors.CommandError as exc:
            raise CommandError(f"cannot list the stacks in {settings.backend_url}: "
                               f"{stack_settings.command_error_text(exc)}", Exit.ENGINE) from None
    rows = []
    records = history.history_dir(settings, project)
    holdings = Holdings()
    pools: dict[str, Pool] = {}
    sampled_agents: dict[str, dict[str, Agent]] = {}  # `--sample`: session -> its agents
    for summary in sorted(summaries, key=lambda s: s.name):
        outputs = workspace.stack_outputs(summary.name)
        if outputs and "session" not in outputs:
            continue  # a pool stack (`sessionctl pool up`), not a session
        session = getattr(outputs.get("session"), "value", outputs.get("session")) or {}
        pool = session_pool(session, project) if isinstance(session, Mapping) else None
        if pool is not None:
            pools.setdefault(pool.name, pool)
        row = listed(summary.name, outputs, project, connect, records, holdings)
        if args.sample and row.phase == "running" and isinstance(session, Mapping):
            agent_info = getattr(outputs.get("agents"), "value", outputs.get("agents")) or {}
            sampled_agents[row.name] = stack_agents(session, agent_info, project)
        if row.state == "empty":  # held nothing: a pool stack, or what an interrupted up left
            config = {k: getattr(v, "value", v)
                      for k, v in workspace.get_all_config(summary.name).items()}
            if config.get(stack_settings.CONFIG_POOL_DEFINITION):
                continue  # a pool stack whose swarm is gone (`pool destroy`)
            row = (left_behind(row, config, project, summary.resource_count or 0)
                   or preempted_row(row, config) or row)
        rows.append(row)
    rows = with_waiting(rows, pools)
    if args.state:
        rows = [r for r in rows if r.phase in args.state]
    elif not args.all:  # a destroyed session's stack holds nothing: shown with --all
        hidden = sum(r.state == "empty" for r in rows)
        rows = [r for r in rows if r.state != "empty"]
        if hidden and not args.json:
            print(f"({hidden} empty stack{'s' if hidden != 1 else ''} not shown: --all shows "
                  "them; `sessionctl destroy FILE --remove` removes one)", file=sys.stderr)
    if args.sample:
        from .top import sample_listed

        rows = sample_listed(rows, sampled_agents)
    usage = holdings.usage()
    if args.json:
        sampled_only = () if args.sample else ("used", "idle_since")  # `--sample`'s keys
        json.dump({"backend": settings.backend_url,
                   "sessions": [{k: v for k, v in asdict(r).items() if k not in sampled_only}
                                for r in rows],
                   "usage": [{"pool": pool, "agents": [usage_to_dict(u) for u in agents]}
                             for pool, agents in usage]},
                  sys.stdout, indent=2, ensure_ascii=False)
        print()
        return Exit.OK
    if rows:
        print(listing_table(rows, sampled=args.sample))
    else:
        shown = f" {','.join(args.state)}" if args.state else ""
        print(f"no{shown} sessions in {settings.backend_url}", file=sys.stderr)
    for line in usage_lines(usage):
        print(line)
    return Exit.OK


def register(subparsers) -> None:
    p = needs_pulumi(verb_parser(
        subparsers, "ls", "the sessions in the state backend: RUNNING, FINISHED, ERROR, ...",
        "List the session stacks of the state backend (PULUMI_BACKEND_URL, else the "
        "project's file backend) with name, type, mode, size, agents and a state read "
        "from the engines now: RUNNING; FINISHED (a batch job: exit code, start, end, "
        "duration; after `run` or `destroy` removed its containers, as `wait`/`run` recorded "
        "it); ERROR (the fault `status` reports: a host missing, exited, restarting or dead, "
        "or a job lost); UNKNOWN (an agent did not answer); EMPTY (destroyed, or never up); "
        "PENDING (queued, or its containers coming); EXPIRED (its lifetime ended); PREEMPTED "
        "(a higher priority ended it: by whom, and the priorities). "
        "Under the table, per pool, what the listed sessions hold on each agent against its "
        "declared capacity (`sessionctl pool usage POOL` counts every session on the agents). "
        "Needs the pulumi CLI to read the backend (exit 4 without it).",
        epilog="exit codes: 0 listed, 1 the backend could not be read, 2 a bad --state, "
        "4 no pulumi CLI"))
    p.add_argument("--json", action="store_true",
                   help="print {backend, sessions: [...], usage: [...]} as JSON instead of a "
                   "table; each session has state and phase, exit_code, started, finished, "
                   "duration_s, faults, recorded, image (what its containers run: repo@sha256:… "
                   "or an image ID)")
    p.add_argument("--all", action="store_true",
                   help="also the EMPTY stacks (destroyed, or never up), hidden by default")
    p.add_argument("--sample", action="store_true",
                   help="also measure the running sessions (two stats readings a second apart, "
                   "every agent at once): USED (mean cpu %% of the allocated cores, and of "
                   "the GPUs) and IDLE-SINCE (an idle session's last login or start); in "
                   "--json, `used` and `idle_since` per session")
    p.add_argument("--state", type=parse_states, metavar="PHASE[,PHASE]",
                   help=f"only sessions in these phases: {', '.join(PHASES)} (any case)")
    p.set_defaults(func=cmd_ls)
