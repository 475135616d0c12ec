"""Typed, immutable definitions: ``kind: ClusterSession`` and ``kind: AgentPool``.

Pydantic checks shape and types field by field; rules that relate several fields (shmem below
mem, the swarm manager being one of the agents, ...) live in :func:`session_problems` and
:func:`pool_problems`, so that each problem can name the exact field it is about.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import unicodedata
from typing import Annotated, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    WithJsonSchema,
)

from .accounts import USER_ID_RANGES, user_id_problem, user_name_problem
from .folders import STORAGE_NAME, folder_name_problem, folder_path, storage_of
from .names import CLUSTER_ENV_PREFIX, DEFAULT_DOCKER_HOST, DEFAULT_MASTER_PORT, SSH_ENV_PREFIX
from .provider_facts import cpus_argument, cpus_read_back, stable_cpus_near
from .selectors import DEFAULT_SELECTOR, Selector
from .terminal import is_hidden
from .units import (
    MAX_BYTES,
    duration_json_schema,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
    size_json_schema,
)

MAX_SESSION_NAME = 64
SESSION_NAME = re.compile(rf"^(?=.{{4,{MAX_SESSION_NAME}}}$)\w[\w.-]*\w$", re.ASCII)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")
# The engines a pool may name (an allowlist): a unix socket, SSH, or TCP with TLS. npipe://
# (Windows), fd:// (systemd activation) and the like are never an agent's engine.
DOCKER_HOST = re.compile(r"(unix|tcp|ssh)://\S+")
# ssh reads an ``-o Key=value`` option as a config line: whitespace and quotes split or quote
# it, and ``%`` starts a token that IdentityFile and UserKnownHostsFile expand.
SSH_OPTION_VALUE = re.compile(r"[^\s\"'%]+")
# Every container's env and ssh files list every host, so plan and render output grow with
# the square of the size: 2,048 keeps `plan --json` (~34 MB) and `render` (~16 s, ~60 MB of
# memory, ~650 MB on disk) well inside 1 GB and 60 s (benchmarks/plan_scale.py, worst case).
MAX_CLUSTER_SIZE = 2048
# Processes per container in a hostfile: far beyond any machine, small enough to mean a count.
MAX_SLOTS = 1024
# Sessions one definition makes with ``count`` (Backend.AI's launch dialog: "Sessions").
MAX_COUNT = 100
# What a container runs when the definition (or, for subs of a batch session, the plan) gives
# no command: nothing but staying up for ssh.
DEFAULT_COMMAND = ("sleep", "infinity")
RESERVED_ENV_PREFIX = CLUSTER_ENV_PREFIX
SSH_PORT = 2200
SERVICE_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}[a-z0-9]|[a-z]")
SERVICE_PROTOCOLS = ("http", "https", "tcp")  # what the URL of a service starts with
MAX_SERVICES = 64
BUNDLE_DIR = "/opt/cluster-session"
"""Where one container's rendered files are mounted or uploaded (possibly read-only)."""
DEFAULT_SCRATCH = "/var/lib/cluster-sessions"
"""The pool's ``scratch`` unless it names another: the bundles' directory on every agent."""
RUN_DIR = "/run/cluster-session"
"""Where the entrypoint puts what sshd and ssh sessions read: sshd_config, the host key, the
saved environment, the ForceCommand wrapper. Root-owned; rewritten at every start. A sent
bundle (the Pulumi upload) is unpacked here, on a tmpfs of the container's own."""
RUN_TMPFS = "rw,nosuid,nodev,noexec,mode=0755,size=64m"
"""The tmpfs at RUN_DIR of every container the Pulumi program makes: a file created in the
container's overlay root costs about a millisecond of kernel time, one on a tmpfs a few
microseconds, and the entrypoint creates some thirty before sshd listens (issue 22). Empty at
every start, so nothing of an earlier run is left in it; its scripts run through /bin/sh."""
MOUNT_ROOTS = ("/data", "/mnt", "/scratch", "/workspace")
"""Where a mount may go (an allowlist), besides below the session user's home: directories
that hold a user's data and nothing the set-up (root) reads, runs or writes. Anything else,
``/var/log``, ``/run/utmp``, ``/etc``, ``/opt/cluster-session``, is the image's or the
set-up's, where root would run a definition's files or write into a host directory."""
MIB = 1024**2
MIN_MEMORY = 6 * MIB
"""Docker refuses a memory limit below 6 MiB (``Minimum memory limit allowed is 6MB``)."""
MIN_SHMEM = MIB
"""The provider passes shm_size in whole MiB and 0 means Docker's default (64 MiB)."""
MAX_MEMORY = MAX_BYTES // MIB * MIB
"""The largest whole number of MiB (what the provider passes) that Docker's int64 bytes hold."""
MAX_ARG_STRLEN = 32 * 4096
"""The kernel's limit on one argument or ``NAME=value`` string, its terminating NUL included;
a longer one makes exec fail with E2BIG, so the container could never start."""
MAX_ENV_BYTES = 256 * 1024
"""The definition's env in all, per container: the ``NAME=value`` strings with their NULs
and the 8-byte pointer the kernel counts for each. exec fails with E2BIG when argv and envp
together pass a quarter of the stack limit (``ARG_MAX``, 2 MiB with the default 8 MiB stack);
the session's own variables (``BACKENDAI_CLUSTER_HOSTS`` lists every host: ~20 KiB at 2,048),
the command and the image's env share that, so the user's part gets an eighth of it. It also
bounds the work: every container's plan and files repeat the env (benchmarks/plan_scale.py,
worst case)."""
MAX_ENV_ENTRIES = 1024
"""Variables in a definition's env: each costs a pointer in ``ARG_MAX`` and a line in every
container's files; real sessions set tens."""
MAX_MOUNTS = 64
"""Mounts per container: every container's plan and resource repeats them (12,000 mounts in a
1 MiB file made ``plan --json`` of 2,048 containers run for minutes); far beyond a real
session's data folders."""
PATH_MAX = 4096
"""Linux's limit on a path, its NUL included: a longer mount path cannot be mounted."""
MAX_MOUNT_BYTES = 16 * 1024
"""The mounts' sources and targets in all: repeated in every container's plan, like the env
(2,048 containers x 16 KiB is 32 MiB of ``plan --json``)."""
MAX_PLANNED_ENV = 16 * 1024**2
"""The env (counted as :data:`MAX_ENV_BYTES` counts it) times the containers one definition
plans (count x size): the plan and every container's files repeat it, so this bounds the work
of ``plan --json`` and ``render``. 64 containers may use the full 256 KiB each; 2,048 get
8 KiB each, where the worst case stays under 1 GB and 60 s (docs/benchmarks.md, issue 21)."""
HOST = re.compile(r"[A-Za-z0-9_.:%\[\]-]+", re.ASCII)


def _memory(value: object) -> int:
    return parse_size(value, MIN_MEMORY, MAX_MEMORY)


def _shmem(value: object) -> int:
    return parse_size(value, MIN_SHMEM, MAX_MEMORY)


def _listed(value: object) -> object:
    """YAML gives lists; the models keep tuples so that a parsed definition is immutable."""
    return tuple(value) if isinstance(value, list) else value


Memory = Annotated[int, BeforeValidator(_memory),
                   PlainSerializer(format_size, return_type=str),
                   WithJsonSchema(size_json_schema(MIN_MEMORY, MAX_MEMORY), mode="validation")]
ShmSize = Annotated[int, BeforeValidator(_shmem), PlainSerializer(format_size, return_type=str),
                    WithJsonSchema(size_json_schema(MIN_SHMEM, MAX_MEMORY), mode="validation")]


def _user_id(value: int) -> int:
    problem = user_id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


UserId = Annotated[int, Field(strict=True), AfterValidator(_user_id), WithJsonSchema(
    {"type": "integer", "anyOf": [{"minimum": low, "maximum": high}
                                  for low, high in USER_ID_RANGES]}, mode="validation")]
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
Duration = Annotated[int, BeforeValidator(parse_duration),
                     PlainSerializer(format_duration, return_type=str),
                     WithJsonSchema(duration_json_schema(), mode="validation")]
Priority = Annotated[int, Field(strict=True, ge=0, le=100)]
Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
PROJECT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}", re.ASCII)
DEFAULT_PROJECT = "default"
"""What a session that names no project runs under: the pool's ``policies.default``."""
NonEmpty = Annotated[str, Field(strict=True, min_length=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ClusterShape(_Model):
    mode: Literal["single-node", "multi-node"] = "single-node"
    size: Annotated[int, Field(ge=1, le=MAX_CLUSTER_SIZE)] = 1


class Resources(_Model):
    """Per container, never per session (Backend.AI semantics)."""

    cpu: Annotated[float, Field(ge=0.001, le=4096, allow_inf_nan=False)] = 1
    mem: Memory = parse_size("1g")
    shmem: ShmSize = parse_size("64m")
    gpu: Annotated[int, Field(ge=0, le=64)] = 0

    @property
    def millicpu(self) -> int:
        return round(self.cpu * 1000)


class Mount(_Model):
    """A host path or named volume (``source``), or a data folder of the pool's storage
    (``folder``, with ``storage`` naming the root when the pool has several): one of the two."""

    source: NonEmpty | None = None
    folder: NonEmpty | None = None
    storage: NonEmpty | None = None
    target: NonEmpty
    read_only: StrictBool = False


class Distributed(_Model):
    # 1024-32767: no privileged ports, and below Linux's ephemeral range (32768-60999), where a
    # fixed port may already be taken by an outgoing connection (EADDRINUSE).
    master_port: Annotated[int, Field(ge=1024, le=32767)] = DEFAULT_MASTER_PORT
    # Processes per container in the MPI/DeepSpeed hostfiles ("slots"); default: the
    # container's GPU count when it has GPUs, else 1. At most the GPUs when GPUs are set.
    slots: Annotated[int, Field(ge=1, le=MAX_SLOTS)] | None = None


class User(_Model):
    name: NonEmpty = "work"
    uid: UserId = 9001
    gid: UserId = 9001


class PublishedPort(_Model):
    """A port of main1 published on its agent; subs never publish ports."""

    container: Port
    host: Port | None = None  # None: the engine picks a free port
    host_ip: NonEmpty = "127.0.0.1"
    protocol: Literal["tcp", "udp"] = "tcp"
    # true: host_ip is meant to be an address beyond the agent's loopback (is_loopback)
    public: StrictBool = False


def is_loopback(address: str) -> bool:
    """Whether a bind address reaches only the agent itself: 127.0.0.0/8, ::1, and an IPv4
    loopback written IPv6-mapped (``::ffff:127.0.0.1``). Anything else, ``0.0.0.0`` and ``::``
    above all (every address of the agent), reaches beyond it."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


class Service(_Model):
    """An app main1 serves (Backend.AI's "service port"): declaring it publishes and names the
    port; the user's command or image starts it. Its host port comes from the pool's
    ``service_ports`` range on main1's agent, chosen at ``up`` (core.services)."""

    name: NonEmpty
    port: Port  # inside main1
    protocol: Literal[SERVICE_PROTOCOLS] = "http"  # type: ignore[valid-type]
    # below 1024 only root may bind; the pool's range decides whether it can be had
    preferred_port: Annotated[int, Field(strict=True, ge=1024, le=65535)] | None = None
    # true: bound to the agent's address, reachable by anyone who reaches the agent
    public: StrictBool = False


class Readiness(_Model):
    timeout: Annotated[int, Field(ge=1, le=3600)] = 120


class Session(_Model):
    kind: Literal["ClusterSession"]
    name: NonEmpty
    pool: NonEmpty
    image: NonEmpty
    # interactive: runs until destroyed. batch: main1's command is the job; the session ends
    # (for `sessionctl wait`/`run`) when it does, with its exit code; subs stay up meanwhile.
    type: Literal["interactive", "batch"] = "interactive"
    # K identical sessions <name>-1 .. <name>-K, each its own stack, planned together.
    count: Annotated[int, Field(ge=1, le=MAX_COUNT)] = 1
    cluster: ClusterShape = ClusterShape()
    resources: Resources = Resources()
    mounts: Annotated[tuple[Mount, ...], BeforeValidator(_listed),
                      Field(max_length=MAX_MOUNTS)] = ()
    env: dict[str, str] = {}
    distributed: Distributed | None = None
    user: User = User()
    command: Annotated[
        tuple[NonEmpty, ...], BeforeValidator(_listed), Field(min_length=1)
    ] = DEFAULT_COMMAND
    ports: Annotated[tuple[PublishedPort, ...], BeforeValidator(_listed)] = ()
    services: Annotated[tuple[Service, ...], BeforeValidator(_listed),
                        Field(max_length=MAX_SERVICES)] = ()
    readiness: Readiness = Readiness()
    restart: Literal["no", "on-failure", "always", "unless-stopped"] = "unless-stopped"
    # governance (DESIGN contract 8; core/governance.py): the project claimed (the operator's
    # --project / CLUSTER_SESSIONS_PROJECT wins), a lifetime at most the policy's, a priority
    # at most the project's, and whether a higher priority may end it (batch only)
    project: NonEmpty | None = None
    lifetime: Duration | None = None
    priority: Priority = 0
    preemptible: StrictBool = False


class Capacity(_Model):
    cpu: Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)]
    mem: Memory
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


class AgentTLS(_Model):
    """The TLS material of a ``tcp://`` engine: a directory with ``ca.pem``, ``cert.pem`` and
    ``key.pem`` (Docker's ``DOCKER_CERT_PATH`` layout), on the machine that runs ``pulumi``."""

    cert_path: NonEmpty


class RegistryAuth(_Model):
    """Where the pool's registry credentials are: a docker config file (``auths``,
    ``credHelpers``, ``credsStore``, as ``docker login`` writes it), relative to the pool file's
    folder or absolute; without it, the operator's own (``$DOCKER_CONFIG``, ``~/.docker``).
    The credentials go to the engine with each pull, never into a stack's state."""

    config_file: NonEmpty


class PortRange(_Model):
    """Host ports ``first``..``last`` (inclusive) an agent publishes services on (Backend.AI's
    agent ``port-range``, 30000-31000 by default)."""

    first: Annotated[int, Field(strict=True, ge=1024, le=65535)]
    last: Annotated[int, Field(strict=True, ge=1024, le=65535)]

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last


DEFAULT_SERVICE_PORTS = PortRange(first=30000, last=31000)


class Agent(_Model):
    name: NonEmpty
    # With an ssh block: the engine's socket ON the agent (agents.reach); else how it is
    # reached from here: a unix socket, ssh://, or tcp:// with tls.
    docker_host: NonEmpty = DEFAULT_DOCKER_HOST
    ssh: AgentSSH | None = None
    tls: AgentTLS | None = None
    address: NonEmpty | None = None  # swarm advertise address
    capacity: Capacity
    service_ports: PortRange | None = None  # this agent's port pool; else the pool's


class Swarm(_Model):
    manager: NonEmpty


class PoolNetwork(_Model):
    mtu: Annotated[int, Field(ge=576, le=9216)] | None = None
    encrypted: StrictBool = False


LINUX_CAPABILITIES = frozenset((
    "AUDIT_CONTROL", "AUDIT_READ", "AUDIT_WRITE", "BLOCK_SUSPEND", "BPF", "CHECKPOINT_RESTORE",
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "IPC_LOCK", "IPC_OWNER",
    "KILL", "LEASE", "LINUX_IMMUTABLE", "MAC_ADMIN", "MAC_OVERRIDE", "MKNOD", "NET_ADMIN",
    "NET_BIND_SERVICE", "NET_BROADCAST", "NET_RAW", "PERFMON", "SETFCAP", "SETGID", "SETPCAP",
    "SETUID", "SYS_ADMIN", "SYS_BOOT", "SYS_CHROOT", "SYS_MODULE", "SYS_NICE", "SYS_PACCT",
    "SYS_PTRACE", "SYS_RAWIO", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "SYSLOG",
    "WAKE_ALARM"))
"""What Docker's ``--cap-add`` names (capabilities(7) without ``CAP_``)."""
SESSION_CAPABILITIES = (
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID", "SYS_CHROOT")
"""What a session's root (the set-up and sshd) keeps by default; every other capability is
dropped (docs/threat-model.md, class 7, measured on the real entrypoint): CHOWN and FOWNER for
the set-up's chown and install into the user's home, DAC_OVERRIDE to write into a home only
its user may enter, KILL for the init (root) to pass `docker stop`'s signal on to the user's
job, SETUID/SETGID for setpriv and sshd to become the user, SYS_CHROOT for sshd's privilege
separation, AUDIT_WRITE for sshd's login record: Debian's sshd (built with Linux audit) runs
as root and drops every session with a pty when the record cannot be written (openssh
audit-linux.c; tests/test_pty_login.py)."""
MIN_LOG_SIZE = MIB
MAX_LOG_SIZE = 1024 * MIB


def _log_size(value: object) -> int:
    return parse_size(value, MIN_LOG_SIZE, MAX_LOG_SIZE)


LogSize = Annotated[int, BeforeValidator(_log_size), PlainSerializer(format_size, return_type=str),
                    WithJsonSchema(size_json_schema(MIN_LOG_SIZE, MAX_LOG_SIZE),
                                   mode="validation")]


MIN_PIDS_LIMIT = 64  # the set-up, sshd and a login: a container with fewer cannot start
MAX_PIDS_LIMIT = 4_194_304  # the kernel's largest pid_max (PID_MAX_LIMIT on 64-bit)


class SessionLimits(_Model):
    """What one session may take of an agent beyond cpu and memory: its containers' logs
    (Docker's json-file driver keeps ``log_max_files`` files of ``log_max_size`` each, the
    oldest dropped) so that no session fills an agent's disk by writing, and its processes
    (``pids_limit`` tasks per container, threads included: the pids cgroup) so that no
    session fills the agent's process table by forking."""

    log_max_size: LogSize = 16 * MIB
    log_max_files: Annotated[int, Field(strict=True, ge=1, le=100)] = 4
    pids_limit: Annotated[int, Field(strict=True, ge=MIN_PIDS_LIMIT, le=MAX_PIDS_LIMIT)] = 8192


class SessionPrivileges(_Model):
    """What a session's root may do: the capabilities its containers keep (all others are
    dropped) and whether any process may gain privileges by exec (``no-new-privileges``: set,
    a setuid ``sudo`` in the image does not work). The defaults are what the set-up and sshd
    need; a pool widens them for images that need more."""

    capabilities: Annotated[tuple[NonEmpty, ...], BeforeValidator(_listed)] = \
        SESSION_CAPABILITIES
    no_new_privileges: StrictBool = True


class Scheduler(_Model):
    """How the pool's agents are chosen (core.selectors; docs/scheduling.md), and how long a
    waiting session may be passed by smaller ones that fit (core.admission)."""

    selector: Selector = DEFAULT_SELECTOR
    backfill_for: Duration = 600


class Quota(_Model):
    """What one project's sessions may hold at once in the pool, in all (containers live and
    reservations of ``up``s under way), and how many may wait in its queue; a limit left out
    is no limit (Backend.AI's ``total_resource_slots``, ``max_concurrent_sessions``,
    ``max_pending_session_count``)."""

    cpu: Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)] | None = None
    mem: Memory | None = None
    gpus: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] | None = None
    containers: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] | None = None
    sessions: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] | None = None
    pending: Annotated[int, Field(strict=True, ge=0, le=1_000_000)] | None = None


class IdlePolicy(_Model):
    """When an interactive session is idle (issue 44 part 4): no login or service connection
    for ``timeout`` and its use under the thresholds, after ``grace`` from its start."""

    timeout: Duration
    cpu_below: Percent = 5.0
    gpu_below: Percent = 5.0
    grace: Duration = 1800


class Policy(_Model):
    """A project's (or the default's) policy: where its definitions may live, its quota, the
    longest and the default lifetime of its sessions, when they are idle, the highest priority
    they may ask."""

    definitions: Annotated[tuple[NonEmpty, ...], BeforeValidator(_listed)] = ()
    quota: Quota = Quota()
    max_lifetime: Duration | None = None
    default_lifetime: Duration | None = None  # a session that asks none; else max_lifetime
    idle: IdlePolicy | None = None
    max_priority: Priority = 0


class Policies(_Model):
    """The pool's governance (DESIGN contract 8): the default policy, the projects by name."""

    default: Policy = Policy()
    projects: dict[str, Policy] = {}
    # a session pending for capacity may end `preemptible: true` batch sessions of a lower
    # priority (core/preemption.py, driver/placing.py ``placed``)
    preemption: StrictBool = False

    def of(self, project: str | None) -> Policy:
        """The policy a session of ``project`` (None: the default) runs under."""
        if project is None or project == DEFAULT_PROJECT:
            return self.default
        return self.projects[project]


class Pool(_Model):
    kind: Literal["AgentPool"]
    name: NonEmpty
    agents: Annotated[
        tuple[Agent, ...], BeforeValidator(_listed), Field(min_length=1, max_length=10_000)
    ]
    swarm: Swarm | None = None
    network: PoolNetwork = PoolNetwork()
    # Host directories whose contents a session may mount (at or below each); none by default.
    mount_sources: Annotated[tuple[NonEmpty, ...], BeforeValidator(_listed)] = ()
    # Named volumes any session of the pool may mount (the operator's, e.g. shared datasets);
    # any other volume a session mounts is its own: made by it, labelled with its name.
    volumes: Annotated[tuple[NonEmpty, ...], BeforeValidator(_listed)] = ()
    # Storage roots for data folders, by name: host directories present on every agent (an
    # NFS mount, say); a session's {folder: NAME} is <root>/NAME (core.folders).
    storage: dict[str, NonEmpty] = {}
    # Every agent's port pool for services, unless the agent names its own.
    service_ports: PortRange = DEFAULT_SERVICE_PORTS
    # What each session's containers may take and do (logs; capabilities).
    limits: SessionLimits = SessionLimits()
    privileges: SessionPrivileges = SessionPrivileges()
    scheduler: Scheduler = Scheduler()
    # The registry credentials the agents pull sessions' images with (agents/images.py).
    registry_auth: RegistryAuth | None = None
    # The operator's directory on every agent that holds the sessions' bundles
    # (<scratch>/<stack id>/<host>/, core/bundles.py): made by `pool check --fix` / `pool up`,
    # only the pool's SSH user (and root) may enter it; no session may mount a path in it.
    scratch: NonEmpty = DEFAULT_SCRATCH
    # Projects, their quotas, lifetimes, idle rules and priorities (core/governance.py).
    policies: Policies = Policies()

    def agent(self, name: str) -> Agent:
        return next(a for a in self.agents if a.name == name)

    def service_ports_of(self, agent: str) -> PortRange:
        return self.agent(agent).service_ports or self.service_ports


def agent_address(agent: Agent) -> str | None:
    """The address other machines reach an agent at: its ``address``, else its SSH host, else
    the host of an ``ssh://``/``tcp://`` docker_host; None for a local unix socket. The swarm
    advertises it, and main1's published ports are shown at it."""
    if agent.address:
        return agent.address
    if agent.ssh is not None:
        return agent.ssh.host
    url = urlsplit(agent.docker_host)
    return url.hostname if url.scheme in ("ssh", "tcp") else None


KINDS: dict[str, type[_Model]] = {"ClusterSession": Session, "AgentPool": Pool}

MAX_INT = 2**63 - 1
"""The largest integer the loader takes anywhere (what Docker, the kernel and JSON readers
hold); the schema says so too."""


def json_schema(model: type[_Model]) -> dict:
    """A kind's JSON Schema (``sessionctl schema``), saying what the models check: pydantic's
    schema, with a length on an array written as its item count (``minItems``, not the
    ``minLength`` pydantic writes for a tuple behind a validator) and every integer held to
    int64, as the loader holds it."""
    schema = _agreeing(model.model_json_schema(mode="validation"))
    if model is Session:  # the loader names a session without one after its file
        schema["required"] = [k for k in schema["required"] if k != "name"]
    return schema


def _agreeing(node: object) -> object:
    if isinstance(node, list):
        return [_agreeing(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _agreeing(v) for k, v in node.items()}
    if out.get("type") == "array":
        for text, items in (("minLength", "minItems"), ("maxLength", "maxItems")):
            if text in out:
                out[items] = out.pop(text)
    if out.get("type") == "integer":
        out.setdefault("minimum", -MAX_INT)
        out.setdefault("maximum", MAX_INT)
    return out


def session_problems(session: Session) -> list[tuple[str, str]]:
    """Rules across fields of one session, as ``(dotted path, message)``."""
    found: list[tuple[str, str]] = []
    if not SESSION_NAME.fullmatch(session.name):
        found.append(("name", "must be 4-64 characters of letters, digits, '_', '.' or '-', "
                      "starting and ending with a letter, digit or '_'"))
    elif not session.name[0].isalnum():
        found.append(("name", "must start with a letter or digit: it begins the Docker "
                      "container and network names, which allow nothing else there"))
    total = session.count * session.cluster.size
    if session.count > 1 and total > MAX_CLUSTER_SIZE:
        found.append(("count", f"{session.count} sessions of {session.cluster.size} containers "
                      f"are {total} containers, more than the {MAX_CLUSTER_SIZE} one definition "
                      "may plan: lower the count or the size"))
    longest = f"{session.name}-{session.count}"
    if session.count > 1 and len(longest) > MAX_SESSION_NAME:
        found.append(("count", f"{session.count} sessions are named {session.name}-1 .. "
                      f"{longest}, longer than the {MAX_SESSION_NAME} characters a session name "
                      "may have: shorten the name or lower the count"))
    if any(c.isspace() for c in session.image):
        found.append(("image", "must not contain whitespace"))
    found += _text_problems(session)
    res = session.resources
    if session.preemptible and session.type != "batch":
        found.append(("preemptible", "applies to batch sessions only (type: batch): an "
                      "interactive session is someone's work in progress"))
    if session.project is not None and not PROJECT_NAME.fullmatch(session.project):
        found.append(("project", "must be a project name: lowercase letters, digits, '_' or "
                      "'-', starting with a letter or digit (at most 63)"))
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
        elif key.startswith(SSH_ENV_PREFIX):
            found.append((path, f"{SSH_ENV_PREFIX}* variables are set by sshd for each ssh "
                          "session (and read by ssh, ssh-agent and the session's ssh wrapper): "
                          "a definition cannot set them"))
        if "\0" in value:
            found.append((path, "must not contain a NUL byte"))
        length = len(f"{key}={value}".encode()) + 1
        if length > MAX_ARG_STRLEN:
            found.append((path, f"is too long: NAME=value is {length - 1} bytes, and the kernel "
                          f"passes at most {MAX_ARG_STRLEN - 1} (MAX_ARG_STRLEN, 128 KiB with "
                          "the terminating NUL): put large data in a mounted file"))
    entries = len(session.env)
    total = sum(len(f"{k}={v}".encode()) + 1 + 8 for k, v in session.env.items())
    if entries > MAX_ENV_ENTRIES:
        found.append(("env", f"has {entries} variables, more than {MAX_ENV_ENTRIES}: put "
                      "large configuration in a mounted file"))
    if total > MAX_ENV_BYTES:
        found.append(("env", f"is {total} bytes in all (NAME=value, NUL and pointer each), more "
                      f"than {MAX_ENV_BYTES} ({MAX_ENV_BYTES // 1024} KiB): the kernel passes "
                      "at most 2 MiB of arguments and environment to a program (ARG_MAX), "
                      "which the session's own variables share; put large data in a mounted "
                      "file"))
    containers = session.count * session.cluster.size
    if total <= MAX_ENV_BYTES and total * containers > MAX_PLANNED_ENV:
        found.append(("env", f"is {total} bytes in all, repeated in each of the {containers} "
                      f"containers this definition plans: {total * containers} bytes, more "
                      f"than {MAX_PLANNED_ENV} ({MAX_PLANNED_ENV // 1024**2} MiB) that plan "
                      f"and render may repeat (at most {MAX_PLANNED_ENV // containers} bytes "
                      "per container at this size); put large data in a mounted file"))
    found += _port_problems(session)
    if session.count > 1:
        found += [(f"ports.{i}.host", f"host port {p.host} is fixed, but count makes "
                   f"{session.count} sessions that may share an agent and cannot all publish "
                   "it: leave host unset (the engine picks a free port)")
                  for i, p in enumerate(session.ports) if p.host is not None]
    if session.type == "batch" and "command" not in session.model_fields_set:
        found.append(("command", "a batch session needs a command: main1 runs it as the job "
                      "(e.g. command: [python3, train.py])"))
    if cpus_argument(session.resources.cpu) is None:
        cpu = session.resources.cpu
        found.append(("resources.cpu", f"{cpu:g} CPUs: the docker provider reads this back as "
                      f"{cpus_read_back(round(cpu * 1e9))}, so every up would replace the "
                      f"containers; use a value it reads back as written, such as "
                      f"{stable_cpus_near(cpu):g}"))
    slots = session.distributed.slots if session.distributed is not None else None
    if slots is not None and session.resources.gpu and slots > session.resources.gpu:
        found.append(("distributed.slots", f"{slots} slots per container, but each container "
                      f"has {session.resources.gpu} GPUs (resources.gpu): at most "
                      f"{session.resources.gpu}, one process per GPU"))
    found += _mount_problems(session)
    name = session.user.name
    if not USER_NAME.fullmatch(name) or name == "root":
        found.append(("user.name", "must be a lower-case user name other than root"))
    elif user_name_problem(name):
        found.append(("user.name", user_name_problem(name)))
    found += _service_problems(session)
    seen_ports: set[tuple[int, str]] = set()
    seen_host: set[tuple[str, int, str]] = set()
    for i, port in enumerate(session.ports):
        if (port.container, port.protocol) in seen_ports:
            found.append((f"ports.{i}.container", f"{port.container}/{port.protocol} "
                          "is published twice"))
        seen_ports.add((port.container, port.protocol))
        try:
            ipaddress.ip_address(port.host_ip)
            if "%" in port.host_ip:  # Python takes any text as an IPv6 zone; Docker takes none
                raise ValueError(port.host_ip)
        except ValueError:
            found.append((f"ports.{i}.host_ip", f"{port.host_ip!r} is not an IP address"))
        else:
            found += _public_problems(i, port)
        if port.host is not None:
            key = (port.host_ip, port.host, port.protocol)
            if key in seen_host:
                found.append((f"ports.{i}.host", f"host port {port.host}/{port.protocol} on "
                              f"{port.host_ip} is used twice"))
            seen_host.add(key)
    return found


def _public_problems(i: int, port: PublishedPort) -> list[tuple[str, str]]:
    """One rule for every published port (services follow it by construction: bound to the
    loopback unless ``public``): an address beyond the agent's loopback must be meant."""
    if not is_loopback(port.host_ip) and not port.public:
        return [(f"ports.{i}.host_ip", f"{port.host_ip} is not a loopback address: port "
                 f"{port.container}/{port.protocol} of main1 would be reachable by anyone who "
                 "reaches the agent there; add public: true to this port to mean it, or leave "
                 "host_ip unset (127.0.0.1: `sessionctl ssh`/`open` reach it through the "
                 "agent)")]
    if is_loopback(port.host_ip) and port.public:
        return [(f"ports.{i}.public", f"public: true, but host_ip {port.host_ip} is the "
                 "agent's loopback: give the address to publish on as host_ip, or drop "
                 "public")]
    return []


def _mount_problems(session: Session) -> list[tuple[str, str]]:
    """Each target on the allowlist (below the user's home, or under :data:`MOUNT_ROOTS`),
    compared as Docker cleans it; ``..`` nowhere. Host sources are the pool's business
    (:func:`mount_source_problems`)."""
    found: list[tuple[str, str]] = []
    targets: set[str] = set()
    home = f"/home/{session.user.name}"
    allowed = ", ".join(f"{r} and below" for r in MOUNT_ROOTS)
    for i, mount in enumerate(session.mounts):
        target = clean_target(mount.target)
        if not mount.target.startswith("/"):
            found.append((f"mounts.{i}.target", "must be an absolute path in the container"))
        elif _dotdot(mount.target):
            found.append((f"mounts.{i}.target", "must not contain '..': name the directory "
                          "itself"))
        elif not mount_target_allowed(target, home):
            found.append((f"mounts.{i}.target", f"{mount.target} is not where a user's data "
                          f"goes: mount below the home ({home}/NAME, not {home}/.ssh) or at "
                          f"{allowed}; the rest of the container is the image's and the "
                          "set-up's, which runs as root"))
        if ":" in mount.target:
            found.append((f"mounts.{i}.target", "must not contain ':'"))
        if target in targets:
            found.append((f"mounts.{i}.target", f"{mount.target} is mounted twice"))
        targets.add(target)
        found += _source_problems(i, mount)
        if "," in (mount.source or "") or "," in mount.target:
            found.append((f"mounts.{i}", "paths must not contain ','"))
        for field in ("source", "target"):
            if len((getattr(mount, field) or "").encode()) >= PATH_MAX:
                found.append((f"mounts.{i}.{field}", f"is longer than the {PATH_MAX - 1} bytes "
                              "a path may have (PATH_MAX)"))
    paths = sum(len((m.source or m.folder or "").encode()) + len(m.target.encode())
                for m in session.mounts)
    if paths > MAX_MOUNT_BYTES:
        found.append(("mounts", f"sources and targets are {paths} bytes in all, more than "
                      f"{MAX_MOUNT_BYTES} ({MAX_MOUNT_BYTES // 1024} KiB): every container's "
                      "plan repeats them"))
    return found


def _source_problems(i: int, mount: Mount) -> list[tuple[str, str]]:
    """Where a mount comes from: ``source`` (a host path or volume) or ``folder`` (with
    ``storage`` only then), exactly one."""
    if mount.folder is not None:
        found = []
        if mount.source is not None:
            found.append((f"mounts.{i}", "has both source and folder: a mount is a host path "
                          "or volume (source) or a data folder (folder), not both"))
        problem = folder_name_problem(mount.folder)
        if problem:
            found.append((f"mounts.{i}.folder", problem))
        if mount.storage is not None and not STORAGE_NAME.fullmatch(mount.storage):
            found.append((f"mounts.{i}.storage", f"{mount.storage!r} is not a storage name"))
        return found
    if mount.storage is not None:
        return [(f"mounts.{i}.storage", "applies only to a folder mount ({folder: NAME, "
                 "storage: ROOT, target: ...})")]
    if mount.source is None:
        return [(f"mounts.{i}", "needs a source (a host path or volume name) or a folder (a "
                 "data folder of the pool's storage)")]
    if not (mount.source.startswith("/") or VOLUME_NAME.fullmatch(mount.source)):
        return [(f"mounts.{i}.source", "must be an absolute host path or a volume name")]
    if _dotdot(mount.source):
        return [(f"mounts.{i}.source", "must not contain '..': name the directory itself")]
    return []


def mount_target_allowed(target: str, home: str) -> bool:
    """Whether a cleaned target is on the allowlist: strictly below ``home`` but not its
    ``.ssh`` (the set-up creates, chowns and writes keys there as root), or at or below one
    of :data:`MOUNT_ROOTS`."""
    if any(_covers(root, target) for root in MOUNT_ROOTS):
        return True
    return target != home and _covers(home, target) and not _covers(home + "/.ssh", target)


def mount_source_problems(session: Session, pool: Pool) -> list[tuple[str, str]]:
    """A host path may be mounted only at or below a directory the pool's ``mount_sources``
    lists (the operator's choice; none by default), compared as Docker cleans paths. A named
    volume is the pool's (``volumes``) or the session's own (agents/folders.py
    ``volume_refusals`` checks that on the agents), so the sessions of a count cannot share
    one the pool does not list."""
    found: list[tuple[str, str]] = []
    roots = [clean_target(r) for r in pool.mount_sources]
    folders: dict[tuple[str, str], int] = {}
    for i, mount in enumerate(session.mounts):
        if mount.folder is not None:
            storage, problem = storage_of(pool.storage, mount.storage)
            if problem:
                found.append((f"mounts.{i}.storage" if mount.storage else f"mounts.{i}.folder",
                              problem))
            elif (storage, mount.folder) in folders:
                found.append((f"mounts.{i}.folder", f"folder {mount.folder!r} of storage "
                              f"{storage!r} is mounted twice (also mounts."
                              f"{folders[(storage, mount.folder)]})"))
            folders.setdefault((storage or "", mount.folder), i)
            continue
        if (mount.source is not None and VOLUME_NAME.fullmatch(mount.source)
                and session.count > 1 and mount.source not in pool.volumes):
            found.append((f"mounts.{i}.source", f"volume {mount.source!r} would be shared by "
                          f"the {session.count} sessions of count: a volume a session makes is "
                          "its own; list it in the pool's volumes to share it"))
        if mount.source is None or not mount.source.startswith("/") or _dotdot(mount.source):
            continue  # a volume name, or a problem session_problems names
        source = clean_target(mount.source)
        if _covers(clean_target(pool.scratch), source):  # (an ancestor: not a mount source)
            found.append((f"mounts.{i}.source", f"{mount.source} is in the pool's scratch "
                          f"root {pool.scratch} (every session's bundles, with their keys): no "
                          "session may mount it or a path in it"))
        elif not any(_covers(root, source) for root in roots):
            found.append((f"mounts.{i}.source", f"{mount.source}: {_allowed_sources(pool)}"))
    return found


def _allowed_sources(pool: Pool) -> str:
    ask = "or ask the pool's operator to add the directory to mount_sources"
    if not pool.mount_sources:
        return (f"pool {pool.name!r} lets sessions mount no host path (it has no "
                f"mount_sources): use a named volume, {ask}")
    return (f"pool {pool.name!r} lets sessions mount host paths only at or below "
            f"{', '.join(pool.mount_sources)} (its mount_sources): use a path there or a named "
            f"volume, {ask}")


def _dotdot(path: str) -> bool:
    return ".." in path.split("/")


SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue",
                   "/run/user")
"""Directories every user can write on any Linux machine (sticky, world-writable): refused as
``mount_sources`` before any agent is asked. The rule itself is checked on each agent at ``up``
(agents/folders.py ``bind_refusals``): no link and no directory anyone but root can write on
the way of a mount source."""


def clean_target(path: str) -> str:
    """A container path as Docker cleans it (Go's ``filepath.Clean``): ``//data/`` is
    ``/data``. POSIX lets a leading ``//`` mean something else, so ``normpath`` keeps it."""
    if not path.startswith("/"):
        return path
    return "/" + posixpath.normpath(path).lstrip("/")


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two host paths is the other or below it."""
    return _covers(a, b) or _covers(b, a)


def _covers(outer: str, inner: str) -> bool:
    """Whether a mount at ``outer`` covers ``inner`` (the same path, or an ancestor of it)."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _hidden(text: str) -> bool:
    """Whether ``text`` holds a control, format or line-break character (never meant in a
    name or a path, and what forges output on a terminal)."""
    return any(is_hidden(c) for c in text)


def _controls(text: str, allow: str) -> bool:
    return any(unicodedata.category(c) == "Cc" and c not in allow for c in text)


NO_CONTROLS = "must not contain control characters (newline, escape, NUL, ...)"


def _text_problems(session: Session) -> list[tuple[str, str]]:
    """Control characters where a value names something (an image, a path, the pool) or
    reaches a process as an argument: there they are never meant, and they forge output.

    Env values are the exception: they are kept byte for byte (only NUL is impossible in a
    process's environment), and are escaped wherever they are printed. Command arguments may
    hold newlines and tabs (``bash -c`` scripts), nothing else of the kind.
    """
    found: list[tuple[str, str]] = []
    for path, value in (("image", session.image), ("pool", session.pool)):  # names: regexes
        if _hidden(value):
            found.append((path, NO_CONTROLS))
    if "/" not in session.pool and len(f"{session.pool}.yaml".encode()) > 255:
        found.append(("pool", "is too long for a pool name (a file name: at most 250 bytes)"))
    for i, mount in enumerate(session.mounts):
        for field in ("source", "folder", "storage", "target"):
            if _hidden(getattr(mount, field) or ""):
                found.append((f"mounts.{i}.{field}", NO_CONTROLS))
    for i, arg in enumerate(session.command):
        if _controls(arg, allow="\n\t"):
            found.append((f"command.{i}", "must not contain control characters other than "
                          "newline and tab"))
        if len(arg.encode()) + 1 > MAX_ARG_STRLEN:
            found.append((f"command.{i}", f"is too long: the kernel passes at most "
                          f"{MAX_ARG_STRLEN - 1} bytes per argument (MAX_ARG_STRLEN)"))
    argv = sum(len(arg.encode()) + 1 + 8 for arg in session.command)
    if argv > MAX_ENV_BYTES:
        found.append(("command", f"is {argv} bytes in all (each argument, its NUL and pointer), "
                      f"more than {MAX_ENV_BYTES}: the kernel passes at most 2 MiB of arguments "
                      "and environment to a program (ARG_MAX); put a long script in a mounted "
                      "file"))
    return found




def slots_per_container(session: Session) -> int:
    """The hostfiles' slots: distributed.slots, else the GPUs per container, else 1."""
    if session.distributed is not None and session.distributed.slots is not None:
        return session.distributed.slots
    return session.resources.gpu or 1


def _derived_ports(session: Session) -> list[tuple[str, int, int]]:
    """(dotted path, first, last) of the ports cluster-env.sh derives (MASTER_PORT, TF_CONFIG's
    base + rank): the base is env MASTER_PORT when it is a port, else
    distributed.master_port; nothing for one container."""
    size = session.cluster.size
    if size <= 1:
        return []
    bases = []
    user_port = session.env.get("MASTER_PORT")
    if user_port is not None and re.fullmatch(r"[1-9][0-9]{0,4}", user_port) \
            and int(user_port) <= 65535:
        bases.append(("env.MASTER_PORT", int(user_port)))
    if session.distributed is not None:
        bases.append(("distributed.master_port", session.distributed.master_port))
    elif user_port is None:
        bases.append(("distributed.master_port", DEFAULT_MASTER_PORT))
    return [(path, base, base + size - 1) for path, base in bases]


def _service_problems(session: Session) -> list[tuple[str, str]]:
    """Names on the allowlist and unique; a container port that is not sshd's, not one the
    distributed variables derive, and published once (by ``services`` or ``ports``)."""
    found: list[tuple[str, str]] = []
    names: dict[str, int] = {}
    ports: dict[int, str] = {p.container: f"ports.{i}" for i, p in enumerate(session.ports)
                             if p.protocol == "tcp"}
    derived = _derived_ports(session)
    for i, svc in enumerate(session.services):
        if not SERVICE_NAME.fullmatch(svc.name):
            found.append((f"services.{i}.name", f"{svc.name!r} must be 1-32 lower-case letters, "
                          "digits or '-', starting with a letter and not ending with '-'"))
        elif svc.name in names:
            found.append((f"services.{i}.name", f"duplicate service name {svc.name!r} (also "
                          f"services.{names[svc.name]})"))
        names.setdefault(svc.name, i)
        if svc.port == SSH_PORT:
            found.append((f"services.{i}.port", f"{SSH_PORT} is sshd's port in every container "
                          "(`sessionctl ssh` reaches it); serve the app on another port"))
        elif svc.port in ports:
            found.append((f"services.{i}.port", f"container port {svc.port} is already "
                          f"published by {ports[svc.port]}"))
        else:
            for path, first, last in derived:
                if first <= svc.port <= last:
                    found.append((f"services.{i}.port", f"{svc.port} is one of the ports the "
                                  f"distributed variables use ({first}-{last}, from {path}): "
                                  "serve the app on another port"))
                    break
        ports.setdefault(svc.port, f"services.{i}")
    return found


def _port_problems(session: Session) -> list[tuple[str, str]]:
    """Ports cluster-env.sh derives must not be sshd's: MASTER_PORT (and PET_MASTER_PORT) is
    the base, TF_CONFIG gives rank r the port base + r. The base is env MASTER_PORT when it is
    a port (cluster-env.sh keeps the user's value), else distributed.master_port."""
    size = session.cluster.size
    found: list[tuple[str, str]] = []
    for path, base, last in _derived_ports(session):  # none for one container
        if base <= SSH_PORT <= last:
            what = "is sshd's port" if base == SSH_PORT else (
                f"gives TF_CONFIG ports {base}-{last} for {size} containers, which include "
                f"sshd's port {SSH_PORT}")
            found.append((path, f"{base} {what}; choose a port above {SSH_PORT} (e.g. "
                          f"{DEFAULT_MASTER_PORT})"))
        elif last > 65535:
            found.append((path, f"{base} gives TF_CONFIG ports up to {last} for {size} "
                          "containers, beyond 65535"))
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
        problem = _docker_host_problem(agent.docker_host) or _reach_mismatch(agent)
        if problem:
            found.append((f"agents.{i}.docker_host", problem))
        if agent.tls is not None and not agent.docker_host.startswith("tcp://"):
            found.append((f"agents.{i}.tls", "applies only to a tcp:// docker_host"))
        found += [(f"agents.{i}.{path}", msg) for path, msg in _reach_problems(agent)]
        seen: set[int] = set()
        for gpu in agent.capacity.gpus:
            if gpu in seen:
                found.append((f"agents.{i}.capacity.gpus", f"GPU id {gpu} is listed twice"))
            seen.add(gpu)
    ranges = [("service_ports", pool.service_ports)] + [
        (f"agents.{i}.service_ports", a.service_ports) for i, a in enumerate(pool.agents)
        if a.service_ports is not None]
    for path, span in ranges:
        if span.first > span.last:
            found.append((f"{path}.first", f"{span.first} is above last ({span.last}): the "
                          "range is first..last, inclusive"))
    if _hidden(pool.name):
        found.append(("name", NO_CONTROLS))
    for i, root in enumerate(pool.mount_sources):
        if not root.startswith("/") or _dotdot(root):
            found.append((f"mount_sources.{i}", "must be an absolute host directory without "
                          "'..'"))
        elif _hidden(root) or any(c in root for c in ",:"):
            found.append((f"mount_sources.{i}", "must not contain control characters, ',' "
                          "or ':'"))
        elif any(_covers(shared, clean_target(root)) for shared in SHARED_WRITABLE):
            found.append((f"mount_sources.{i}", f"{root} is in a directory every user (every "
                          "session) can write: one session could put a link there that "
                          "another's mount follows; list a directory only root can write"))
    for i, volume in enumerate(pool.volumes):
        if not VOLUME_NAME.fullmatch(volume):
            found.append((f"volumes.{i}", f"{volume!r} is not a volume name (letters, digits, "
                          "'_', '.', '-', starting with a letter or digit)"))
    found += _storage_problems(pool)
    found += _scratch_problems(pool)
    found += _privilege_problems(pool.privileges)
    found += _policy_problems(pool.policies)
    if pool.swarm and pool.swarm.manager not in names:
        found.append(("swarm.manager", f"{pool.swarm.manager!r} is not one of the pool's agents "
                      f"({', '.join(names)})"))
    return found


def _plain_root(path: str) -> bool:
    """An absolute path other than ``/`` without ``..`` (other roots have a problem of their
    own, said once)."""
    return path.startswith("/") and not _dotdot(path) and clean_target(path) != "/"


def _scratch_problems(pool: Pool) -> list[tuple[str, str]]:
    """The scratch root: absolute, no ``..``, not ``/``, and apart from every
    path the pool lets a session mount (mount_sources, storage roots): a session that could
    mount it would read every session's keys, or put a link that decides what another mounts.
    Named volumes are names (the engine's own directory), never a path in it."""
    root = pool.scratch
    if not root.startswith("/") or _dotdot(root) or clean_target(root) == "/":
        return [("scratch", "must be an absolute host directory other than '/', without '..'")]
    if _hidden(root) or any(c in root for c in ",:"):
        return [("scratch", "must not contain control characters, ',' or ':'")]
    root = clean_target(root)
    if len(root.encode()) > 1024:
        return [("scratch", "is too long: at most 1024 bytes")]
    # what is on its way on the agent (no link; the root the SSH user's, 0700) is checked
    # there, at every delivery (agents/bundles.py)
    found: list[tuple[str, str]] = []
    for i, source in enumerate(pool.mount_sources):
        if _plain_root(source) and _overlaps(clean_target(source), root):
            found.append((f"mount_sources.{i}", f"{source} overlaps the pool's scratch root "
                          f"{root} (every session's bundles): they must be separate "
                          "directories"))
    for name, storage in pool.storage.items():
        if _plain_root(storage) and _overlaps(clean_target(storage), root):
            found.append((f"storage.{name}", f"{storage} overlaps the pool's scratch root "
                          f"{root} (every session's bundles): they must be separate "
                          "directories"))
    return found


def _policy_problems(policies: Policies) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    named = [("policies.default", policies.default)] + [
        (f"policies.projects.{name}", policy) for name, policy in policies.projects.items()]
    for name in policies.projects:
        if name == DEFAULT_PROJECT:
            found.append((f"policies.projects.{name}", f"{DEFAULT_PROJECT!r} is the policy of "
                          "sessions that name no project (policies.default): give the project "
                          "another name"))
        elif not PROJECT_NAME.fullmatch(name):
            found.append((f"policies.projects.{name}", "must be a project name: lowercase "
                          "letters, digits, '_' or '-', starting with a letter or digit"))
    if policies.default.definitions:
        found.append(("policies.default.definitions", "the default policy is for definitions "
                      "that name no project, wherever they live: list directories under a "
                      "project"))
    for path, policy in named:
        for i, where in enumerate(policy.definitions):
            if _hidden(where) or "\0" in where:
                found.append((f"{path}.definitions.{i}", NO_CONTROLS))
        if (policy.default_lifetime is not None and policy.max_lifetime is not None
                and policy.default_lifetime > policy.max_lifetime):
            found.append((f"{path}.default_lifetime", f"{format_duration(policy.default_lifetime)}"
                          f" is above max_lifetime ({format_duration(policy.max_lifetime)})"))
    return found


def _privilege_problems(privileges: SessionPrivileges) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, cap in enumerate(privileges.capabilities):
        path = f"privileges.capabilities.{i}"
        if cap in seen:
            found.append((path, f"{cap} is listed twice"))
        elif cap not in LINUX_CAPABILITIES:
            bare = cap.upper().removeprefix("CAP_")
            hint = (f" (write {bare})" if bare in LINUX_CAPABILITIES else
                    f"; one of {', '.join(sorted(LINUX_CAPABILITIES))}")
            found.append((path, f"{cap!r} is not a Linux capability{hint}"))
        seen.add(cap)
    return found


def _storage_problems(pool: Pool) -> list[tuple[str, str]]:
    """Storage roots: named plainly, absolute, not ``/``, no ``..``, not one inside another
    (a folder of one root would be a path in the other, and the same directory two folders)."""
    found: list[tuple[str, str]] = []
    cleaned: dict[str, str] = {}
    for name, root in pool.storage.items():
        path = f"storage.{name}"
        if not STORAGE_NAME.fullmatch(name):
            found.append(("storage", f"{name!r} is not a storage name: letters, digits, '_', "
                          "'.' or '-', starting with a letter or digit"))
            continue
        if not root.startswith("/") or _dotdot(root) or clean_target(root) == "/":
            found.append((path, "must be an absolute host directory other than '/', without "
                          "'..'"))
        elif _hidden(root) or any(c in root for c in ",:"):
            found.append((path, "must not contain control characters, ',' or ':'"))
        elif len(folder_path(root, "x" * 64).encode()) >= PATH_MAX:
            found.append((path, f"is too long: its folders' paths pass {PATH_MAX - 1} bytes"))
        else:
            root = clean_target(root)
            for other, other_root in cleaned.items():
                if _covers(other_root, root) or _covers(root, other_root):
                    found.append((path, f"{root} overlaps storage {other!r} ({other_root}): "
                                  "roots must be separate directories"))
            cleaned[name] = root
    return found


def _host_problem(host: str) -> str | None:
    """A host that ``ssh`` (or the docker CLI's ssh helper) would read as an option, such as
    ``-oProxyCommand=...``, runs a command on the operator's machine."""
    if host.startswith("-"):
        return f"{host!r} must not begin with '-' (ssh would read it as an option)"
    if not HOST.fullmatch(host):
        return f"{host!r} must be a host name or IP address (letters, digits, '.', '-', ':')"
    return None


def _user_problem(user: str) -> str | None:
    if user.startswith("-"):
        return f"{user!r} must not begin with '-' (ssh would read it as an option)"
    if any(c.isspace() for c in user) or _hidden(user):
        return "must not contain whitespace or control characters"
    return None


def _reach_mismatch(agent: Agent) -> str | None:
    """What the ``ssh`` and ``tls`` blocks say must agree with the docker_host's scheme
    (agents.reach): with ``ssh`` it is the socket on the agent; ``tcp://`` needs TLS."""
    scheme = agent.docker_host.partition("://")[0]
    if agent.ssh is not None and scheme != "unix":
        return ("with an ssh block, docker_host names the engine's socket on the agent: "
                f"unix:///PATH (default {DEFAULT_DOCKER_HOST}); the ssh block says how "
                "the agent is reached")
    if scheme == "tcp" and agent.tls is None:
        return ("tcp:// without TLS gives anyone who reaches the port root on the agent: add "
                "tls: {cert_path: DIR} (ca.pem, cert.pem, key.pem), or reach the agent over "
                "ssh")
    return None


def _docker_host_problem(value: str) -> str | None:
    if _hidden(value):
        return NO_CONTROLS
    if not DOCKER_HOST.fullmatch(value):
        return "must be unix:///PATH, ssh://[USER@]HOST[:PORT] or tcp://HOST:PORT (with tls)"
    try:
        parts = urlsplit(value)
    except ValueError:  # a [bracketed] host that is no IP address, or no closing ']'
        return "must hold an IP address between '[' and ']' (e.g. ssh://[::1]:22)"
    if parts.scheme == "unix" and not (parts.netloc == "" and parts.path.startswith("/")):
        return "must be unix:///ABSOLUTE/PATH"
    if parts.scheme not in ("ssh", "tcp"):
        return None
    user, at, hostport = parts.netloc.rpartition("@")
    if at and parts.scheme == "tcp":
        return "tcp:// takes no user"
    if ":" in user:  # never echoed: it is a password
        return ("must not hold a password (USER:PASSWORD@): docker and ssh refuse it, and a "
                "pool file is no place for one; use a key")
    if at:  # Go's URL parser (the docker CLI's) decodes %-escapes: check what it will see
        problem = _user_problem(unquote(user))
        if problem:
            return f"user {problem}"
    try:
        if parts.port == 0:
            return "has port 0, which no engine listens on"
    except ValueError:
        return "has a port that is not a number from 1 to 65535"
    if parts.scheme == "tcp" and parts.port is None:
        return "tcp:// needs a port (Docker's TLS port is 2376)"
    # more than one ':' outside [brackets] is a port Python refused above
    host = hostport[:hostport.index("]") + 1] if hostport.startswith("[") and "]" in hostport \
        else hostport.partition(":")[0]
    if not host:
        return "names no host"
    problem = _host_problem(host) or _host_problem(unquote(host))
    if problem is None and parts.path not in ("", "/"):
        return f"must be {parts.scheme}://[USER@]HOST[:PORT] with no path"
    return problem


def _reach_problems(agent: Agent) -> list[tuple[str, str]]:
    """The ssh block and the advertise address: values that reach ssh, paths and commands."""
    found: list[tuple[str, str]] = []
    if agent.ssh is not None:
        problem = _host_problem(agent.ssh.host)
        if problem:
            found.append(("ssh.host", problem))
        problem = _user_problem(agent.ssh.user)
        if problem:
            found.append(("ssh.user", problem))
        for field in ("key_file", "known_hosts"):
            value = getattr(agent.ssh, field)
            if value is not None and _hidden(value):
                found.append((f"ssh.{field}", NO_CONTROLS))
            elif value is not None and not SSH_OPTION_VALUE.fullmatch(value):
                found.append((f"ssh.{field}", "must not contain whitespace, quotes or '%': the "
                              "path is handed to ssh as an -o option, which would split or "
                              "expand it"))
    if agent.tls is not None and _hidden(agent.tls.cert_path):
        found.append(("tls.cert_path", NO_CONTROLS))
    if agent.address is not None:
        problem = _host_problem(agent.address)
        if problem:
            found.append(("address", problem))
    return found
