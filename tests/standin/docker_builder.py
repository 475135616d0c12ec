"""Test support: build what the Pulumi program declares on real Docker Engines, and use it.

:class:`DockerBuilder` is the ``on_create`` hook of :class:`.engine.Engine`: for each
declared ``docker.Container`` it does what the Docker provider would do
with the same inputs, on the engine the resource's ``docker.Provider`` reaches (its ``host``,
``ssh_opts``, ``cert_path``: :mod:`.connhelper`), so a
multi-agent session lands on several engines (tests/test_multinode.py) exactly as declared,
and a single-agent one on the local engine (tests/test_program_e2e.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor

from cluster_sessions.agents import engine as engine_room
from cluster_sessions.core.spec import BUNDLE_DIR

from . import connhelper, provider
from .engine import Registration


def find_image(api, image: str) -> None:
    """What the provider's container create does first (kreuzwerker
    resource_docker_image_funcs.go ``findImage`` 343-377, called from
    resource_docker_container_funcs.go 49-53): an image the engine holds under that name is
    used as it is, whatever the registry now has; a missing one is pulled, silently, with the
    provider's credentials (we give it none: ``sessionctl up`` pulls first, with the
    operator's), and the create fails when the pull does."""
    import docker.errors

    try:
        api.inspect_image(image)
        return
    except docker.errors.ImageNotFound:
        pass
    for event in api.pull(image, stream=True, decode=True):
        if event.get("error"):
            raise provider.ProviderRefused(f"Unable to create container with image {image}: "
                                           f"unable to pull image {image}: {event['error']}")


class SessionNotReady(AssertionError):
    """A declared session did not come up (an AssertionError: a test that waits on it fails)."""

MIB = 1024 * 1024
READY_TIMEOUT = 150  # seconds: the entrypoint itself waits up to readiness.timeout (120 s)
PROVIDER_TYPE = "pulumi:providers:docker"
SESSION_NETWORK = "pulumi-python:dynamic/cluster-sessions:SessionNetwork"
def remove_bundle_dir(path: str) -> None:
    """A host's bundle directory (0500, its pack 0000) and its stack's directory once empty."""
    import shutil

    if not os.path.isdir(path) or os.path.islink(path):
        return
    os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))


class DockerBuilder:
    """The hooks of :class:`.engine.Engine`: the Docker provider's create, update and delete,
    by hand, on the engine its ``docker.Provider`` reaches (:mod:`.connhelper`, from the
    provider's own ``host``, ``ssh_opts`` and ``cert_path``; nothing else).

    Follows terraform-provider-docker's container create: create, leave the default bridge for
    ``networks_advanced`` (here: created straight onto the session network with its aliases),
    upload each file as a one-entry tar at ``/`` with its mode, start, then insist it runs.
    ``placed`` records, per container name, the ``host`` it was created on (the session
    network is the program's own dynamic resource: the engine runs its provider).
    """

    def __init__(self) -> None:
        self.provider_configs: dict[str, dict] = {}
        self.connections: dict[tuple, connhelper.Connection] = {}
        self.containers: list[tuple[object, str]] = []
        self.networks: list[tuple[object, str]] = []  # (client, network name)
        self.made_networks: list[tuple[dict, str]] = []  # (inputs, id): make_network's
        self.placed: dict[str, str] = {}
        self.made: dict[str, tuple[str, dict, str]] = {}  # urn -> (kind, provider config, id)
        # the bundle directories the containers bind-mount (issue 45): what the deliveries'
        # delete removes at a destroy, removed by remove_all too (this machine's filesystem:
        # the local engine's and the lab's agents share it)
        self.bundle_dirs: list[str] = []

    def __call__(self, reg: Registration, inputs: dict) -> dict | None:
        if reg.type == PROVIDER_TYPE:
            self.provider_configs[reg.urn] = connhelper.config_of(inputs)
            return None
        if reg.type == SESSION_NETWORK:  # a benchmark's direct call (the engine runs its own)
            return self.make_network(inputs)
        if reg.type == "docker:index/container:Container":
            return self.container(reg, inputs)
        return None

    def config_for(self, reg: Registration) -> dict:
        """The resource's provider configuration; the default provider's when it names none."""
        if reg.provider_urn:
            return self.provider_configs[reg.provider_urn]
        return connhelper.config_of({})

    @staticmethod
    def _key(config: dict) -> tuple:
        return (config["host"], tuple(config["ssh_opts"]), config["cert_path"])

    def client_for(self, reg: Registration):
        """(client, host): one pinged connection per provider configuration, as the provider
        caches one client per configuration hash (config.go l. 120-127, 206)."""
        config = self.config_for(reg)
        key = self._key(config)
        if key not in self.connections:
            self.connections[key] = connhelper.connect(config)
        return self.connections[key].client, config["host"]

    def make_network(self, inputs: dict) -> dict:
        """What the engine does with the program's SessionNetwork (pulumi_layer/network.py):
        its provider's create; :meth:`remove_all` deletes it through the provider."""
        from cluster_sessions.pulumi_layer.network import SessionNetworkProvider

        network_id = SessionNetworkProvider().create(dict(inputs)).id
        self.made_networks.append((dict(inputs), network_id))
        return {"id": network_id}

    def container(self, reg: Registration, inputs: dict) -> dict:
        import docker.types

        if inputs.get("gpus"):
            provider.gpus_request(inputs["gpus"])  # what the provider would refuse, first
            raise provider.ProviderRefused(f"{inputs['name']}: gpus={inputs['gpus']!r} parses, "
                                           "but there are no GPUs on this engine")
        client, host = self.client_for(reg)
        api = client.api
        ports = inputs.get("ports") or []
        bindings = {
            f"{int(p['internal'])}/{p.get('protocol', 'tcp')}":
                (p.get("ip", "0.0.0.0"), int(p["external"]) if p.get("external") else None)
            for p in ports
        }
        host_config = api.create_host_config(
            mounts=[docker.types.Mount(
                m["target"], m["source"], type=m["type"], read_only=m.get("readOnly", False),
                labels={lb["label"]: lb["value"]
                        for lb in (m.get("volumeOptions") or {}).get("labels") or []} or None)
                    for m in inputs.get("mounts", [])],
            mem_limit=int(inputs["memory"]) * MIB,
            memswap_limit=swap_bytes(inputs.get("memorySwap")),
            shm_size=int(inputs["shmSize"]) * MIB,
            nano_cpus=round(float(inputs["cpus"]) * 1e9),
            restart_policy={"Name": inputs["restart"]},
            init=inputs.get("init", False),
            port_bindings=bindings or None,
            tmpfs=dict(inputs.get("tmpfs") or {}) or None,
            # rcf.go 261-262, 387-389 (log), 286-293 (capabilities), 327-332 (security_opts)
            log_config={"Type": inputs.get("logDriver") or "",
                        "Config": dict(inputs.get("logOpts") or {})},
            # as the provider's Docker client sends them (provider.normalize_capabilities)
            cap_add=provider.normalize_capabilities(
                (inputs.get("capabilities") or {}).get("adds") or []) or None,
            cap_drop=provider.normalize_capabilities(
                (inputs.get("capabilities") or {}).get("drops") or []) or None,
            security_opt=list(inputs.get("securityOpts") or []) or None,
        )
        find_image(api, inputs["image"])
        (network,) = inputs["networksAdvanced"]
        networking = api.create_networking_config({
            network["name"]: api.create_endpoint_config(aliases=network["aliases"])})
        created = api.create_container(
            inputs["image"],
            name=inputs["name"],
            hostname=inputs["hostname"],
            entrypoint=inputs["entrypoints"],
            command=inputs["command"],
            environment=inputs["envs"],
            labels={x["label"]: x["value"] for x in inputs["labels"]},
            ports=[(int(p["internal"]), p.get("protocol", "tcp")) for p in ports] or None,
            host_config=host_config,
            networking_config=networking,
        )
        cid = created["Id"]
        self.containers.append((client, cid))
        # the session network is the program's own resource (pulumi_layer/network.py), made
        # and deleted by its provider through the engine; remove_all removes it after
        # the containers that use it, wherever a container saw it
        self.networks.append((client, network["name"]))
        self.bundle_dirs += [m["source"] for m in inputs.get("mounts", [])
                             if m.get("target") == BUNDLE_DIR and m.get("type") == "bind"]
        self.placed[inputs["name"]] = host
        self.made[reg.urn] = ("container", self.config_for(reg), cid)
        for upload in inputs.get("uploads") or []:
            api.put_archive(cid, "/", tar_upload(upload))
        api.start(cid)
        if inputs.get("mustRun", True):  # the provider checks a must_run container runs
            time.sleep(0.2)
            state = api.inspect_container(cid)["State"]
            assert state["Running"], f"{inputs['name']} exited at once: {state}"
        published = api.inspect_container(cid)["NetworkSettings"]["Ports"] or {}
        return {"id": cid, "ports": [
            {**p, "external": int(published[f"{int(p['internal'])}/{p.get('protocol', 'tcp')}"]
                                  [0]["HostPort"])}
            for p in ports
        ]}

    def remove_all(self) -> None:
        """What ``pulumi destroy`` does: the containers (last first), then the networks, on
        each engine a container used it (what the engine's delete of the SessionNetwork
        did not remove already)."""
        import docker.errors

        def remove(item: tuple) -> None:
            client, cid = item
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(cid, force=True)

        # in parallel, as the engine deletes independent resources (leaving an overlay takes
        # a worker a second or two)
        with ThreadPoolExecutor(max_workers=8) as ex:
            list(ex.map(remove, reversed(self.containers)))
        from cluster_sessions.pulumi_layer.network import SessionNetworkProvider

        for inputs, network_id in self.made_networks:
            SessionNetworkProvider().delete(network_id, inputs)
        for client, name in dict.fromkeys(self.networks):
            with contextlib.suppress(docker.errors.APIError):  # gone, or a worker's copy
                client.api.remove_network(name)
        for path in dict.fromkeys(self.bundle_dirs):
            remove_bundle_dir(path)

    def update(self, reg: Registration, inputs: dict, changed: tuple[str, ...]) -> None:
        """The provider's in-place update of a container (rcf.go l. 991-1072): start it again
        when ``must_run`` turns true, then one ``ContainerUpdate`` with the restart policy and
        the memory limits."""
        if reg.urn not in self.made or self.made[reg.urn][0] != "container":
            return
        client, _ = self.client_for(reg)
        cid = self.made[reg.urn][2]
        if "mustRun" in changed and inputs.get("mustRun", True):
            client.api.start(cid)
        if set(changed) & {"restart", "memory", "memorySwap"}:
            client.api.update_container(
                cid, mem_limit=int(inputs.get("memory") or 0) * MIB or None,
                memswap_limit=swap_bytes(inputs.get("memorySwap")),
                restart_policy={"Name": inputs.get("restart", "no")})

    def remove(self, urn: str) -> None:
        """What the provider's delete does for one resource (nothing for what it did not
        build): through a new connection to the engine it was created on, so an engine that
        stopped answering fails it; one that no longer has it is fine (the provider ignores
        "No such container")."""
        import docker.errors

        if urn not in self.made:
            return
        kind, config, object_id = self.made[urn]
        conn = connhelper.connect(config, timeout=15)
        try:
            with contextlib.suppress(docker.errors.NotFound):
                if kind == "container":
                    conn.client.api.remove_container(object_id, force=True)
                else:
                    conn.client.api.remove_network(object_id)
        finally:
            conn.close()
        del self.made[urn]

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()
        self.connections.clear()


def swap_bytes(mib) -> int | None:
    """``memory_swap`` as the provider sends it: MiB, but -1 (unlimited) as it is (rcf.go
    l. 342-348)."""
    if mib is None:
        return None
    swap = int(mib)
    return swap * MIB if swap > 0 else swap


def tar_upload(upload: dict) -> bytes:
    """One upload as the provider sends it: a single entry named by the absolute path."""
    data = upload["content"].encode()
    if upload.get("permissions"):
        mode = int(upload["permissions"], 8)
    else:
        mode = 0o744 if upload.get("executable") else 0o644
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(upload["file"])
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sweep_session(client, session: str) -> None:
    """Remove anything an interrupted earlier run of this session left on one engine."""
    for c in engine_room.session_containers(client, session):
        engine_room.remove(client, "container", c.id)
    for n in engine_room.session_network_attrs(client, session):
        engine_room.remove(client, "network", n["Id"])


def run_in(container, command: str, user: str = "work") -> tuple[int, str]:
    code, out = container.exec_run(["/bin/sh", "-c", command], user=user, demux=False)
    return code, (out or b"").decode(errors="replace").strip()


def wait_until_ready(containers: dict, timeout: float = READY_TIMEOUT) -> None:
    """Every container running, and main1 reaching the last host by ssh (every entrypoint past
    its peer wait)."""
    deadline = time.monotonic() + timeout
    main1 = containers["main1"]
    last = ""
    while time.monotonic() < deadline:
        for c in containers.values():
            c.reload()
            if c.status != "running":
                raise SessionNotReady(
                    f"{c.name} is {c.status}: {c.logs(tail=30).decode(errors='replace')}")
        code, last = run_in(main1, "ssh -o BatchMode=yes -o ConnectTimeout=5 "
                            f"{list(containers)[-1]} true")
        if code == 0:
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- {h}\n{c.logs(tail=20).decode(errors='replace')}"
                     for h, c in containers.items())
    raise SessionNotReady(f"the session did not become ready in {timeout:.0f}s: {last}\n{logs}")


def ssh_mesh(containers: dict, command: str = "hostname",
             options: str = "-o BatchMode=yes") -> dict[tuple[str, str], tuple[int, str]]:
    """``ssh <peer> <command>`` from every container to every other, in parallel."""
    pairs = [(h, p) for h in containers for p in containers if p != h]

    def one(pair: tuple[str, str]) -> tuple[int, str]:
        host, peer = pair
        return run_in(containers[host], f"ssh {options} {peer} {command}")

    with ThreadPoolExecutor(max_workers=8) as ex:
        return dict(zip(pairs, ex.map(one, pairs), strict=True))
