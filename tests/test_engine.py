"""The engine room (agents/engine.py): ``docker inspect`` read into typed facts once, a
session's objects listed by label and removed, the same through the API and over a shell.
The guard at the end keeps other modules from talking to an engine about sessions
themselves."""

from __future__ import annotations

import ast
import contextlib
import json
import subprocess
import uuid
from pathlib import Path

import pytest

import cluster_sessions
from cluster_sessions.agents import docker_transport, engine
from cluster_sessions.core.names import HOST_LABEL, SESSION_ID_LABEL, SESSION_LABEL

from .test_observe import tiny_image  # noqa: F401, F811 (a fixture, used by name)

DATA = Path(__file__).parent / "data" / "agents"
# where the package is imported from (the checkout's modules/, or a mutation run's copy)
PACKAGE = Path(cluster_sessions.__file__).resolve().parent


def captured(name: str) -> list[dict]:
    return json.loads((DATA / name).read_text())


def test_container_facts_read_our_labels_and_the_engine_state_from_captured_inspect():
    c = engine.container_facts(captured("docker-inspect-containers-worker.json")[0])
    assert (c.name, c.session, c.session_id, c.host, c.role, c.state) == (
        "demo-mn-sub1", "demo-mn", "abc123", "sub1", "sub", "running")
    assert (c.millicpu, c.mem, c.gpus) == (1500, 1073741824, (0, 1))
    assert c.exit_code is None and c.finished_at is None  # still running
    assert c.started_at and not c.started_at.startswith("0001")


def test_container_facts_of_an_exited_never_started_or_unlabelled_container():
    exited = engine.container_facts({
        "Id": "abc", "Name": "/x", "State": {"Status": "exited", "ExitCode": 3,
                                             "StartedAt": "0001-01-01T00:00:00Z",
                                             "FinishedAt": "2025-01-01T00:00:00Z"},
        "Config": {"Image": "img", "Labels": None},
        "HostConfig": {"NanoCpus": 2_500_000_000, "Memory": 1024,
                       "DeviceRequests": [{"DeviceIDs": ["3", "x"]}]}})
    assert (exited.exit_code, exited.finished_at, exited.started_at) == (
        3, "2025-01-01T00:00:00Z", None)
    assert (exited.session, exited.host, exited.role) == ("", None, None)
    assert (exited.millicpu, exited.mem, exited.gpus) == (2500, 1024, (3,))


def test_network_facts_from_captured_inspect():
    n = engine.network_facts(captured("docker-network-inspect-manager.json")[0])
    assert (n.session, n.session_id) == ("demo-mn", "abc123")
    assert n.driver and n.scope and n.network_id


def test_the_shell_listing_quotes_the_session_name():
    cmd = engine.labelled_inspect_command("container", "it's")
    assert "docker ps -a -q --no-trunc --filter 'label=cluster-sessions.session=it'\\''s'" in cmd
    out = subprocess.run(["sh", "-n", "-c", cmd], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "docker network inspect" in engine.labelled_inspect_command("network")
    assert engine.removal_command("container", ["a b"]) == "docker rm -f -v 'a b'"


@pytest.mark.docker
def test_session_objects_are_listed_by_label_and_removed_on_the_real_engine(docker_client,
                                                                            tiny_image):  # noqa: F811
    """Only the named session's container is listed (not another session's, not an unlabelled
    one); removing it twice says it was gone the second time; its network too."""
    image = tiny_image
    name = f"csl-engine-{uuid.uuid4().hex[:8]}"
    made = []
    try:
        for session in (name, f"{name}-other"):
            made.append(docker_client.containers.create(
                image, ["sleep", "60"], name=session,
                labels={SESSION_LABEL: session, SESSION_ID_LABEL: "id", HOST_LABEL: "main1"}))
        made.append(docker_client.containers.create(image, ["sleep", "60"],
                                                    name=f"{name}-plain"))
        net = docker_client.networks.create(name, labels={SESSION_LABEL: name})
        listed = engine.session_containers(docker_client, name)
        assert [c.name for c in listed] == [name]
        assert engine.container_facts(listed[0].attrs).host == "main1"
        assert {n["Name"] for n in engine.session_network_attrs(docker_client, name)} == {name}
        assert engine.remove(docker_client, "container", listed[0].id) is True
        assert engine.remove(docker_client, "container", listed[0].id) is False
        assert engine.remove(docker_client, "network", net.id) is True
        assert engine.session_containers(docker_client, name) == []
        assert engine.session_network_attrs(docker_client, name) == []
    finally:
        for c in made:
            engine.remove(docker_client, "container", c.id)
        for n in docker_client.networks.list(names=[name]):
            n.remove()


# --- the guard: nobody else lists sessions by label or reads inspect output -----------------


ROOM = PACKAGE / "agents" / "engine.py"
# The lab stops every container of its own engines at ``lab down`` (no session, no label).
WHOLE_ENGINE = ("lab",)


def offenders(path: Path, source: str | None = None) -> list[str]:
    """Where ``path`` lists engine objects by label, lists containers or networks itself, or
    reads labels out of inspect output."""
    found = []
    rel = path.relative_to(PACKAGE)
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "label" for k in node.keys):
            found.append(f"{rel}:{node.lineno}: a label filter")
        if isinstance(node, ast.Constant) and node.value == "Labels":
            found.append(f"{rel}:{node.lineno}: reads Labels from inspect output")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute)
                and (node.func.value.attr, node.func.attr) in (
                    ("containers", "list"), ("networks", "list"), ("api", "containers"),
                    ("api", "networks"))
                and rel.parts[0] not in WHOLE_ENGINE):
            found.append(f"{rel}:{node.lineno}: lists {node.func.value.attr}")
    return found


def test_only_the_engine_room_lists_sessions_by_label_or_reads_their_labels():
    bad = [o for path in sorted(PACKAGE.rglob("*.py")) if path != ROOM
           for o in offenders(path)]
    assert bad == []


def test_the_guard_sees_a_listing_outside_the_room():
    """The guard would fail on what it forbids (no vacuous pass)."""
    source = ('c.containers.list(all=True, filters={"label": "x"})\n'
              'attrs["Config"]["Labels"]\n')
    assert len(offenders(PACKAGE / "driver" / "fake.py", source)) == 3
    assert offenders(PACKAGE / "lab" / "fake.py", "c.containers.list()") == []


@pytest.mark.docker
def test_a_call_on_a_connection_the_agent_dropped_is_sent_once_more(tmp_path):
    """The lab's agents close idle pooled connections; a client that sat idle through an `up`
    (the pool ledger's) got `Connection reset` and the `up` ended in an internal error (seen
    in CI). A dropped connection is retried once on a new one; the plain client fails."""
    import socket
    import threading

    import docker
    import requests

    path = str(tmp_path / "relay.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)
    accepted = []

    def pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                b.shutdown(socket.SHUT_WR)

    def serve() -> None:  # the first two are dropped once the request arrived (one a client)
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            if len(accepted) <= 2:
                conn.recv(65536)
                conn.close()
                continue
            engine_side = socket.socket(socket.AF_UNIX)
            engine_side.connect("/var/run/docker.sock")
            for a, b in ((conn, engine_side), (engine_side, conn)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        plain = docker.DockerClient(base_url=f"unix://{path}", version="1.41")
        with pytest.raises(requests.exceptions.ConnectionError):
            plain.api.version()
        retrying = docker.DockerClient(base_url=f"unix://{path}", version="1.41")
        docker_transport.retry_a_dropped_connection(retrying)
        assert retrying.api.version()["ApiVersion"]
        assert len(accepted) == 3  # plain: 1 dropped; retrying: 1 dropped, 1 relayed
    finally:
        server.close()


def test_a_stats_call_answered_with_no_document_is_that_container_gone():
    """The engine ends the stats stream without a document for a container removed during
    the call (docker-py then fails decoding ""): ``Gone``, not the agent unreachable."""
    import docker.errors

    class Api:
        def __init__(self, fail):
            self.fail = fail

        def stats(self, cid, stream, one_shot):
            raise self.fail

    class Client:
        def __init__(self, fail):
            self.api = Api(fail)

    for fail in (json.JSONDecodeError("Expecting value", "", 0),
                 docker.errors.NotFound("No such container")):
        with pytest.raises(engine.Gone):
            engine.container_stats(Client(fail), "a" * 64)
    with pytest.raises(ConnectionError):  # the connection, not the container: the agent's
        engine.container_stats(Client(ConnectionError("reset")), "a" * 64)
