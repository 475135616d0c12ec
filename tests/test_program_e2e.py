"""End to end: what the Pulumi program declares, built on the real local Docker Engine.

No pulumi CLI or provider plugin can be installed here, so the real ``__main__.py`` runs under
mocks whose ``new_resource`` does what the Docker provider would do with the declared inputs:
create the network, create each container (env, entrypoint, command, hostname, alias, labels,
memory/shm/cpus, mounts, ports), upload the rendered files with ``put_archive`` before the
start, and start it. Then the runtime checks run on those containers: ``ssh <peer> hostname``
from every container to every other, the derived variables over ``ssh``, and main1 reached
from this machine with nothing but the stack's outputs.

The session is the train-demo example under a unique name (so it never meets a real
``sessionctl up`` of train-demo on this engine), on the test image from
``cluster_sessions.lab.image``; everything it creates is removed afterwards.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from cluster_sessions.lab.image import ensure_image
from cluster_sessions.plan import LABEL_PREFIX

from .mockengine import STACKS, Engine, Registration, run_program

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MIB = 1024 * 1024
READY_TIMEOUT = 150  # seconds: the entrypoint itself waits up to readiness.timeout (120 s)


class DockerBuilder:
    """``on_create`` for :class:`~tests.mockengine.Engine`: the Docker provider's create, by hand.

    Follows terraform-provider-docker's container create: create, leave the default bridge for
    ``networks_advanced`` (here: created straight onto the session network with its aliases),
    upload each file as a one-entry tar at ``/`` with its mode, start, then insist it runs.
    """

    def __init__(self, client) -> None:
        self.client = client
        self.containers: list[str] = []
        self.networks: list[str] = []

    def __call__(self, reg: Registration, inputs: dict) -> dict | None:
        if reg.type == "docker:index/network:Network":
            return self.network(inputs)
        if reg.type == "docker:index/container:Container":
            return self.container(inputs)
        return None

    def network(self, inputs: dict) -> dict:
        net = self.client.networks.create(
            inputs["name"],
            driver=inputs.get("driver"),
            options=inputs.get("options"),
            attachable=inputs.get("attachable"),
            labels={x["label"]: x["value"] for x in inputs.get("labels", [])},
        )
        self.networks.append(net.id)
        return {"id": net.id}

    def container(self, inputs: dict) -> dict:
        import docker.types

        api = self.client.api
        assert "gpus" not in inputs, "no GPUs on this engine"
        ports = inputs.get("ports") or []
        bindings = {
            f"{int(p['internal'])}/{p.get('protocol', 'tcp')}":
                (p.get("ip", "0.0.0.0"), int(p["external"]) if p.get("external") else None)
            for p in ports
        }
        host_config = api.create_host_config(
            mounts=[docker.types.Mount(m["target"], m["source"], type=m["type"],
                                       read_only=m.get("readOnly", False))
                    for m in inputs.get("mounts", [])],
            mem_limit=int(inputs["memory"]) * MIB,
            shm_size=int(inputs["shmSize"]) * MIB,
            nano_cpus=round(float(inputs["cpus"]) * 1e9),
            restart_policy={"Name": inputs["restart"]},
            port_bindings=bindings or None,
        )
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
        self.containers.append(cid)
        for upload in inputs["uploads"]:
            api.put_archive(cid, "/", _tar(upload))
        api.start(cid)
        time.sleep(0.2)
        state = api.inspect_container(cid)["State"]
        assert state["Running"], f"{inputs['name']} exited at once: {state}"  # must_run
        published = api.inspect_container(cid)["NetworkSettings"]["Ports"] or {}
        return {"ports": [
            {**p, "external": int(published[f"{int(p['internal'])}/{p.get('protocol', 'tcp')}"]
                                  [0]["HostPort"])}
            for p in ports
        ]}

    def remove_all(self) -> None:
        import docker.errors

        for cid in reversed(self.containers):
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_container(cid, force=True)
        for nid in self.networks:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_network(nid)


def _tar(upload: dict) -> bytes:
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


def _sweep(client, session: str) -> None:
    """Remove anything an interrupted earlier run of this session left behind."""
    label = f"{LABEL_PREFIX}.session={session}"
    for c in client.containers.list(all=True, filters={"label": label}):
        c.remove(force=True)
    for n in client.networks.list(filters={"label": label}):
        n.remove()


@pytest.fixture(scope="module")
def live(docker_client, tmp_path_factory):
    """The train-demo example under a unique name, built by the program on the real engine."""
    image = ensure_image(docker_client)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    definition = yaml.safe_load((STACKS / "sessions" / "train-demo.yaml").read_text())
    definition.update(name=name, image=image, pool=str(STACKS / "pools" / "local.yaml"))
    path = tmp_path_factory.mktemp("e2e") / f"{name}.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False))

    builder = DockerBuilder(docker_client)
    engine = Engine(on_create=builder)
    _sweep(docker_client, name)
    try:
        outputs = run_program(engine, name, {"cluster-sessions:definition": str(path)})
        hosts = outputs["hosts"][0]
        containers = {h: docker_client.containers.get(f"{name}-{h}") for h in hosts}
        _wait_until_ready(containers)
        yield {"name": name, "engine": engine, "outputs": outputs, "hosts": hosts,
               "containers": containers, "definition": definition}
    finally:
        builder.remove_all()
        _sweep(docker_client, name)


def _run(container, command: str, user: str = "work") -> tuple[int, str]:
    code, out = container.exec_run(["/bin/sh", "-c", command], user=user, demux=False)
    return code, (out or b"").decode(errors="replace").strip()


def _wait_until_ready(containers: dict) -> None:
    """Every container's sshd answering, and every entrypoint past its peer wait."""
    deadline = time.monotonic() + READY_TIMEOUT
    main1 = containers["main1"]
    last = ""
    while time.monotonic() < deadline:
        for c in containers.values():
            c.reload()
            if c.status != "running":
                pytest.fail(f"{c.name} is {c.status}: {c.logs(tail=30).decode(errors='replace')}")
        code, last = _run(main1, "ssh -o BatchMode=yes -o ConnectTimeout=5 "
                          f"{list(containers)[-1]} true")
        if code == 0:
            return
        time.sleep(1)
    logs = "\n".join(f"--- {h}\n{c.logs(tail=20).decode(errors='replace')}"
                     for h, c in containers.items())
    pytest.fail(f"the session did not become ready in {READY_TIMEOUT}s: {last}\n{logs}")


def test_the_engine_runs_exactly_what_the_program_declared(live, docker_client):
    name = live["name"]
    for host, c in live["containers"].items():
        attrs = docker_client.api.inspect_container(c.id)
        reg = live["engine"].named("docker:index/container:Container", f"{name}-{host}")
        declared = reg.plain_inputs
        assert attrs["Config"]["Hostname"] == host
        assert attrs["Config"]["Labels"][f"{LABEL_PREFIX}.host"] == host
        assert set(declared["envs"]) <= set(attrs["Config"]["Env"])
        aliases = attrs["NetworkSettings"]["Networks"][f"{name}-net"]["Aliases"]
        assert host in aliases
        assert list(attrs["NetworkSettings"]["Networks"]) == [f"{name}-net"]
        assert attrs["HostConfig"]["Memory"] == 1024 * MIB
        assert attrs["HostConfig"]["ShmSize"] == 256 * MIB
        published = attrs["HostConfig"]["PortBindings"] or {}
        if host == "main1":
            assert published == {"2200/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
        else:
            assert published == {}, f"{host} publishes {published}"
        code, mode = _run(c, "stat -c '%a %U' /opt/cluster-session/ssh/id_cluster", user="root")
        assert (code, mode) == (0, "600 root"), f"{host}: the uploaded key is {mode}"


def test_every_container_reaches_every_peer_by_ssh_without_a_prompt(live):
    hosts = live["hosts"]
    for host, c in live["containers"].items():
        for peer in hosts:
            if peer == host:
                continue
            code, out = _run(c, f"ssh -o BatchMode=yes {peer} hostname")
            assert (code, out) == (0, peer), f"ssh {host} -> {peer}: {out}"


def test_derived_variables_are_visible_in_ssh_sessions(live):
    main1 = live["containers"]["main1"]
    code, out = _run(main1, "ssh -o BatchMode=yes sub1 'echo $MASTER_ADDR $MASTER_PORT'")
    assert (code, out) == (0, "main1 29500")
    code, out = _run(main1, "ssh -o BatchMode=yes sub2 'echo $BACKENDAI_CLUSTER_HOST "
                            "$BACKENDAI_CLUSTER_LOCAL_RANK $PET_NODE_RANK'")
    assert (code, out) == (0, "sub2 2 2")
    code, out = _run(main1, "ssh -o BatchMode=yes sub3 'echo \"$EXPERIMENT\"'")
    assert (code, out) == (0, "demo run 1")


def test_main1_is_reachable_from_this_machine_with_the_stack_outputs(live, tmp_path):
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client on this machine")
    main1, _ = live["outputs"]["main1"]
    private_key, secret = live["outputs"]["ssh_private_key"]
    assert secret
    ssh = main1["ssh"]
    key = tmp_path / "id_cluster"
    key.touch(mode=0o600)
    key.write_text(private_key)  # never printed
    known = tmp_path / "main1_known_hosts"
    known.write_text(ssh["known_hosts"] + "\n")
    port = next(p for p in main1["ports"] if p["container"] == 2200)
    command = [
        "ssh", "-i", str(key), "-o", f"UserKnownHostsFile={known}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-F", os.devnull, "-p", str(port["host"]), f"work@{port['address']}",
        "echo $BACKENDAI_CLUSTER_HOST $(hostname)",
    ]
    assert ssh["command"].split()[:1] == ["ssh"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "main1 main1"), out.stderr
    assert Path(key).stat().st_mode & 0o077 == 0
