"""The ``Session`` component: a finished :class:`~cluster_sessions.core.plan.ClusterPlan` as
resources.

It maps the plan onto Docker resources and decides nothing the plan already decided:

- one ``docker.Provider`` per agent the session uses (its ``docker_host``; ``ssh://`` hosts get
  ``ssh_opts`` that pin host keys, from the agent's ``ssh`` block);
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
  own request, 50-270 ms apiece before the container starts (docs/benchmarks.md).

A pending plan raises :class:`SessionPending` before anything is registered.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import pulumi
import pulumi_docker as docker

from ..core import keys
from ..core.names import BUNDLE_DIGEST_LABEL
from ..core.plan import (
    ClusterPlan,
    ContainerPlan,
    container_command,
    container_labels,
    network_labels,
    runs_job,
)
from ..core.provider_facts import NETWORK_IGNORED, cpus_argument
from ..core.render import BUNDLE_DIR, RenderedFile, pack, pack_entrypoint_argv, render_container
from ..core.spec import SSH_PORT, Agent, Pool, agent_address
from .keystore import SessionKeyStore

TYPE_TOKEN = "cluster-sessions:index:Session"
MIB = 1024 * 1024
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


class SessionPending(pulumi.RunError):
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


def ssh_opts(agent: Agent) -> list[str] | None:
    """Options for the ``ssh`` the Docker provider runs for an ``ssh://`` docker host.

    Host keys are always checked (``StrictHostKeyChecking=yes``) and ssh never prompts
    (``BatchMode=yes``). The ``ssh`` block adds its known-hosts file, key file and, when the
    URL names no port, its port. Paths are passed as written (ssh expands ``~`` itself), so the
    provider's configuration is the same on every operator's machine.
    """
    if not agent.docker_host.startswith("ssh://"):
        return None
    opts = ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    ssh = agent.ssh
    if ssh is None:
        return opts
    if ssh.known_hosts:
        opts += ["-o", f"UserKnownHostsFile={ssh.known_hosts}"]
    if ssh.key_file:
        opts += ["-o", f"IdentityFile={ssh.key_file}", "-o", "IdentitiesOnly=yes"]
    if urlsplit(agent.docker_host).port is None and "port" in ssh.model_fields_set:
        opts += ["-o", f"Port={ssh.port}"]
    return opts


def published_at(agent: Agent) -> str:
    """Where a person reaches ports the agent publishes on all addresses."""
    return agent_address(agent) or "127.0.0.1"


def docker_cli(agent: Agent) -> str:
    if agent.docker_host == DEFAULT_DOCKER_HOST:
        return "docker"
    return f"docker -H {agent.docker_host}"


def memory_mb(size: int) -> int:
    """Docker's ``memory``/``shm_size`` are whole MiB; round up, never give less than asked."""
    return -(-size // MIB)


BUNDLE_PACK = posixpath.join(BUNDLE_DIR, "bundle.pack")
# Spelled as the provider reads it back ("0" + octal), so it never shows as a diff.
BUNDLE_PACK_PERMISSIONS = "0600"


def check_rendered(files: Sequence[RenderedFile], material: keys.SessionKeys,
                   host: str) -> list[RenderedFile]:
    """``host``'s rendered bundle, checked: a file rendered as not secret must not hold a
    private key (the user key or this host's key: the only private keys a container receives).
    """
    private = [material.user.private_openssh, material.hosts[host].private_openssh]
    for f in files:
        if not f.secret and any(p.strip() and p.strip() in f.content for p in private):
            raise RuntimeError(f"{f.path} holds a private key but is not marked secret")
    return list(files)


def bundle_pack(files: Sequence[RenderedFile]) -> tuple[str, str]:
    """(the pack of one container's whole bundle, the digest of its public files).

    One upload, because the provider copies each upload with a request of its own (about
    50 ms apiece, before the container starts); it is secret since it holds the private keys.
    The digest (SHA-256 of :func:`render.pack` of the files that are not secret) goes on a
    label, so that a preview still shows when the entrypoint or any public file changes.
    """
    public = pack([f for f in files if not f.secret])
    return pack(files), hashlib.sha256(public.encode()).hexdigest()


class Session(pulumi.ComponentResource):
    """One cluster session: providers, network, keys and containers, all children of this.

    Type token ``cluster-sessions:index:Session``. Outputs (also registered on the component):

    hosts: host names in order, main1 first.
    agents: per agent used, its ``docker_host`` and its hosts.
    network: ``name``, ``driver`` (bridge | overlay), ``agent`` it was created through, ``id``.
    main1: container name, agent, published ports, and commands to reach it.
    ssh_public_key: the session's user public key.
    """

    hosts: pulumi.Output[list[str]]
    agents: pulumi.Output[dict]
    network: pulumi.Output[dict]
    main1: pulumi.Output[dict]
    ssh_public_key: pulumi.Output[str]

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
        self.keys = SessionKeyStore(f"{name}-keys", plan.hosts,
                                opts=pulumi.ResourceOptions(parent=self))
        self.docker_network = self._build_network()
        material = self.keys.material()
        self.containers: dict[str, docker.Container] = {
            c.host: self._build_container(c, material) for c in plan.containers
        }

        self.hosts = pulumi.Output.from_input(list(plan.hosts))
        self.agents = pulumi.Output.from_input(self._agents_info())
        self.network = pulumi.Output.from_input({
            "name": plan.network.name,
            "driver": plan.network.driver,
            "agent": plan.network.agent,
            "id": self.docker_network.id,
        })
        self.main1 = self._main1_info()
        self.ssh_public_key = self.keys.user_public
        self.register_outputs({
            "hosts": self.hosts,
            "agents": self.agents,
            "network": self.network,
            "main1": self.main1,
            "ssh_public_key": self.ssh_public_key,
        })

    # --- children ---------------------------------------------------------------------------

    def _build_providers(self, name: str) -> dict[str, docker.Provider]:
        used = set(self.plan.agents) | {self.plan.network.agent}
        return {
            agent.name: docker.Provider(
                f"{name}-{agent.name}",
                host=agent.docker_host,
                ssh_opts=ssh_opts(agent),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for agent in self.pool.agents  # pool order: the same on every run
            if agent.name in used
        }

    def _build_network(self) -> docker.Network:
        net = self.plan.network
        options: dict[str, str] = {}
        if net.mtu:
            options["com.docker.network.driver.mtu"] = str(net.mtu)
        if net.encrypted:
            options["encrypted"] = "true"  # the overlay driver checks only that the key is set
        overlay = net.driver == "overlay"
        return docker.Network(
            net.name,
            name=net.name,
            driver=net.driver,
            attachable=True if overlay else None,
            options=options or None,
            labels=[docker.NetworkLabelArgs(label=k, value=v)
                    for k, v in network_labels(self.plan).items()],
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.providers[net.agent],
                delete_before_replace=True,  # the name is fixed: the old one must go first
                # Docker adds its own options to an overlay (vxlanid_list), which the provider
                # reads back: compared as they are, every up would replace the network. The
                # labels carry the MTU and encryption, so a change to them still replaces it.
                ignore_changes=list(NETWORK_IGNORED),
            ),
        )

    def _build_bundle(self, c: ContainerPlan, material: pulumi.Output[keys.SessionKeys]
                      ) -> tuple[list[docker.ContainerUploadArgs], pulumi.Output[str]]:
        """(the one upload of the bundle, a secret; the digest of its public files, not)."""
        plan = self.plan
        packed = material.apply(
            lambda k: bundle_pack(check_rendered(render_container(plan, c, k), k, c.host)))
        content = pulumi.Output.secret(packed.apply(lambda p: p[0]))
        # The keys resource is secret as a whole; the digest of the public files is not, so a
        # preview shows changes to the entrypoint and the public files.
        digest = pulumi.Output.unsecret(packed.apply(lambda p: p[1]))
        # 0600 from the first byte on: it holds the private keys
        return [docker.ContainerUploadArgs(file=BUNDLE_PACK, content=content, executable=False,
                                           permissions=BUNDLE_PACK_PERMISSIONS)], digest

    def _build_container(self, c: ContainerPlan,
                         material: pulumi.Output[keys.SessionKeys]) -> docker.Container:
        plan = self.plan
        session = plan.session
        res = plan.resources
        ports = None
        if c.role == "main":
            ports = [docker.ContainerPortArgs(internal=p.container, external=p.host,
                                              ip=p.host_ip, protocol=p.protocol)
                     for p in session.ports] or None
        mounts = [
            docker.ContainerMountArgs(
                target=m.target,
                source=m.source,
                type="bind" if m.source.startswith("/") else "volume",
                read_only=m.read_only,
            )
            for m in plan.mounts
        ] or None
        uploads, digest = self._build_bundle(c, material)
        labels = [docker.ContainerLabelArgs(label=k, value=v)
                  for k, v in container_labels(plan, c).items()]
        labels.append(docker.ContainerLabelArgs(label=BUNDLE_DIGEST_LABEL, value=digest))
        return docker.Container(
            c.container_name,
            name=c.container_name,
            image=session.image,
            hostname=c.host,
            networks_advanced=[docker.ContainerNetworksAdvancedArgs(
                # By name: on a swarm worker the overlay only appears once a container attaches.
                name=self.docker_network.name,
                aliases=[c.host],
            )],
            envs=[f"{k}={v}" for k, v in c.env.items()],
            uploads=uploads,
            # unpacks the upload into BUNDLE_DIR, then execs the bundled entrypoint.sh
            entrypoints=pack_entrypoint_argv(),
            command=list(container_command(plan, c)),
            # spelled as the provider reads it back ("1.0", not "1"): no change on the next up
            cpus=cpus_argument(res.cpu),
            memory=memory_mb(res.mem),
            shm_size=memory_mb(res.shmem),
            gpus=f"device={','.join(map(str, c.gpus))}" if c.gpus else None,
            mounts=mounts,
            labels=labels,
            # A finished job stays finished: no restart policy, and must_run off, since the
            # provider starts a stopped container again on the next up (provider-fidelity.md).
            restart="no" if runs_job(plan, c) else session.restart,
            must_run=not runs_job(plan, c),
            # docker-init as PID 1: it reaps what sshd sessions leave behind and passes signals
            # on to the command (the entrypoint execs it, so it would otherwise be PID 1).
            init=True,
            # No healthcheck wait: ``wait`` needs a HEALTHCHECK in the user's image. The
            # entrypoint itself waits for the peers' sshd (readiness.timeout).
            wait=False,
            ports=ports,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.providers[c.agent],
                depends_on=[self.docker_network],
                delete_before_replace=True,  # fixed names: the old container must go first
            ),
        )

    # --- outputs ----------------------------------------------------------------------------

    def _agents_info(self) -> dict[str, dict]:
        info: dict[str, dict] = {}
        for c in self.plan.containers:
            assert c.agent is not None
            entry = info.setdefault(c.agent, {
                "docker_host": self.pool.agent(c.agent).docker_host, "hosts": []})
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
        if not self.plan.session.ports:
            return pulumi.Output.from_input({**base, "ports": [], "ssh": None})
        host_key = self.keys.host_public.apply(lambda k: k.get(main.host))

        def describe(ports: Sequence, main1_key: str | None) -> dict:
            published = [_published(p, agent) for p in ports or []]
            ssh = next((p for p in published if p["container"] == SSH_PORT and p["host"]), None)
            return {**base, "ports": published, "ssh": _ssh_hint(ssh, user, main1_key)}

        return pulumi.Output.all(container.ports, host_key).apply(lambda a: describe(*a))


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
