"""``sessionctl top FILE|NAME``: what a session's containers use now, beside what they were
allocated (issue 43; contract 9 for ``--once --json``).

One sample is two stats readings of each container a second apart on every agent of the
session's pool, at once (:mod:`cluster_sessions.agents.sampling`; the arithmetic:
:mod:`cluster_sessions.core.stats`). On a terminal the table is drawn again in place every
``--interval`` seconds until Ctrl-C (which ends it quietly, exit 0 or 1 as the last sample);
``--once`` takes one sample; not on a terminal, one sample unless ``--watch``. ``--json``
prints one document (one per sample, one per line, with ``--watch``). A reader that goes away
(``| head``) ends it as every verb ends then (:data:`.cli.BROKEN_PIPE`).

FILE is a definition (``--pool``, ``--index`` as for every session verb); NAME a session
stack of the configured backend, whose config names its definition. Exit 0; 1 when an agent
did not answer (its row says why, the others are shown) or no container of the session was
found; 2 for bad input (the file and the field named).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core import stats
from ..core.spec import Agent
from ..core.terminal import dumps, printable, redraw, table
from .errors import CommandError, Exit
from .session_args import add_session_args, positive_seconds, verb_parser


@dataclass(frozen=True)
class Target:
    session: str
    agents: tuple[Agent, ...]
    mine: Callable[[str], bool] | None
    described: str  # how the verb names it


def target_of(args: argparse.Namespace) -> Target:
    """The session FILE (or NAME) means, its pool's agents, and which objects are its."""
    from .observe import own_objects
    from .session_args import load_definition, select

    ref = Path(args.file)
    if not ref.exists() and "/" not in args.file and not args.file.endswith((".yaml", ".yml")):
        file, pool, index = definition_of_stack(args.file)
        args.index = args.index or index
        stack = args.file
    else:
        file, pool, stack = ref, Path(args.pool) if args.pool is not None else None, None
    if args.pool is not None:
        pool = Path(args.pool)
    loaded = load_definition(file, pool)  # DefinitionError: exit 2, file and field named
    plan = select(loaded, args.index).one("top shows one session")
    return Target(plan.name, tuple(loaded.pool.agents),
                  own_objects(stack or plan.name, loaded.session_file),
                  f"session {plan.name} on pool {loaded.pool.name}")


def definition_of_stack(name: str) -> tuple[Path, Path | None, int | None]:
    """The definition, pool and index the session stack ``name`` was made from (its config),
    or invalid input naming what was looked for."""
    import os

    from . import stack_settings, stacks

    project = stacks.find_project([Path.cwd(), Path(__file__).resolve().parent])
    pulumi = stacks.find_pulumi(os.environ)
    missing = CommandError(f"{name}: no such definition file, and no session stack {name!r} in "
                           "the backend (give the definition: sessionctl top FILE)",
                           Exit.INVALID)
    if project is None or pulumi is None:
        raise missing
    settings = stacks.engine_settings(os.environ, project)
    if settings.state_dir is not None and not settings.state_dir.exists():
        raise missing
    try:
        workspace = stacks.open_workspace(project, settings, pulumi)
        if name not in {s.name for s in workspace.list_stacks()}:
            raise missing
        config = {k: v.value for k, v in workspace.get_all_config(name).items()}
    except CommandError:
        raise
    except Exception as exc:
        raise CommandError(f"could not read the config of stack {name}: {printable(exc)}",
                           Exit.ENGINE) from None
    definition = config.get(stack_settings.CONFIG_DEFINITION)
    if not definition:
        raise missing
    base = project / stacks.STACKS_DIR
    pool = config.get(stack_settings.CONFIG_POOL)
    index = config.get(stack_settings.CONFIG_INDEX)
    return (base / definition, base / pool if pool else None,
            int(index) if index and str(index).isdigit() else None)


# --- text -----------------------------------------------------------------------------------


def cpu_cell(c: stats.ContainerUse) -> str:
    return f"{c.cpus:g} · {stats.percent_text(c.cpu_percent)}"


def mem_cell(c: stats.ContainerUse) -> str:
    limit = stats.human_size(c.mem_limit) if c.mem_limit else "-"
    return f"{limit} · {stats.human_size(c.mem_used)}"


def gpu_cell(c: stats.ContainerUse) -> str:
    if not c.gpu_ids:
        return "-"
    ids = ",".join(map(str, c.gpu_ids))
    if c.gpus is None:
        return f"{ids} · unknown"
    return f"{ids} · " + " ".join(stats.percent_text(g["util_percent"]) for g in c.gpus)


def net_cell(c: stats.ContainerUse) -> str:
    return f"{stats.human_size(c.net_rx)} / {stats.human_size(c.net_tx)}"


class Window:
    """Each container's cpu % over the last ``seconds`` of a watch (:func:`stats.
    window_average`), beside the sample's own figure."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.seen: dict[tuple[str, str], list[tuple[float, float | None]]] = {}

    def add(self, sampled) -> None:
        for c in sampled.containers:
            kept = self.seen.setdefault((c.agent, c.host), [])
            kept.append((sampled.sampled_at, c.cpu_percent))
            while kept and kept[0][0] < sampled.sampled_at - self.seconds:
                kept.pop(0)

    def average(self, c: stats.ContainerUse, now: float) -> float | None:
        return stats.window_average(self.seen.get((c.agent, c.host), ()), now, self.seconds)


def top_lines(target: Target, sampled, now_text: Callable[[float], str] | None = None,
              window: Window | None = None) -> list[str]:
    clock = now_text or stats.clock
    rows = []
    for c in sampled.containers:
        if c.state != "running":
            rows.append((c.host, c.agent, f"{c.cpus:g} · {c.state}", "-", "-", "-", "-",
                         *(("-",) if window else ())))
            continue
        avg = (stats.percent_text(window.average(c, sampled.sampled_at)),) if window else ()
        rows.append((c.host, c.agent, cpu_cell(c), *avg, mem_cell(c), str(c.pids),
                     net_cell(c), gpu_cell(c)))
    for agent in sorted(sampled.unreachable):
        rows.append(("?", agent, "unreachable", "-", "-", "-", "-", *(("-",) if window else ())))
    main = next((c for c in sampled.containers if c.host == "main1"
                 and c.state == "running"), None)
    head = f"{target.described} · sampled {clock(sampled.sampled_at)}"
    if main is not None:
        open_now = main.connections.get(stats.SSHD_PORT, 0)
        head += (f" · main1 last login {clock(main.last_login)}" if main.last_login
                 else " · main1: no login yet")
        if open_now:
            head += f" ({open_now} open)"
    avg_head = (f"CPU {window.seconds:g}s avg",) if window else ()
    lines = [printable(head), *table(("HOST", "AGENT", "CPU alloc · used", *avg_head,
                                      "MEM alloc · used", "PIDS", "NET rx / tx",
                                      "GPU alloc · used"), rows)]
    lines += [printable(f"agent {a}: {why}") for a, why in sorted(sampled.unreachable.items())]
    if not sampled.containers and not sampled.unreachable:
        lines.append(printable(f"no container of session {target.session} found on its "
                               "pool's agents (not up?)"))
    return lines


def document(target: Target, sampled, window: Window | None = None) -> dict:
    doc = stats.usage_document(target.session, sampled.sampled_at, sampled.containers)
    doc["unreachable"] = dict(sampled.unreachable)
    if window is not None:  # a watch: each container's cpu % over the window too
        doc["window_s"] = window.seconds
        for row, c in zip(doc["containers"], sampled.containers, strict=True):
            row["cpu_percent_avg"] = window.average(c, sampled.sampled_at)
    return doc


def code_of(sampled) -> int:
    return Exit.ENGINE if sampled.unreachable or not sampled.containers else Exit.OK


# --- the verb -------------------------------------------------------------------------------


def cmd_top(args: argparse.Namespace, sample: Callable | None = None) -> int:
    from ..agents import sampling
    from .observe import unreachable_cause

    take = sample or sampling.sample
    target = target_of(args)
    on_terminal = sys.stdout.isatty()
    watch = args.watch or (not args.once and not args.json and on_terminal)
    code = Exit.OK
    kept: dict = {}  # one connection per agent for the whole watch
    window = Window(args.window) if watch else None
    try:
        while True:
            began = time.monotonic()
            sampled = take(target.agents, target.session, target.mine,
                           interval=args.sample_interval, cause=unreachable_cause, kept=kept)
            code = code_of(sampled)
            if window is not None:
                window.add(sampled)
            if args.json:
                doc = document(target, sampled, window)
                print(dumps(doc) if watch else dumps(doc, indent=2))
                sys.stdout.flush()
            elif watch and on_terminal:
                redraw([*top_lines(target, sampled, window=window), "(Ctrl-C ends)"])
            else:
                print("\n".join(top_lines(target, sampled, window=window)))
                sys.stdout.flush()
            if not watch:
                return code
            time.sleep(max(0.0, args.interval - (time.monotonic() - began)))
            if not args.json and not on_terminal:
                print()
    except KeyboardInterrupt:  # how a watch ends: quietly, with the last sample's code
        return code
    finally:
        sampling.close_kept(kept)


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "top", "what a session's containers use now: cpu, memory, GPUs, network",
        "Per container of the session: the cores it was allocated and how busy they are (100 "
        "% = every allocated core busy), memory limit and used (page cache left out), pids, "
        "bytes received and sent, each allocated GPU's utilisation (`unknown` where the "
        "agent has no nvidia-smi), and main1's last SSH login. Two stats readings a second "
        "apart, every agent at once, one connection per agent. On a terminal it refreshes in "
        "place until Ctrl-C; elsewhere it samples once (--watch: again every --interval). "
        "FILE is a definition; NAME a session stack of the configured backend. Exit 1 when "
        "an agent did not answer (its row says so) or nothing of the session was found.")
    add_session_args(p)
    for action in p._actions:  # FILE, or the name of a session stack
        if action.dest == "file":
            action.metavar = "FILE|NAME"
            action.help = ("a ClusterSession definition (YAML), or the name of a session "
                           "stack of the configured backend")
    p.add_argument("--once", action="store_true", help="one sample, then exit")
    p.add_argument("--watch", action="store_true",
                   help="sample again every --interval, also when not on a terminal (with "
                   "--json: one document per line)")
    p.add_argument("--json", action="store_true",
                   help="print {session, sampled_at, containers: [{host, agent, cpus, "
                   "cpu_percent, mem_limit, mem_used, pids, net_rx, net_tx, gpus: [{id, "
                   "util_percent, mem_used, mem_total}] | null, last_login, source: cgroup "
                   "(the agent's cgroup files, over SSH) | api (the engine's stats), ...}], "
                   "unreachable}")
    p.add_argument("--interval", type=positive_seconds, default=2.0, metavar="S",
                   help="seconds between samples with --watch or on a terminal (default 2)")
    p.add_argument("--window", type=positive_seconds, default=60.0, metavar="S",
                   help="while watching, also each container's mean cpu %% over the last S "
                   "seconds (default 60; JSON: cpu_percent_avg)")
    p.add_argument("--sample-interval", type=positive_seconds, default=1.0, metavar="S",
                   help="seconds between the two stats readings of one sample (default 1)")
    p.set_defaults(func=cmd_top)


# --- `ls --sample` (driver/listing.py) ------------------------------------------------------


def used_of_session(containers: Sequence[stats.ContainerUse]) -> dict:
    """``ls``'s ``used``: the mean cpu % and GPU % of the session's containers, and whether
    it has GPUs nobody can tell about."""
    used = stats.session_used(containers)
    return {**used, "gpus": any(c.gpu_ids for c in containers),
            "measured": sum(c.state == "running" for c in containers)}


def used_cell(used: dict | None) -> str:
    """``cpu 87 %``, ``cpu 87 %, gpu 93 %`` (``gpu unknown`` without nvidia-smi); ``-``."""
    if not used or not used.get("measured"):
        return "-"
    text = f"cpu {stats.percent_text(used['cpu_percent'])}"
    if used.get("gpus"):
        text += (f", gpu {stats.percent_text(used['gpu_percent'])}"
                 if used["gpu_percent"] is not None else ", gpu unknown")
    return text


def idle_cell(row) -> str:
    if row.idle_since is None:
        return "busy" if row.used and row.used.get("measured") else "-"
    return stats.clock(row.idle_since)


def sample_listed(rows: Sequence, agents_of: dict[str, dict[str, Agent]],
                  sample: Callable | None = None) -> list:
    """``rows`` with ``used`` and ``idle_since`` for each running session in ``agents_of``:
    one sample of every labelled container on all their agents at once, split by session
    name."""
    from dataclasses import replace

    from ..agents import sampling

    take = sample or sampling.sample
    agents: dict[str, Agent] = {}
    for by_name in agents_of.values():
        for agent in by_name.values():
            agents.setdefault(repr(agent), agent)
    if not agents:
        return list(rows)
    sampled = take(list(agents.values()), None, None, interval=1.0)
    out = []
    for row in rows:
        if row.name in agents_of:
            mine = sampling.of_session(sampled, row.name)
            row = replace(row, used=used_of_session(mine),
                          idle_since=stats.idle_since(mine, sampled.started.get(row.name)))
        out.append(row)
    return out
