"""One image on every agent, against a real registry (issue 33): Debian's docker-registry on
the lab bridge's address with basic auth, a tag pushed twice, agents 1 and 2 holding different
pushes of it. One session runs one digest on both agents (asserted from the engines), and
`up` said it pulled the newer one where it was missing; a second `up` keeps the digest and
pulls nothing; wrong credentials exit 4 before anything is created; `pool pull` pre-pulls.

One lab for the module (prefix ``csli``, 10.251.121.0/24), always torn down.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import docker
import pytest
import yaml

from cluster_sessions.agents import cleanup
from cluster_sessions.core.names import SESSION_LABEL

from . import factories
from .conftest import PROJECT, SESSIONCTL, backend_env
from .lab_support import lab_pool, pool_swarm
from .registry_support import registry

pytestmark = [pytest.mark.lab, pytest.mark.docker, pytest.mark.slow]

PREFIX, SUBNET = "csli", "10.251.121.0/24"
REGISTRY_PORT = 5121


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 2, name="images",
                  capacity={"cpu": 2, "mem": "2g"}) as built, \
            pool_swarm(built.pool_file, "pool-images"):
        yield built


@pytest.fixture(scope="module")
def reg(lab, tmp_path_factory):
    with registry(tmp_path_factory.mktemp("registry"), lab.info.bridge_address,
                  REGISTRY_PORT) as r:
        yield r


def local(lab, agent: str) -> docker.DockerClient:
    """The agent's engine through the lab's own socket (the test's hand, not the driver's)."""
    sock = next(a.socket for a in lab.info.agents if a.name == agent)
    return docker.DockerClient(base_url=f"unix://{sock}", timeout=300)


def push(client: docker.DockerClient, image_id: str, ref: str, reg) -> str:
    """``image_id`` pushed as ``ref``; the registry's digest of it."""
    repo, tag = ref.rsplit(":", 1)
    client.images.get(image_id).tag(repo, tag)
    for event in client.api.push(repo, tag, stream=True, decode=True, auth_config=reg.auth()):
        assert "error" not in event, event
    return client.images.get_registry_data(ref, auth_config=reg.auth()).id


def second_push(client: docker.DockerClient, base: str, ref: str, reg) -> tuple[str, str]:
    """Another content under ``ref``: ``base`` with one more label, committed and pushed;
    (its image ID, its digest)."""
    made = client.api.create_container(base, command=["true"])
    try:
        committed = client.api.commit(made["Id"], changes=[f"LABEL push={uuid.uuid4().hex}"])
    finally:
        client.api.remove_container(made["Id"], force=True)
    return committed["Id"], push(client, committed["Id"], ref, reg)


def pool_with_auth(lab, directory: Path, config: Path) -> Path:
    doc = yaml.safe_load(lab.pool_file.read_text())
    doc["registry_auth"] = {"config_file": str(config)}
    path = directory / "pool-auth.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run(state: Path, *argv: str, timeout: float = 600) -> tuple[int, str, str]:
    env = backend_env(state, HOME=str(state))  # no operator docker config
    proc = subprocess.run([SESSIONCTL, *argv], cwd=PROJECT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def definition(directory: Path, name: str, pool: Path, image: str) -> Path:
    doc = factories.session(name, str(pool), image, size=2, mode="multi-node", cpu=1.5,
                            mem="256m", shmem="64m")  # one container per agent
    return factories.write(directory / f"{name}.yaml", doc)


def session_containers(lab, name: str) -> dict[str, dict]:
    found = {}
    for agent in lab.info.names:
        client = local(lab, agent)
        try:
            for c in client.api.containers(all=True,
                                           filters={"label": f"{SESSION_LABEL}={name}"}):
                found[agent] = client.api.inspect_container(c["Id"])
        finally:
            client.close()
    return found


def test_one_session_runs_one_digest_on_agents_that_held_different_pushes(lab, reg, tmp_path):
    ref = f"{reg.address}/cs/train:latest"
    a1, a2 = local(lab, "agent1"), local(lab, "agent2")
    try:
        push(a1, lab.image, ref, reg)
        a2.api.pull(f"{reg.address}/cs/train", tag="latest", auth_config=reg.auth())
        held_before = a2.images.get(ref).id
        newer_id, newer = second_push(a1, lab.image, ref, reg)
        assert a1.images.get(ref).id == newer_id != held_before  # two pushes, two holdings
    finally:
        a1.close()
        a2.close()
    config = reg.docker_config(tmp_path / "docker-config.json")
    pool = pool_with_auth(lab, tmp_path, config)
    name = f"img-{uuid.uuid4().hex[:6]}"
    path = definition(tmp_path, name, pool, ref)
    state = tmp_path / "backend"
    state.mkdir()
    try:
        code, _out, err = run(state, "up", str(path), "--yes")
        assert code == 0, err
        assert f"-> {reg.address}/cs/train@{newer}" in err, err
        assert "agent2 pulled" in err and "agent1 present" in err, err
        assert reg.password not in err
        made = session_containers(lab, name)
        assert sorted(made) == ["agent1", "agent2"]
        assert {c["Image"] for c in made.values()} == {newer_id}  # one content everywhere
        assert {c["Config"]["Image"] for c in made.values()} == {
            f"{reg.address}/cs/train@{newer}"}
        # progress without a terminal: a line per agent as it went
        assert "sessionctl up: agent2:" in err, err

        code, out, err = run(state, "up", str(path), "--yes", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["outputs"]["session"]["image"] == f"{reg.address}/cs/train@{newer}"
        events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert events and all(e["status"] == "present" for e in events), err  # nothing pulled
    finally:
        run(state, "destroy", str(path), "--yes")
        cleanup.sweep(lab.pool, name, wait=10)


def test_wrong_credentials_exit_4_before_anything_is_created(lab, reg, tmp_path):
    ref = f"{reg.address}/cs/only-remote:v1"
    a1 = local(lab, "agent1")
    try:
        push(a1, lab.image, ref, reg)
        a1.images.remove(ref)  # the registry holds it, no agent does
    finally:
        a1.close()
    config = reg.docker_config(tmp_path / "docker-config.json", password="wrong-password")
    pool = pool_with_auth(lab, tmp_path, config)
    name = f"bad-{uuid.uuid4().hex[:6]}"
    path = definition(tmp_path, name, pool, ref)
    state = tmp_path / "backend"
    state.mkdir()
    code, _out, err = run(state, "up", str(path), "--yes")
    assert code == 4, err
    assert "credentials" in err and "nothing was created" in err, err
    assert "wrong-password" not in err
    found, errors = cleanup.find_leftovers(lab.pool, name)
    assert not errors and found == []


def test_pool_pull_puts_the_image_on_every_agent_and_says_its_digest(lab, reg, tmp_path):
    ref = f"{reg.address}/cs/prepull:v1"
    a1 = local(lab, "agent1")
    try:
        digest = push(a1, lab.image, ref, reg)
        a1.images.remove(ref)
    finally:
        a1.close()
    config = reg.docker_config(tmp_path / "docker-config.json")
    pool = pool_with_auth(lab, tmp_path, config)
    state = tmp_path / "backend"
    state.mkdir()
    code, out, err = run(state, "pool", "pull", str(pool), ref, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["digest"] == digest
    how = {a["agent"]: a["how"] for a in doc["agents"]}
    assert how["agent2"] == "pulled" and how["agent1"] in ("pulled", "present"), how
    for agent in ("agent1", "agent2"):
        client = local(lab, agent)
        try:
            assert client.images.get(f"{reg.address}/cs/prepull@{digest}")
        finally:
            client.close()


def big_image(client: docker.DockerClient, base: str, ref: str, reg, mb: int) -> str:
    """``base`` with one more layer of ``mb`` MB of random bytes, pushed as ``ref`` and removed
    from this engine again; its digest."""
    import io
    import tarfile

    made = client.api.create_container(base, command=["true"])
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("blob")
            info.size = mb * 2**20
            tar.addfile(info, io.BytesIO(os.urandom(info.size)))
        client.api.put_archive(made["Id"], "/", buf.getvalue())
        committed = client.api.commit(made["Id"])["Id"]
    finally:
        client.api.remove_container(made["Id"], force=True)
    digest = push(client, committed, ref, reg)
    client.api.remove_image(committed, force=True)
    return digest


def test_a_pull_killed_mid_way_is_finished_by_the_next_up_drawn_on_a_terminal(
        lab, reg, tmp_path):
    import pty
    import select
    import signal
    import time

    ref = f"{reg.address}/cs/big:v1"
    a1 = local(lab, "agent1")
    try:
        digest = big_image(a1, lab.image, ref, reg, 400)
    finally:
        a1.close()
    pool = pool_with_auth(lab, tmp_path, reg.docker_config(tmp_path / "docker-config.json"))
    name = f"kill-{uuid.uuid4().hex[:6]}"
    path = definition(tmp_path, name, pool, ref)
    state = tmp_path / "backend"
    state.mkdir()
    env = backend_env(state, HOME=str(state))
    argv = [SESSIONCTL, "up", str(path), "--yes"]
    try:
        proc = subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        seen = []
        assert proc.stderr is not None
        for line in proc.stderr:  # a line per agent per 10 % (no terminal)
            seen.append(line)
            if ": " in line and "pulling" in line and "%" in line:
                percent = int(line.split(": ", 2)[2].split("%")[0])
                if percent < 90:  # the engines are pulling: stop them there
                    proc.send_signal(signal.SIGINT)
                    break
        assert proc.wait(60) != 0, seen
        assert session_containers(lab, name) == {}, seen  # nothing created
        # the next up, on a pseudo-terminal: one line per agent, redrawn in place
        leader, follower = pty.openpty()
        again = subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=follower,
                                 stderr=follower)
        os.close(follower)
        out = b""
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            elif again.poll() is not None:
                break
        os.close(leader)
        assert again.wait(60) == 0, out.decode(errors="replace")[-3000:]
        text = out.decode(errors="replace")
        (tmp_path / "terminal.txt").write_text(text)
        assert "\x1b[2F" in text, f"not redrawn: {tmp_path / 'terminal.txt'}"
        assert "agent2:" in text and "agent1 pulled, agent2 pulled" in text, text[-3000:]
        made = session_containers(lab, name)
        assert {c["Config"]["Image"] for c in made.values()} == {
            f"{reg.address}/cs/big@{digest}"}
        assert len({c["Image"] for c in made.values()}) == 1 and len(made) == 2
    finally:
        run(state, "destroy", str(path), "--yes")
        cleanup.sweep(lab.pool, name, wait=10)
