"""``sessionctl status|logs|wait FILE``: what is running, read from Docker.

They find a session's containers by the labels the component puts on them
(:func:`cluster_sessions.core.plan.container_labels`: ``cluster-sessions.session``, ``.host``,
``.role``), on each agent with the Docker SDK through the agent's connector (over SSH with the
pool's key and known_hosts when the agent has an ``ssh`` block); none needs the
Pulumi CLI or the stack's state, so they also show what Pulumi does not know about (a
container left behind by an interrupted ``up``, or one from before the session shrank).

Which agents are asked: the ones the plan places containers on, plus the one holding the
network; when the plan is pending (nothing fits now), every agent of the pool, since leftovers
may be anywhere.

Exit codes: 0 when every agent asked answered (missing or stopped containers are shown, not
failures: ``status`` describes); 1 when an agent could not be asked (the report still shows
the rest), or when ``logs`` found none of the containers it was asked for; 2 invalid input.
"""

from __future__ import annotations

import argparse
import codecs
import heapq
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..agents.engine import (
    close_client,
    container_facts,
    network_facts,
    open_client,
    session_containers,
)
from ..core.loader import Loaded
from ..core.plan import ClusterPlan
from ..core.spec import Agent
from ..core.terminal import dumps, printable, table
from .errors import CommandError, Exit
from .session_args import (
    Selected,
    add_session_args,
    add_timeout,
    combined,
    selected,
    verb_parser,
)

DOCKER_TIMEOUT = 15


# --- pure: what Docker said, and what it means for the plan --------------------------------


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


def found_from_attrs(agent: str, attrs: Mapping[str, Any]) -> Found:
    """A container from ``docker inspect`` attributes (read by the engine room)."""
    c = container_facts(attrs)
    return Found(agent=agent, id=c.container_id[:12], name=c.name, host=c.host, role=c.role,
                 state=c.state or "unknown", health=c.health, started_at=c.started_at,
                 exit_code=c.exit_code, image=c.image, finished_at=c.finished_at)


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


@dataclass(frozen=True)
class Row:
    """One line of ``status``: a planned host, or a labelled container the plan does not have."""

    host: str
    role: str
    agent: str | None  # where it is (found) or should be (planned)
    state: str  # a Docker state, ``missing``, or ``unknown`` (agent did not answer)
    health: str | None = None
    started_at: str | None = None
    image: str | None = None
    name: str | None = None
    id: str | None = None
    planned: bool = True
    note: str | None = None


@dataclass(frozen=True)
class Report:
    plan: ClusterPlan
    rows: tuple[Row, ...]
    network: NetworkState
    unreachable: Mapping[str, str]

    @property
    def faults(self) -> list[str]:
        """:func:`host_faults` of this report's rows."""
        return host_faults(self.plan.session.type, self.rows)

    @property
    def ok(self) -> bool:
        return not self.unreachable and not self.faults


def host_faults(session_type: str, rows: Iterable[Row]) -> list[str]:
    """One line per planned host that is not as it should be, with the cause: missing,
    exited (not a batch job that finished), restarting or dead. (A host whose agent did not
    answer is ``unknown``, reported with the agent's cause separately.) ``status`` exits 1 on
    these and ``ls`` shows them as the ERROR's fault: one judgement, here."""
    found = []
    for r in rows:
        if not r.planned or r.state in ("running", "unknown"):
            continue
        if r.state == "exited" and r.role == "main" and session_type == "batch":
            continue  # the job finished: `sessionctl wait` says how
        why = "no container (is the session up?)" if r.state == "missing" else r.state
        found.append(f"{r.host}: {why}" + (f" ({r.note})" if r.note else ""))
    return found


@dataclass(frozen=True)
class Planned:
    """A container a session should have: from its plan (``status``) or its stack's outputs
    (``ls``)."""

    host: str
    role: str
    agent: str | None
    container_name: str


def agents_to_ask(plan: ClusterPlan, loaded: Loaded) -> tuple[str, ...]:
    if plan.pending:
        return tuple(a.name for a in loaded.pool.agents)
    extra = (plan.network.agent,) if plan.network.agent else ()
    return tuple(dict.fromkeys((*plan.agents, *extra)))


def status_report(plan: ClusterPlan, found: Iterable[Found], network: NetworkState,
                  unreachable: Mapping[str, str]) -> Report:
    """Planned hosts in host order (found or not), then containers the plan does not have."""
    planned = [Planned(c.host, c.role, c.agent, c.container_name) for c in plan.containers]
    return Report(plan, planned_rows(planned, found, unreachable), network, dict(unreachable))


def planned_rows(planned: Sequence[Planned], found: Iterable[Found],
                 unreachable: Mapping[str, str]) -> tuple[Row, ...]:
    """The rows of ``status``: planned hosts in order (found or not), then the leftovers."""
    by_host: dict[str, list[Found]] = {}
    for f in found:
        by_host.setdefault(f.host or f"?{f.name}", []).append(f)
    rows: list[Row] = []
    for c in planned:
        matches = by_host.pop(c.host, [])
        if not matches:
            unknown = c.agent in unreachable
            rows.append(Row(c.host, c.role, c.agent, "unknown" if unknown else "missing",
                            note=f"agent {c.agent} did not answer" if unknown else None))
            continue
        for f in matches:
            note = []
            if c.agent and f.agent != c.agent:
                note.append(f"planned on {c.agent}")
            if f.name != c.container_name:
                note.append(f"expected name {c.container_name}")
            if f.exit_code is not None:
                note.append(f"exit code {f.exit_code}")
            if len(matches) > 1:
                note.append("duplicate")
            rows.append(Row(c.host, c.role, f.agent, f.state, f.health, f.started_at, f.image,
                            f.name, f.id, note="; ".join(note) or None))
    for host, matches in sorted(by_host.items()):
        for f in matches:
            rows.append(Row(host, f.role or "?", f.agent, f.state, f.health, f.started_at,
                            f.image, f.name, f.id, planned=False,
                            note="not in the plan (left over; `sessionctl up` removes what "
                            "its stack created)"))
    return tuple(rows)


def report_to_dict(report: Report) -> dict[str, Any]:
    plan = report.plan
    return {
        "session": {"name": plan.name, "id": plan.session_id},
        "status": plan.status,
        **({"reason": plan.reason} if plan.reason else {}),
        "network": asdict(report.network),
        "containers": [asdict(r) for r in report.rows],
        "unreachable": dict(report.unreachable),
        "faults": report.faults,
    }


def short_time(stamp: str | None) -> str:
    """``2025-01-02T03:04:05.123456789Z`` -> ``2025-01-02 03:04:05Z``."""
    if not stamp:
        return "-"
    day, _, rest = stamp.partition("T")
    return f"{day} {rest[:8]}Z" if rest else stamp


def containers_summary(report: Report) -> str:
    """What the engines hold of the plan, e.g. ``0 of 4 running (4 missing)``."""
    planned = [r for r in report.rows if r.planned]
    counts: dict[str, int] = {}
    for r in planned:
        counts[r.state] = counts.get(r.state, 0) + 1
    running = counts.pop("running", 0)
    rest = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return (f"{running} of {len(report.plan.containers)} running"
            + (f" ({rest})" if rest else ""))


def report_table(report: Report) -> str:
    plan, net = report.plan, report.network
    lines = [f"session  {plan.name}  (id {plan.session_id}): plan {plan.status}, "
             f"{containers_summary(report)}"]
    if plan.pending:
        lines.append(f"pending  {plan.reason}")
    where = f" on {net.agent}" if net.agent else ""
    detail = ""
    if net.state == "present":
        detail = f" (id {net.id}, {net.actual_driver}, {net.containers} attached)"
    lines.append(f"network  {net.name} [{net.driver}]{where}: {net.state}{detail}"
                 + (f" - {net.note}" if net.note else ""))
    lines = [printable(line) for line in lines]  # the engine's words: driver, error notes
    lines.append("")
    lines += table(("HOST", "ROLE", "AGENT", "STATE", "HEALTH", "STARTED", "IMAGE", "NOTE"), (
        (r.host, r.role, r.agent or "-", r.state, r.health or "-", short_time(r.started_at),
         r.image or "-", r.note or "")
        for r in report.rows))
    return "\n".join(lines)  # why an agent did not answer: one line each on stderr


class LineSplitter:
    """Bytes from a log stream to whole lines; a line split across chunks is joined, and bytes
    that are not UTF-8 become U+FFFD instead of an error."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, chunk: bytes) -> list[str]:
        text = self._partial + self._decoder.decode(chunk)
        *lines, self._partial = text.split("\n")
        return [line.rstrip("\r") for line in lines]

    def flush(self) -> list[str]:
        text = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [text.rstrip("\r")] if text else []


def prefixed(host: str, width: int, line: str) -> str:
    """A log line as printed: a container writes any bytes, so controls are escaped (tabs
    kept), and so is a host name read from a container's label."""
    return printable(f"{host.ljust(width)} | {line}", keep="\t")


# --- effects: asking the agents ------------------------------------------------------------------


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


def survey(plan: ClusterPlan, loaded: Loaded, agents: Sequence[str],
           connect: Connect = connect) -> Survey:
    result = Survey([], {}, {}, {})
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
        for container in listed:
            found = found_from_attrs(name, container.attrs)
            result.found.append(found)
            result.containers.setdefault(found.host or found.name, []).append(container)
    return result


def network_state(plan: ClusterPlan, clients: Mapping[str, Any],
                  unreachable: Mapping[str, str]) -> NetworkState:
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
    return NetworkState(**base, state="present", id=facts.network_id[:12],
                        actual_driver=facts.driver, containers=facts.containers)


def cmd_status(args: argparse.Namespace, connect: Connect = connect) -> int:
    sel = selected(args)
    reports = []
    for _, plan in sel.chosen:
        found = survey(plan, sel.loaded, agents_to_ask(plan, sel.loaded), connect)
        try:
            net = network_state(plan, found.clients, found.unreachable)
            reports.append(status_report(plan, found.found, net, found.unreachable))
        finally:
            found.close()
    if args.json:
        docs = [report_to_dict(r) for r in reports]
        whole = {"count": len(sel.plans), "sessions": docs}
        print(dumps(whole if len(docs) > 1 else docs[0], indent=2))
    else:
        print("\n\n".join(report_table(r) for r in reports))
    for report in reports:
        who = f"{report.plan.name}: " if len(reports) > 1 else ""
        for agent, why in report.unreachable.items():
            print(printable(f"sessionctl status: {who}agent {agent} did not answer: {why}"),
                  file=sys.stderr)
        for fault in report.faults:  # states and names as the engine gave them
            print(printable(f"sessionctl status: {who}{fault}"), file=sys.stderr)
    return Exit.OK if all(r.ok for r in reports) else Exit.ENGINE


def label_for(sel: Selected, plan: ClusterPlan, host: str) -> str:
    """How a host is named in prefixed output: ``sub1``, or ``train-2/sub1`` for one of K."""
    return f"{plan.name}/{host}" if len(sel.chosen) > 1 else host


# --- logs ----------------------------------------------------------------------------------------


class Printer:
    """Writes prefixed lines from several threads without interleaving inside a line."""

    def __init__(self, width: int, out=None):
        self.width = width
        self.out = out or sys.stdout
        self._lock = threading.Lock()

    def lines(self, host: str, lines: Iterable[str]) -> None:
        text = "".join(prefixed(host, self.width, line) + "\n" for line in lines)
        if text:
            with self._lock:
                self.out.write(text)
                self.out.flush()


def pump(host: str, chunks: Iterator[bytes], printer: Printer) -> None:
    splitter = LineSplitter()
    for chunk in chunks:
        printer.lines(host, splitter.feed(chunk))
    printer.lines(host, splitter.flush())


def select_hosts(plan: ClusterPlan, present: Iterable[str], wanted: Sequence[str] | None
                 ) -> list[str]:
    """Hosts to show, in host order: all planned ones, or the ``--host`` ones (which may also
    be left-over containers the plan no longer has)."""
    known = list(dict.fromkeys((*plan.hosts, *sorted(present))))
    if not wanted:
        return list(plan.hosts)
    unknown = [h for h in wanted if h not in known]
    if unknown:
        raise CommandError(f"no host {', '.join(unknown)} in session {plan.name} (hosts: "
                           f"{', '.join(known)})", Exit.INVALID)
    return [h for h in known if h in wanted]


def parse_tail(value: str) -> int | str:
    if value == "all":
        return value
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError("must be a number of lines >= 0, or 'all'")
    return n


def cmd_logs(args: argparse.Namespace, connect: Connect = connect) -> int:
    sel = selected(args)
    sources: list[tuple[str, Any]] = []
    surveys = []
    try:
        for _, plan in sel.chosen:
            found = survey(plan, sel.loaded, agents_to_ask(plan, sel.loaded), connect)
            surveys.append(found)
            sources += [(label_for(sel, plan, host), c)
                        for host, c in log_sources(args, plan, found)]
        if not sources:
            shown = ", ".join(p.name for _, p in sel.chosen)
            raise CommandError(f"none of the containers of session {shown} were found; is it "
                               "up?", Exit.ENGINE)
        return show_logs(args, sources)
    finally:
        for found in surveys:
            found.close()


def log_sources(args: argparse.Namespace, plan: ClusterPlan, found: Survey
                ) -> list[tuple[str, Any]]:
    """The containers whose logs to show, host order; what is missing is said on stderr."""
    hosts = select_hosts(plan, found.containers, args.host)
    for agent, why in found.unreachable.items():
        print(printable(f"sessionctl logs: agent {agent} did not answer: {why}"),
              file=sys.stderr)
    sources = []
    for host in hosts:
        containers = found.containers.get(host, [])
        if not containers:
            print(printable(f"sessionctl logs: {plan.name}: {host}: no container found"),
                  file=sys.stderr)
        sources += [(host, c) for c in containers]
    return sources


_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ", re.ASCII)

Stamped = tuple[tuple[str, str], str, str]  # (sort key, the engine's timestamp, the line)


def stamped_lines(host: str, chunks: Iterable[bytes]) -> list[Stamped]:
    """A container's log read with the engine's timestamps, in the order it was written: the
    engine copies stdout and stderr separately and may store a line after one written later,
    but it stamps each line as it reads it. A line without a stamp (a continuation) keeps its
    place after the one before it. Sorted stably by stamp."""
    splitter = LineSplitter()
    lines = [*(line for chunk in chunks for line in splitter.feed(chunk)), *splitter.flush()]
    found: list[Stamped] = []
    key = ("", "")
    for line in lines:
        match = _STAMP.match(line)
        if match:
            key = (match[1], (match[2] or "").ljust(9, "0"))  # RFC 3339 trims trailing zeros
            found.append((key, line[:match.end() - 1], line[match.end():]))
        else:
            found.append((key, "", line))
    return sorted(found, key=lambda item: item[0])


def show_logs(args: argparse.Namespace, sources: Sequence[tuple[str, Any]]) -> int:
    printer = Printer(max(len(h) for h, _ in sources))
    options = {"stdout": True, "stderr": True, "stream": True, "tail": args.tail,
               "timestamps": args.timestamps, "follow": args.follow}
    if not args.follow:
        logs = [[(item, host) for item in stamped_lines(host, container.logs(
            **{**options, "timestamps": True}))] for host, container in sources]
        if args.timestamps:  # all containers by time (hosts in host order on a tie)
            logs = [list(heapq.merge(*logs, key=lambda entry: entry[0][0]))]
        for entries in logs:
            for (_, stamp, line), host in entries:
                printer.lines(host, [f"{stamp} {line}" if args.timestamps and stamp else line])
        return Exit.OK
    threads = [threading.Thread(target=pump, args=(host, container.logs(**options), printer),
                                daemon=True, name=f"logs-{host}")
               for host, container in sources]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)  # short joins keep Ctrl-C responsive
    return Exit.OK


# --- wait: a batch job until it ends ------------------------------------------------------------

POLL_S = 0.5


@dataclass(frozen=True)
class JobEnd:
    """How waiting for a batch job ended."""

    code: Exit
    message: str
    job_exit_code: int | None = None
    started_at: str | None = None  # main1's, as its engine stamped it
    finished_at: str | None = None  # main1's when it exited
    ended: bool = False  # the job is over (succeeded, failed or lost), not merely unwatched


def job_outcome(plan: ClusterPlan, states: Mapping[str, Found | None]) -> JobEnd | None:
    """Whether the job has ended, from the containers' current states (None: still running).

    main1 exited: the job's own exit code decides (0 or 5). Before that, a sub that is not
    running (exited, restarting, dead or gone) or a missing main1 ends the wait with 6."""
    main = plan.containers[0]
    job = states.get(main.host)
    if job is None:
        return JobEnd(Exit.JOB_LOST, f"{main.host}: container {main.container_name} not found",
                      ended=True)
    times = {"started_at": job.started_at, "finished_at": job.finished_at, "ended": True}
    if job.state in ("exited", "dead") and job.exit_code is not None:
        if job.exit_code == 0:
            return JobEnd(Exit.OK, f"the job on {main.host} succeeded (exit code 0)", 0, **times)
        return JobEnd(Exit.JOB_FAILED, f"the job on {main.host} failed with exit code "
                      f"{job.exit_code}", job.exit_code, **times)
    for c in plan.containers[1:]:
        sub = states.get(c.host)
        if sub is None:
            return JobEnd(Exit.JOB_LOST, f"{c.host} disappeared before the job ended", **times)
        if sub.state != "running":
            code = f" (exit code {sub.exit_code})" if sub.exit_code is not None else ""
            return JobEnd(Exit.JOB_LOST, f"{c.host} is {sub.state}{code} before the job ended",
                          **times)
    return None


def cmd_wait(args: argparse.Namespace, connect: Connect = connect) -> int:
    sel = selected(args)
    if sel.loaded.session.type != "batch":
        raise CommandError(f"{args.file}: type: session {sel.plans[0].name} is interactive; "
                           "only a batch session (type: batch) has a job to wait for",
                           Exit.INVALID)
    ends = wait_for_jobs(args, sel, connect, "wait")
    for plan, end in ends:
        who = f"{plan.name}: " if len(ends) > 1 else ""
        print(printable(f"sessionctl wait: {who}{end.message}"), file=sys.stderr)
    code = combined(end.code for _, end in ends)
    if args.json:
        docs = [{"session": p.name, "exit": int(e.code), "result": e.message,
                 "job_exit_code": e.job_exit_code} for p, e in ends]
        print(dumps(docs[0] if len(docs) == 1 else {"exit": code, "sessions": docs}))
    return code


def wait_for_jobs(args: argparse.Namespace, sel: Selected, connect: Connect, verb: str
                  ) -> list[tuple[ClusterPlan, JobEnd]]:
    """Each chosen session's job until it ends, one after the other, within one deadline."""
    deadline = time.monotonic() + args.timeout if args.timeout else None
    ends = []
    for _, plan in sel.chosen:
        found = survey(plan, sel.loaded, agents_to_ask(plan, sel.loaded), connect)
        try:
            for agent, why in found.unreachable.items():
                print(printable(f"sessionctl {verb}: agent {agent} did not answer: {why}"),
                      file=sys.stderr)
            if found.unreachable:
                end = JobEnd(Exit.ENGINE, "agents did not answer: " + "; ".join(
                    f"{a}: {w}" for a, w in found.unreachable.items()))
            else:
                prefix = f"{plan.name}/" if len(sel.chosen) > 1 else ""
                end = follow_job(plan, found, deadline, args.timeout, prefix)
        finally:
            found.close()
        if end.ended:
            remember(args, sel, plan, end, verb)
        ends.append((plan, end))
    return ends


def remember(args: argparse.Namespace, sel: Selected, plan: ClusterPlan, end: JobEnd,
             verb: str) -> None:
    """Write how the job ended (:mod:`.history`) for ``ls``; a record that cannot be written
    is said on stderr and changes nothing else."""
    from . import history, stack_settings

    stack = stack_settings.stack_name_for(plan.name, getattr(args, "stack", None))
    lost = end.code == Exit.JOB_LOST
    record = history.JobRecord(
        stack=stack, name=plan.name, session_id=plan.session_id, type=plan.session.type,
        mode=plan.mode, size=len(plan.containers), agents=plan.agents,
        state="lost" if lost else "finished", detail=end.message,
        exit_code=end.job_exit_code, started=end.started_at,
        finished=end.finished_at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    try:
        project = stack_settings.find_project(stack_settings.project_starts(Path(args.file)))
        where = project and history.history_dir(
            stack_settings.engine_settings(os.environ, project), project)
        if where is not None:
            history.write_record(where, record)
    except OSError as exc:
        print(printable(f"sessionctl {verb}: warning: could not record how the job of "
                        f"{plan.name} ended: {exc}"), file=sys.stderr)


def follow_job(plan: ClusterPlan, found: Survey, deadline: float | None,
               timeout: float | None, prefix: str = "") -> JobEnd:
    """main1's log lines (prefixed with the host) while polling every container's state."""
    main = plan.containers[0].host
    containers = {host: cs[0] for host, cs in found.containers.items() if cs}
    printer = Printer(max(len(prefix + h) for h in plan.hosts))
    if main in containers:
        stream = containers[main].logs(stdout=True, stderr=True, stream=True, follow=True)
        threading.Thread(target=pump, args=(prefix + main, stream, printer), daemon=True,
                         name=f"logs-{main}").start()
    while True:
        states: dict[str, Found | None] = {}
        for c in plan.containers:
            container = containers.get(c.host)
            try:
                if container is not None:
                    container.reload()
                    states[c.host] = found_from_attrs(c.agent or "", container.attrs)
                else:
                    states[c.host] = None
            except Exception:  # gone since the survey
                states[c.host] = None
        end = job_outcome(plan, states)
        if end is not None:
            time.sleep(POLL_S)  # the last log lines are on their way
            return end
        if deadline is not None and time.monotonic() >= deadline:
            return JobEnd(Exit.JOB_LOST, f"the job on {main} did not end within "
                          f"{timeout:g} s (it is still running)")
        time.sleep(POLL_S)


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "status", "the session's containers on its agents: state, health, image",
        "Find the session's containers by their labels on each agent (Docker API "
        "through the agent's connector) and show them next to the plan: planned but missing "
        "containers, left-over ones, and the network. Exit 1 when a planned container is "
        "missing, exited (but a batch session's finished job), restarting or dead, or an "
        "agent did not answer; each such host is named on stderr with its cause.")
    add_session_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_status)

    p = verb_parser(
        subparsers, "logs", "the containers' logs, each line prefixed with its host",
        "Print each container's logs (Docker API), in host order, every line "
        "prefixed with its host (`sub1 | ...`); a container's stdout and stderr lines in the "
        "order the engine stamped them. With --timestamps, all containers' lines by time. "
        "With --follow, lines from all containers are printed as they come until Ctrl-C.")
    add_session_args(p)
    p.add_argument("--host", action="append", metavar="HOST",
                   help="only this host (main1, sub1, ...); may be repeated")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    p.add_argument("--tail", type=parse_tail, default="all", metavar="N",
                   help="only the last N lines of each container (default: all)")
    p.add_argument("--timestamps", "-t", action="store_true",
                   help="show the engine's timestamp on each line")
    p.set_defaults(func=cmd_logs)

    p = verb_parser(
        subparsers, "wait", "follow a batch session's job until it ends; exit 0, 5 or 6",
        "Follow main1's log (each line prefixed with its host) until the batch job, "
        "main1's command, ends. Exit 0 when it succeeded, 5 when it failed (its exit code "
        "is printed), 6 when --timeout passed first or another container died or "
        "disappeared before the job ended, 1 when an agent did not answer, 2 for a "
        "definition that is not a batch session.")
    add_session_args(p)
    add_timeout(p, "give up after S seconds (exit 6); default: wait as long as it runs")
    p.add_argument("--json", action="store_true",
                   help="also print the outcome as JSON on stdout (exit, result, job_exit_code)")
    p.set_defaults(func=cmd_wait)
