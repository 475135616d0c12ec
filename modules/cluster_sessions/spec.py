"""Typed, immutable definitions: ``kind: ClusterSession`` and ``kind: AgentPool``.

Pydantic checks shape and types field by field; rules that relate several fields (shmem below
mem, the swarm manager being one of the agents, ...) live in :func:`session_problems` and
:func:`pool_problems`, so that each problem can name the exact field it is about.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, StrictBool

from .units import format_size, parse_size

SESSION_NAME = re.compile(r"^(?=.{4,64}$)\w[\w.-]*\w$", re.ASCII)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")
DOCKER_HOST = re.compile(r"(unix|tcp|ssh|npipe)://\S+")
MAX_CLUSTER_SIZE = 10_000
RESERVED_ENV_PREFIX = "BACKENDAI_"
SSH_PORT = 2200
BUNDLE_DIR = "/opt/cluster-session"
"""Where one container's rendered files are mounted or uploaded (possibly read-only)."""
RUN_DIR = "/run/cluster-session"
"""Where the entrypoint puts what sshd and ssh sessions read: sshd_config, the host key, the
saved environment, the ForceCommand wrapper. Root-owned; rewritten at every start."""
RESERVED_DIRS = (BUNDLE_DIR, RUN_DIR)  # no user mount may cover the session's own files


def _size(value: object) -> int:
    return parse_size(value)


def _listed(value: object) -> object:
    """YAML gives lists; the models keep tuples so that a parsed definition is immutable."""
    return tuple(value) if isinstance(value, list) else value


Size = Annotated[int, BeforeValidator(_size), PlainSerializer(format_size, return_type=str)]
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
NonEmpty = Annotated[str, Field(strict=True, min_length=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ClusterShape(_Model):
    mode: Literal["single-node", "multi-node"] = "single-node"
    size: Annotated[int, Field(ge=1, le=MAX_CLUSTER_SIZE)] = 1


class Resources(_Model):
    """Per container, never per session (Backend.AI semantics)."""

    cpu: Annotated[float, Field(ge=0.001, le=4096, allow_inf_nan=False)] = 1
    mem: Size = parse_size("1g")
    shmem: Size = parse_size("64m")
    gpu: Annotated[int, Field(ge=0, le=64)] = 0

    @property
    def millicpu(self) -> int:
        return round(self.cpu * 1000)


class Mount(_Model):
    source: NonEmpty
    target: NonEmpty
    read_only: StrictBool = False


class Distributed(_Model):
    # 1024-32767: no privileged ports, and below Linux's ephemeral range (32768-60999), where a
    # fixed port may already be taken by an outgoing connection (EADDRINUSE).
    master_port: Annotated[int, Field(ge=1024, le=32767)] = 29500


class User(_Model):
    name: NonEmpty = "work"
    uid: Annotated[int, Field(ge=1, le=2**31 - 2)] = 9001
    gid: Annotated[int, Field(ge=1, le=2**31 - 2)] = 9001


class PublishedPort(_Model):
    """A port of main1 published on its agent; subs never publish ports."""

    container: Port
    host: Port | None = None  # None: the engine picks a free port
    host_ip: NonEmpty = "127.0.0.1"
    protocol: Literal["tcp", "udp"] = "tcp"


class Readiness(_Model):
    timeout: Annotated[int, Field(ge=1, le=3600)] = 120


class Session(_Model):
    kind: Literal["ClusterSession"]
    name: NonEmpty
    pool: NonEmpty
    image: NonEmpty
    cluster: ClusterShape = ClusterShape()
    resources: Resources = Resources()
    mounts: Annotated[tuple[Mount, ...], BeforeValidator(_listed)] = ()
    env: dict[str, str] = {}
    distributed: Distributed | None = None
    user: User = User()
    command: Annotated[
        tuple[NonEmpty, ...], BeforeValidator(_listed), Field(min_length=1)
    ] = ("sleep", "infinity")
    ports: Annotated[tuple[PublishedPort, ...], BeforeValidator(_listed)] = ()
    readiness: Readiness = Readiness()
    restart: Literal["no", "on-failure", "always", "unless-stopped"] = "unless-stopped"


class Capacity(_Model):
    cpu: Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)]
    mem: Size
    gpus: Annotated[tuple[Annotated[int, Field(ge=0)], ...], BeforeValidator(_listed)] = ()

    @property
    def millicpu(self) -> int:
        return round(self.cpu * 1000)


class AgentSSH(_Model):
    host: NonEmpty
    port: Port = 22
    user: NonEmpty = "root"
    key_file: NonEmpty | None = None
    known_hosts: NonEmpty | None = None


class Agent(_Model):
    name: NonEmpty
    docker_host: NonEmpty
    ssh: AgentSSH | None = None
    address: NonEmpty | None = None  # swarm advertise address
    capacity: Capacity


class Swarm(_Model):
    manager: NonEmpty


class PoolNetwork(_Model):
    mtu: Annotated[int, Field(ge=576, le=9216)] | None = None
    encrypted: StrictBool = False


class Pool(_Model):
    kind: Literal["AgentPool"]
    name: NonEmpty
    agents: Annotated[
        tuple[Agent, ...], BeforeValidator(_listed), Field(min_length=1, max_length=10_000)
    ]
    swarm: Swarm | None = None
    network: PoolNetwork = PoolNetwork()

    def agent(self, name: str) -> Agent:
        return next(a for a in self.agents if a.name == name)


KINDS: dict[str, type[_Model]] = {"ClusterSession": Session, "AgentPool": Pool}


def session_problems(session: Session) -> list[tuple[str, str]]:
    """Rules across fields of one session, as ``(dotted path, message)``."""
    found: list[tuple[str, str]] = []
    if not SESSION_NAME.fullmatch(session.name):
        found.append(("name", "must be 4-64 characters of letters, digits, '_', '.' or '-', "
                      "starting and ending with a letter, digit or '_'"))
    elif not session.name[0].isalnum():
        found.append(("name", "must start with a letter or digit: it begins the Docker "
                      "container and network names, which allow nothing else there"))
    if any(c.isspace() for c in session.image):
        found.append(("image", "must not contain whitespace"))
    res = session.resources
    if res.shmem >= res.mem:
        found.append(("resources.shmem", f"must be smaller than resources.mem "
                      f"({format_size(res.shmem)} >= {format_size(res.mem)})"))
    for key, value in session.env.items():
        path = f"env.{key}"
        if not ENV_NAME.fullmatch(key):
            found.append((path, "is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"))
        elif key.startswith(RESERVED_ENV_PREFIX):
            found.append((path, f"{RESERVED_ENV_PREFIX}* variables are set by the session and "
                          "cannot be overridden (use distributed.master_port for the port)"))
        if "\0" in value:
            found.append((path, "must not contain a NUL byte"))
    targets: set[str] = set()
    for i, mount in enumerate(session.mounts):
        target = posixpath.normpath(mount.target)
        if not mount.target.startswith("/"):
            found.append((f"mounts.{i}.target", "must be an absolute path in the container"))
        elif any(target == d or target.startswith(d + "/") or d.startswith(target + "/")
                 for d in RESERVED_DIRS):
            found.append((f"mounts.{i}.target", f"{mount.target} would hide the session's own "
                          f"files ({', '.join(RESERVED_DIRS)})"))
        if ":" in mount.target:
            found.append((f"mounts.{i}.target", "must not contain ':'"))
        if target in targets:
            found.append((f"mounts.{i}.target", f"{mount.target} is mounted twice"))
        targets.add(target)
        if not (mount.source.startswith("/") or VOLUME_NAME.fullmatch(mount.source)):
            found.append((f"mounts.{i}.source", "must be an absolute host path or a volume name"))
        if "," in mount.source or "," in mount.target:
            found.append((f"mounts.{i}", "paths must not contain ','"))
    if not USER_NAME.fullmatch(session.user.name) or session.user.name == "root":
        found.append(("user.name", "must be a lower-case user name other than root"))
    seen_ports: set[tuple[int, str]] = set()
    seen_host: set[tuple[str, int, str]] = set()
    for i, port in enumerate(session.ports):
        if (port.container, port.protocol) in seen_ports:
            found.append((f"ports.{i}.container", f"{port.container}/{port.protocol} "
                          "is published twice"))
        seen_ports.add((port.container, port.protocol))
        try:
            ipaddress.ip_address(port.host_ip)
        except ValueError:
            found.append((f"ports.{i}.host_ip", f"{port.host_ip!r} is not an IP address"))
        if port.host is not None:
            key = (port.host_ip, port.host, port.protocol)
            if key in seen_host:
                found.append((f"ports.{i}.host", f"host port {port.host}/{port.protocol} on "
                              f"{port.host_ip} is used twice"))
            seen_host.add(key)
    return found


def pool_problems(pool: Pool) -> list[tuple[str, str]]:
    """Rules across fields of one pool, as ``(dotted path, message)``."""
    found: list[tuple[str, str]] = []
    names: dict[str, int] = {}
    for i, agent in enumerate(pool.agents):
        if not AGENT_NAME.fullmatch(agent.name):
            found.append((f"agents.{i}.name", "must be letters, digits, '_', '.' or '-' "
                          "(at most 63), starting with a letter or digit"))
        if agent.name in names:
            found.append((f"agents.{i}.name", f"duplicate agent name {agent.name!r} "
                          f"(also agents.{names[agent.name]})"))
        names.setdefault(agent.name, i)
        if not DOCKER_HOST.fullmatch(agent.docker_host):
            found.append((f"agents.{i}.docker_host",
                          "must be unix://PATH, ssh://[USER@]HOST[:PORT] or tcp://HOST:PORT"))
        seen: set[int] = set()
        for gpu in agent.capacity.gpus:
            if gpu in seen:
                found.append((f"agents.{i}.capacity.gpus", f"GPU id {gpu} is listed twice"))
            seen.add(gpu)
    if pool.swarm and pool.swarm.manager not in names:
        found.append(("swarm.manager", f"{pool.swarm.manager!r} is not one of the pool's agents "
                      f"({', '.join(names)})"))
    return found
