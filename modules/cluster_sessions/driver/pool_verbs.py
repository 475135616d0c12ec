"""``sessionctl pool check|up|destroy|sweep POOL``: the verbs about a pool's agents.

``pool check POOL``: every agent probed in parallel (SSH, Docker, swarm, CPUs, memory, GPUs, the
sessions it holds); a table on stdout, one line per failing agent on stderr, exit 1 if any
fails. ``--accept-new`` records the host key of an agent seen for the first time.

``pool up|destroy POOL``: the pool stack (``pool-<name>``), whose program builds the pool's
swarm (:mod:`cluster_sessions.pulumi_layer.pool_program`), run by the same stack runner as the
session verbs (:mod:`.stacks`): same backend, passphrase, confirmation and exit codes; 4
without the CLI. ``up`` first checks that every agent answers (nothing is created otherwise).

``pool usage POOL``: per agent, what running sessions' containers hold (cpu, mem, GPUs,
containers; from our labels, :mod:`cluster_sessions.core.usage`) against the declared capacity;
exit 1 when an agent could not be asked.

``pool sweep POOL --session NAME``: remove every container and network labelled with the
session on every agent, then verify none is left (``--dry-run`` only lists them, each with the
stack id it carries). It is the operator's tool, so by default it removes the name's objects
whichever stack holds them; ``--stack-id ID`` limits it to one stack's (``none``: those made
before stack ids), as a refused ``up`` suggests.

``pool reap POOL``: end the pool's idle and expired sessions through their stacks' destroy
(:mod:`.reap_verb`).

``pool pull POOL IMAGE``: the image resolved once (a registry's digest, or the image ID every
agent holds) and pulled onto every agent that lacks it, all at once, with the progress ``up``
shows; then the digest and image ID per agent (issue 33, :mod:`.image_step`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.names import POOL_DEFINITION_KEY, config_key, session_label_filter
from ..core.spec import Pool, clean_target
from ..core.terminal import printable, table
from .errors import CommandError, Exit
from .pool_files import load_pool, pool_path  # noqa: F401 (the verbs' names for them)

POOL_CONFIG = config_key(POOL_DEFINITION_KEY)


# --- pools --------------------------------------------------------------------------------------


def project_dir() -> Path | None:
    from .stacks import find_project

    return find_project([Path.cwd(), Path(__file__).resolve().parent])


def _gib(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**30:.1f}g"


def _cpu(millicpu: int | None) -> str:
    return "-" if millicpu is None else f"{millicpu / 1000:g}"


def check_table(reports: Sequence[Any]) -> str:
    header = ("AGENT", "REACHABLE", "DOCKER", "SWARM", "CPU free/total", "MEM free/total",
              "GPUS free/total", "SESSIONS")
    rows = []
    for r in reports:
        total, free = r.total, r.free
        rows.append((
            r.name,
            "yes" if r.reachable else "no",
            r.docker_version or "-",
            r.swarm_role,
            f"{_cpu(free.millicpu if free else None)}/{_cpu(total.millicpu if total else None)}",
            f"{_gib(free.mem if free else None)}/{_gib(total.mem if total else None)}",
            (f"{len(free.gpus) if free else '-'}/{len(total.gpus)}"
             if total and total.gpus else "-"),
            ",".join(r.sessions) or "-",
        ))
    return "\n".join(table(header, rows))


def report_document(pool: Pool, reports: Sequence[Any], notes: Sequence[str],
                    swarm_formed: bool = True) -> dict:
    def free(f):
        return None if f is None else {"cpu": f.millicpu / 1000, "mem": f.mem,
                                       "gpus": list(f.gpus)}
    return {
        "pool": pool.name,
        "ok": all(r.ok for r in reports) and swarm_formed,
        "swarm_formed": swarm_formed,
        "agents": [{
            "name": r.name,
            "via": r.via,
            "reachable": r.reachable,
            "ok": r.ok,
            "docker_version": r.docker_version,
            "engine_id": r.engine.engine_id if r.engine else None,
            "swarm": ({"role": r.swarm.role, "node_id": r.swarm.node_id,
                       "node_addr": r.swarm.node_addr} if r.swarm else None),
            "machine": {"cpus": r.cpus, "mem": r.mem,
                        "gpus": list(r.gpus.ids) if r.gpus and r.gpus.present else None},
            "total": free(r.total),
            "free": free(r.free),
            "sessions": r.sessions,
            "encryption": ({"supported": r.encryption.supported, "detail": r.encryption.detail}
                           if r.encryption else None),
            "problems": [{"cause": p.cause, "message": str(p)} for p in r.problems],
            "warnings": list(r.warnings),
        } for r in reports],
        "notes": list(notes),
    }


def image_holdings(pool: Pool, reports: Sequence[Any], ref: str) -> dict[str, str | None]:
    """Per reachable agent, the ID of the image it holds under ``ref`` (None: it lacks it).
    Whether an agent has the image is not a fault of the agent: ``up`` pulls it."""
    from ..agents.images import each_agent, inspect_held

    reachable = [r.name for r in reports if r.reachable]
    found = each_agent(pool, reachable, lambda client, agent: inspect_held(client, agent, ref))
    return {agent: (h.image_id or None) if not isinstance(h, Exception) else None
            for agent, h in found.items()}


def scratch_roots(pool: Pool, fix: bool, only: Sequence[str] | None = None) -> dict[str, str]:
    """Per agent that delivers bundles into its scratch root (core/bundles.py), in parallel:
    ``ok`` (usable), ``made`` or ``kept`` (``fix``: made if missing, agents/bundles.py
    make_root), or the problem, naming the agent and the path. Agents reached only through
    ``tcp://`` are left out: their containers get the provider's upload; so are agents not in
    ``only`` (those a probe found unusable: their problem is said once)."""
    from concurrent.futures import ThreadPoolExecutor

    from ..agents.bundles import check_root, make_root
    from ..agents.connectors import AgentError, connector_for
    from ..core.bundles import SCRATCH, delivery_of

    root = clean_target(pool.scratch)
    agents = [a for a in pool.agents if delivery_of(a, pool) == SCRATCH
              and (only is None or a.name in only)]

    def one(agent: Any) -> str:
        try:
            with connector_for(agent) as conn:
                verdict = make_root(conn, root) if fix else "ok"
                check_root(conn, root)
                return verdict
        except AgentError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(agents)))) as workers:
        return dict(zip([a.name for a in agents], workers.map(one, agents), strict=True))


def cmd_pool_check(args: argparse.Namespace) -> int:
    from ..agents.capacity import probe_pool, swarm_unready

    pool, _path = load_pool(args.pool)
    reports = probe_pool(pool, encryption=pool.network.encrypted,
                         host_keys="accept-new" if args.accept_new else "strict",
                         connect_timeout=args.timeout)
    for r in reports:
        enc = r.encryption
        if enc is not None and enc.supported is False:
            r.fail("misconfigured", f"the pool asks for encrypted overlays, which cannot carry "
                   f"traffic between agents here: {enc.detail} (docs/encrypted-overlay.md)")
        elif enc is not None and enc.supported is None:
            r.warnings.append(f"encrypted overlay support unknown: {enc.detail}")
    notes = []
    by_name = {r.name: r for r in reports}
    usable = [r.name for r in reports if r.ok]
    for agent, verdict in scratch_roots(pool, fix=args.fix, only=usable).items():
        r = by_name[agent]
        if verdict in ("made", "kept", "ok"):
            if verdict == "made":
                notes.append(f"agent {agent}: scratch root {clean_target(pool.scratch)} made "
                             "(the SSH user's, 0700)")
        elif args.fix:
            r.fail("misconfigured", verdict)
        else:
            r.warnings.append(f"{verdict}; `sessionctl pool check --fix {args.pool}` makes "
                              "it where it is missing")
    swarm_problems = []
    unready = None
    if pool.swarm is not None and len(pool.agents) > 1:
        unready = swarm_unready(pool, reports, [a.name for a in pool.agents], pool_ref=args.pool)
        swarm_problems = unready[1] if unready else []
        if swarm_problems:
            notes.append(f"swarm of {pool.swarm.manager} not formed or incomplete; multi-agent "
                         f"sessions need `sessionctl pool up {args.pool}`:")
            notes += [f"  {p}" for p in swarm_problems]
        elif all(r.engine for r in reports):
            notes.append(f"swarm: {len(pool.agents)} nodes, manager {pool.swarm.manager}")
    held = image_holdings(pool, reports, args.image) if args.image else None
    if held is not None:
        lacking = [a for a, h in held.items() if not h]
        notes.append(f"image {args.image}: " + (
            f"missing on {', '.join(lacking)}: `up` pulls it there first, or `sessionctl pool "
            f"pull {args.pool} {args.image}` now" if lacking else "on every agent"))
    if args.json:
        doc = report_document(pool, reports, notes, swarm_formed=not swarm_problems)
        if held is not None:
            doc["image"] = {"reference": args.image, "held": held}
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(check_table(reports))
        for note in notes:
            print(printable(note))
    for r in reports:  # warnings and problems quote what the agents answered
        for w in r.warnings:
            print(printable(f"warning: agent {r.name}: {w}"), file=sys.stderr)
    failing = [r for r in reports if not r.ok]
    for r in failing:
        for p in r.problems:
            print(printable(p), file=sys.stderr)
    if failing:
        print(f"pool {pool.name}: {len(failing)} of {len(reports)} agent(s) failed the check",
              file=sys.stderr)
        return Exit.ENGINE
    if unready:  # every agent works, but a session across them would not
        print(f"pool {pool.name}: {unready[0]}", file=sys.stderr)
        return Exit.ENGINE
    return Exit.OK


def ledger_view(pool, entries: list | None = None) -> dict:
    """What the pool's ledger holds now (agents.pool_ledger): who decides a placement, the
    reservations of sessions being placed, the queue of ``up --wait``; times are the ledger
    engine's, as seconds since the epoch, and ``until`` is when a lease runs out. The live
    entries themselves are appended to ``entries`` (the projects' usage counts them)."""
    from ..agents.pool_ledger import Ledger, ledger_agent

    def entry(e) -> dict:
        return {"session": e.session, "holder": e.holder.describe() if e.holder else None,
                "since": round(e.arrival, 3), "until": round(e.until, 3),
                "project": e.project, "priority": e.priority,
                **({"holds": dict(e.holds)} if e.kind == "reservation" else {})}

    view: dict = {"agent": ledger_agent(pool).name}
    try:
        with Ledger.open(pool) as ledger:
            now = ledger.now()
            lock = ledger.lock_holder()
            reserved, queued = ledger.read("reservation", now), ledger.read("queue", now)
            if entries is not None:
                entries += [*reserved.entries, *queued.entries]
            view.update(now=round(now, 3),
                        lock=({**entry(lock), "marker": lock.container_id[:12]}
                              if lock and not lock.expired(now) else None),
                        reservations=[entry(e) for e in reserved.entries],
                        queue=[entry(e) for e in queued.entries],
                        malformed=[f"{e.kind} marker {e.name}: {'; '.join(e.malformed)}; "
                                   "it holds nothing" for e in
                                   (*reserved.malformed, *queued.malformed)])
    except Exception as exc:  # the ledger agent down: say so, the usage above still stands
        view["error"] = f"could not read the ledger on agent {view['agent']}: {exc}"
    return view


def ledger_text(view: dict) -> list[str]:
    """What :func:`ledger_view` found, one printable line per entry (a holder's text is
    another user's: escaped line by line, never joined into one line with ``\\n``). Each lease
    says what it is: the holder renews it while it runs, so it only runs out for a holder that
    stopped (killed, or its machine gone), and then the entry no longer counts."""
    if "error" in view:
        return [printable(view["error"])]
    now = view["now"]

    def ago(e: dict) -> str:
        left = max(0.0, e["until"] - now)
        return (f"for {now - e['since']:.0f}s; its lease, renewed while that sessionctl runs, "
                f"would lapse in {left:.0f}s if it stopped")

    lock = view["lock"]
    lines = [f"placements on this pool are decided one at a time on agent {view['agent']}: "
             + (f"now by {lock['holder'] or 'an unnamed holder'} ({ago(lock)}; marker "
                f"{lock['marker']}: `sessionctl pool sweep POOL --lock` removes it)" if lock
                else "nobody deciding now")]
    for e in view["reservations"]:
        held = "; ".join(f"{agent}: cpu {h['cpu'] / 1000:g}, mem {_gib(h['mem'])}"
                         + (f", gpus {','.join(map(str, h['gpus']))}" if h["gpus"] else "")
                         for agent, h in sorted(e["holds"].items()))
        lines.append(f"reserved for {e['session']} by {e['holder']} ({ago(e)}): {held}")
    for i, e in enumerate(view["queue"], 1):
        lines.append(f"queued #{i}: {e['session']} by {e['holder']} (waiting {ago(e)})")
    lines += [f"malformed: {m}" for m in view.get("malformed", ())]
    return [printable(line) for line in lines]


def cmd_pool_usage(args: argparse.Namespace) -> int:
    from ..agents.capacity import probe_pool
    from ..core.usage import agent_usage, usage_text, usage_to_dict

    pool, _path = load_pool(args.pool)
    reports = probe_pool(pool, connect_timeout=args.timeout)
    declared = {a.name: a.capacity for a in pool.agents}
    usage = [agent_usage(r.name, declared.get(r.name), r.held) for r in reports if r.ok]
    failing = [r for r in reports if not r.ok]
    malformed = [line for r in reports if r.ok for line in r.malformed]
    entries: list = []
    ledger = ledger_view(pool, entries)
    projects = project_rows(pool, [r for r in reports if r.ok], entries)
    measured = None if args.no_sample else measure_pool(pool, [u.agent for u in usage])
    if args.json:
        doc = {"pool": pool.name, "agents": [usage_to_dict(u) for u in usage],
               "ledger": ledger, "malformed": malformed, "projects": projects,
               "unreachable": {r.name: "; ".join(str(p) for p in r.problems)
                               for r in failing}}
        if measured is not None:
            doc.update(used_document(usage, measured))
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print("\n".join(table(
            ("AGENT", "CPU alloc/declared", "MEM alloc/declared", "GPUS alloc/declared",
             "CONTAINERS", "STOPPED", "SESSIONS"),
            ((u.agent, f"{_cpu(u.millicpu)}/{_cpu(u.declared_millicpu)}",
              f"{_gib(u.mem)}/{_gib(u.declared_mem)}",
              f"{','.join(map(str, u.gpus)) or '-'}/{','.join(map(str, u.declared_gpus)) or '-'}",
              str(u.containers), str(u.stopped), ",".join(u.sessions) or "-")
             for u in usage))))
        if measured is not None:
            for line in used_text(usage, measured):
                print(printable(line))
        governed = pool.policies.projects or any(
            v is not None for v in pool.policies.default.quota.model_dump().values())
        for row in projects if governed else ():
            print(printable(project_line(row)))
        for line in ledger_text(ledger):
            print(line)
        for line in malformed:
            print(printable(f"malformed: {line}"))
        for u in usage:
            if u.over:
                print(printable(f"warning: {usage_text(u)}"), file=sys.stderr)
    for r in failing:
        for problem in r.problems:
            print(printable(problem), file=sys.stderr)
    if measured is not None:
        for agent, why in sorted(measured.unreachable.items()):
            print(printable(f"agent {agent}: not sampled: {why}"), file=sys.stderr)
    return Exit.ENGINE if failing or (measured is not None and measured.unreachable) \
        else Exit.OK


def project_rows(pool: Pool, reports: Sequence[Any], entries: Sequence[Any]) -> list[dict]:
    """Per project of the pool (the default policy's first): what its sessions hold now
    (containers and reservations, as ``up`` counts them under the lock), its quota, how many
    of its sessions wait in the queue (issue 44)."""
    from ..core import governance
    from ..core.spec import DEFAULT_PROJECT
    from .placing import held_by_projects

    reservations = [e for e in entries if e.kind == "reservation"]
    held = held_by_projects(reports, reservations)
    rows = []
    for name in (DEFAULT_PROJECT, *pool.policies.projects):
        quota = pool.policies.of(name).quota
        use = governance.held_by(name, held)
        rows.append({
            "project": name,
            "held": {"cpu": use.millicpu / 1000, "mem": use.mem, "gpus": use.gpus,
                     "containers": use.containers, "sessions": use.sessions},
            "quota": {k: getattr(quota, k) for k in type(quota).model_fields
                      if getattr(quota, k) is not None},
            "pending": sum(1 for e in entries if e.kind == "queue" and e.project == name),
        })
    return rows


def project_line(row: dict) -> str:
    """``project vision: cpu 2/64, mem 4g/512g, ..., pending 0/8``: held / quota (``-``: no
    limit)."""
    from ..core.units import format_size

    quota, held = row["quota"], row["held"]

    def shown(key: str, value: object) -> str:
        return format_size(int(value)) if key == "mem" and value else f"{value:g}" \
            if isinstance(value, float) else str(value)

    parts = [f"{k} {shown(k, held[k])}/{shown(k, quota[k]) if k in quota else '-'}"
             for k in ("cpu", "mem", "gpus", "containers", "sessions")]
    parts.append(f"pending {row['pending']}/{quota.get('pending', '-')}")
    return f"project {row['project']}: " + ", ".join(parts)


def measure_pool(pool: Pool, agents: Sequence[str]) -> Any:
    """One sample of every labelled container on ``agents`` (``sessionctl top``'s sampling)."""
    from ..agents.sampling import sample

    return sample([pool.agent(a) for a in agents], None, logins=False)


def _by(measured: Any, key: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for c in measured.containers:
        out.setdefault(getattr(c, key), []).append(c)
    return out


def used_document(usage: Sequence[Any], measured: Any) -> dict:
    """``pool usage --json``'s figures of use: per agent (``used`` beside ``allocated``), the
    pool's totals, each session's share."""
    from ..core.stats import used_of

    by_agent = _by(measured, "agent")
    per_agent = {u.agent: used_of(by_agent.get(u.agent, ())).to_dict() for u in usage}
    sessions = []
    for name, rows in sorted(_by(measured, "session").items()):
        running = [c for c in rows if c.state == "running"]
        sessions.append({
            "session": name, "agents": sorted({c.agent for c in running}),
            "allocated": {"cpu": sum(c.cpus for c in running),
                          "mem": sum(c.mem_limit or 0 for c in running),
                          "gpus": sorted({g for c in running for g in c.gpu_ids})},
            "used": used_of(running).to_dict()})
    total = used_of(measured.containers).to_dict()
    return {"used": per_agent, "sessions": [s for s in sessions if s["agents"]],
            "totals": {"declared": {"cpu": sum(u.declared_millicpu for u in usage) / 1000,
                                    "mem": sum(u.declared_mem for u in usage),
                                    "gpus": sum(len(u.declared_gpus) for u in usage)},
                       "allocated": {"cpu": sum(u.millicpu for u in usage) / 1000,
                                     "mem": sum(u.mem for u in usage),
                                     "gpus": sum(len(u.gpus) for u in usage)},
                       "used": total},
            "sampled_at": round(measured.sampled_at, 3)}


def used_text(usage: Sequence[Any], measured: Any) -> list[str]:
    """Bars per agent and for the pool (allocated of declared, used of allocated), then each
    session's share."""
    from ..core.stats import bar_lines, human_size, percent_text, used_of

    by_agent = _by(measured, "agent")
    lines: list[str] = []
    width = max([len(u.agent) for u in usage] + [len("pool")])
    for u in usage:
        lines += bar_lines(u.agent.ljust(width), u.millicpu / 1000, u.declared_millicpu / 1000,
                           u.mem, u.declared_mem, len(u.gpus), len(u.declared_gpus),
                           used_of(by_agent.get(u.agent, ())))
    if len(usage) > 1:
        lines += bar_lines("pool".ljust(width), sum(u.millicpu for u in usage) / 1000,
                           sum(u.declared_millicpu for u in usage) / 1000,
                           sum(u.mem for u in usage), sum(u.declared_mem for u in usage),
                           sum(len(u.gpus) for u in usage),
                           sum(len(u.declared_gpus) for u in usage),
                           used_of(measured.containers))
    for name, rows in sorted(_by(measured, "session").items()):
        running = [c for c in rows if c.state == "running"]
        if not running:
            continue
        used = used_of(running)
        cpus = sum(c.cpus for c in running)
        mem = sum(c.mem_limit or 0 for c in running)
        gpus = sorted({g for c in running for g in c.gpu_ids})
        text = (f"session {name}: cpu {cpus:g} (used {used.cores:.1f}, "
                f"{percent_text(100 * used.cores / cpus if cpus else None)}), mem "
                f"{human_size(mem)} (used {human_size(used.mem)})")
        if gpus:
            text += (f", gpus {','.join(map(str, gpus))} ("
                     + ("unknown" if used.gpu_percent is None else percent_text(used.gpu_percent))
                     + ")")
        lines.append(text)
    return lines


def stack_id_arg(value: str) -> str:
    """``--stack-id``: a stack id as labels carry it, or ``none`` (objects without one)."""
    from ..core.decisions import valid_stack_id

    if value == "none":
        return ""
    if not valid_stack_id(value):
        raise argparse.ArgumentTypeError("must be a stack id (16 hex digits) or none")
    return value


def cmd_pool_sweep(args: argparse.Namespace) -> int:
    from ..agents.cleanup import sweep

    pool, _path = load_pool(args.pool)
    if args.lock:
        return sweep_lock(pool, args.dry_run)
    if args.scratch:
        return sweep_scratch(pool, args.dry_run, args.older_than)
    if args.session is None:
        raise CommandError("pool sweep: give --session NAME (a session's objects), --lock "
                           "(the pool's lock) or --scratch (bundles of stacks that are gone)",
                           Exit.INVALID)
    wanted = args.stack_id
    mine = None if wanted is None else (lambda label: label == wanted)
    report = sweep(pool, args.session, dry_run=args.dry_run, mine=mine)
    if args.dry_run:
        for item in report.remaining:
            print(printable(f"{item} [stack id {item.owner.stack_id or 'none'}]"))
        for err in report.errors:
            print(printable(err), file=sys.stderr)
        print(f"session {args.session}: {len(report.remaining)} object(s) found", file=sys.stderr)
        return Exit.ENGINE if report.errors else Exit.OK
    for item in report.removed:
        print(printable(f"removed {item}"))
    print(printable(report.summary()), file=sys.stderr)
    return Exit.OK if report.clean else Exit.ENGINE


def sweep_scratch(pool: Pool, dry_run: bool, older_than: float) -> int:
    """``pool sweep POOL --scratch``: remove the bundle directories (``<scratch>/<stack id>/``,
    issue 45) of stacks that no longer exist: no container or network of ours on any agent of
    the pool carries the id (the engines are the truth of what is held, not one backend's
    state), and the directory has not changed for ``older_than`` seconds (an ``up`` writes its
    bundles before it creates its containers). Every agent must answer (an agent that does
    not may hold the stack's containers): else nothing is removed, exit 1."""
    from ..agents.bundles import stacks_on, sweep_stack
    from ..agents.connectors import AgentError, connector_for
    from ..agents.engine import live_stacks
    from ..core.bundles import SCRATCH, delivery_of

    root = clean_target(pool.scratch)
    live: set[str] = set()
    found: dict[str, dict[str, float]] = {}
    errors = []
    for agent in pool.agents:
        try:
            with connector_for(agent) as conn:
                client = conn.docker_client()
                try:
                    live |= live_stacks(client)
                finally:
                    client.close()
                if delivery_of(agent, pool) == SCRATCH:
                    found[agent.name] = stacks_on(conn, root)
        except Exception as exc:  # AgentError, the SDK's: the agent could not be asked
            errors.append(f"agent {agent.name}: {exc}" if not isinstance(exc, AgentError)
                          else str(exc))
    if errors:
        for err in errors:
            print(printable(err), file=sys.stderr)
        print(f"pool {pool.name}: not every agent answered; nothing was removed",
              file=sys.stderr)
        return Exit.ENGINE
    removed = 0
    for agent in pool.agents:
        for stack_id, age in sorted(found.get(agent.name, {}).items()):
            if stack_id in live or age < older_than:
                continue
            where = f"agent {agent.name}: {root}/{stack_id}"
            if dry_run:
                print(printable(f"{where} (no stack of the pool holds it)"))
                continue
            with connector_for(agent) as conn:
                sweep_stack(conn, root, stack_id)
            print(printable(f"removed {where}"))
            removed += 1
    print(f"pool {pool.name}: {removed} scratch director{'y' if removed == 1 else 'ies'} "
          "removed" if not dry_run else f"pool {pool.name}: dry run", file=sys.stderr)
    return Exit.OK


def sweep_lock(pool: Pool, dry_run: bool) -> int:
    """``pool sweep POOL --lock``: remove the pool's lock whoever holds it (a forged one, or a
    stuck one), saying whose it claimed to be. An ``up`` that really held it decides again
    (a decision that lost its lock is made anew: agents.pool_ledger)."""
    from ..agents.pool_ledger import Ledger

    with Ledger.open(pool) as ledger:
        current = ledger.lock_holder() if dry_run else ledger.remove_lock()
    if current is None:
        print(f"pool {pool.name}: nobody holds the lock", file=sys.stderr)
        return Exit.OK
    who = current.holder.describe() if current.holder else "an unnamed holder"
    print(printable(f"{'would remove' if dry_run else 'removed'} the lock of pool {pool.name} "
                    f"(marker {current.container_id[:12]}), held by {who}"))
    return Exit.OK


def cmd_pool_pull(args: argparse.Namespace) -> int:
    from ..agents.images import resolve
    from .image_step import credentials, pull

    pool, path = load_pool(args.pool)
    agents = args.agent or [a.name for a in pool.agents]
    unknown = [a for a in agents if a not in {x.name for x in pool.agents}]
    if unknown:
        raise CommandError(f"{path}: agents: no agent {', '.join(unknown)} in pool {pool.name}",
                           Exit.INVALID)
    auth = credentials(pool, path, args.image)
    kept, how = resolve(pool, agents, args.image, auth)
    done = pull(pool, agents, kept, None if kept.local else auth, "sessionctl pool pull",
                args.json)
    if args.json:
        json.dump({"pool": pool.name, "image": args.image, "digest": kept.digest,
                   "pinned": kept.pinned, "local": kept.local, "resolved": how,
                   "agents": [{"agent": d.agent, "how": d.how, "image_id": d.image_id}
                              for d in done]}, sys.stdout, indent=2)
        print()
        return Exit.OK
    print(printable(f"{args.image} -> {kept.pinned} ({how})"))
    print("\n".join(table(("AGENT", "PULL", "IMAGE ID"),
                          ((d.agent, d.how, d.image_id[:19]) for d in done))))
    return Exit.OK


def pool_stack_name(pool: Pool) -> str:
    from .stacks import stack_name_for

    return stack_name_for(f"pool-{pool.name}")


def cmd_pool_engine(args: argparse.Namespace) -> int:
    """``pool up|destroy``: the pool stack, run as the session stacks are (:mod:`.stacks`)."""
    from . import stacks

    verb = args.pool_verb
    pool, path = load_pool(args.pool)
    if pool.swarm is None:
        raise CommandError(f"{path}: swarm.manager: a pool stack builds the pool's swarm, and "
                           "this pool names no manager", Exit.INVALID)
    stack_name = pool_stack_name(pool)
    label = f"pool {pool.name}"

    def report(result: str, **extra: Any) -> None:
        if args.json:
            stacks.emit(stacks.summary_document(verb, stack_name, label,
                                                extra.pop("backend", None), result, **extra))

    prepared = stacks.prepare(verb, args, [path.resolve().parent, Path.cwd(),
                                           Path(__file__).resolve().parent], str(path), report)
    if verb == "up":
        from ..agents.capacity import PreflightError, probe_pool

        reports = probe_pool(pool)
        # made where missing, as `pool check --fix`
        roots = scratch_roots(pool, fix=True, only=[r.name for r in reports if r.ok])
        for r in reports:
            verdict = roots.get(r.name, "ok")
            if verdict not in ("made", "kept", "ok"):
                r.fail("misconfigured", verdict)
        if not all(r.ok for r in reports):
            err = PreflightError(pool, reports, "; nothing was created")
            report("missing-prerequisite", backend=prepared.settings.backend_url,
                   error=str(err))
            raise err
    stacks.started(prepared)
    where = stacks.config_path(path, prepared.project / stacks.STACKS_DIR)
    target = stacks.Target(stack_name, label, {POOL_CONFIG: where},
                           f"sessionctl pool {verb} {where}", f"sessionctl pool up {args.pool}")
    try:
        stacks.refuse_taken_stacks([target], prepared)
    except CommandError as exc:
        report("invalid", backend=prepared.settings.backend_url, error=str(exc))
        raise
    try:
        doc = stacks.run_stack(args, verb, target, prepared)
    except stacks.StackFailed as exc:
        report_doc = exc.doc
        if args.json:
            stacks.emit(report_doc)
        raise CommandError(str(exc), exc.code) from None
    if args.json:
        stacks.emit(doc)
    return Exit.OK


# --- registration -------------------------------------------------------------------------------


def register(subparsers) -> None:
    from .session_args import EPILOG, needs_pulumi

    fmt = argparse.RawDescriptionHelpFormatter
    pool = subparsers.add_parser(
        "pool", help="check an agent pool, its usage, build or remove its swarm, sweep leftovers",
        description="Agent pools: `check` probes every agent; `usage` shows allocated "
        "against declared capacity; `up`/`destroy` build or remove "
        "the pool's Docker Swarm (a pool stack, through the Automation API); `sweep` removes "
        "what a session left behind. POOL is a pool file, or a name looked up as a definition's "
        "`pool` is ($CLUSTER_SESSIONS_POOLS, then the project's stacks/pools).",
        epilog=EPILOG, formatter_class=fmt)
    verbs = pool.add_subparsers(dest="pool_verb", required=True, metavar="ACTION")

    p = verbs.add_parser("check", help="probe every agent: SSH, Docker, swarm, capacity, sessions",
                         description="Probe every agent of the pool in parallel and print a "
                         "table. Exit 0 when all can be used (and, for a pool with a swarm "
                         "manager and several agents, its swarm is formed), 1 otherwise (one "
                         "line per failing "
                         "agent on stderr), 2 for an invalid pool file.", formatter_class=fmt)
    p.add_argument("pool", metavar="POOL")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.add_argument("--image", metavar="IMAGE",
                   help="also say which agents lack IMAGE (e.g. a session's `image`): `up` "
                   "pulls it there first, `pool pull` does it ahead")
    p.add_argument("--accept-new", action="store_true",
                   help="record the SSH host key of agents seen for the first time in their "
                   "known_hosts file (a changed key is still refused)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="SSH connect timeout per agent (default 10)")
    p.add_argument("--fix", action="store_true",
                   help="make the pool's scratch root on every agent where it is missing: the "
                   "SSH user's (or, locally, this user's), mode 0700 (only that user and root "
                   "may enter it); through `sudo -n` where only root may make it")
    p.set_defaults(func=cmd_pool_check)

    for verb, text in (("up", "form the pool's swarm: init on the manager, join the others"),
                       ("destroy", "remove the pool's swarm: the workers leave, then the "
                        "manager")):
        p = verbs.add_parser(verb, help=text, epilog=EPILOG, formatter_class=fmt,
                             description=f"{text[0].upper()}{text[1:]}, as the pool stack "
                             "pool-NAME through the Automation API (needs the pulumi CLI; exit 4 "
                             "without it). Same backend and passphrase rules as `sessionctl up`.")
        p.add_argument("pool", metavar="POOL")
        p.add_argument("--json", action="store_true", help="print one JSON summary")
        p.add_argument("--yes", "-y", action="store_true",
                       help="do not ask for confirmation (required without a terminal)")
        p.set_defaults(func=cmd_pool_engine)
        needs_pulumi(p)

    p = verbs.add_parser("usage", help="allocated vs declared capacity on every agent",
                         description="Per agent of the pool: what the containers of running "
                         "sessions hold now (cpu, memory, GPUs, containers, read from their "
                         "cluster-sessions labels on the engine) against the capacity the pool "
                         "declares, and what they use of it (bars: allocated of declared, used "
                         "of allocated, per agent and for the pool; each session's share); "
                         "stopped containers are counted apart (placement still "
                         "reserves them). Exit 0, 1 when an agent could not be asked (named on "
                         "stderr), 2 for an invalid pool file.", formatter_class=fmt)
    p.add_argument("pool", metavar="POOL")
    p.add_argument("--json", action="store_true",
                   help="print {pool, agents: [{agent, declared, allocated, sessions, "
                   "stopped_containers, over}], used: {agent: {cpu, mem, gpu_percent}}, "
                   "totals, sessions: [{session, agents, allocated, used}], unreachable} "
                   "as JSON")
    p.add_argument("--no-sample", action="store_true",
                   help="allocation only: do not measure what the containers use (a sample "
                   "takes two stats readings a second apart on every agent)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="SSH connect timeout per agent (default 10)")
    p.set_defaults(func=cmd_pool_usage)

    p = verbs.add_parser("sweep", help="remove every container and network a session left",
                         description="Remove every container and network labelled "
                         f"{session_label_filter('NAME')} on every agent of the pool (overlays "
                         "through the swarm manager), then verify that none is left. Exit 0 "
                         "when clean, 1 otherwise.", formatter_class=fmt)
    p.add_argument("pool", metavar="POOL")
    p.add_argument("--session", metavar="NAME", help="the session's name")
    p.add_argument("--lock", action="store_true",
                   help="remove the pool's lock instead, whoever holds it (a forged or stuck "
                   "one: `pool usage` shows who holds it)")
    p.add_argument("--stack-id", type=stack_id_arg, metavar="ID",
                   help="only the objects of the stack with this id (16 hex digits, as a "
                   "refused `up` names it; `none`: objects without one); default: every "
                   "stack's objects of that session name")
    p.add_argument("--scratch", action="store_true",
                   help="remove instead the bundle directories of the pool's scratch root "
                   "whose stack holds no container or network on any agent")
    p.add_argument("--older-than", type=float, default=900.0, metavar="SECONDS",
                   help="with --scratch: only directories unchanged this long (default 900: "
                   "an up writes its bundles before it creates its containers)")
    p.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    p.set_defaults(func=cmd_pool_sweep)

    from .reap_verb import register as register_reap

    register_reap(verbs, fmt)

    p = verbs.add_parser("pull", help="pre-pull an image onto every agent, in parallel",
                         description="Resolve IMAGE once (its registry's content digest, asked "
                         "through the first agent's engine; or the image ID every agent holds "
                         "for an image built there) and pull it onto every agent that lacks "
                         "it, all at once, with progress on stderr. Credentials: the pool's "
                         "registry_auth.config_file, else your docker config. Exit 0; 4 when "
                         "the registry refuses the credentials; 1 when a pull fails (each "
                         "agent named with the cause); 2 for an invalid pool file.",
                         formatter_class=fmt)
    p.add_argument("pool", metavar="POOL")
    p.add_argument("image", metavar="IMAGE", help="an image reference, e.g. reg.example/t:2.3")
    p.add_argument("--agent", action="append", metavar="NAME",
                   help="only this agent (repeatable); default: every agent of the pool")
    p.add_argument("--json", action="store_true",
                   help="progress as JSON lines on stderr; on stdout {pool, image, digest, "
                   "pinned, local, agents: [{agent, how, image_id}]}")
    p.set_defaults(func=cmd_pool_pull)
