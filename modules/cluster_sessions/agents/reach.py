"""How an agent's Docker Engine is reached: decided once, here, for everyone who talks to it.

The rule (docs/agents.md, "How an agent is reached"):

- an agent **with an ``ssh`` block** is remote: its ``docker_host`` (default
  ``unix:///var/run/docker.sock``) names the engine's socket *on the agent*, and every client
  reaches it over that SSH: the connectors (paramiko, ``DOCKER_HOST`` set to that socket for
  commands run there), the Docker SDK clients (``docker system dial-stdio`` on the agent) and
  the ``docker.Provider`` (``ssh://USER@HOST:PORT[/SOCKET]`` with ``ssh_opts`` carrying the
  key, the pool's ``known_hosts``, ``BatchMode`` and a connect timeout);
- an agent **without** one is reached at ``docker_host`` directly: a ``unix://`` socket on this
  machine, an ``ssh://`` URL with the operator's own ssh defaults, or ``tcp://`` with the
  pool's TLS material (plain ``tcp://`` is refused when the pool is validated).

Pure: no I/O, no pulumi. :func:`reach_of` is the decision; :class:`Reach` turns it into the
provider's arguments and into the environment of commands run on the agent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..core.names import DEFAULT_DOCKER_SOCKET

if TYPE_CHECKING:
    from ..core.spec import Agent

SSH, LOCAL, TCP = "ssh", "local", "tcp"
# Seconds ssh waits for the agent's TCP handshake; docker/cli adds 30 when none is given
# (connhelper.go addSSHTimeout), we give our own so a dead agent fails as fast as a preflight.
PROVIDER_CONNECT_TIMEOUT = 10


@dataclass(frozen=True)
class Reach:
    """One agent's engine and the way to it.

    kind: ``ssh`` (a remote agent), ``local`` (a unix socket here) or ``tcp`` (TLS).
    socket: the engine's unix socket: on the agent for ``ssh`` (None: that host's default, as
        an ``ssh://`` docker_host without an ``ssh`` block means), here for ``local``.
    host, port, user: the SSH endpoint (``ssh``), or the TCP endpoint (``tcp``, no user).
    key_file, known_hosts: from the ``ssh`` block; None means the operator's ssh defaults.
    cert_path: the TLS directory (``ca.pem``, ``cert.pem``, ``key.pem``) of a ``tcp`` engine.
    """

    agent: str
    kind: str
    socket: str | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    cert_path: str | None = None

    # --- the docker.Provider ----------------------------------------------------------------

    @property
    def provider_host(self) -> str:
        """The provider's ``host``: for SSH, docker/cli's ``ssh://USER@HOST:PORT[/SOCKET]``,
        whose path makes the agent run ``docker --host unix://SOCKET system dial-stdio``
        (connhelper.go); the default socket is left out so the agent's own default applies."""
        if self.kind == SSH:
            user = f"{self.user}@" if self.user else ""
            host = f"[{self.host}]" if self.host and ":" in self.host else self.host
            port = f":{self.port}" if self.port else ""
            path = self.socket if self.socket and self.socket != DEFAULT_DOCKER_SOCKET else ""
            return f"ssh://{user}{host}{port}{path}"
        if self.kind == TCP:
            return f"tcp://{self.host}:{self.port}"
        return f"unix://{self.socket}"

    @property
    def provider_ssh_opts(self) -> list[str] | None:
        """The provider's ``ssh_opts``: flags docker/cli puts before ``-l USER -p PORT -- HOST``
        in the ``ssh`` command it runs (connhelper.go, ssh.go ``Args``). Host keys are always
        checked and ssh never prompts; the ``ssh`` block adds its known-hosts and key files.
        Paths are passed as written (ssh expands ``~`` itself)."""
        if self.kind != SSH:
            return None
        opts = ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", f"ConnectTimeout={PROVIDER_CONNECT_TIMEOUT}"]
        if self.known_hosts:
            opts += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        if self.key_file:
            opts += ["-o", f"IdentityFile={self.key_file}", "-o", "IdentitiesOnly=yes"]
        return opts

    @property
    def provider_cert_path(self) -> str | None:
        return self.cert_path if self.kind == TCP else None

    @property
    def endpoint(self) -> str:
        """Where the engine is, in one line: what changes when an agent points elsewhere (the
        credentials used to get there do not)."""
        if self.kind == SSH:
            where = f"ssh://{self.user + '@' if self.user else ''}{self.host}:{self.port or 22}"
            return f"{where} unix://{self.socket}" if self.socket else where
        return self.provider_host

    @property
    def digest(self) -> str:
        """8 hex digits of :attr:`endpoint`: the provider's resource name carries it, so a
        changed endpoint is a new provider (its resources are replaced on the new engine and
        deleted on the old one), never an in-place provider update."""
        return hashlib.sha256(self.endpoint.encode()).hexdigest()[:8]

    # --- commands run on the agent ----------------------------------------------------------

    @property
    def docker_env(self) -> dict[str, str]:
        """``DOCKER_HOST`` for commands run where the engine is: the socket named for it (on
        the agent for SSH, here for a local socket), the TCP URL, or nothing (the default)."""
        if self.kind == TCP:
            env = {"DOCKER_HOST": self.provider_host, "DOCKER_TLS_VERIFY": "1"}
            if self.cert_path:
                env["DOCKER_CERT_PATH"] = self.cert_path
            return env
        return {"DOCKER_HOST": f"unix://{self.socket}"} if self.socket else {}

    @property
    def description(self) -> str:
        if self.kind == SSH:
            return f"ssh {self.user or '(your ssh user)'}@{self.host}:{self.port or 22}"
        return self.provider_host


def reach_of(agent: Agent) -> Reach:
    """The one decision of how ``agent`` is reached (see the module docstring)."""
    url = urlsplit(agent.docker_host)
    if agent.ssh is not None:
        s = agent.ssh
        return Reach(agent.name, SSH, socket=url.path or DEFAULT_DOCKER_SOCKET, host=s.host,
                     port=s.port, user=s.user, key_file=s.key_file, known_hosts=s.known_hosts)
    if url.scheme == "ssh":
        return Reach(agent.name, SSH, socket=None, host=url.hostname, port=url.port,
                     user=url.username)
    if url.scheme == "tcp":
        tls = agent.tls
        return Reach(agent.name, TCP, host=url.hostname, port=url.port,
                     cert_path=tls.cert_path if tls is not None else None)
    return Reach(agent.name, LOCAL, socket=url.path)
