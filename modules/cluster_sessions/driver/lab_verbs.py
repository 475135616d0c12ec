"""``sessionctl lab up|down|status``: the local netns lab (:mod:`cluster_sessions.lab.netns`),
root only.

Defaults: state in ``/run/cluster-sessions-lab`` (the paths ``stacks/pools/lab3.yaml`` names),
pool file ``stacks/pools/lab.yaml`` of the project (a file there that ``lab up`` did not write
is never overwritten without ``--force``), and the test image imported into every agent's
engine and tagged ``cluster-sessions/debian-sshd:latest`` (``--no-image`` skips it).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from ..core.names import DEMO_IMAGE, POOLS_DIR, STACKS_DIR
from ..core.terminal import progress
from ..lab.layout import MAX_AGENTS, layout_for
from ..lab.processes import LabError
from .errors import CommandError, Exit
from .pool_verbs import project_dir

DEFAULT_LAB_STATE = Path("/run/cluster-sessions-lab")
LAB_POOL_NAME = "lab"
IMAGE_LATEST = DEMO_IMAGE


# --- the lab ------------------------------------------------------------------------------------


def _lab_prerequisites() -> None:
    from ..lab.requirements import REQUIRED_TOOLS, SSHD

    if os.geteuid() != 0:
        raise CommandError("the lab needs root (network namespaces, a bridge, iptables, one "
                           "dockerd and sshd per agent); run it as root, e.g. with sudo",
                           Exit.MISSING)
    missing = [f"{tool} ({pkg})" for tool, pkg in REQUIRED_TOOLS.items()
               if not shutil.which(tool)]
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD} (openssh-server)")
    if missing:
        raise CommandError(f"the lab needs {', '.join(missing)}; install them with "
                           "`apt-get install docker.io openssh-server iproute2 iptables` "
                           "(scripts/setup.sh does)", Exit.MISSING)


def default_lab_pool_file() -> Path:
    project = project_dir()
    base = project if project is not None else Path.cwd()
    return base / STACKS_DIR / POOLS_DIR / f"{LAB_POOL_NAME}.yaml"


def check_pool_file_is_ours(path: Path, force: bool) -> None:
    """Refuse to overwrite a pool file that ``lab up`` did not write (e.g. a committed one)."""
    if not path.exists() or force:
        return
    try:
        head = path.read_text(errors="replace")[:200]
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}", Exit.INVALID) from None
    from ..lab.pool_file import POOL_FILE_HEADER

    if not head.startswith(POOL_FILE_HEADER):
        raise CommandError(f"{path} exists and was not written by `sessionctl lab up`; choose "
                           "another --pool-file, or pass --force to overwrite it",
                           Exit.INVALID)


_progress = functools.partial(progress, prefix="lab: ")


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


def agent_count(text: str) -> int:
    """``--agents``: checked by argparse, so a bad count is invalid input (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 1 <= value <= MAX_AGENTS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_AGENTS}, got {value}")
    return value


def lab_subnet(text: str) -> str:
    """``--subnet``: a private /24, checked as the lab's layout checks it (exit 2 if not)."""
    try:
        layout_for(Path("/"), "csl", text)
    except LabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def lab_prefix(text: str) -> str:
    try:
        layout_for(Path("/"), text, "10.251.0.0/24")
    except LabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def cmd_lab_up(args: argparse.Namespace) -> int:
    from ..lab import netns

    _lab_prerequisites()
    pool_file = None if args.no_pool else Path(args.pool_file or default_lab_pool_file())
    if pool_file is not None:
        check_pool_file_is_ours(pool_file, args.force)
    info = netns.lab_up(args.agents, Path(args.state_dir), pool_file, _progress,
                        prefix=args.prefix, subnet=args.subnet)  # LabError: an engine failure
    for a in info.agents:
        print(f"{a.name}  ssh {info.user}@{a.address}  {a.docker_host} (on the agent)")
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
    netns.lab_down(Path(args.state_dir), _progress, keep_keys=args.keep_keys)
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
            if a.image is not None:
                parts.append(f"image {'yes' if a.image else 'missing'}")
            print(f"  {a.name}  {a.address}  {', '.join(parts)}"
                  + (f"  ({a.error})" if a.error else ""))
        lacking = [a.name for a in status.agents if a.image is False]
        if lacking:  # an interrupted `lab up`, or --no-image: the engines are up, the image not
            print(f"the demo image {IMAGE_LATEST} is missing on {', '.join(lacking)}: "
                  "`sessionctl lab up` again imports it (the lab is kept)", file=sys.stderr)
    return Exit.OK if status.state == "up" else Exit.ENGINE


# --- registration -------------------------------------------------------------------------------


def register(subparsers) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
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
    p.add_argument("--agents", type=agent_count, default=3, metavar="N",
                   help=f"number of agents, 1-{MAX_AGENTS} (3)")
    state_arg(p)
    p.add_argument("--pool-file", metavar="FILE", help="where to write the pool file")
    p.add_argument("--no-pool", action="store_true", help="write no pool file")
    p.add_argument("--force", action="store_true",
                   help="overwrite a pool file that `lab up` did not write")
    p.add_argument("--no-image", action="store_true",
                   help="do not import the test image into the agents' engines")
    p.add_argument("--prefix", default="csl", type=lab_prefix,
                   help="name prefix of bridge and namespaces (csl)")
    p.add_argument("--subnet", default="10.251.0.0/24", type=lab_subnet,
                   help="the lab's private /24 (10.251.0.0/24)")
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
