"""How an agent is reached: a *connector* runs a shell command there and returns its result.

What is asked of an agent (its Docker version, swarm state, CPUs, our containers) is a fact
(:mod:`.facts`); how the question gets there is a connector. The same facts run against the lab,
a real agent over SSH, or this machine. Which connector an agent gets is
:func:`.reach.reach_of`'s decision, the same one the ``docker.Provider`` arguments follow:

- :class:`SSHConnector` (paramiko): key file or ssh-agent/default keys; host keys are checked
  strictly by default against the agent's ``known_hosts`` file (or ``~/.ssh/known_hosts``): an
  unknown key is refused, a changed key is always refused. ``host_keys="accept-new"`` records
  the key of a host seen for the first time (trust on first use), as ``ssh -o
  StrictHostKeyChecking=accept-new`` does.
- :class:`LocalConnector` (subprocess): agents with no ``ssh`` block whose ``docker_host`` is a
  unix socket, which is on this machine by definition.
- :class:`ApiConnector` (docker SDK): ``tcp://`` agents, with the pool's TLS material; there is
  no shell there, so only facts that the Docker API can answer are available.

Every failure is an :class:`AgentError` that names the agent and the cause (unreachable, auth
failed, host key unknown, host key changed, docker not answering, timeout, ...). Nothing
connects at construction; the SSH connection opens at the first command and is reused.

The operator's own files are read here, not by paramiko's loaders, which crash on lines
OpenSSH writes (``@cert-authority``, ``@revoked``) and on damaged ones, and print the line in
the exception: :func:`read_known_hosts` refuses a damaged line by file and line number (a
damaged pin must never turn into an unknown host that ``accept-new`` would then trust), skips
well-formed lines of key types paramiko cannot use, and honours ``@revoked``; a key file is
loaded once before connecting. Either failure is ``misconfigured``, naming the file.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import getpass
import hashlib
import os
import re
import selectors
import shlex
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import EngineFailure, InvalidInput
from ..core.names import DEFAULT_DOCKER_HOST, DOCKER_CLIENT_ENV
from .docker_transport import one_pool_per_engine, retry_a_dropped_connection
from .reach import LOCAL, SSH, reach_of

if TYPE_CHECKING:
    from ..core.spec import Agent

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 60.0
HOST_KEY_POLICIES = ("strict", "accept-new")

# Causes, as the first words of an AgentError message.
UNREACHABLE = "unreachable"
AUTH_FAILED = "auth failed"
HOST_KEY_UNKNOWN = "host key unknown"
HOST_KEY_CHANGED = "host key changed"
DOCKER_NOT_ANSWERING = "docker not answering"
TIMEOUT = "timed out"
MISCONFIGURED = "misconfigured"
COMMAND_FAILED = "command failed"
NOT_SWARM_READY = "swarm not ready"


class AgentError(EngineFailure, RuntimeError):
    """An agent cannot be used; ``agent`` and ``cause`` for programs, the message for people."""

    def __init__(self, agent: str, cause: str, detail: str):
        self.agent = agent
        self.cause = cause
        self.detail = detail
        super().__init__(f"agent {agent}: {cause}: {detail}")


class Connector:
    """Runs shell commands on one agent. ``run`` returns ``(rc, stdout, stderr)``."""

    agent: str
    description: str  # how it is reached, e.g. "ssh root@10.0.0.11:22" or "local"
    shell = True  # False: no shell (ApiConnector), only API-backed facts work

    def run(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        raise NotImplementedError

    def check(self, cmd: str, timeout: float | None = None, shown: str | None = None) -> str:
        """``run`` and return stdout; a non-zero exit is an AgentError (``shown`` replaces the
        command in the message, for commands that carry secrets)."""
        rc, out, err = self.run(cmd, timeout)
        if rc != 0:
            text = (err.strip() or out.strip() or "no output").splitlines()
            raise AgentError(self.agent, COMMAND_FAILED,
                             f"`{shown or cmd}` exited {rc}: {' / '.join(text[-3:])}")
        return out

    def run_script(self, script: str, timeout: float | None = None) -> tuple[int, str, str]:
        """``run``, with ``script`` reaching the agent's shell on its stdin, never in a
        process's arguments (what ``ps`` and ``/proc/PID/cmdline`` show every user): for a
        script that carries a secret. Over SSH every command already goes on stdin."""
        return self.run(script, timeout)

    def close(self) -> None:
        pass

    def docker_client(self) -> Any:
        """A Docker SDK client for the agent's engine, reached the way this connector reaches
        the agent (so an SSH agent's key file and known_hosts apply); closing it closes what
        it opened, not the connector."""
        raise NotImplementedError

    def open_tcp(self, host: str, port: int) -> Any:
        """A byte stream to ``host:port`` as seen *from the agent* (a socket or an SSH
        ``direct-tcpip`` channel): how ``sessionctl open`` reaches a service bound to the
        agent's loopback."""
        raise AgentError(self.agent, MISCONFIGURED, f"{self.description} has no way to reach "
                         "the agent's own ports (only an SSH or a local agent has)")

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _env_prefix(env: Mapping[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())


class LocalConnector(Connector):
    """This machine, through ``/bin/sh -c``; ``env`` is added to the environment (DOCKER_HOST)."""

    def __init__(self, agent: str, env: Mapping[str, str] | None = None,
                 timeout: float = DEFAULT_COMMAND_TIMEOUT):
        self.agent = agent
        self.env = dict(env or {})
        self.timeout = timeout
        self.description = "local" + (f" ({self.env['DOCKER_HOST']})"
                                      if "DOCKER_HOST" in self.env else "")

    def run(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        limit = timeout or self.timeout
        try:
            # the caller's DOCKER_HOST, DOCKER_CONTEXT, ... never choose the engine: env does
            inherited = {k: v for k, v in os.environ.items() if k not in DOCKER_CLIENT_ENV}
            proc = subprocess.run(["/bin/sh", "-c", cmd], env={**inherited, **self.env},
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise AgentError(self.agent, TIMEOUT,
                             f"`{cmd}` did not finish within {limit:g}s") from None
        return (proc.returncode, proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"))

    def run_script(self, script: str, timeout: float | None = None) -> tuple[int, str, str]:
        limit = timeout or self.timeout
        try:
            inherited = {k: v for k, v in os.environ.items() if k not in DOCKER_CLIENT_ENV}
            proc = subprocess.run(["/bin/sh", "-s"], env={**inherited, **self.env},
                                  input=script.encode(), capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise AgentError(self.agent, TIMEOUT,
                             f"a script did not finish within {limit:g}s") from None
        return (proc.returncode, proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"))

    def docker_client(self) -> Any:
        import docker

        host = self.env.get("DOCKER_HOST", DEFAULT_DOCKER_HOST)
        return docker.DockerClient(base_url=host, timeout=int(self.timeout))

    def open_tcp(self, host: str, port: int) -> Any:
        import socket

        try:
            return socket.create_connection((host, port), timeout=self.timeout)
        except OSError as exc:
            raise AgentError(self.agent, UNREACHABLE, f"{host}:{port}: {exc}") from None


def fingerprint(key: Any) -> str:
    """OpenSSH's form: ``SHA256:<base64 without padding>``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


KNOWN_HOSTS_MAX = 16 * 2**20  # bytes; a known_hosts file larger than this is not one
HostLine = tuple[list[str], Any]  # the host names (patterns, hashes) of a line, and its key


class KnownHostsError(InvalidInput, ValueError):
    """A known_hosts file that cannot be used; the message names the line, never quotes it."""


def _blob_type(blob: bytes) -> str | None:
    """The key type a public key blob names in its first field (SSH wire format)."""
    if len(blob) < 4:
        return None
    (size,) = struct.unpack(">I", blob[:4])
    if size > 64 or len(blob) < 4 + size:
        return None
    return blob[4:4 + size].decode("ascii", errors="replace")


def _read_regular(path: Path, what: str, limit: int) -> bytes:
    """A file's bytes, refusing what is not a regular file (a FIFO would block forever)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise KnownHostsError(f"is {kind}, not {what}")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise KnownHostsError(f"is larger than {limit // 2**20} MiB: not {what}")
    return data


def read_known_hosts(path: Path) -> tuple[list[HostLine], list[HostLine]]:
    """(pinned, revoked) keys of an OpenSSH known_hosts file; :class:`KnownHostsError` (or
    OSError) when it cannot be used, naming the line."""
    import base64
    import binascii

    import paramiko

    pinned: list[HostLine] = []
    revoked: list[HostLine] = []
    data = _read_regular(path, "a known_hosts file", KNOWN_HOSTS_MAX)
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise KnownHostsError(f"line {number} is not UTF-8 text") from None
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = fields.pop(0) if fields[0].startswith("@") else None
        if marker not in (None, "@cert-authority", "@revoked"):
            raise KnownHostsError(f"line {number}: unknown marker {marker!r}")
        if len(fields) < 3:
            raise KnownHostsError(f"line {number}: expected `HOSTS KEY-TYPE BASE64-KEY`")
        names, key_type, text = fields[:3]
        try:
            blob = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise KnownHostsError(f"line {number}: the third field is not a base64 key"
                                  ) from None
        inside = _blob_type(blob)
        if inside is None:
            raise KnownHostsError(f"line {number}: the {key_type} key is truncated")
        if inside != key_type:
            raise KnownHostsError(f"line {number}: says {key_type} but holds a {inside} key")
        if marker == "@cert-authority":
            continue  # a CA vouching for hosts: not supported, such hosts stay unknown
        try:
            key = paramiko.PKey.from_type_string(key_type, blob)
            damaged = key.asbytes() != blob  # paramiko pads a short key with zeros
        except paramiko.UnknownKeyType:
            continue  # well formed, of a type paramiko cannot use (as OpenSSH skips them)
        except Exception:  # noqa: BLE001 - each crypto backend fails in its own words
            damaged = True
        if damaged:
            raise KnownHostsError(f"line {number}: the {key_type} key is damaged")
        (revoked if marker == "@revoked" else pinned).append((names.split(","), key))
    return pinned, revoked


def names_match(names: list[str], host: str) -> bool:
    """Whether a known_hosts line's names (patterns, or hashed ``|1|salt|hash``) include
    ``host``."""
    import hmac

    import paramiko

    return any(fnmatch.fnmatchcase(host, n) or (n.startswith("|1|") and hmac.compare_digest(
        paramiko.HostKeys.hash_host(host, n), n)) for n in names)


class _HostKeyUnknown(EngineFailure):
    def __init__(self, hostname: str, key: Any):
        self.hostname = hostname
        self.key = key


class _HostKeyRevoked(_HostKeyUnknown):
    pass


def _policies(revoked: list[HostLine]):
    """The two policies for a key known_hosts does not pin; a key it marks ``@revoked`` (never
    pinned, see :meth:`SSHConnector._open`) lands here too and is refused by both."""
    import paramiko

    def refuse_revoked(hostname: str, key: Any) -> None:
        if any(k == key and names_match(names, hostname) for names, k in revoked):
            raise _HostKeyRevoked(hostname, key)

    class Reject(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):  # noqa: ARG002
            refuse_revoked(hostname, key)
            raise _HostKeyUnknown(hostname, key)

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """Trust on first use: append the new host's key to the known_hosts file."""

        def __init__(self, path: Path):
            self.path = path

        def missing_host_key(self, client, hostname, key):
            refuse_revoked(hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as out:
                out.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")

    return Reject, AcceptNew


class SSHConnector(Connector):
    """One agent over SSH (paramiko). The connection opens at the first ``run`` and is reused.

    ``key_file``: use that key only (like ``IdentitiesOnly``); else the ssh-agent and the
    default keys (``~/.ssh/id_*``). ``known_hosts``: the file that pins the agent's host key,
    default ``~/.ssh/known_hosts``. ``env`` is exported before each command (DOCKER_HOST).
    Commands are POSIX sh, run by ``/bin/sh`` whatever the user's login shell is.
    """

    def __init__(self, agent: str, host: str, port: int = 22, user: str | None = None,
                 key_file: str | None = None, known_hosts: str | None = None,
                 env: Mapping[str, str] | None = None, host_keys: str = "strict",
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 timeout: float = DEFAULT_COMMAND_TIMEOUT):
        if host_keys not in HOST_KEY_POLICIES:
            raise ValueError(f"host_keys must be one of {HOST_KEY_POLICIES}, not {host_keys!r}")
        self.agent = agent
        self.host = host
        self.port = port
        self.user = user or getpass.getuser()
        self.key_file = key_file
        self.known_hosts = known_hosts
        self.env = dict(env or {})
        self.host_keys = host_keys
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.description = f"ssh {self.user}@{host}:{port}"
        self._client: Any = None
        self._lock = threading.Lock()
        self._relays: list[DialStdioRelay] = []
        self._more: list[Any] = []  # more connections, for channels beyond MaxSessions
        self._grow = threading.Lock()

    # --- connection ----------------------------------------------------------------------------

    def _known_hosts_path(self) -> Path:
        return Path(self.known_hosts or "~/.ssh/known_hosts").expanduser()

    def _fail(self, cause: str, detail: str) -> AgentError:
        return AgentError(self.agent, cause, f"{self.description}: {detail}")

    def connect(self) -> None:
        with self._lock:
            if self._client is not None and self._client.get_transport() is not None \
                    and self._client.get_transport().is_active():
                return
            self._client = self._open()

    def _open(self):
        import paramiko

        client = paramiko.SSHClient()
        known = self._known_hosts_path()
        revoked: list[HostLine] = []
        if os.path.lexists(known):
            try:
                pinned, revoked = read_known_hosts(known)
            except (OSError, KnownHostsError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise self._fail(MISCONFIGURED, f"known_hosts {known}: {why}") from None
            for names, key in pinned:
                if any(k == key for _, k in revoked):
                    continue  # left to the policy, which refuses it
                for name in names:
                    client.get_host_keys().add(name, key.get_name(), key)
        elif self.known_hosts and self.host_keys == "strict":
            raise self._fail(MISCONFIGURED, f"known_hosts file {known} does not exist")
        Reject, AcceptNew = _policies(revoked)
        if self.host_keys == "accept-new":
            client.set_missing_host_key_policy(AcceptNew(known))
        else:
            client.set_missing_host_key_policy(Reject())
        kwargs: dict[str, Any] = {}
        if self.key_file:
            key = Path(self.key_file).expanduser()
            if not os.path.lexists(key):
                raise self._fail(MISCONFIGURED, f"key file {key} does not exist")
            kwargs.update(pkey=self._load_key(key), allow_agent=False, look_for_keys=False)
        try:
            client.connect(
                self.host, port=self.port, username=self.user,
                timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
                **kwargs,
            )
        except _HostKeyRevoked as exc:
            client.close()
            raise self._fail(HOST_KEY_CHANGED, f"{exc.hostname} offered {exc.key.get_name()} key "
                             f"{fingerprint(exc.key)}, which {known} marks @revoked") from None
        except _HostKeyUnknown as exc:
            client.close()
            raise self._fail(
                HOST_KEY_UNKNOWN,
                f"{exc.hostname} offered {exc.key.get_name()} key {fingerprint(exc.key)}, which "
                f"is not in {known}; check it and add it (e.g. `ssh-keyscan -p {self.port} "
                f"-- {self.host} >> {known}`), or run `sessionctl pool check --accept-new`",
            ) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise self._fail(
                HOST_KEY_CHANGED,
                f"the host key changed: {known} pins {fingerprint(exc.expected_key)}, the server "
                f"offered {exc.key.get_name()} {fingerprint(exc.key)} (a reinstalled agent, or "
                "someone in between); remove the old entry only if you know why it changed",
            ) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise self._fail(AUTH_FAILED, f"key file {self.key_file} is encrypted; load it "
                             "into ssh-agent and drop key_file from the pool") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            how = f"key {self.key_file}" if self.key_file else "ssh-agent and default keys"
            raise self._fail(AUTH_FAILED, f"{self.user} was refused with {how} "
                             f"({exc or type(exc).__name__})") from None
        except TimeoutError:
            client.close()
            raise self._fail(UNREACHABLE, f"no answer within {self.connect_timeout:g}s") from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            client.close()
            reasons = "; ".join(f"{e.strerror or e}" for e in exc.errors.values()) or str(exc)
            raise self._fail(UNREACHABLE, reasons) from None
        except OSError as exc:
            client.close()
            raise self._fail(UNREACHABLE, exc.strerror or str(exc)) from None
        except paramiko.SSHException as exc:
            client.close()
            text = str(exc)
            cause = TIMEOUT if "timeout" in text.lower() else UNREACHABLE
            raise self._fail(cause, f"SSH handshake failed: {text}") from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        return client

    def _load_key(self, path: Path) -> Any:
        """The private key at ``path``, read before connecting so a damaged file is named as
        such, not reported as a refused login or a failed handshake."""
        import paramiko

        try:
            _read_regular(path, "a private key file", 2**20)
            return paramiko.PKey.from_path(path)
        except paramiko.PasswordRequiredException:
            raise self._fail(AUTH_FAILED, f"key file {path} is encrypted; load it into "
                             "ssh-agent and drop key_file from the pool") from None
        except OSError as exc:
            raise self._fail(MISCONFIGURED, f"key file {path}: {exc.strerror or exc}") from None
        except KnownHostsError as exc:
            raise self._fail(MISCONFIGURED, f"key file {path} {exc}") from None
        except Exception:  # noqa: BLE001 - each key format fails in its own words
            raise self._fail(MISCONFIGURED, f"key file {path} is not a private key paramiko "
                             "can read (OpenSSH, PEM: ed25519, ecdsa, rsa)") from None

    def close(self) -> None:
        with self._lock:
            for relay in self._relays:
                relay.close()
            self._relays.clear()
            for client in self._more:
                client.close()
            self._more.clear()
            if self._client is not None:
                self._client.close()
                self._client = None

    def docker_client(self) -> Any:
        """The Docker SDK over this SSH connection: a private unix socket here whose every
        connection is ``docker system dial-stdio`` on the agent (with ``env``), as ``docker -H
        ssh://`` does, but with this connector's key and known_hosts."""
        import docker

        self.connect()
        relay = DialStdioRelay(self, f"{_env_prefix(self.env)}exec docker system dial-stdio")
        with self._lock:
            self._relays.append(relay)
        client = docker.DockerClient(base_url=f"unix://{relay.path}", timeout=int(self.timeout))
        retry_a_dropped_connection(client)  # an idle relayed connection the agent dropped
        one_pool_per_engine(client)  # one channel per connection in use, not per URL
        return client

    def open_channel(self, command: str) -> Any:
        """A new session channel running ``command`` under /bin/sh on the agent.

        sshd allows ``MaxSessions`` (10 by default) channels per connection, and a Docker
        client in several threads holds one per pooled connection or stream: when the agent
        refuses another, it is opened on one more connection to the agent (kept until
        ``close``), one new connection at a time (sshd's ``MaxStartups`` drops a burst)."""
        self.connect()
        chan = self._session_on(lambda: [self._client, *self._more])
        if chan is None:
            with self._grow:
                chan = self._session_on(lambda: list(reversed(self._more)))
                if chan is None:
                    client = self._open_again()
                    with self._lock:
                        self._more.append(client)
                    chan = client.get_transport().open_session(timeout=self.connect_timeout)
        chan.exec_command(f"/bin/sh -c {shlex.quote(command)}")
        return chan

    def open_tcp(self, host: str, port: int) -> Any:
        """A ``direct-tcpip`` channel: the agent's sshd connects to ``host:port`` (as ``ssh
        -L`` does), with this connector's user, key and known_hosts."""
        import paramiko

        self.connect()
        try:
            return self._client.get_transport().open_channel(
                "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._fail(UNREACHABLE, f"the agent's sshd did not connect to {host}:{port} "
                             f"({exc}); its AllowTcpForwarding must allow it") from None

    def _open_again(self, attempts: int = 3) -> Any:
        """One more connection to the agent. sshd drops connections that are still
        authenticating beyond ``MaxStartups`` (10 by default) at random, and many channels
        at once (a Docker client in threads, several ``up``s) open connections in a burst: a
        dropped handshake is tried again after a short pause."""
        for attempt in range(1, attempts):
            try:
                return self._open()
            except AgentError as exc:
                if exc.cause not in (UNREACHABLE, TIMEOUT):
                    raise
                time.sleep(0.3 * attempt)
        return self._open()

    def _session_on(self, clients: Any) -> Any:
        """A session channel on the first of ``clients()`` that has room for one, or None."""
        import paramiko

        with self._lock:
            candidates = clients()
        for client in candidates:
            transport = client.get_transport() if client is not None else None
            if transport is None or not transport.is_active():
                continue
            try:
                return transport.open_session(timeout=self.connect_timeout)
            # ChannelException: this connection has its MaxSessions; a bare SSHException when
            # another thread took the transport's saved reason first (paramiko open_channel)
            except paramiko.SSHException:
                continue
        return None

    def run_script(self, script: str, timeout: float | None = None) -> tuple[int, str, str]:
        return _script_timeout(self, script, timeout)

    def run(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        import paramiko

        self.connect()
        limit = timeout or self.timeout
        try:
            chan = self._client.get_transport().open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise self._fail(UNREACHABLE, f"the connection broke: {exc}") from None
        try:
            chan.settimeout(1.0)
            # The script goes to /bin/sh on stdin, not through the user's login shell (which may
            # be csh or fish); the command itself reads /dev/null, never the rest of the script.
            chan.exec_command("/bin/sh -s")
            chan.sendall(f"{_env_prefix(self.env)}{{\n{cmd}\n}} </dev/null\n".encode())
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + limit
            while True:
                got = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
                if time.monotonic() > deadline:
                    raise AgentError(self.agent, TIMEOUT,
                                     f"`{cmd}` did not finish within {limit:g}s")
                if not got:
                    # wake on stdout, end of file or close (the channel's pipe); stderr alone
                    # does not wake it, so look again at least every 0.2 s
                    wait_readable(chan, min(0.2, max(0.0, deadline - time.monotonic())))
            rc = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise self._fail(UNREACHABLE, f"the connection broke: {exc}") from None
        finally:
            chan.close()
        return rc, out.decode(errors="replace"), err.decode(errors="replace")


def _script_timeout(connector: Connector, script: str, timeout: float | None
                    ) -> tuple[int, str, str]:
    try:
        return connector.run(script, timeout)
    except AgentError as exc:  # its message quotes the command: here a secret
        if exc.cause == TIMEOUT:
            raise AgentError(exc.agent, TIMEOUT, "a script did not finish in time") from None
        raise


class DialStdioRelay:
    """A unix socket in a private directory of this machine; each connection to it is piped to
    a new SSH channel running ``command`` on the agent (a byte stream to its engine)."""

    def __init__(self, connector: SSHConnector, command: str):
        import socket
        import tempfile

        self.connector = connector
        self.command = command
        self.dir = Path(tempfile.mkdtemp(prefix="cluster-sessions-docker-"))  # mode 0700
        self.path = self.dir / "docker.sock"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.path))
        self.server.listen(16)
        self._closed = False
        threading.Thread(target=self._serve, daemon=True, name="docker-relay").start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, conn: Any) -> None:
        try:
            chan = self.connector.open_channel(self.command)
        except Exception:  # the agent went away: the client sees the connection close
            conn.close()
            return
        pipe(conn, chan)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.server.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
            self.dir.rmdir()

    # --- commands ------------------------------------------------------------------------------


def _shut_write(end: Any) -> None:
    """Say end of file to ``end`` (a paramiko channel or a socket), keep reading from it."""
    import socket

    with contextlib.suppress(OSError, EOFError):
        if hasattr(end, "shutdown_write"):
            end.shutdown_write()
        else:
            end.shutdown(socket.SHUT_WR)


def pipe(conn: Any, chan: Any) -> None:
    """Copy bytes both ways between a local connection and a channel to the agent (sockets or
    paramiko channels) until the agent's side ends; both are closed after. The local side's
    end of file is passed on and the answer still read. A selector, not select(): a process
    with many connections has descriptors past 1024, which select() cannot watch
    ("filedescriptor out of range")."""
    watch = selectors.DefaultSelector()
    try:
        watch.register(conn, selectors.EVENT_READ)
        watch.register(chan, selectors.EVENT_READ)
        while True:
            readable = {key.fileobj for key, _ in watch.select(5)}
            if conn in readable:
                data = conn.recv(65536)
                if data:
                    chan.sendall(data)
                else:  # the client is done sending: say so, keep reading the answer
                    _shut_write(chan)
                    watch.unregister(conn)
            if chan in readable:
                data = chan.recv(65536)  # b"" at the agent's end of file
                if not data:
                    _shut_write(conn)
                    return
                conn.sendall(data)
    except Exception:  # noqa: BLE001 - either end went away: this connection is over
        pass
    finally:
        watch.close()
        for end in (chan, conn):
            with contextlib.suppress(Exception):
                end.close()


class ApiConnector(Connector):
    """A Docker Engine reached only through its API (``tcp://`` with TLS); no shell, no host
    facts. The TLS material is the pool's (``tls.cert_path``), never the caller's
    ``DOCKER_CERT_PATH``."""

    shell = False

    def __init__(self, agent: str, docker_host: str, cert_path: str | None = None,
                 timeout: float = DEFAULT_COMMAND_TIMEOUT):
        self.agent = agent
        self.docker_host = docker_host
        self.cert_path = cert_path
        self.timeout = timeout
        self.description = f"docker API {docker_host}"
        self._client: Any = None

    def _new_client(self):
        import docker

        tls: Any = False
        if self.cert_path:
            d = Path(self.cert_path).expanduser()
            tls = docker.tls.TLSConfig(client_cert=(str(d / "cert.pem"), str(d / "key.pem")),
                                       ca_cert=str(d / "ca.pem"), verify=True)
        return docker.DockerClient(base_url=self.docker_host, tls=tls, timeout=int(self.timeout))

    def client(self):
        if self._client is None:
            import docker

            try:
                self._client = self._new_client()
                self._client.ping()
            except docker.errors.TLSParameterError as exc:
                raise AgentError(self.agent, MISCONFIGURED,
                                 f"{self.description}: {exc}") from None
            except docker.errors.DockerException as exc:
                raise AgentError(self.agent, DOCKER_NOT_ANSWERING,
                                 f"{self.description}: {short_error(exc)}") from None
        return self._client

    def docker_client(self) -> Any:
        return self._new_client()

    def run(self, cmd: str, timeout: float | None = None) -> tuple[int, str, str]:
        raise AgentError(self.agent, MISCONFIGURED,
                         f"{self.description} has no shell to run `{cmd}`; give the agent an "
                         "`ssh` block to probe it fully")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def wait_readable(obj: Any, timeout: float) -> None:
    """Until ``obj`` (a socket, a paramiko channel) is readable or ``timeout`` passes; with a
    selector, which watches descriptors past 1024 as well."""
    with selectors.DefaultSelector() as watch:
        watch.register(obj, selectors.EVENT_READ)
        watch.select(timeout)


def short_error(exc: BaseException) -> str:
    """The useful end of a requests/urllib3 error chain (``[Errno 111] Connection refused``,
    ``No such file or directory`` from a ``FileNotFoundError(2, '...')`` repr)."""
    text = str(exc)
    found = re.findall(r"\[Errno -?\d+\] [^'\")\]]+", text)
    if found:
        return found[-1].strip()
    found = re.findall(r"\w+Error\(-?\d+, '([^']+)'\)", text)
    return found[-1] if found else text


def docker_env(agent: Agent) -> dict[str, str]:
    """DOCKER_HOST (and TLS settings) for commands run where the agent's engine is
    (:attr:`.reach.Reach.docker_env`)."""
    return reach_of(agent).docker_env


def connector_for(agent: Agent, *, host_keys: str = "strict",
                  connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                  timeout: float = DEFAULT_COMMAND_TIMEOUT) -> Connector:
    """The connector for an agent of a pool (nothing is opened yet), as :func:`.reach.reach_of`
    decides: SSH for a remote agent (its ``ssh`` block, or an ``ssh://`` docker_host with the
    default keys and ``~/.ssh/known_hosts``), this machine for a local socket, the Docker API
    with the pool's TLS material for ``tcp://``."""
    reach = reach_of(agent)
    env = reach.docker_env
    if reach.kind == SSH:
        if not reach.host:
            raise AgentError(agent.name, MISCONFIGURED, f"docker_host {agent.docker_host} "
                             "names no host")
        return SSHConnector(agent.name, reach.host, reach.port or 22, reach.user,
                            reach.key_file, reach.known_hosts, env=env, host_keys=host_keys,
                            connect_timeout=connect_timeout, timeout=timeout)
    if reach.kind == LOCAL:
        return LocalConnector(agent.name, env=env, timeout=timeout)
    return ApiConnector(agent.name, reach.provider_host, cert_path=reach.cert_path,
                        timeout=timeout)


def agent_props(agent: Agent) -> dict[str, Any]:
    """A plain, picklable description of how to reach an agent (for dynamic providers)."""
    return agent.model_dump(mode="json", exclude={"capacity"})


def agent_from_props(props: Mapping[str, Any]) -> Agent:
    """The agent :func:`agent_props` described (dynamic providers' inputs)."""
    from ..core.spec import Agent

    data = dict(props)
    data.setdefault("capacity", {"cpu": 1, "mem": "1g"})  # a placeholder: unused here
    return Agent.model_validate(data, strict=False)


def connector_from_props(props: Mapping[str, Any], **kwargs: Any) -> Connector:
    """:func:`connector_for` from :func:`agent_props` output (dynamic providers' inputs)."""
    return connector_for(agent_from_props(props), **kwargs)
