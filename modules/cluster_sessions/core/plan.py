"""The cluster plan: everything about a session that can be decided without touching anything.

``build_plan`` is a pure function of a session, its pool and (optionally) live free capacity.
The renderer, the Pulumi component, ``sessionctl plan`` and ``sessionctl diff`` all read the
plan; none of them decides a cluster fact again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from .bundles import SCRATCH, UPLOAD, delivery_of, delivery_reason
from .clusterenv import kernel_id, members, split_user_env, static_envs
from .folders import folder_path, storage_of
from .loader import Loaded
from .names import (
    CPU_LABEL,
    ENCRYPTED_LABEL,
    EXPIRES_LABEL,
    GPUS_LABEL,
    HOST_LABEL,
    KERNEL_ID_LABEL,
    MADE_BY_LABEL,
    MEM_LABEL,
    MTU_LABEL,
    PROJECT_LABEL,
    ROLE_LABEL,
    SESSION_ID_LABEL,
    SESSION_LABEL,
    STACK_ID_LABEL,
    STACK_LABEL,
)
from .placement import Free, Placement, Request, Slot, place, take
from .problems import DefinitionError, Problem
from .services import ALL_ADDRESSES, LOOPBACK, bind_address, service_url
from .spec import (
    DEFAULT_COMMAND,
    DEFAULT_PROJECT,
    SSH_PORT,
    Pool,
    PortRange,
    Resources,
    Session,
    SessionLimits,
    SessionPrivileges,
    agent_address,
    clean_target,
    is_loopback,
    mount_source_problems,
    slots_per_container,
)
from .units import format_size


@dataclass(frozen=True)
class ContainerPlan:
    host: str
    role: str
    idx: int
    local_rank: int
    agent: str | None  # None while the session is pending
    kernel_id: str
    env: Mapping[str, str]  # the static env the container is created with: BACKENDAI_* only
    gpus: tuple[int, ...]
    # the definition's variables: never in ``env`` (root would see them); the bundle gives them
    # to the session user's processes only (the command, ssh sessions, the user's login shells)
    user_env: Mapping[str, str] = field(default_factory=dict)
    # processes per container in the MPI/DeepSpeed hostfiles (spec.slots_per_container)
    slots: int = 1

    @property
    def exec_env(self) -> dict[str, str]:
        """The part of ``user_env`` put on the exec of the user's program only, never assigned
        by a shell (clusterenv.read_at_startup)."""
        return split_user_env(self.user_env)[1]

    @property
    def container_name(self) -> str:
        return f"{self.env['BACKENDAI_SESSION_NAME']}-{self.host}"


@dataclass(frozen=True)
class PlannedMount:
    """One mount of every container, its host side resolved: a host path or volume as the
    definition gave it, or a data folder's ``<root>/<folder>`` (core.folders)."""

    source: str  # a host path (bind) or a volume name
    target: str
    read_only: bool
    folder: str | None = None  # a data folder: made if missing, never removed
    storage: str | None = None
    root: str | None = None  # the storage root the folder is in
    listed: bool = False  # a named volume the pool lists (``volumes``): the operator's, shared

    @property
    def type(self) -> str:
        return "bind" if self.source.startswith("/") else "volume"

    @property
    def made(self) -> bool:
        """A named volume the session makes (the pool does not list it), labelled its own
        (:func:`volume_labels`)."""
        return self.folder is None and self.type == "volume" and not self.listed

    def as_dict(self) -> dict:
        extra = {"folder": self.folder, "storage": self.storage} if self.folder else {}
        return {"source": self.source, "target": self.target, "read_only": self.read_only,
                **extra}


def planned_mounts(session: Session, pool: Pool) -> tuple[PlannedMount, ...]:
    """The definition's mounts with each folder's host path. A folder whose storage the pool
    lacks gets an empty source: :func:`definition_problems` refuses it before anything uses it."""
    out = []
    for m in session.mounts:
        if m.folder is None:
            out.append(PlannedMount(m.source or "", m.target, m.read_only,
                                    listed=m.source in pool.volumes))
            continue
        storage, _ = storage_of(pool.storage, m.storage)
        source = folder_path(pool.storage[storage], m.folder) if storage else ""
        root = pool.storage[storage] if storage else None
        out.append(PlannedMount(source, m.target, m.read_only, m.folder, storage, root))
    return tuple(out)


@dataclass(frozen=True)
class NetworkPlan:
    driver: str  # bridge | overlay: what is built, not what was asked for
    name: str
    agent: str | None  # where it is created: the one agent, or the swarm manager
    mtu: int | None
    encrypted: bool


@dataclass(frozen=True)
class ServicePlan:
    """A service of main1: where its agent binds it, and the host port chosen at ``up``
    (``host_port`` None until then: core.services decides it from what the engine holds)."""

    name: str
    port: int  # in main1
    protocol: str
    public: bool
    preferred_port: int | None
    agent: str | None
    bind: str  # the address the agent's engine binds it to
    reach: str  # the address a person (or `sessionctl open`, from the agent) reaches it at
    port_range: PortRange
    host_port: int | None = None

    @property
    def url(self) -> str | None:
        if self.host_port is None:
            return None
        return service_url(self.protocol, self.reach, self.host_port)

    def to_dict(self) -> dict:
        return {"name": self.name, "port": self.port, "protocol": self.protocol,
                "public": self.public, "preferred_port": self.preferred_port,
                "agent": self.agent, "bind": self.bind,
                "port_range": [self.port_range.first, self.port_range.last],
                "host_port": self.host_port, "url": self.url}


@dataclass(frozen=True)
class ClusterPlan:
    session: Session
    session_id: str
    status: str  # scheduled | pending
    reason: str | None
    network: NetworkPlan
    containers: tuple[ContainerPlan, ...]
    mounts: tuple[PlannedMount, ...] = ()
    services: tuple[ServicePlan, ...] = ()
    # whose the session's objects are (core/decisions.py): set by the program from the stack's
    # config (with_identity); "" in an offline plan
    stack_id: str = ""
    stack: str = ""
    made_by: str = ""
    limits: SessionLimits = SessionLimits()  # the pool's, for every container
    privileges: SessionPrivileges = SessionPrivileges()  # the pool's, for every container
    # what every container is created from when the image was resolved at ``up`` (the stack's
    # kept ``image``, core/decisions.py): ``repo@sha256:…`` or an image ID; "" in an offline
    # plan, whose containers name the definition's reference as it is
    pinned_image: str = ""
    # when the session's lifetime ends (epoch seconds; core/governance.py): decided at its
    # first ``up`` and kept in the stack's config; None: no lifetime (or an offline plan)
    expires_at: int | None = None
    # how each agent's bundles reach its containers (core/bundles.py): (agent, scratch |
    # upload, why), in the order of ``agents``; and the pool's scratch root on the agents
    deliveries: tuple[tuple[str, str, str], ...] = ()
    scratch: str = ""

    def delivery(self, agent: str | None) -> str:
        """``scratch`` or ``upload`` for ``agent`` (upload when the plan does not say)."""
        return next((d for a, d, _ in self.deliveries if a == agent), UPLOAD)

    @property
    def name(self) -> str:
        return self.session.name

    @property
    def mode(self) -> str:
        return self.session.cluster.mode

    @property
    def image(self) -> str:
        """What every container is created from: the pinned image, else the definition's."""
        return self.pinned_image or self.session.image

    @property
    def resources(self) -> Resources:
        return self.session.resources

    @property
    def folders(self) -> tuple[PlannedMount, ...]:
        """The data folders, each once (made on every agent the session uses)."""
        seen = {m.source: m for m in self.mounts if m.folder is not None}
        return tuple(seen.values())

    @cached_property
    def hosts(self) -> tuple[str, ...]:
        # Cached: rendering asks for it once per container, and it is O(N) to build.
        return tuple(c.host for c in self.containers)

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.agent for c in self.containers if c.agent))

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @property
    def placement(self) -> Placement:
        """Where the containers run (agent, GPU ids), in host order: what core.decisions keeps."""
        if self.pending:
            return Placement(reason=self.reason)
        return Placement(tuple(Slot(c.agent or "", c.gpus) for c in self.containers))




def with_service_ports(plan: ClusterPlan, ports: Mapping[str, int]) -> ClusterPlan:
    """``plan`` with the host ports chosen for its services (by name; others stay None)."""
    return replace(plan, services=tuple(replace(s, host_port=ports.get(s.name, s.host_port))
                                        for s in plan.services))


def with_identity(plan: ClusterPlan, stack_id: str, stack: str, made_by: str = "") -> ClusterPlan:
    """``plan`` as stack ``stack`` (id ``stack_id``, made by ``made_by``) makes it: every label
    of its containers and network says so."""
    return replace(plan, stack_id=stack_id, stack=stack, made_by=made_by)


def with_image(plan: ClusterPlan, pinned: str) -> ClusterPlan:
    """``plan`` with every container created from ``pinned`` (core.decisions.KeptImage)."""
    return replace(plan, pinned_image=pinned)


def with_expiry(plan: ClusterPlan, expires_at: int | None) -> ClusterPlan:
    """``plan`` whose containers end their command at ``expires_at`` (templates/lifetime.sh)."""
    return replace(plan, expires_at=expires_at)


def identity_labels(plan: ClusterPlan) -> dict[str, str]:
    """The labels saying whose an object is (none in an offline plan)."""
    if not plan.stack_id:
        return {}
    labels = {STACK_ID_LABEL: plan.stack_id, STACK_LABEL: plan.stack}
    if plan.session.project is not None:  # the default policy's sessions carry none
        labels[PROJECT_LABEL] = plan.session.project
    if plan.made_by:
        labels[MADE_BY_LABEL] = plan.made_by
    return labels


def _services(session: Session, pool: Pool, agent: str | None) -> tuple[ServicePlan, ...]:
    address = agent_address(pool.agent(agent)) if agent else None
    span = pool.service_ports_of(agent) if agent else pool.service_ports
    out = []
    for svc in session.services:
        bind = bind_address(svc, address)
        out.append(ServicePlan(svc.name, svc.port, svc.protocol, svc.public, svc.preferred_port,
                               agent, bind, LOOPBACK if bind == ALL_ADDRESSES else bind, span))
    return tuple(out)


def runs_job(plan: ClusterPlan, container: ContainerPlan) -> bool:
    """Whether this container runs the batch job: main1 of a batch session."""
    return plan.session.type == "batch" and container.role == "main"


def container_command(plan: ClusterPlan, container: ContainerPlan) -> tuple[str, ...]:
    """The command a container is created with. In a batch session only main1 runs the job;
    the subs stay up for ssh (spec.DEFAULT_COMMAND) until the session is torn down."""
    if plan.session.type == "batch" and not runs_job(plan, container):
        return DEFAULT_COMMAND
    return tuple(plan.session.command)


def container_labels(plan: ClusterPlan, container: ContainerPlan) -> dict[str, str]:
    """Labels that let ``status``, ``logs``, capacity probes and clean-up find our containers."""
    return {
        SESSION_LABEL: plan.name,
        SESSION_ID_LABEL: plan.session_id,
        HOST_LABEL: container.host,
        ROLE_LABEL: container.role,
        KERNEL_ID_LABEL: container.kernel_id,
        CPU_LABEL: f"{plan.resources.cpu:g}",
        MEM_LABEL: str(plan.resources.mem),
        GPUS_LABEL: ",".join(map(str, container.gpus)),
        **identity_labels(plan),
        **({EXPIRES_LABEL: str(plan.expires_at)} if plan.expires_at is not None else {}),
    }


def network_labels(plan: ClusterPlan) -> dict[str, str]:
    """Labels of the session network; the MTU and encryption too, so that a change to them
    replaces the network although the provider's ``options`` are not compared (Docker adds its
    own there: session.py)."""
    return {SESSION_LABEL: plan.name, SESSION_ID_LABEL: plan.session_id,
            MTU_LABEL: str(plan.network.mtu or ""),
            ENCRYPTED_LABEL: "true" if plan.network.encrypted else "false",
            **identity_labels(plan)}


def volume_labels(plan: ClusterPlan) -> dict[str, str]:
    """Labels of a named volume the session makes (``PlannedMount.made``): its SessionVolume
    makes it with them (pulumi_layer/volumes.py), and they are what says, on any later
    ``up``, that the volume is this session's own (agents/folders.py)."""
    return {SESSION_LABEL: plan.name}


def request_of(resources: Resources) -> Request:
    return Request(resources.millicpu, resources.mem, resources.gpu)


def pool_capacity(pool: Pool) -> list[Free]:
    """Declared capacity, for offline planning (``--probe`` passes live free capacity)."""
    return [Free(a.name, a.capacity.millicpu, a.capacity.mem, a.capacity.gpus)
            for a in pool.agents]


def network_name(session: Session, mtu: int | None = None, encrypted: bool = False) -> str:
    """``<session>-net``, plus the options it is built with (``-mtu1450``, ``-enc``): a
    network's options cannot change in place, and the provider does not compare them (Docker
    adds its own: provider_facts.NETWORK_IGNORED), so they are part of its identity. Another MTU
    is another network, built with the new options, and the containers move to it."""
    return f"{session.name}-net" + (f"-mtu{mtu}" if mtu else "") + ("-enc" if encrypted else "")


def session_copies(session: Session) -> tuple[Session, ...]:
    """The sessions a definition makes: itself, or with ``count: K`` K alike ones named
    ``<name>-1`` .. ``<name>-K`` (Backend.AI's "Sessions" in its launch dialog)."""
    if session.count == 1:
        return (session,)
    return tuple(session.model_copy(update={"name": f"{session.name}-{i}", "count": 1})
                 for i in range(1, session.count + 1))


def build_plans(session: Session, pool: Pool, free: Sequence[Free] | None = None,
                kept: Mapping[str, Placement] | None = None,
                after: str | None = None) -> tuple[ClusterPlan, ...]:
    """Every session of a definition, planned together: each is placed on what the ones before
    it left, and when one does not fit, all are pending with the reason (none is launched
    while another cannot be). ``kept``: the placements already decided (core.decisions), by
    session name: those sessions stay where they are, and the others are placed on what is
    left beside them. The pool's selector picks the agents; ``after`` is the agent its last
    decision chose (roundrobin), and each session placed here moves it on to its main1's
    agent: the caller keeps the last placed session's main1 agent for the next decision."""
    return place_sessions(session_copies(session), pool, free, kept, after)


def place_sessions(copies: Sequence[Session], pool: Pool, free: Sequence[Free] | None = None,
                   kept: Mapping[str, Placement] | None = None,
                   after: str | None = None) -> tuple[ClusterPlan, ...]:
    """:func:`build_plans` for some of a definition's sessions (an ``up --index I`` places
    only session I, beside what the others hold on the engines)."""
    kept = kept or {}
    left = list(pool_capacity(pool) if free is None else free)
    for copy in copies:
        if copy.name in kept:
            left = take(left, kept[copy.name], request_of(copy.resources))
    placements: list[Placement] = []
    for copy in copies:
        request = request_of(copy.resources)
        if copy.name in kept:
            placements.append(kept[copy.name])
            continue
        placement = place(copy.cluster.mode, copy.cluster.size, request, left,
                          pool.scheduler.selector, after)
        if len(placement.agents) > 1 and pool.swarm is None:  # no one to make the overlay
            placement = Placement(reason=no_swarm_reason(pool))
        if placement.pending:
            reason = placement.reason if len(copies) == 1 else (
                f"the {len(copies)} sessions of count: {len(copies)} do not fit together, "
                f"{copy.name} is left over: {placement.reason}")
            return tuple(_plan(c, pool, Placement(reason=reason)) for c in copies)
        placements.append(placement)
        left = take(left, placement, request)
        after = placement.slots[0].agent
    return tuple(_plan(c, pool, p) for c, p in zip(copies, placements, strict=True))


def plan_placed(session: Session, pool: Pool, placement: Placement) -> ClusterPlan:
    """The plan of one session (a copy, with ``count``) where ``placement`` puts it: a kept
    decision (core.decisions), read back by the program."""
    return _plan(session, pool, placement)


def build_plan(session: Session, pool: Pool, free: Sequence[Free] | None = None) -> ClusterPlan:
    """The plan of a definition that makes one session (``count`` 1)."""
    if session.count != 1:
        raise ValueError(f"session {session.name} has count {session.count}: use build_plans")
    return build_plans(session, pool, free)[0]


def no_swarm_reason(pool: Pool) -> str:
    return (f"multi-node needs a swarm manager, but pool {pool.name!r} has no swarm.manager, "
            "and no one agent holds the whole session")


def definition_problems(session: Session, pool: Pool) -> list[tuple[str, str]]:
    """What makes a definition unusable with its pool whatever the agents hold now, as
    ``(dotted path, message)``: a multi-node session that its pool's declared capacity spreads
    over several agents, in a pool without a swarm manager (live capacity may spread a session
    that declared capacity does not; the plan is then pending with the same reason); and a
    host path the pool does not let sessions mount (:func:`spec.mount_source_problems`)."""
    found = mount_source_problems(session, pool)
    if pool.swarm is not None or session.cluster.mode != "multi-node":
        return found
    plans = build_plans(session, pool)
    reason = no_swarm_reason(pool)
    return found + ([("cluster.mode", reason)] if any(p.reason == reason for p in plans) else [])


def check_usable(loaded: Loaded) -> Loaded:
    """``loaded``, or DefinitionError naming the session file and field of each
    :func:`definition_problems` (the driver and the program both ask this, once each)."""
    found = definition_problems(loaded.session, loaded.pool)
    if found:
        raise DefinitionError([Problem(str(loaded.session_file), path, message)
                               for path, message in found])
    return loaded


def _plan(session: Session, pool: Pool, placement: Placement) -> ClusterPlan:
    size = session.cluster.size
    group = members(size)
    master_port = session.distributed.master_port if session.distributed else None
    envs = static_envs(session.name, session.cluster.mode, group, master_port)
    slots = placement.slots or (None,) * size
    user_env = dict(session.env)
    containers = tuple(
        ContainerPlan(
            host=m.host, role=m.role, idx=m.idx, local_rank=m.local_rank,
            agent=slot.agent if slot else None,
            kernel_id=env["BACKENDAI_KERNEL_ID"], env=env,
            gpus=slot.gpus if slot else (), user_env=user_env,
            slots=slots_per_container(session),
        )
        for m, env, slot in zip(group, envs, slots, strict=True)
    )
    agents = placement.agents
    overlay = len(agents) > 1
    if overlay:
        # build_plans spreads a session over several agents only in a pool with a swarm
        assert pool.swarm is not None
        net_agent = pool.swarm.manager
    else:
        net_agent = agents[0] if agents else None
    encrypted = overlay and pool.network.encrypted
    network = NetworkPlan(
        driver="overlay" if overlay else "bridge",
        name=network_name(session, pool.network.mtu, encrypted),
        agent=net_agent,
        mtu=pool.network.mtu,
        encrypted=encrypted,
    )
    return ClusterPlan(
        session=session,
        session_id=kernel_id(session.name, "main1"),
        status="pending" if placement.pending else "scheduled",
        reason=placement.reason,
        network=network,
        containers=containers,
        mounts=planned_mounts(session, pool),
        services=_services(session, pool, containers[0].agent),
        limits=pool.limits,
        privileges=pool.privileges,
        deliveries=tuple((a, delivery_of(pool.agent(a), pool), delivery_reason(pool.agent(a), pool))
                         for a in dict.fromkeys(c.agent for c in containers if c.agent)),
        scratch=clean_target(pool.scratch),
    )


def plan_to_dict(plan: ClusterPlan) -> dict:
    """The JSON form of contract 2 (``sessionctl plan --json``)."""
    res = plan.resources
    mounts = [m.as_dict() for m in plan.mounts]
    return {
        "session": {"name": plan.name, "id": plan.session_id},
        "type": plan.session.type,
        "mode": plan.mode,
        "status": plan.status,
        # governance (contract 8): the project it runs under ("default": the pool's default
        # policy), its priority
        "project": plan.session.project or DEFAULT_PROJECT,
        "priority": plan.session.priority,
        **({"reason": plan.reason} if plan.reason else {}),
        "image": plan.session.image,
        **({"image_pinned": plan.pinned_image} if plan.pinned_image else {}),
        "network": {
            "driver": plan.network.driver,
            "name": plan.network.name,
            "agent": plan.network.agent,
            "mtu": plan.network.mtu,
            "encrypted": plan.network.encrypted,
        },
        "agents": list(plan.agents),
        "ssh_port": SSH_PORT,
        "services": [s.to_dict() for s in plan.services],
        "limits": {"log_max_size": format_size(plan.limits.log_max_size),
                   "log_max_files": plan.limits.log_max_files,
                   "pids_limit": plan.limits.pids_limit},
        "privileges": {"capabilities": list(plan.privileges.capabilities),
                       "no_new_privileges": plan.privileges.no_new_privileges},
        # how each agent's bundles reach its containers (issue 45, core/bundles.py)
        "delivery": {"scratch": plan.scratch,
                     "agents": {a: {"delivery": d, "why": why} for a, d, why in plan.deliveries}},
        "containers": [
            {
                "host": c.host,
                "role": c.role,
                "idx": c.idx,
                "local_rank": c.local_rank,
                "agent": c.agent,
                "kernel_id": c.kernel_id,
                "env": dict(c.env),
                "user_env": dict(c.user_env),
                "exec_env": c.exec_env,
                "slots": c.slots,
                "resources": {
                    "cpu": res.cpu,
                    "mem": format_size(res.mem),
                    "shmem": format_size(res.shmem),
                    "gpu": res.gpu,
                    "gpus": list(c.gpus),
                },
                "mounts": mounts,
            }
            for c in plan.containers
        ],
    }


def delivers_to_scratch(plan: ClusterPlan, agent: str | None) -> bool:
    """Whether ``agent``'s containers bind-mount their bundle from its scratch root (a plan
    without a stack id, offline, uploads)."""
    return bool(plan.stack_id) and bool(plan.scratch) and plan.delivery(agent) == SCRATCH


def public_warnings(plan: ClusterPlan) -> list[str]:
    """What ``plan``, ``plan --markdown``, ``diff`` and ``status`` say of each binding beyond
    the agent's loopback: every ``public: true`` service, and every port of ``ports`` (which
    needs ``public: true`` for that: spec.is_loopback). One rule, whichever declared it."""
    out = []
    for s in plan.services:
        if not s.public:
            continue
        where = ("every address of this machine (a local agent has no address of its own)"
                 if s.bind == ALL_ADDRESSES else f"agent {s.agent}'s address {s.bind}")
        out.append(f"service {s.name!r} is public: port {s.port} of main1 is published on "
                   f"{where}, not on its loopback; anyone who reaches it reaches the app, with "
                   "no login in front of it (Backend.AI's AppProxy would stand there)")
    agent = plan.containers[0].agent if plan.containers else None
    on = f"agent {agent}" if agent else "its agent"
    for p in plan.session.ports:
        if is_loopback(p.host_ip):
            continue
        where = (f"every address of {on}" if p.host_ip in (ALL_ADDRESSES, "::")
                 else f"{on}'s address {p.host_ip}")
        what = "sshd" if p.container == SSH_PORT and p.protocol == "tcp" else "whatever listens"
        out.append(f"port {p.container}/{p.protocol} of main1 is public: published on {where}, "
                   f"not on its loopback; anyone who reaches it reaches {what} there")
    return out
