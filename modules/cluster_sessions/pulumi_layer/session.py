"""The ``Session`` component: a finished :class:`~cluster_sessions.core.plan.ClusterPlan` as
resources.

It maps the plan onto Docker resources and decides nothing the plan already decided; the
arguments themselves are :mod:`cluster_sessions.core.container_args`'s:

- one ``docker.Provider`` per agent the session uses, reached as
  :func:`cluster_sessions.agents.reach.reach_of` decides (a remote agent: ``ssh://`` with
  ``ssh_opts`` carrying its key and known_hosts; a local socket; ``tcp://`` with TLS), named
  after a digest of that endpoint;
- the session network: a bridge on the one agent, or an attachable swarm overlay created
  through the swarm manager (workers cannot create it, and only see it once a container
  attaches, so their containers refer to it by name);
- the SSH key material (:class:`~cluster_sessions.pulumi_layer.keystore.SessionKeyStore`), made once
  and kept;
- one ``docker.Container`` per plan entry, named ``<session>-<host>``, with the static env, the
  rendered files as one upload under :data:`~cluster_sessions.core.render.BUNDLE_DIR`
  (``bundle.pack``, a secret, 0600: it holds the private keys; the entrypoint unpacks it:
  :func:`~cluster_sessions.core.render.pack_entrypoint_argv`), a label with the digest of the
  public files (so a preview shows an entrypoint change), resources, mounts, labels and
  restart policy. Only main1 publishes ports.

  One upload, not one per file: the provider copies each upload into the container with its
  own request, 50-270 ms apiece before the container starts (docs/benchmarks.md). That upload
  is now only for agents with no file access (``tcp://``, core/bundles.py): elsewhere
- per agent, its containers' packs delivered once into its scratch root
  (:class:`~cluster_sessions.pulumi_layer.bundles.BundleDelivery`), each container binding
  ``<scratch>/<stack id>/<host>`` read-only at ``BUNDLE_DIR`` and depending on the delivery;
- per agent, the pool's pids limit on its containers once they exist
  (:class:`~cluster_sessions.pulumi_layer.limits.ContainerLimits`: the provider has no
  argument for it); each container's set-up waits for it before anything runs as the user.

A pending plan raises :class:`SessionPending` before anything is registered.
"""

from __future__ import annotations

import operator
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pulumi
import pulumi_docker as docker

from ..agents.reach import LOCAL, reach_of
from ..core import keys
from ..core.container_args import container_args, network_args
from ..core.errors import Pending
from ..core.names import BUNDLE_DIGEST_LABEL, DEFAULT_DOCKER_HOST, SESSION_LABEL
from ..core.plan import ClusterPlan, ContainerPlan, delivers_to_scratch, volume_labels
from ..core.render import BUNDLE_DIR, RenderedFile, pack, public_digest, render_container
from ..core.spec import SSH_PORT, Agent, Pool, agent_address
from .bundles import BundleDelivery
from .folders import DataFolder
from .keystore import SessionKeyStore
from .limits import ContainerLimits
from .network import DOCKER_NETWORK_TYPE, SessionNetwork
from .volumes import SessionVolume

TYPE_TOKEN = "cluster-sessions:index:Session"


class SessionPending(pulumi.RunError, Pending):
    """The plan could not place the session; nothing was created.

    A ``RunError``: Pulumi fails the update with this message and no stack trace.
    """


@dataclass(frozen=True)
class SessionArgs:
    """What a :class:`Session` is built from.

    plan: the finished plan (``plan.build_plan``); it must be scheduled, not pending.
    pool: the agent pool the plan was made for; it supplies each agent's ``docker_host``, its
        ``ssh`` block (for ``ssh://`` hosts) and its address.
    """

    plan: ClusterPlan
    pool: Pool

    def __post_init__(self) -> None:
        known = {a.name for a in self.pool.agents}
        wanted = set(self.plan.agents)
        if self.plan.network.agent:
            wanted.add(self.plan.network.agent)
        missing = sorted(wanted - known)
        if missing:
            raise ValueError(f"the plan places containers on {', '.join(missing)}, which "
                             f"pool {self.pool.name!r} does not have")


def provider_name(session: str, agent: Agent) -> str:
    """``<session>-<agent>-<digest of the endpoint>``: a changed endpoint is another provider,
    so Pulumi replaces the containers made through it (on the new engine) and deletes the old
    ones through the old provider, instead of updating the provider in place and orphaning
    them (agents.reach.Reach.digest)."""
    return f"{session}-{agent.name}-{reach_of(agent).digest}"


def published_at(agent: Agent) -> str:
    """Where a person reaches ports the agent publishes on all addresses."""
    return agent_address(agent) or "127.0.0.1"


def docker_cli(agent: Agent) -> str:
    """The docker command that reaches ``agent`` from the operator's machine."""
    reach = reach_of(agent)
    if reach.kind == LOCAL and agent.docker_host == DEFAULT_DOCKER_HOST:
        return "docker"
    return f"docker -H {reach.provider_host}"


BUNDLE_PACK = posixpath.join(BUNDLE_DIR, "bundle.pack")
# Spelled as the provider reads it back ("0" + octal), so it never shows as a diff.
BUNDLE_PACK_PERMISSIONS = "0600"


def check_rendered(files: Sequence[RenderedFile], material: keys.SessionKeys,
                   host: str) -> list[RenderedFile]:
    """``host``'s rendered bundle, checked: a file rendered as not secret must not hold a
    private key (the user key or this host's key: the only private keys a container receives),
    and no file at all the session CA's private key (it stays in the stack).
    """
    private = [material.user.private_openssh, material.hosts[host].private_openssh,
               material.ca.private_openssh if material.ca is not None else ""]
    for f in files:
        if not f.secret and any(p.strip() and p.strip() in f.content for p in private):
            raise RuntimeError(f"{f.path} holds a private key but is not marked secret")
        if private[2].strip() and private[2].strip() in f.content:
            raise RuntimeError(f"{f.path} holds the session CA's private key")
    return list(files)


def bundle_pack(files: Sequence[RenderedFile]) -> tuple[str, str]:
    """(the pack of one container's whole bundle, the digest of its public files).

    One upload, because the provider copies each upload with a request of its own (about
    50 ms apiece, before the container starts); it is secret since it holds the private keys.
    The digest (SHA-256 of :func:`render.pack` of the files that are not secret) goes on a
    label, so that a preview still shows when the entrypoint or any public file changes.
    """
    return pack(files), public_digest(files)


class Session(pulumi.ComponentResource):
    """One cluster session: providers, network, keys and containers, all children of this.

    Type token ``cluster-sessions:index:Session``. Outputs (also registered on the component):

    hosts: host names in order, main1 first.
    agents: per agent used, its ``docker_host`` and its hosts.
    network: ``name``, ``driver`` (bridge | overlay), ``agent`` it was created through, ``id``.
    main1: container name, agent, published ports, and commands to reach it.
    services: per service of main1, its agent, container and host port, bind address and URL
    (the host port as the engine reports it).
    ssh_public_key: the session's user public key.
    ssh_ca_public_key: the session CA's public key (``@cert-authority`` in known_hosts).
    """

    hosts: pulumi.Output[list[str]]
    agents: pulumi.Output[dict]
    network: pulumi.Output[dict]
    main1: pulumi.Output[dict]
    services: pulumi.Output[dict]
    ssh_public_key: pulumi.Output[str]
    ssh_ca_public_key: pulumi.Output[str]

    def __init__(self, name: str, args: SessionArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plan = args.plan
        if plan.pending:
            raise SessionPending(f"session {plan.name!r} is pending, nothing was created: "
                                 f"{plan.reason}")
        super().__init__(TYPE_TOKEN, name, None, opts)
        self.plan = plan
        self.pool = args.pool

        self.providers = self._build_providers(name)
        # host certificates name the container's host name and container name (both resolve
        # on the session network)
        self.keys = SessionKeyStore(f"{name}-keys", plan.hosts,
                                opts=pulumi.ResourceOptions(parent=self),
                                principals={c.host: [c.host, c.container_name]
                                            for c in plan.containers})
        self.session_network = self._build_network()
        self.folders = self._build_folders(name)
        self.volumes = self._build_volumes(name)
        bundles, digests = self._build_bundles(self.keys.material())
        self.deliveries = self._build_deliveries(name, bundles)
        self.containers: dict[str, docker.Container] = {
            c.host: self._build_container(c, bundles, digests) for c in plan.containers
        }
        self.limits = self._build_limits(name)

        self.hosts = pulumi.Output.from_input(list(plan.hosts))
        self.agents = pulumi.Output.from_input(self._agents_info())
        self.network = pulumi.Output.from_input({
            "name": plan.network.name,
            "driver": plan.network.driver,
            "agent": plan.network.agent,
            "id": self.session_network.id,
        })
        self.main1 = self._main1_info()
        self.services = self._services_info()
        self.ssh_public_key = self.keys.user_public
        self.ssh_ca_public_key = self.keys.ca_public
        self.register_outputs({
            "ssh_ca_public_key": self.ssh_ca_public_key,
            "hosts": self.hosts,
            "agents": self.agents,
            "network": self.network,
            "main1": self.main1,
            "services": self.services,
            "ssh_public_key": self.ssh_public_key,
        })

    # --- children ---------------------------------------------------------------------------

    def _build_providers(self, name: str) -> dict[str, docker.Provider]:
        used = set(self.plan.agents) | {self.plan.network.agent}
        providers = {}
        for agent in self.pool.agents:  # pool order: the same on every run
            if agent.name not in used:
                continue
            reach = reach_of(agent)
            providers[agent.name] = docker.Provider(
                provider_name(name, agent),
                host=reach.provider_host,
                ssh_opts=reach.provider_ssh_opts,
                cert_path=reach.provider_cert_path,
                opts=pulumi.ResourceOptions(parent=self),
            )
        return providers

    def _endpoint(self, agent: str | None) -> str:
        assert agent is not None
        return reach_of(self.pool.agent(agent)).endpoint

    def _build_network(self) -> SessionNetwork:
        """Our own resource, not ``docker.Network``, whose create waits 2 s more than the
        engine (pulumi_layer/network.py); the same arguments, through the network's agent."""
        args = network_args(self.plan, self._endpoint(self.plan.network.agent))
        return SessionNetwork(
            args.name, self.pool.agent(self.plan.network.agent), args.name, args.driver,
            bool(args.attachable), dict(args.options), dict(args.labels),
            # the name is fixed: the old network must go first (its provider says so too)
            opts=pulumi.ResourceOptions(
                parent=self, delete_before_replace=True,
                # a stack made before holds the provider's docker.Network under this name: the
                # same resource to the engine, replaced (with the containers on it) once
                aliases=[pulumi.Alias(type_=DOCKER_NETWORK_TYPE)]))

    def _build_folders(self, name: str) -> dict[str, list[DataFolder]]:
        """Each data folder on each agent the containers use, made before them (never deleted:
        pulumi_layer/folders.py)."""
        plan, user = self.plan, self.plan.session.user
        out: dict[str, list[DataFolder]] = {}
        for agent in plan.agents:
            out[agent] = [
                DataFolder(f"{name}-folder-{agent}/{m.storage}/{m.folder}",
                           self.pool.agent(agent), plan.image, m.root or "",
                           m.folder or "", user.uid, user.gid,
                           opts=pulumi.ResourceOptions(parent=self))
                for m in plan.folders]
        return out

    def _build_volumes(self, name: str) -> dict[str, list[SessionVolume]]:
        """The named volumes the session makes, per agent its containers mount them on,
        labelled as the session's own (pulumi_layer/volumes.py); never deleted."""
        made = sorted({m.source for m in self.plan.mounts if m.made})
        labels = volume_labels(self.plan)
        return {agent: [SessionVolume(f"{name}-volume-{agent}/{volume}", self.pool.agent(agent),
                                      volume, labels, self.plan.name, SESSION_LABEL,
                                      opts=pulumi.ResourceOptions(parent=self))
                        for volume in made]
                for agent in self.plan.agents}

    def _build_limits(self, name: str) -> dict[str, ContainerLimits]:
        """The pool's pids limit on each agent's containers, set once they exist (the provider
        has no argument for it: pulumi_layer/limits.py); their set-up waits for it."""
        out = {}
        for agent in self.plan.agents:
            mine = [c for c in self.plan.containers if c.agent == agent]
            out[agent] = ContainerLimits(
                f"{name}-limits-{agent}", self.pool.agent(agent),
                {c.host: self.containers[c.host].id for c in mine},
                self.plan.limits.pids_limit,
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[self.containers[c.host] for c in mine]))
        return out

    def scratch_delivery(self, agent: str | None) -> bool:
        """Whether ``agent``'s containers bind-mount their bundle from its scratch root
        (core/bundles.py; a plan without a stack id, offline, uploads)."""
        return delivers_to_scratch(self.plan, agent)

    def _build_deliveries(self, name: str, bundles: pulumi.Output[dict[str, str]]
                          ) -> dict[str, BundleDelivery]:
        """Per agent that delivers into its scratch root, its containers' bundles in one
        resource (pulumi_layer/bundles.py), made before them and in parallel with the other
        agents'; each depends on nothing but the keys."""
        out = {}
        for agent in self.plan.agents:
            if not self.scratch_delivery(agent):
                continue
            mine = [c.host for c in self.plan.containers if c.agent == agent]
            out[agent] = BundleDelivery(
                f"{name}-bundles-{agent}", self.pool.agent(agent), self.plan.scratch,
                self.plan.stack_id,
                bundles.apply(lambda b, mine=mine: {h: b[h] for h in mine}),
                opts=pulumi.ResourceOptions(parent=self))
        return out

    def _build_bundles(self, material: pulumi.Output[keys.SessionKeys]
                       ) -> tuple[pulumi.Output[dict[str, str]], pulumi.Output[dict[str, str]]]:
        """(each host's pack of its whole bundle, a secret; each host's digest of its public
        files, not), every container's rendered in one ``apply`` once the keys are known.

        ``material`` is a secret, and so is all that is derived from it: the packs are secret
        without being marked again. The keys resource is secret as a whole; the digests of the
        public files are not, so a preview shows changes to the entrypoint and the public
        files. Few Outputs per container (two: its pack and its digest), as each one is work
        for the SDK.
        """
        plan = self.plan

        def render_all(k: keys.SessionKeys) -> dict[str, tuple[str, str]]:
            return {c.host: bundle_pack(check_rendered(render_container(plan, c, k), k, c.host))
                    for c in plan.containers}

        packed = material.apply(render_all)
        bundles = packed.apply(lambda b: {host: pair[0] for host, pair in b.items()})
        digests = pulumi.Output.unsecret(
            packed.apply(lambda b: {host: pair[1] for host, pair in b.items()}))
        return bundles, digests

    def _build_container(self, c: ContainerPlan, bundles: pulumi.Output[dict[str, str]],
                         digests: pulumi.Output[dict[str, str]]) -> docker.Container:
        args = container_args(self.plan, c, self._endpoint(c.agent))
        delivered = self.deliveries.get(c.agent or "")
        # a volume the session makes is made, labelled, by its SessionVolume first
        mounts = [docker.ContainerMountArgs(target=m.target, source=m.source, type=m.type,
                                            read_only=m.read_only)
                  for m in args.mounts]
        if delivered is not None:
            # its own directory of the agent's scratch root is in args.mounts, read-only
            # (container_args._bundle_mount): a bind of a missing source fails, so a
            # container never starts on a half-written bundle
            uploads = None
        else:
            # the one upload of the bundle, 0600 from the first byte on: it holds the private
            # keys (an agent with no file access: tcp://)
            uploads = [docker.ContainerUploadArgs(
                file=BUNDLE_PACK, content=bundles.apply(operator.itemgetter(c.host)),
                executable=False, permissions=BUNDLE_PACK_PERMISSIONS)]
        labels = [docker.ContainerLabelArgs(label=k, value=v) for k, v in args.labels]
        labels.append(docker.ContainerLabelArgs(
            label=BUNDLE_DIGEST_LABEL, value=digests.apply(operator.itemgetter(c.host))))

        return docker.Container(
            args.name,
            name=args.name,
            image=args.image,
            hostname=args.hostname,
            networks_advanced=[docker.ContainerNetworksAdvancedArgs(
                # By name: on a swarm worker the overlay only appears once a container attaches.
                name=self.session_network.name,
                aliases=list(args.aliases),
            )],
            envs=list(args.envs),
            uploads=uploads,
            entrypoints=list(args.entrypoints),
            command=list(args.command),
            cpus=args.cpus,
            memory=args.memory,
            memory_swap=args.memory_swap,
            shm_size=args.shm_size,
            device_requests=[docker.ContainerDeviceRequestArgs(
                driver=r["driver"], device_ids=list(r["device_ids"]),
                capabilities=list(r["capabilities"])) for r in args.device_requests] or None,
            mounts=mounts or None,
            labels=labels,
            restart=args.restart,
            must_run=args.must_run,
            init=args.init,
            wait=args.wait,
            ports=[docker.ContainerPortArgs(internal=p.internal, external=p.external, ip=p.ip,
                                            protocol=p.protocol)
                   for p in args.ports] or None,
            tmpfs=dict(args.tmpfs) or None,
            log_driver=args.log_driver,
            log_opts=dict(args.log_opts),
            capabilities=docker.ContainerCapabilitiesArgs(
                adds=list(args.capabilities_add), drops=list(args.capabilities_drop)),
            security_opts=list(args.security_opts) or None,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.providers[c.agent],
                depends_on=[self.session_network, *self.folders.get(c.agent or "", []),
                            *self.volumes.get(c.agent or "", []),
                            *([delivered] if delivered is not None else [])],
                delete_before_replace=True,  # fixed names: the old container must go first
            ),
        )

    # --- outputs ----------------------------------------------------------------------------

    def _agents_info(self) -> dict[str, dict]:
        info: dict[str, dict] = {}
        for c in self.plan.containers:
            assert c.agent is not None
            agent = self.pool.agent(c.agent)
            entry = info.setdefault(c.agent, {
                "docker_host": agent.docker_host, "endpoint": reach_of(agent).endpoint,
                "hosts": []})
            entry["hosts"].append(c.host)
        return info

    def _main1_info(self) -> pulumi.Output[dict]:
        main = self.plan.containers[0]
        assert main.agent is not None
        agent = self.pool.agent(main.agent)
        user = self.plan.session.user.name
        container = self.containers[main.host]
        base = {
            "container": main.container_name,
            "agent": agent.name,
            "docker_host": agent.docker_host,
            "exec": f"{docker_cli(agent)} exec -it -u {user} {main.container_name} bash -l",
        }
        host_key = self.keys.host_public.apply(lambda k: k.get(main.host))

        def describe(ports: Sequence, main1_key: str | None) -> dict:
            published = [_published(p, agent) for p in ports or []]
            ssh = next((p for p in published if p["container"] == SSH_PORT and p["host"]), None)
            return {**base, "ports": published, "ssh": _ssh_hint(ssh, user, main1_key)}

        return pulumi.Output.all(container.ports, host_key).apply(lambda a: describe(*a))

    def _services_info(self) -> pulumi.Output[dict]:
        main = self.plan.containers[0]
        services = self.plan.services

        def describe(ports: Sequence) -> dict:
            bound = {}
            for p in ports or []:
                get = p.get if isinstance(p, Mapping) else lambda k, p=p: getattr(p, k, None)
                if get("external"):
                    bound[(int(get("internal")), get("ip") or "0.0.0.0")] = int(get("external"))
            out = {}
            for svc in services:
                host_port = bound.get((svc.port, svc.bind), svc.host_port)
                out[svc.name] = {**replace(svc, host_port=host_port).to_dict(),
                                 "container": main.container_name}
            return out

        return self.containers[main.host].ports.apply(describe)


def _published(port, agent: Agent) -> dict:
    get = port.get if isinstance(port, Mapping) else lambda k: getattr(port, k, None)
    ip = get("ip") or "0.0.0.0"
    external = get("external")
    return {
        "container": int(get("internal")),
        "host": int(external) if external else None,
        "host_ip": ip,
        "protocol": get("protocol") or "tcp",
        "address": published_at(agent) if ip in ("0.0.0.0", "::") else ip,
    }


def _ssh_hint(port: dict | None, user: str, host_key: str | None) -> dict | None:
    if port is None:
        return None
    where = f"[{port['address']}]:{port['host']}"
    return {
        "command": (f"ssh -i id_cluster -o UserKnownHostsFile=main1_known_hosts "
                    f"-p {port['host']} -- {user}@{port['address']}"),
        "key": "pulumi stack output --show-secrets ssh_private_key > id_cluster "
               "&& chmod 600 id_cluster",
        "known_hosts": f"{where} {host_key}" if host_key else None,
    }
