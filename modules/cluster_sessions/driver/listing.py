"""``sessionctl ls``: the sessions in the state backend, each with what its engines say now.

The stacks come from the backend (the Automation API's ``list_stacks``, so the same backend the
engine verbs use); what each session is (name, type, mode, hosts, agents and their
``docker_host``) from its stack outputs, so ``ls`` needs no definition file. The status is read
from the agents' engines by label, as ``status`` does:

- ``running``: every host's container runs;
- ``finished``: a batch job's main1 has exited (with its exit code);
- ``degraded``: some container exited, restarts, is dead or missing (named);
- ``unreachable``: an agent did not answer (named, with the cause);
- ``down``: the stack holds the session but no container of it is found;
- ``empty``: the stack holds nothing (destroyed, or never up).

Exit 0 when the list was read (``ls`` describes; ``status`` judges), 4 without the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..agents.engine import session_containers
from ..core.loader import load_file
from ..core.spec import Agent, Pool
from ..core.terminal import table
from . import stacks
from .errors import CommandError, Exit
from .observe import (
    Connect,
    Found,
    connect,
    disconnect,
    found_from_attrs,
    unreachable_cause,
)
from .session_args import verb_parser


@dataclass(frozen=True)
class Listed:
    stack: str
    name: str
    type: str
    mode: str
    size: int
    agents: tuple[str, ...]
    state: str  # running | finished | degraded | unreachable | down | empty
    detail: str = ""
    exit_code: int | None = None


def session_state(kind: str, hosts: Sequence[str], found: Sequence[Found],
                  unreachable: Mapping[str, str]) -> tuple[str, str, int | None]:
    """(state, detail, job exit code) of one session from what its agents hold."""
    if unreachable:
        return "unreachable", "; ".join(f"{a}: {why}" for a, why in unreachable.items()), None
    if not found:
        return "down", "no container of it on its agents", None
    by_host = {f.host: f for f in found}
    main = by_host.get(hosts[0]) if hosts else None
    if kind == "batch" and main is not None and main.state in ("exited", "dead"):
        return "finished", f"exit code {main.exit_code}", main.exit_code
    wrong = [f"{h} {by_host[h].state}" if h in by_host else f"{h} missing" for h in hosts
             if h not in by_host or by_host[h].state != "running"]
    if wrong:
        return "degraded", ", ".join(wrong), None
    return "running", "", None


def stack_agents(session: Mapping[str, Any], agents: Mapping[str, Mapping[str, Any]],
                 project: Path) -> dict[str, Agent]:
    """The session's agents as its pool file describes them (with their SSH settings) when
    that file is still there, else as the stack recorded them (their docker_host)."""
    pool: Pool | None = None
    with contextlib.suppress(Exception):  # moved or changed since: fall back to the stack's
        found = load_file(project / str(session.get("pool", "")), expect="AgentPool")
        pool = found if isinstance(found, Pool) else None
    known = {a.name: a for a in pool.agents} if pool is not None else {}
    return {name: known.get(name) or Agent.model_validate(
                {"name": name, "docker_host": str(info["docker_host"]),
                 "capacity": {"cpu": 1, "mem": "1g"}})  # capacity is not used here
            for name, info in agents.items()}


def listed(stack: str, outputs: Mapping[str, Any], project: Path, connect: Connect) -> Listed:
    def value(key: str) -> Any:
        out = outputs.get(key)
        return getattr(out, "value", out)

    session = value("session") or {}
    if not session:
        return Listed(stack, stack, "-", "-", 0, (), "empty", "no resources in the stack")
    hosts = list(value("hosts") or [])
    agents = stack_agents(session, value("agents") or {}, project)
    found: list[Found] = []
    unreachable: dict[str, str] = {}
    for name, agent in agents.items():
        try:
            client = connect(agent)
        except Exception as exc:  # any failure to reach it: say so, go on with the others
            unreachable[name] = unreachable_cause(agent, exc)
            continue
        try:
            found += [found_from_attrs(name, c.attrs)
                      for c in session_containers(client, session["name"])]
        except Exception as exc:
            unreachable[name] = unreachable_cause(agent, exc)
        finally:
            disconnect(client)
    state, detail, code = session_state(session.get("type", "interactive"), hosts, found,
                                        unreachable)
    return Listed(stack, session["name"], session.get("type", "interactive"),
                  session.get("mode", "-"), len(hosts), tuple(agents), state, detail, code)


def listing_table(rows: Sequence[Listed]) -> str:
    return "\n".join(table(("NAME", "TYPE", "MODE", "SIZE", "AGENTS", "STATUS"), (
        (r.name, r.type, r.mode, str(r.size), ",".join(r.agents) or "-",
         r.state + (f" ({r.detail})" if r.detail else ""))
        for r in rows)))


def cmd_ls(args: argparse.Namespace, connect: Connect = connect) -> int:
    project = stacks.find_project([Path.cwd(), Path(__file__).resolve().parent])
    if project is None:
        raise CommandError(f"no Pulumi project {stacks.PROJECT_NAME!r} (Pulumi.yaml) found "
                           "above the current directory or the installed package", Exit.MISSING)
    settings = stacks.engine_settings(os.environ, project)
    pulumi = stacks.find_pulumi(os.environ)
    if pulumi is None:
        raise CommandError(stacks.how_to_install(), Exit.MISSING)
    workspace: Any = None
    summaries: list[Any] = []
    if settings.state_dir is None or settings.state_dir.exists():  # else: before the first up
        from pulumi import automation as auto

        workspace = stacks.open_workspace(project, settings, pulumi)
        try:
            summaries = workspace.list_stacks()
        except auto.errors.CommandError as exc:
            raise CommandError(f"cannot list the stacks in {settings.backend_url}: "
                               f"{str(exc).strip()}", Exit.ENGINE) from None
    rows = []
    for summary in sorted(summaries, key=lambda s: s.name):
        outputs = workspace.stack_outputs(summary.name)
        if outputs and "session" not in outputs:
            continue  # a pool stack (`sessionctl pool up`), not a session
        rows.append(listed(summary.name, outputs, project, connect))
    if args.json:
        json.dump({"backend": settings.backend_url, "sessions": [asdict(r) for r in rows]},
                  sys.stdout, indent=2, ensure_ascii=False)
        print()
    elif rows:
        print(listing_table(rows))
    else:
        print(f"no sessions in {settings.backend_url}", file=sys.stderr)
    return Exit.OK


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "ls", "the sessions in the state backend and how their containers are",
        "List the session stacks of the state backend (PULUMI_BACKEND_URL, else the "
        "project's file backend) with name, type, mode, size, agents and a status read "
        "from the engines now: running, finished (a batch job, with its exit code), "
        "degraded (which hosts), unreachable (which agents), down or empty. Needs the "
        "pulumi CLI to read the backend (exit 4 without it).",
        epilog="exit codes: 0 listed, 1 the backend could not be read, 4 no pulumi CLI")
    p.add_argument("--json", action="store_true",
                   help="print {backend, sessions: [...]} as JSON instead of a table")
    p.set_defaults(func=cmd_ls)
