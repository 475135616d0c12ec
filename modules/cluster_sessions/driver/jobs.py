"""``sessionctl run``: a batch session as one command for CI: up, wait for the job, destroy.

The engine verbs (``up``, ``destroy``) and the wait are the ones ``sessionctl up``,
``sessionctl wait`` and ``sessionctl destroy`` run; this module only sequences them, prints the
summary and decides what to tear down. Ctrl-C while waiting asks on a terminal and destroys in
CI: nothing is left behind without saying so; it exits 130 either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..core.terminal import printable
from .errors import INTERRUPTED, CommandError, Exit
from .logs import drop_output
from .observe import Connect, agents_to_ask, connect, survey
from .session_args import (
    Selected,
    add_session_args,
    add_timeout,
    combined,
    needs_pulumi,
    selected,
    verb_parser,
)
from .status import short_time
from .wait_verb import JobEnd, one_document, stopped, wait_for_jobs

EngineVerb = Callable[[argparse.Namespace], int]
JOB_KEYS = ("session", "exit", "result", "job_exit_code")


def _engine_args(args: argparse.Namespace, verb: str) -> argparse.Namespace:
    """``up``/``destroy`` as ``run`` calls them: live engine output, always on stderr: stdout
    is the job's (main1's log, ``run FILE | head -1``), or with ``--json`` ``run``'s one
    document. (The stand-in engine printed nothing; the real CLI's "Updating (stack):" came
    first on stdout.)"""
    return argparse.Namespace(verb=verb, file=args.file, pool=args.pool, index=args.index,
                              stack=args.stack, json=False, yes=True, diff=False,
                              output_to_stderr=True,
                              **({"wait": getattr(args, "wait", None)} if verb == "up" else {}))


def _summary(sel: Selected, connect: Connect, stack: str | None = None
             ) -> list[dict[str, Any]]:
    rows = []
    for _, plan in sel.chosen:
        found = survey(plan, sel.loaded, agents_to_ask(plan, sel.loaded), connect, stack)
        try:
            by_host = {f.host: f for f in found.found}
            for c in plan.containers:
                f = by_host.get(c.host)
                state = f.state if f else ("unknown" if c.agent in found.unreachable
                                           else "missing")
                rows.append({"session": plan.name, "host": c.host, "state": state,
                             "exit_code": f.exit_code if f else None,
                             "started": f.started_at if f else None,
                             "finished": f.finished_at if f else None})
        finally:
            found.close()
    return rows


def _ask(question: str) -> bool:
    print(question, end=" ", file=sys.stderr, flush=True)
    try:
        return input().strip().lower() in ("y", "yes")
    except EOFError:
        return False


def cmd_run(args: argparse.Namespace, engine_verb: EngineVerb | None = None,
            connect: Connect = connect) -> int:
    """With ``--json``, stdout is one document whatever happens: a run that stops before its
    summary (invalid input, ``up`` failed, Ctrl-C during ``up``) says so in one too."""
    return one_document("run", args, lambda: _run(args, engine_verb, connect))


def _run(args: argparse.Namespace, engine_verb: EngineVerb | None,
         connect: Connect) -> int:
    if engine_verb is None:
        from .stacks import cmd_stack as engine_verb
    sel = selected(args)
    names = ", ".join(p.name for _, p in sel.chosen)
    if sel.loaded.session.type != "batch":
        raise CommandError(f"{args.file}: type: session {sel.plans[0].name} is interactive; "
                           "`run` runs a batch session (type: batch) and tears it down after "
                           "its job", Exit.INVALID)
    code = engine_verb(_engine_args(args, "up"))
    if code != Exit.OK:
        if args.json:
            stopped("run", args, code, "failed", f"up of {names} exited {code}; see stderr")
        return code
    interrupted = reader_left = False
    try:
        ends = wait_for_jobs(args, sel, connect, "run")
    except KeyboardInterrupt:
        interrupted = True
        ends = [(p, JobEnd(Exit.JOB_LOST, "interrupted (Ctrl-C) before the job ended"))
                for _, p in sel.chosen]
    except BrokenPipeError:
        # The reader of the job's log went away (``| head``): the session is still torn down
        # as after a timeout (unless kept), then the verb exits 141 as any verb does.
        reader_left = True
        drop_output()
        ends = [(p, JobEnd(Exit.JOB_LOST, "the reader of the output went away before the "
                           "job ended")) for _, p in sel.chosen]
    # Ctrl-C is 130 as for every verb (and `up`), whatever is done with the session after it:
    # the job did not end, so 0, 5 and 6 (how it ended) would not be true
    outcome = INTERRUPTED if interrupted else combined(end.code for _, end in ends)
    rows = _summary(sel, connect, args.stack)
    keep = args.keep or (args.keep_on_failure and outcome != Exit.OK)
    if interrupted and not args.keep:
        keep = sys.stdin.isatty() and not _ask(
            f"sessionctl run: destroy session {names} now? [y/N]")
    destroyed = False
    if not keep:
        destroy_code = engine_verb(_engine_args(args, "destroy"))
        destroyed = destroy_code == Exit.OK
        if not destroyed:
            print(f"sessionctl run: destroy failed (exit {destroy_code}); the session is still "
                  f"there: run `sessionctl destroy {args.file}`", file=sys.stderr)
    else:
        print(f"sessionctl run: session {names} kept; `sessionctl destroy {args.file}` "
              "removes it", file=sys.stderr)
    if reader_left:
        raise BrokenPipeError("the reader of the output went away")
    for plan, end in ends:
        who = f"{plan.name}: " if len(ends) > 1 else ""
        print(printable(f"sessionctl run: {who}{end.message}"), file=sys.stderr)
    if args.json:
        docs = [{"session": p.name, "exit": int(e.code), "result": e.message,
                 "job_exit_code": e.job_exit_code, "destroyed": destroyed,
                 "containers": [r for r in rows if r["session"] == p.name]}
                for p, e in ends]
        if interrupted:
            for doc in docs:
                doc["exit"] = INTERRUPTED
        # one session: its document; all of a count: `up --json`'s shape (stacks.emit_docs)
        whole = ({**docs[0], "jobs": [{k: docs[0][k] for k in JOB_KEYS}]}
                 if not sel.all_of_count else
                 {"verb": "run", "count": len(sel.plans), "exit": int(outcome),
                  "sessions": docs})
        json.dump(whole, sys.stdout, indent=2)
        print()
    else:
        names = [f"{r['session']}/{r['host']}" if sel.counted else r["host"] for r in rows]
        width = max(map(len, names))
        for where, r in zip(names, rows, strict=True):
            code_text = "" if r["exit_code"] is None else f" (exit code {r['exit_code']})"
            print(printable(f"{where:<{width}}  {r['state']}{code_text}  started "
                            f"{short_time(r['started'])}  finished {short_time(r['finished'])}"),
                  file=sys.stderr)
    return outcome


def register(subparsers) -> None:
    from .placing import parse_duration

    p = needs_pulumi(verb_parser(
        subparsers, "run", "up a batch session, wait for its job, destroy it; exit 0, 5 or 6",
        "For CI: `sessionctl up --yes`, then `sessionctl wait` (main1's log, prefixed), then "
        "`sessionctl destroy --yes`, and a summary per container (state, exit code, start "
        "and finish). Exit 0 when the job succeeded, 5 when it failed, 6 on timeout or a "
        "container that died first; 1-4 as for up. Ctrl-C while waiting asks on a terminal "
        "and destroys otherwise; either way it exits 130, as every verb does on Ctrl-C."))
    add_session_args(p)
    add_timeout(p, "give up waiting after S seconds (exit 6; the session is destroyed)")
    p.add_argument("--wait", nargs="?", type=parse_duration, const=float("inf"),
                   metavar="DURATION",
                   help="when the pool cannot hold the session now, queue for it as `up --wait` "
                   "does (first come, first served) instead of exiting 3; DURATION (90s, 10m, "
                   "2h) bounds the wait for capacity, not the job's (--timeout)")
    p.add_argument("--keep", action="store_true", help="do not destroy the session afterwards")
    p.add_argument("--keep-on-failure", action="store_true",
                   help="keep the session when the job failed or was lost, to look into it")
    p.add_argument("--stack", metavar="NAME", help="stack name (default: the session's name)")
    p.add_argument("--json", action="store_true",
                   help="print the outcome and the per-container summary as JSON on stdout")
    p.set_defaults(func=cmd_run)
