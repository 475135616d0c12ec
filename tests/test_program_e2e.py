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

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from cluster_sessions.core.names import LABEL_PREFIX
from cluster_sessions.lab.image import ensure_image
from tests.standin.docker_builder import MIB, DockerBuilder
from tests.standin.docker_builder import run_in as _run
from tests.standin.docker_builder import sweep_session as _sweep
from tests.standin.docker_builder import wait_until_ready as _wait_until_ready
from tests.standin.engine import STACKS, Engine, run_program

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def live(docker_client, tmp_path_factory):
    """The train-demo example under a unique name, built by the program on the real engine."""
    image = ensure_image(docker_client)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    definition = yaml.safe_load((STACKS / "sessions" / "train-demo.yaml").read_text())
    definition.update(name=name, image=image, pool=str(STACKS / "pools" / "local.yaml"))
    path = tmp_path_factory.mktemp("e2e") / f"{name}.yaml"
    path.write_text(yaml.safe_dump(definition, sort_keys=False))

    builder = DockerBuilder()
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
        builder.close()
        _sweep(docker_client, name)


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
        # the bundle is unpacked on a tmpfs of the container's own (spec.RUN_TMPFS)
        assert attrs["HostConfig"]["Tmpfs"] == {
            "/run/cluster-session": "rw,nosuid,nodev,noexec,mode=0755,size=64m"}
        # the pool's bounds (issue 32): a rotated json-file log, only the set-up's
        # capabilities, no privilege gained by exec; root in the container has no other one
        assert attrs["HostConfig"]["LogConfig"] == {
            "Type": "json-file", "Config": {"max-file": "4", "max-size": str(16 * MIB)}}
        assert attrs["HostConfig"]["PidsLimit"] == 8192  # the pool's (ContainerLimits)
        assert attrs["HostConfig"]["CapDrop"] == ["ALL"]
        assert attrs["HostConfig"]["CapAdd"] == ["CAP_AUDIT_WRITE", "CAP_CHOWN",
                                                 "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL",
                                                 "CAP_SETGID", "CAP_SETUID", "CAP_SYS_CHROOT"]
        assert attrs["HostConfig"]["SecurityOpt"] == ["no-new-privileges:true"]
        code, caps = _run(c, "grep -E '^(CapBnd|NoNewPrivs)' /proc/1/status", user="root")
        assert caps.split() == ["CapBnd:", "00000000200400eb", "NoNewPrivs:", "1"], caps
        code, modes = _run(c, "stat -c '%a %U' /run/cluster-session/ssh "
                           "/run/cluster-session/ssh/id_cluster "
                           "/run/cluster-session/ssh/ssh_host_ed25519_key", user="root")
        assert (code, modes.split("\n")) == (0, ["711 root", "600 root", "600 root"]), (
            f"{host}: the uploaded keys are {modes}")
        code, _ = _run(c, "cat /run/cluster-session/ssh/id_cluster")  # as the session user
        assert code != 0, f"{host}: the user reads root's copy of the session key"


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
