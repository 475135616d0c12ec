"""``sessionctl status FILE``: the session's containers next to its plan, read from Docker
(:mod:`.observe`); the rows and the faults ``ls`` shows too.

Exit codes: 0 when every agent asked answered and every planned host is as it should be
(a batch session's finished job included); 1 when an agent could not be asked (the report
still shows the rest) or a planned host is missing, exited, restarting or dead; 2 invalid
input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..core.plan import ClusterPlan, ServicePlan, public_warnings
from ..core.terminal import dumps, printable, table
from . import ending
from .errors import Exit
from .observe import (
    Connect,
    Found,
    NetworkState,
    agents_to_ask,
    connect,
    network_state,
    placed_as_found,
    survey,
)
from .session_args import add_session_args, selected, verb_parser
from .stack_records import preempted_record, unfinished_up
from .stack_settings import project_starts


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
    services: tuple[ServicePlan, ...] = ()  # host_port as main1's engine publishes it
    unfinished: str | None = None  # the stack's last up did not finish (stack_identity)
    preempted: str | None = None  # a higher priority ended it (driver/ending.py): why

    @property
    def faults(self) -> list[str]:
        """:func:`host_faults` of this report's rows, after the stack's own fault."""
        stack = [f"stack: {self.unfinished}"] if self.unfinished else []
        return stack + host_faults(self.plan.session.type, self.rows)

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


def status_report(plan: ClusterPlan, found: Iterable[Found], network: NetworkState,
                  unreachable: Mapping[str, str]) -> Report:
    """Planned hosts in host order (found or not), then containers the plan does not have."""
    planned = [Planned(c.host, c.role, c.agent, c.container_name) for c in plan.containers]
    found = list(found)
    main1 = [f for f in found if f.name == plan.containers[0].container_name]
    return Report(plan, planned_rows(planned, found, unreachable), network, dict(unreachable),
                  services_found(plan, main1))


def services_found(plan: ClusterPlan, main1: Sequence[Found]) -> tuple[ServicePlan, ...]:
    """The plan's services with the host port main1's engine publishes each at (None: not
    published, main1 missing or its agent not answering)."""
    bound = {(port, ip): host for f in main1 for port, ip, host in f.ports}
    return tuple(replace(s, host_port=bound.get((s.port, s.bind))) for s in plan.services)


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
        "services": [s.to_dict() for s in report.services],
        "unfinished": report.unfinished,
        "preempted": report.preempted,
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
    if report.unfinished:
        lines.append(f"stack    {report.unfinished}: `sessionctl up` converges, "
                     "`sessionctl destroy` removes it all")
    if report.preempted:
        lines.append(f"preempted {report.preempted}")
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
    if report.services:
        lines += ["", *table(("SERVICE", "PORT", "AGENT", "AGENT PORT", "URL"), (
            (s.name, str(s.port), s.agent or "-", str(s.host_port or "-"),
             (s.url or "not published") + (" (public)" if s.public else ""))
            for s in report.services))]
    return "\n".join(lines)  # why an agent did not answer: one line each on stderr


def cmd_status(args: argparse.Namespace, connect: Connect = connect) -> int:
    sel = selected(args)
    reports = []
    for _, plan in sel.chosen:
        found = survey(plan, sel.loaded, agents_to_ask(plan, sel.loaded), connect)
        try:
            plan = placed_as_found(plan, sel.loaded, found.found)
            net = network_state(plan, found.clients, found.unreachable, found.mine)
            report = status_report(plan, found.found, net, found.unreachable)
            why = unfinished_up(plan.name, project_starts(Path(args.file)))
            gone = not any(r.planned and r.state != "missing" for r in report.rows)
            record = (preempted_record(plan.name, project_starts(Path(args.file)))
                      if gone else None)
            reports.append(replace(report, unfinished=why, preempted=(
                ending.preempted_text(record) if record is not None else None)))
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
        for warning in public_warnings(report.plan):  # as `plan` and `diff` say it
            print(printable(f"sessionctl status: {who}warning: {warning}"), file=sys.stderr)
    return Exit.OK if all(r.ok for r in reports) else Exit.ENGINE


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
