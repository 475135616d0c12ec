"""agents/reach.py: one decision of how an agent is reached, and everyone following it.

The provider's arguments are spelled out by hand here (what docker/cli's connhelper reads:
``ssh://USER@HOST:PORT[/SOCKET]``), so a change in reach.py that moves a session elsewhere
fails these tests instead of agreeing with itself.
"""

from __future__ import annotations

import os

import pytest

from cluster_sessions.agents.connectors import (
    ApiConnector,
    LocalConnector,
    SSHConnector,
    connector_for,
)
from cluster_sessions.agents.reach import LOCAL, SSH, TCP, reach_of
from cluster_sessions.core.spec import Agent
from cluster_sessions.driver import stacks
from tests.conftest import PROJECT

CAPACITY = {"cpu": 4, "mem": "8g"}
SSH_BLOCK = {"host": "10.0.0.11", "port": 2222, "user": "ops", "key_file": "~/.ssh/id_pool",
             "known_hosts": "~/.ssh/kh_pool"}


def agent(**fields) -> Agent:
    return Agent.model_validate({"name": "a1", "capacity": CAPACITY, **fields})


def test_an_agent_with_an_ssh_block_is_remote_and_its_socket_is_on_the_agent():
    default = reach_of(agent(ssh=SSH_BLOCK))
    assert (default.kind, default.socket) == (SSH, "/var/run/docker.sock")
    assert default.provider_host == "ssh://ops@10.0.0.11:2222"  # the agent's own default
    rootless = reach_of(agent(ssh=SSH_BLOCK, docker_host="unix:///run/user/1000/docker.sock"))
    assert rootless.provider_host == "ssh://ops@10.0.0.11:2222/run/user/1000/docker.sock"
    # commands run there name the socket explicitly, whatever the login environment says
    assert rootless.docker_env == {"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}
    assert rootless.provider_ssh_opts == [
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
        "-o", "UserKnownHostsFile=~/.ssh/kh_pool",
        "-o", "IdentityFile=~/.ssh/id_pool", "-o", "IdentitiesOnly=yes"]
    conn = connector_for(agent(ssh=SSH_BLOCK, docker_host="unix:///run/user/1000/docker.sock"))
    assert isinstance(conn, SSHConnector)
    assert (conn.host, conn.port, conn.user, conn.key_file, conn.known_hosts) == (
        "10.0.0.11", 2222, "ops", "~/.ssh/id_pool", "~/.ssh/kh_pool")
    assert conn.env == {"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}


def test_an_agent_without_one_is_reached_at_its_docker_host():
    local = reach_of(agent(docker_host="unix:///run/docker.sock"))
    assert (local.kind, local.provider_host, local.provider_ssh_opts) == (
        LOCAL, "unix:///run/docker.sock", None)
    assert isinstance(connector_for(agent(docker_host="unix:///run/docker.sock")),
                      LocalConnector)
    url = reach_of(agent(docker_host="ssh://ops@10.0.0.12:2201"))
    assert (url.kind, url.provider_host, url.docker_env) == (SSH, "ssh://ops@10.0.0.12:2201", {})
    assert url.provider_ssh_opts == ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                                     "-o", "ConnectTimeout=10"]
    tcp = reach_of(agent(docker_host="tcp://10.0.0.20:2376", tls={"cert_path": "/etc/pool"}))
    assert (tcp.kind, tcp.provider_host, tcp.provider_cert_path) == (
        TCP, "tcp://10.0.0.20:2376", "/etc/pool")
    api = connector_for(agent(docker_host="tcp://10.0.0.20:2376", tls={"cert_path": "/c"}))
    assert isinstance(api, ApiConnector) and api.cert_path == "/c"


def test_the_digest_follows_where_the_engine_is_not_the_credentials():
    base = reach_of(agent(ssh=SSH_BLOCK))
    assert reach_of(agent(ssh={**SSH_BLOCK, "key_file": "~/.ssh/other"})).digest == base.digest
    assert reach_of(agent(ssh={**SSH_BLOCK, "known_hosts": "/kh"})).digest == base.digest
    for other in (agent(ssh={**SSH_BLOCK, "host": "10.0.0.99"}),
                  agent(ssh={**SSH_BLOCK, "port": 22}),
                  agent(ssh={**SSH_BLOCK, "user": "root"}),
                  agent(ssh=SSH_BLOCK, docker_host="unix:///run/other.sock"),
                  agent(docker_host="unix:///var/run/docker.sock")):
        assert reach_of(other).digest != base.digest, other


def test_local_commands_never_inherit_the_callers_docker_settings(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://203.0.113.9:2375")
    monkeypatch.setenv("DOCKER_CONTEXT", "elsewhere")
    conn = connector_for(agent(docker_host="unix:///run/mine.sock"))
    rc, out, _ = conn.run('echo "$DOCKER_HOST|${DOCKER_CONTEXT-unset}"')
    assert (rc, out.strip()) == (0, "unix:///run/mine.sock|unset")


def test_the_driver_drops_what_would_steer_docker_before_pulumi_starts(capsys):
    environ = {"DOCKER_HOST": "tcp://x:2375", "DOCKER_CONTEXT": "c", "DOCKER_CERT_PATH": "/c",
               "DOCKER_TLS_VERIFY": "1", "DOCKER_SSH_OPTS": "-o ProxyCommand=x", "HOME": "/h"}
    dropped = stacks.drop_docker_client_env(environ)
    assert environ == {"HOME": "/h"}
    assert set(dropped) == {"DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CERT_PATH",
                            "DOCKER_TLS_VERIFY", "DOCKER_SSH_OPTS"}
    assert "ignoring" in capsys.readouterr().err
    assert stacks.drop_docker_client_env({"HOME": "/h"}) == []


@pytest.mark.parametrize("name", ["DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CERT_PATH"])
def test_an_engine_verb_runs_pulumi_without_the_callers_docker_settings(
        name, monkeypatch, tmp_path, capsys):
    """The whole verb: ``prepare`` drops them from the process environment, which the
    Automation API hands to the CLI and so to the docker provider."""
    import argparse

    monkeypatch.setenv(name, "somewhere-else")
    args = argparse.Namespace(yes=True, json=False)
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: tmp_path / "pulumi")
    stacks.prepare("preview", args, [PROJECT], "here", report=lambda *a, **k: None)
    assert name not in os.environ


def test_a_dropped_ssh_handshake_is_tried_again_and_a_refusal_is_not(monkeypatch):
    """sshd drops handshakes beyond MaxStartups at random: one more connection for channels
    beyond MaxSessions is tried again; a refused key is final."""
    from cluster_sessions.agents import connectors

    conn = connector_for(agent(ssh=SSH_BLOCK))
    monkeypatch.setattr(connectors.time, "sleep", lambda _s: None)
    outcomes = [connectors.AgentError("a1", connectors.UNREACHABLE, "banner"),
                connectors.AgentError("a1", connectors.UNREACHABLE, "reset"), "client"]

    def opened():
        result = outcomes.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(conn, "_open", opened)
    assert conn._open_again() == "client"
    monkeypatch.setattr(conn, "_open", lambda: (_ for _ in ()).throw(
        connectors.AgentError("a1", connectors.AUTH_FAILED, "refused")))
    with pytest.raises(connectors.AgentError, match="auth failed"):
        conn._open_again()


def test_waiting_on_an_agent_works_past_descriptor_1024():
    """A process that talks to many agents holds many sockets: select() cannot watch a
    descriptor past 1024 ("filedescriptor out of range"), which reset relayed connections."""
    import resource
    import socket

    from cluster_sessions.agents.connectors import wait_readable

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), max(hard, 2048)))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        a, b = socket.socketpair()
        assert a.fileno() > 1024
        b.send(b"x")
        wait_readable(a, 1)
        assert a.recv(1) == b"x"
        a.close()
        b.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
