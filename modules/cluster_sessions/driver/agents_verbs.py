"""Verbs about agents: ``sessionctl pool check|up|destroy|sweep POOL`` and ``sessionctl lab``.

``pool check POOL``: every agent probed in parallel (SSH, Docker, swarm, CPUs, memory, GPUs, the
sessions it holds); a table on stdout, one line per failing agent on stderr, exit 1 if any
fails. ``--accept-new`` records the host key of an agent seen for the first time.

``pool up|destroy POOL``: the pool stack (``pool-<name>``), whose program builds the pool's
swarm (:mod:`cluster_sessions.pulumi_layer.pool_program`), through the Automation API like the
session verbs
(:mod:`.engine`): same backend, passphrase, confirmation and exit codes; 4 without the CLI.
``up`` first checks that every agent answers (nothing is created otherwise).

``pool sweep POOL --session NAME``: remove every container and network labelled with the
session on every agent, then verify none is left (``--dry-run`` only lists them).

``lab up|down|status``: the local netns lab (:mod:`cluster_sessions.lab.netns`), root only.
Defaults: state in ``/run/cluster-sessions-lab`` (the paths ``stacks/pools/lab3.yaml``
names), pool file ``stacks/pools/lab.yaml`` of the project (a file there that ``lab up`` did
not write is never overwritten without ``--force``), and the test image imported into every
agent's engine and tagged ``cluster-sessions/debian-sshd:latest`` (``--no-image`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.loader import load_file
from ..core.names import DEMO_IMAGE, POOL_DEFINITION_KEY, config_key
from ..core.spec import Pool
from ..core.terminal import table
from .errors import CommandError, Exit

DEFAULT_LAB_STATE = Path("/run/cluster-sessions-lab")
LAB_POOL_NAME = "lab"
POOL_CONFIG = config_key(POOL_DEFINITION_KEY)
IMAGE_LATEST = DEMO_IMAGE


# --- pools --------------------------------------------------------------------------------------


def pool_path(ref: str) -> Path:
    """A pool file: a file as written, or found as a definition's ``pool:`` is
    (:func:`cluster_sessions.core.loader.find_pool`, the one lookup rule)."""
    from ..core.loader import PoolNotFound, find_pool

    try:
        return find_pool(ref, given=True)
    except PoolNotFound as exc:
        raise CommandError(str(exc), Exit.INVALID) from None


def _project() -> Path | None:
    from .stacks import find_project

    return find_project([Path.cwd(), Path(__file__).resolve().parent])


def load_pool(ref: str) -> tuple[Pool, Path]:
    if not ref:
        raise CommandError("the pool must not be empty", Exit.INVALID)
    try:
        path = pool_path(ref)
    except (OSError, RuntimeError) as exc:  # a name too long, ~nosuchuser, cwd deleted, ...
        why = getattr(exc, "strerror", None) or str(exc)
        raise CommandError(f"cannot look up pool {ref!r}: {why}", Exit.INVALID) from None
    pool = load_file(path, expect="AgentPool")  # DefinitionError -> exit 2 in cli.main
    assert isinstance(pool, Pool)
    return pool, path


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


def cmd_pool_check(args: argparse.Namespace) -> int:
    from ..agents.capacity import check_swarm, probe_pool

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
    swarm_problems = []
    if pool.swarm is not None and len(pool.agents) > 1:
        swarm_problems = check_swarm(pool, reports, [a.name for a in pool.agents],
                                     pool_ref=args.pool)
        if swarm_problems:
            notes.append(f"swarm of {pool.swarm.manager} not formed or incomplete; multi-agent "
                         f"sessions need `sessionctl pool up {args.pool}`:")
            notes += [f"  {p}" for p in swarm_problems]
        elif all(r.engine for r in reports):
            notes.append(f"swarm: {len(pool.agents)} nodes, manager {pool.swarm.manager}")
    if args.json:
        json.dump(report_document(pool, reports, notes, swarm_formed=not swarm_problems),
                  sys.stdout, indent=2)
        print()
    else:
        print(check_table(reports))
        for note in notes:
            print(note)
    for r in reports:
        for w in r.warnings:
            print(f"warning: agent {r.name}: {w}", file=sys.stderr)
    failing = [r for r in reports if not r.ok]
    for r in failing:
        for p in r.problems:
            print(str(p), file=sys.stderr)
    if failing:
        print(f"pool {pool.name}: {len(failing)} of {len(reports)} agent(s) failed the check",
              file=sys.stderr)
        return Exit.ENGINE
    if swarm_problems:  # every agent works, but a session across them would not
        print(f"pool {pool.name}: the swarm is not formed: multi-agent sessions cannot be "
              f"placed until `sessionctl pool up {args.pool}`", file=sys.stderr)
        return Exit.ENGINE
    return Exit.OK


def cmd_pool_sweep(args: argparse.Namespace) -> int:
    from ..agents.cleanup import sweep

    pool, _path = load_pool(args.pool)
    report = sweep(pool, args.session, dry_run=args.dry_run)
    if args.dry_run:
        for item in report.remaining:
            print(item)
        for err in report.errors:
            print(str(err), file=sys.stderr)
        print(f"session {args.session}: {len(report.remaining)} object(s) found", file=sys.stderr)
        return Exit.ENGINE if report.errors else Exit.OK
    for item in report.removed:
        print(f"removed {item}")
    print(report.summary(), file=sys.stderr)
    return Exit.OK if report.clean else Exit.ENGINE


def pool_stack_name(pool: Pool) -> str:
    from .stacks import stack_name_for

    return stack_name_for(f"pool-{pool.name}")


def cmd_pool_engine(args: argparse.Namespace) -> int:
    """``pool up|destroy``: the pool stack, run as the session stacks are (:mod:`.engine`)."""
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
        doc = stacks.run_stack(args, verb, target, prepared)
    except stacks.StackFailed as exc:
        report_doc = exc.doc
        if args.json:
            stacks.emit(report_doc)
        raise CommandError(str(exc), exc.code) from None
    if args.json:
        stacks.emit(doc)
    return Exit.OK


# --- the lab ------------------------------------------------------------------------------------


def _lab_prerequisites() -> None:
    from ..lab import netns

    if os.geteuid() != 0:
        raise CommandError("the lab needs root (network namespaces, a bridge, iptables, one "
                           "dockerd and sshd per agent); run it as root, e.g. with sudo",
                           Exit.MISSING)
    missing = [f"{tool} ({pkg})" for tool, pkg in netns.REQUIRED_TOOLS.items()
               if not shutil.which(tool)]
    if not os.access(netns.SSHD, os.X_OK):
        missing.append(f"{netns.SSHD} (openssh-server)")
    if missing:
        raise CommandError(f"the lab needs {', '.join(missing)}; install them with "
                           "`apt-get install docker.io openssh-server iproute2 iptables` "
                           "(scripts/setup.sh does)", Exit.MISSING)


def default_lab_pool_file() -> Path:
    project = _project()
    base = project if project is not None else Path.cwd()
    return base / "stacks" / "pools" / f"{LAB_POOL_NAME}.yaml"


def check_pool_file_is_ours(path: Path, force: bool) -> None:
    """Refuse to overwrite a pool file that ``lab up`` did not write (e.g. a committed one)."""
    if not path.exists() or force:
        return
    try:
        head = path.read_text(errors="replace")[:200]
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}", Exit.INVALID) from None
    from ..lab.netns import POOL_FILE_HEADER

    if not head.startswith(POOL_FILE_HEADER):
        raise CommandError(f"{path} exists and was not written by `sessionctl lab up`; choose "
                           "another --pool-file, or pass --force to overwrite it",
                           Exit.INVALID)


def _progress(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


def import_lab_image(sockets: Sequence[Path]) -> str:
    """The test image in every lab engine (from the cached rootfs; built once if needed),
    tagged ``:latest`` as the example sessions name it."""
    import docker

    from ..lab.image import ensure_images

    clients = [docker.DockerClient(base_url=f"unix://{sock}", timeout=600) for sock in sockets]
    try:
        tag = ensure_images(clients, progress=_progress)
        repo, _, version = IMAGE_LATEST.partition(":")
        for client in clients:
            client.images.get(tag).tag(repo, version)
    finally:
        for client in clients:
            client.close()
    return tag


def cmd_lab_up(args: argparse.Namespace) -> int:
    from ..lab import netns

    _lab_prerequisites()
    pool_file = None if args.no_pool else Path(args.pool_file or default_lab_pool_file())
    if pool_file is not None:
        check_pool_file_is_ours(pool_file, args.force)
    try:
        info = netns.lab_up(args.agents, Path(args.state_dir), pool_file, _progress,
                            prefix=args.prefix, subnet=args.subnet)
    except netns.LabError as exc:
        raise CommandError(str(exc), Exit.ENGINE) from None
    for a in info.agents:
        print(f"{a.name}  {a.address}  {a.docker_host}")
    if info.pool_file:
        print(f"pool file: {info.pool_file}")
    if not args.no_image:
        from ..lab.image import ImageBuildError

        try:
            tag = import_lab_image(info.sockets)
        except (ImageBuildError, OSError) as exc:
            raise CommandError(f"the lab is up, but the test image could not be imported: "
                               f"{exc}", Exit.ENGINE) from None
        print(f"image: {tag} (also {IMAGE_LATEST}) on every agent")
    if info.pool_file:
        ref = info.pool_file.stem if info.pool_file == default_lab_pool_file() else info.pool_file
        print(f"next: sessionctl pool check {ref} && sessionctl pool up {ref}", file=sys.stderr)
    return Exit.OK


def cmd_lab_down(args: argparse.Namespace) -> int:
    from ..lab import netns

    _lab_prerequisites()
    try:
        netns.lab_down(Path(args.state_dir), _progress, keep_keys=args.keep_keys)
    except netns.LabError as exc:
        raise CommandError(str(exc), Exit.ENGINE) from None
    return Exit.OK


def cmd_lab_status(args: argparse.Namespace) -> int:
    from ..lab import netns

    status = netns.lab_status(Path(args.state_dir))
    if args.json:
        json.dump(status.as_dict(), sys.stdout, indent=2)
        print()
    else:
        print(f"lab {status.state}  (state {status.state_dir}"
              + (f", pool file {status.pool_file}" if status.pool_file else "") + ")")
        for a in status.agents:
            parts = [f"{k} {'up' if getattr(a, k) else 'down'}"
                     for k in ("netns", "containerd", "dockerd", "sshd")]
            print(f"  {a.name}  {a.address}  {', '.join(parts)}"
                  + (f"  ({a.error})" if a.error else ""))
    return Exit.OK if status.state == "up" else Exit.ENGINE


# --- registration -------------------------------------------------------------------------------


def register(subparsers) -> None:
    from .cli import EPILOG

    fmt = argparse.RawDescriptionHelpFormatter
    pool = subparsers.add_parser(
        "pool", help="check an agent pool, build or remove its swarm, sweep leftovers",
        description="Agent pools: `check` probes every agent; `up`/`destroy` build or remove "
        "the pool's Docker Swarm (a pool stack, through the Automation API); `sweep` removes "
        "what a session left behind. POOL is a pool file, or a name looked up as a definition's "
        "`pool` is ($CLUSTER_SESSIONS_POOLS, ./stacks/pools, the project's stacks/pools).",
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
    p.add_argument("--accept-new", action="store_true",
                   help="record the SSH host key of agents seen for the first time in their "
                   "known_hosts file (a changed key is still refused)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="SSH connect timeout per agent (default 10)")
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

    p = verbs.add_parser("sweep", help="remove every container and network a session left",
                         description="Remove every container and network labelled "
                         "cluster-sessions.session=NAME on every agent of the pool (overlays "
                         "through the swarm manager), then verify that none is left. Exit 0 "
                         "when clean, 1 otherwise.", formatter_class=fmt)
    p.add_argument("pool", metavar="POOL")
    p.add_argument("--session", required=True, metavar="NAME", help="the session's name")
    p.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    p.set_defaults(func=cmd_pool_sweep)

    lab = subparsers.add_parser(
        "lab", help="a local multi-agent lab: N Docker Engines in network namespaces (root)",
        description="Start N agents on this machine, each in its own network namespace with its "
        "own dockerd and sshd, joined by a bridge, and write the matching pool file. Root only.",
        formatter_class=fmt)
    lverbs = lab.add_subparsers(dest="lab_verb", required=True, metavar="ACTION")

    def state_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", default=str(DEFAULT_LAB_STATE), metavar="DIR",
                       help=f"where keys, sockets and logs live (default {DEFAULT_LAB_STATE})")

    p = lverbs.add_parser("up", help="start the lab and write its pool file",
                          formatter_class=fmt,
                          description="Start the lab (idempotent) and write its pool file. "
                          "Default pool file: stacks/pools/lab.yaml of the project (pool name "
                          "'lab'); a file there not written by `lab up` is kept unless --force.")
    p.add_argument("--agents", type=int, default=3, metavar="N", help="number of agents (3)")
    state_arg(p)
    p.add_argument("--pool-file", metavar="FILE", help="where to write the pool file")
    p.add_argument("--no-pool", action="store_true", help="write no pool file")
    p.add_argument("--force", action="store_true",
                   help="overwrite a pool file that `lab up` did not write")
    p.add_argument("--no-image", action="store_true",
                   help="do not import the test image into the agents' engines")
    p.add_argument("--prefix", default="csl", help="name prefix of bridge and namespaces (csl)")
    p.add_argument("--subnet", default="10.251.0.0/24", help="the lab's /24 (10.251.0.0/24)")
    p.set_defaults(func=cmd_lab_up)

    p = lverbs.add_parser("down", help="stop the lab and remove everything it created",
                          formatter_class=fmt,
                          description="Stop every agent's containers, sshd, dockerd and "
                          "containerd; remove the namespaces, the bridge, the iptables rules and "
                          "the engines' data; then the lab's key, host keys, known_hosts, logs "
                          "and the pool file `lab up` wrote. Idempotent. Exit 0 when nothing is "
                          "left, 1 otherwise.")
    state_arg(p)
    p.add_argument("--keep-keys", action="store_true",
                   help="keep the lab's SSH key, host keys, known_hosts and logs (a later "
                   "`lab up` is then known to the same clients); the pool file is removed")
    p.set_defaults(func=cmd_lab_down)

    p = lverbs.add_parser("status", help="what of the lab is running (exit 0 when all is up)",
                          formatter_class=fmt,
                          description="Show whether the lab's namespaces, containerd, dockerd "
                          "and sshd are up, per agent, and where its pool file is. Exit 0 when "
                          "all is up, 1 otherwise.")
    state_arg(p)
    p.add_argument("--json", action="store_true",
                   help="print the state as JSON (lab, per-agent processes, pool file)")
    p.set_defaults(func=cmd_lab_status)
