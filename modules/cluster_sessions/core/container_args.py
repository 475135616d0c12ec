"""A plan as the docker provider's arguments: decided once, for everyone who needs them.

The ``Session`` component passes these to ``docker.Container`` and to its own
``SessionNetwork`` (pulumi_layer/session.py, network.py), ``sessionctl diff`` compares the old
plan's with the new one's to say what ``up`` replaces (core/review.py), and the tests'
stand-in engine receives them as the registered inputs. Each value is spelled the way the
provider reads it back (provider_facts), so an
unchanged definition shows no change on the next ``up``.

What is left out, because it needs the session's key material: the bundle upload and its
digest label (pulumi_layer/session.py adds both).

Pure: no pulumi, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .bundles import host_dir
from .names import ENDPOINT_LABEL
from .plan import (
    ClusterPlan,
    ContainerPlan,
    container_command,
    container_labels,
    delivers_to_scratch,
    network_labels,
    runs_job,
    volume_labels,
)
from .provider_facts import capabilities_argument, cpus_argument, gpu_device_request
from .render import pack_entrypoint_argv
from .services import LOOPBACK  # main1's sshd and private services: the agent's loopback
from .spec import BUNDLE_DIR, RUN_DIR, RUN_TMPFS, SSH_PORT

MIB = 1024 * 1024
MTU_OPTION = "com.docker.network.driver.mtu"
LOG_DRIVER = "json-file"
NO_NEW_PRIVILEGES = "no-new-privileges:true"


def memory_mb(size: int) -> int:
    """Docker's ``memory``/``shm_size`` are whole MiB; round up, never give less than asked."""
    return -(-size // MIB)


@dataclass(frozen=True)
class MountArgs:
    target: str
    source: str
    type: str  # bind (a host path) | volume (a name)
    read_only: bool
    # a volume of the session's own: the labels the engine gives it when the mount creates it
    volume_labels: tuple[tuple[str, str], ...] = ()


def _bundle_mount(plan: ClusterPlan, c: ContainerPlan) -> tuple[MountArgs, ...]:
    """The container's own directory of its agent's scratch root, read-only at BUNDLE_DIR,
    where the entrypoint finds ``bundle.pack`` (core/bundles.py), when the agent delivers
    there; else none (the provider uploads the pack)."""
    if not delivers_to_scratch(plan, c.agent):
        return ()
    return (MountArgs(BUNDLE_DIR, host_dir(plan.scratch, plan.stack_id, c.host), "bind", True),)


@dataclass(frozen=True)
class PortArgs:
    internal: int
    external: int | None  # None: the engine picks a free port
    ip: str
    protocol: str


@dataclass(frozen=True)
class ContainerArgs:
    """One ``docker.Container``'s arguments, by their provider names (snake_case)."""

    name: str
    image: str
    hostname: str
    network: str  # networks_advanced: the session network, by name
    aliases: tuple[str, ...]
    envs: tuple[str, ...]
    entrypoints: tuple[str, ...]
    command: tuple[str, ...]
    cpus: str | None
    memory: int  # MiB
    memory_swap: int  # MiB; the same as memory: no swap beyond the limit
    shm_size: int  # MiB
    device_requests: tuple[dict, ...]  # the GPUs (provider_facts.gpu_device_request)
    mounts: tuple[MountArgs, ...]
    labels: tuple[tuple[str, str], ...]
    restart: str
    must_run: bool
    init: bool
    wait: bool
    ports: tuple[PortArgs, ...]
    tmpfs: tuple[tuple[str, str], ...]  # (container directory, mount options)
    log_driver: str
    log_opts: tuple[tuple[str, str], ...]  # the json-file driver's: the pool's log bound
    capabilities_add: tuple[str, ...]  # capabilities { add, drop }: the pool's set kept,
    capabilities_drop: tuple[str, ...]  # every other one dropped
    security_opts: tuple[str, ...]

    def changed(self, other: ContainerArgs) -> tuple[str, ...]:
        """The provider arguments that differ from ``other``'s (``networks_advanced`` for the
        network and aliases, ``capabilities`` for its add and drop)."""
        out = []
        for f in fields(self):
            if getattr(self, f.name) != getattr(other, f.name):
                out.append(_PROVIDER_NAMES.get(f.name, f.name))
        return tuple(dict.fromkeys(out))


# the fields that are parts of one provider argument
_PROVIDER_NAMES = {"network": "networks_advanced", "aliases": "networks_advanced",
                   "capabilities_add": "capabilities", "capabilities_drop": "capabilities"}


@dataclass(frozen=True)
class NetworkArgs:
    name: str
    driver: str
    attachable: bool | None
    options: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]


def container_args(plan: ClusterPlan, c: ContainerPlan, endpoint: str = "") -> ContainerArgs:
    """``c``'s ``docker.Container`` arguments. ``endpoint``: where its agent's engine is
    (agents.reach.Reach.endpoint), carried by a label: labels force a new container, so when an
    agent points elsewhere its containers are made anew there and deleted through the old
    provider (a changed provider alone is no replacement for the docker provider)."""
    session = plan.session
    res = plan.resources
    job = runs_job(plan, c)
    ports = tuple(PortArgs(p.container, p.host, p.host_ip, p.protocol)
                  for p in session.ports) if c.role == "main" else ()
    if c.role == "main" and not any(p.internal == SSH_PORT and p.protocol == "tcp"
                                    for p in ports):
        # main1's sshd, always, on the agent's loopback only, the engine choosing the port:
        # `sessionctl ssh` comes through the agent's SSH (issue 22)
        ports += (PortArgs(SSH_PORT, None, LOOPBACK, "tcp"),)
    if c.role == "main":
        # each service on the host port chosen at `up` (core.services), on the agent's
        # loopback unless public; before `up` chose one (offline), the port is left to decide
        ports += tuple(PortArgs(svc.port, svc.host_port, svc.bind, "tcp")
                       for svc in plan.services)
    return ContainerArgs(
        name=c.container_name,
        image=plan.image,
        hostname=c.host,
        network=plan.network.name,
        aliases=(c.host,),
        envs=tuple(f"{k}={v}" for k, v in c.env.items()),
        # unpacks the bundle upload, then execs the bundled entrypoint.sh
        entrypoints=tuple(pack_entrypoint_argv()),
        command=tuple(container_command(plan, c)),
        cpus=cpus_argument(res.cpu),
        memory=memory_mb(res.mem),
        memory_swap=memory_mb(res.mem),
        shm_size=memory_mb(res.shmem),
        device_requests=tuple(r for r in [gpu_device_request(c.gpus)] if r),
        mounts=tuple(MountArgs(m.target, m.source, m.type, m.read_only,
                               tuple(volume_labels(plan).items()) if m.made else ())
                     for m in plan.mounts) + _bundle_mount(plan, c),
        labels=_with_endpoint(container_labels(plan, c), endpoint),
        # A finished job stays finished: no restart policy, and must_run off, since the
        # provider starts a stopped container again on the next up (provider-fidelity.md).
        restart="no" if job else session.restart,
        must_run=not job,
        # docker-init as PID 1: it reaps what sshd sessions leave behind and passes signals on
        init=True,
        # no healthcheck wait: the entrypoint itself waits for the peers' sshd
        wait=False,
        ports=ports,
        # the bundle is unpacked there (render.pack_entrypoint_argv)
        tmpfs=((RUN_DIR, RUN_TMPFS),),
        # json-file whatever the agent's default driver: `logs` reads it, and it rotates
        log_driver=LOG_DRIVER,
        log_opts=(("max-file", str(plan.limits.log_max_files)),
                  ("max-size", str(plan.limits.log_max_size))),
        # in the spelling the provider reads back (provider_facts.capabilities_argument)
        capabilities_add=capabilities_argument(plan.privileges.capabilities),
        capabilities_drop=capabilities_argument(("ALL",)),
        security_opts=(NO_NEW_PRIVILEGES,) if plan.privileges.no_new_privileges else (),
    )


def network_args(plan: ClusterPlan, endpoint: str = "") -> NetworkArgs:
    """The session network's ``SessionNetwork`` arguments (``endpoint`` as for
    :func:`container_args`)."""
    net = plan.network
    options: dict[str, str] = {}
    if net.mtu:
        options[MTU_OPTION] = str(net.mtu)
    if net.encrypted:
        options["encrypted"] = "true"  # the overlay driver checks only that the key is set
    return NetworkArgs(
        name=net.name,
        driver=net.driver,
        attachable=True if net.driver == "overlay" else None,
        options=tuple(options.items()),
        labels=_with_endpoint(network_labels(plan), endpoint),
    )


def _with_endpoint(labels: dict[str, str], endpoint: str) -> tuple[tuple[str, str], ...]:
    return tuple({**labels, **({ENDPOINT_LABEL: endpoint} if endpoint else {})}.items())
