"""``sessionctl``: the command line. The only place that decides exit codes.

Exit codes (contracts 4 and 6): 0 ok, 1 engine failure, 2 invalid input, 3 pending, 4 missing
prerequisite (such as the ``pulumi`` CLI), 5 a batch job failed, 6 a batch job was lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from ..core.loader import Loaded
from ..core.placement import Free
from ..core.plan import ClusterPlan, plan_to_dict, public_warnings, session_copies
from ..core.problems import DefinitionError, Problem
from ..core.spec import Pool, Session, json_schema
from ..core.terminal import dumps, guarded, printable, table
from ..core.units import format_size
from . import verbs
from .errors import INTERRUPTED, ClusterSessionsError, Exit, outcome
from .logs import drop_output
from .session_args import (
    EPILOG,
    add_project_arg,
    add_session_args,
    load_definition,
    nonempty,
    select,
    validate_files,
)


def probed_free(args: argparse.Namespace, loaded: Loaded) -> tuple[list[Free], list, list]:
    """Live free capacity (``plan --probe``), said on stderr: which pool, what it found; with
    the agents' reports, from which the swarm's readiness is judged, and the live
    reservations (what a project's quota counts too)."""
    from ..agents.capacity import free_of, probe_pool
    from ..agents.pool_ledger import Ledger
    from .placing import live_free

    exclude = [s.name for s in session_copies(loaded.session)]
    reports = probe_pool(loaded.pool, exclude_session=exclude)
    free_of(loaded.pool, reports)  # every agent answered, or PreflightError naming them
    now, reservations = 0.0, []
    try:
        with Ledger.open(loaded.pool) as ledger:  # what `up`s under way reserved counts too
            now = ledger.now()
            reservations = ledger.live("reservation", now)
    except Exception as exc:  # a plan is advice: say what it could not count, and go on
        print(printable(f"sessionctl plan: warning: reservations not counted: {exc}"),
              file=sys.stderr)
    free = live_free(reports, reservations, dict.fromkeys(exclude, ""), now)
    print(f"probed pool {printable(loaded.pool.name)} ({printable(loaded.pool_file)}), "
          "free now:", file=sys.stderr)
    for f in free:
        print(f"  {printable(f.name)}: cpu {f.millicpu / 1000:g}, mem {format_size(f.mem)}, "
              f"gpus {','.join(map(str, f.gpus)) or '-'}", file=sys.stderr)
    return free, reports, reservations


def problem_dict(problem: Problem) -> dict[str, str]:
    return {"file": problem.file, "path": problem.path, "message": problem.message}


def error_document(verb: str, code: int, exc: BaseException) -> dict[str, object]:
    """What a ``--json`` verb prints when it stops on an error before its own document:
    the verb, the result the exit code means, the message, and each definition problem."""
    results = {Exit.INVALID: "invalid", Exit.PENDING: "pending", Exit.MISSING: "missing"}
    doc: dict[str, object] = {"verb": verb, "result": results.get(code, "failed"),
                              "error": str(exc)}
    if isinstance(exc, DefinitionError):
        doc["problems"] = [problem_dict(p) for p in exc.problems]
    return doc


def cmd_validate(args: argparse.Namespace) -> int:
    problems = validate_files([Path(f) for f in args.files], args.project)
    if args.json:
        bad = {p.file for p in problems}
        print(json.dumps({"valid": not problems,
                          "files": [{"file": f, "valid": f not in bad} for f in args.files],
                          "problems": [problem_dict(p) for p in problems]},
                         indent=2, ensure_ascii=False))
        return Exit.INVALID if problems else Exit.OK
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return Exit.INVALID
    for f in args.files:
        print(f"{printable(f)}: ok")
    return Exit.OK


def cmd_plan(args: argparse.Namespace) -> int:
    loaded = load_definition(Path(args.file), Path(args.pool) if args.pool is not None else None,
                             project=args.project)
    free, reports, reservations = probed_free(args, loaded) if args.probe else (None, [], [])
    sel = select(loaded, args.index, free)
    plans = [p for _, p in sel.chosen]
    pending = sel.pending.reason if sel.pending is not None else None
    problems: list = []
    if args.probe and pending is None:
        # placed on capacity; across agents it also needs the swarm (as `pool check` says).
        # Judged before anything is shown: the plan printed is the verdict, pending or not.
        from ..agents.capacity import swarm_unready

        named = args.pool or loaded.session.pool  # as `pool up` takes it from here
        ref = named if "/" not in named and not named.endswith((".yaml", ".yml")) \
            else str(loaded.pool_file)
        unready = next(filter(None, (swarm_unready(loaded.pool, reports, p.agents, pool_ref=ref)
                                     for p in plans)), None)
        if unready is not None:  # all of a count wait, as when one does not fit
            pending, problems = unready
            plans = [dataclasses.replace(p, status="pending", reason=pending) for p in plans]
    if args.probe and pending is None:
        # the project's quota, as `up` judges it (the sessions' own holdings left out)
        from .placing import quota_error

        over = quota_error(loaded.pool, [p.session for p in sel.plans], reports, reservations,
                           {p.name: "" for p in sel.plans})
        if over is not None:
            pending = str(over).removeprefix("pending: ").split("; nothing was created")[0]
            plans = [dataclasses.replace(p, status="pending", reason=pending) for p in plans]
    if args.json:
        from ..core.plan import with_image
        from .image_step import recorded_image
        from .stack_settings import find_project, project_starts

        project = find_project(project_starts(Path(args.file)))
        docs = [plan_to_dict(with_image(p, recorded_image(project, p))) for p in plans]
        whole = {"count": len(sel.plans), "sessions": docs}
        print(dumps(whole if sel.all_of_count else docs[0], indent=2))
    elif args.markdown:
        from ..core.review import plan_markdown

        sys.stdout.write("\n".join(plan_markdown(p, loaded.name_from_file) for p in plans))
    else:
        print("\n\n".join(plan_table(p, loaded.name_from_file) for p in plans))
    for p in plans:
        for warning in public_warnings(p):
            print(f"{printable(args.file)}: warning: {printable(warning)}", file=sys.stderr)
    if pending is not None:
        print(f"{printable(args.file)}: pending: {printable(pending)}", file=sys.stderr)
        for problem in problems:
            print(f"  {printable(str(problem))}", file=sys.stderr)
        return Exit.PENDING
    return Exit.OK


def plan_table(plan: ClusterPlan, name_from_file: bool = False) -> str:
    """A table for ops review: one row per container, host order. A name the definition did
    not write says where it came from, so a renamed file is not a surprise."""
    res = plan.resources
    net = plan.network
    origin = " (from the file name)" if name_from_file else ""
    lines = [
        f"session  {plan.name}{origin}  (id {plan.session_id})",
        f"image    {plan.session.image}",
        f"mode     {plan.mode}, {len(plan.containers)} container(s), status {plan.status}",
    ]
    if plan.pending:
        lines.append(f"reason   {plan.reason}")
    else:
        lines.append(f"network  {net.driver} {net.name} on {net.agent}"
                     + (f", mtu {net.mtu}" if net.mtu else "")
                     + (", encrypted" if net.encrypted else ""))
    for agent, delivery, why in plan.deliveries:  # issue 45: how the bundles get there
        where = f" into {plan.scratch}" if delivery == "scratch" else ""
        lines.append(f"bundles  {agent}: {delivery}{where} ({why})")
    for m in plan.mounts:
        what = (f"folder {m.folder} ({m.source}: made if missing, kept after destroy)"
                if m.folder else m.source)
        lines.append(f"mount    {what} -> {m.target}{' (read-only)' if m.read_only else ''}")
    lines = [printable(line) for line in lines]
    lines.append("")
    lines += table(("HOST", "ROLE", "AGENT", "CPU", "MEM", "SHMEM", "GPUS"), (
        (c.host, c.role, c.agent or "-", f"{res.cpu:g}", format_size(res.mem),
         format_size(res.shmem), ",".join(map(str, c.gpus)) or "-")
        for c in plan.containers))
    if plan.services:
        lines += ["", *table(("SERVICE", "PORT", "PROTOCOL", "BIND", "HOST PORT"), (
            (v.name, str(v.port), v.protocol, v.bind + (" (public)" if v.public else ""),
             str(v.host_port) if v.host_port else
             "at up: " + (str(v.preferred_port) if v.preferred_port in v.port_range
                          else "first free") + f" of {v.port_range.first}-{v.port_range.last}")
            for v in plan.services))]
    return "\n".join(lines)


def definitions_schema(kind: str | None = None) -> dict:
    """The JSON Schema of one kind, or of both (``oneOf``), with every ``$ref`` resolvable:
    each kind's own ``$defs`` are lifted to the top of the combined document."""
    schemas = {"ClusterSession": json_schema(Session), "AgentPool": json_schema(Pool)}
    if kind:
        return schemas[kind]
    defs: dict = {}
    for name, schema in schemas.items():
        defs.update(schema.pop("$defs", {}))
        defs[name] = schema
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "cluster-sessions definitions",
        "oneOf": [{"$ref": f"#/$defs/{k}"} for k in schemas],
        "$defs": defs,
    }


def cmd_schema(args: argparse.Namespace) -> int:
    json.dump(definitions_schema(args.kind), sys.stdout, indent=2)
    print()
    return Exit.OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionctl",
        description="Plan, render and apply Backend.AI-style cluster sessions on Docker hosts.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = sub.add_parser("validate", help="check definition files (sessions and pools)",
                       description="Check definitions; print one line per problem as "
                       "FILE: dotted.path: message. Exit 0 if all are valid, else 2.")
    p.add_argument("files", nargs="+", metavar="FILE", type=nonempty)
    p.add_argument("--json", action="store_true",
                   help="print {valid, files: [{file, valid}], problems: [{file, path, "
                   "message}]} on stdout instead of lines (exit codes unchanged)")
    add_project_arg(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="show where each container goes (--json: and its env)",
                       description="Plan a session offline: placement, network, static env. "
                       "Exit 3 when the session is pending.", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_session_args(p)
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true",
                       help="print the whole plan as JSON, with each container's environment")
    shown.add_argument("--markdown", action="store_true",
                       help="print the plan as Markdown for a pull request: a table and a "
                       "Mermaid picture of the placement (agents, their containers, the "
                       "network)")
    p.add_argument("--probe", action="store_true",
                   help="plan against live free capacity read from the agents (over SSH); "
                   "says which pool and what it found; a session across agents whose swarm is "
                   "not formed is pending (exit 3), as `pool check` says")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("schema", help="print the JSON Schema of the definition kinds",
                       description="Print the JSON Schema of a ClusterSession, an AgentPool, or "
                       "both (no KIND), for an editor's completion and checks.")
    p.add_argument("kind", nargs="?", choices=["ClusterSession", "AgentPool"])
    p.set_defaults(func=cmd_schema)

    verbs.register_all(sub)
    return parser


def version() -> str:
    """The version of the code that runs: the checkout's ``pyproject.toml`` when this module
    sits in one (a clone run with PYTHONPATH, an editable install), else the installed
    package's metadata. An installed copy elsewhere must not name another checkout's version."""
    import tomllib
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        if project.get("name") == "cluster-sessions":
            return str(project["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return installed("cluster-sessions")
    except PackageNotFoundError:
        return "unknown (neither installed nor in its checkout)"


def quiet_libraries() -> None:
    """paramiko logs each failed connection (with its traceback) through the logging module's
    last-resort handler; the verbs already say what failed, one line per agent."""
    logger = logging.getLogger("paramiko")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False


def verb_parser_of(parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the verb ``args`` chose (``pool up``: the innermost)."""
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return verb_parser_of(chosen, args)
    return parser


BROKEN_PIPE = 128 + 13  # what a shell reports for a program SIGPIPE ended


def main(argv: list[str] | None = None) -> int:
    """Run one verb with the terminal guarded (:func:`~cluster_sessions.core.terminal.guarded`):
    whatever a verb prints, no control character reaches the terminal and no character the
    output's encoding lacks stops it."""
    with guarded():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    quiet_libraries()
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # said with the verb's own usage, not the top level's
        verb_parser_of(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that went away shows here, not after the exit code
        return code
    except ClusterSessionsError as exc:  # every error of ours: its class says the exit code
        code, lines = outcome(args.verb, exc)
        for line in lines:
            print(line, file=sys.stderr)
        if getattr(args, "json", False) and not getattr(sys.stdout, "written", 1):
            # a --json verb stopped before its own document: CI still gets one on stdout
            print(json.dumps(error_document(args.verb, code, exc), ensure_ascii=False))
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): the verb did not finish, so never report
        # success; exit as a program killed by SIGPIPE does (128 + 13), quietly.
        drop_output()
        return BROKEN_PIPE
    except Exception as exc:  # a bug: say so without a traceback unless asked
        if os.environ.get("SESSIONCTL_DEBUG"):
            raise
        print(f"sessionctl {args.verb}: internal error: {type(exc).__name__}: {printable(exc)} "
              "(set SESSIONCTL_DEBUG=1 for a traceback)", file=sys.stderr)
        return Exit.ENGINE


if __name__ == "__main__":
    sys.exit(main())
