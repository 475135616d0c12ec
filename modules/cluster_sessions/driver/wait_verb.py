"""``sessionctl wait FILE``: a batch session's job followed until it ends (main1's log while
every container's state is polled), and how it ended recorded for ``ls``; ``run`` waits the
same way.

Exit codes: 0 the job succeeded, 5 it failed, 6 lost (timeout, or another container died or
disappeared first), 1 an agent did not answer, 2 not a batch session.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.plan import ClusterPlan
from ..core.terminal import dumps, printable
from .errors import INTERRUPTED, ClusterSessionsError, CommandError, Exit
from .logs import Printer, pump
from .observe import Connect, Found, Survey, agents_to_ask, connect, found_from_attrs, survey
from .session_args import Selected, add_session_args, add_timeout, combined, selected, verb_parser

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


def one_document(verb: str, args: argparse.Namespace, run: Callable[[], int]) -> int:
    """``run()``, and with ``--json`` one document on stdout whatever happens: a verb that
    stops before its own (invalid input, an engine failure, Ctrl-C) prints ``{verb, file,
    exit, result, error}``; the message still goes to stderr as for every verb."""
    if not getattr(args, "json", False):
        return run()
    try:
        return run()
    except ClusterSessionsError as exc:
        stopped(verb, args, int(exc.code), "failed", str(exc))
        raise
    except KeyboardInterrupt:
        stopped(verb, args, INTERRUPTED, "interrupted", "interrupted (Ctrl-C)")
        raise


def stopped(verb: str, args: argparse.Namespace, code: int, result: str, error: str) -> None:
    print(dumps({"verb": verb, "file": args.file, "exit": code, "result": result,
                 "error": error}, indent=2))


def cmd_wait(args: argparse.Namespace, connect: Connect = connect) -> int:
    return one_document("wait", args, lambda: _wait(args, connect))


def _wait(args: argparse.Namespace, connect: Connect) -> int:
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
        print(dumps(docs[0] if not sel.all_of_count else
                    {"verb": "wait", "count": len(sel.plans), "exit": code, "sessions": docs}))
    return code


def wait_for_jobs(args: argparse.Namespace, sel: Selected, connect: Connect, verb: str
                  ) -> list[tuple[ClusterPlan, JobEnd]]:
    """Each chosen session's job until it ends, one after the other, within one deadline."""
    deadline = time.monotonic() + args.timeout if args.timeout else None
    ends = []
    for _, plan in sel.chosen:
        found = survey(plan, sel.loaded, agents_to_ask(plan, sel.loaded), connect,
                       getattr(args, "stack", None))
        try:
            for agent, why in found.unreachable.items():
                print(printable(f"sessionctl {verb}: agent {agent} did not answer: {why}"),
                      file=sys.stderr)
            if found.unreachable:
                end = JobEnd(Exit.ENGINE, "agents did not answer: " + "; ".join(
                    f"{a}: {w}" for a, w in found.unreachable.items()))
            else:
                prefix = f"{plan.name}/" if len(sel.chosen) > 1 else ""
                # --json: stdout holds the one document; main1's log goes to stderr
                end = follow_job(plan, found, deadline, args.timeout, prefix,
                                 sys.stderr if getattr(args, "json", False) else None)
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
               timeout: float | None, prefix: str = "", out: Any = None) -> JobEnd:
    """main1's log lines (prefixed with the host, on ``out``: default stdout) while polling
    every container's state."""
    main = plan.containers[0].host
    containers = {host: cs[0] for host, cs in found.containers.items() if cs}
    printer = Printer(max(len(prefix + h) for h in plan.hosts), out)
    if main in containers:
        stream = containers[main].logs(stdout=True, stderr=True, stream=True, follow=True)
        threading.Thread(target=pump, args=(prefix + main, stream, printer), daemon=True,
                         name=f"logs-{main}").start()
    while True:
        printer.check()  # nobody reads the job's log any more: stop waiting (exit 141)
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
