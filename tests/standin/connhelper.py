"""How the docker provider reaches an engine, from its own arguments only (test support).

Mirrors kreuzwerker/terraform-provider-docker v4.5.0 (5074970c)
``internal/provider/config.go`` ``MakeClient`` (l. 116-210): ``cert_material``/``key_material``
first (l. 129-152), then ``cert_path`` with ``ca.pem``/``cert.pem``/``key.pem`` (l. 153-165),
then ``ssh://`` through docker/cli's connection helper (l. 166-181), else the host as it is
(l. 182-188); then a ``Ping`` that fails the resource when the engine does not answer
(l. 193-199). A provider with no ``host`` gets ``DOCKER_HOST`` or
``unix:///var/run/docker.sock`` (``provider.go`` l. 45-56).

The ``ssh://`` helper is docker/cli v28.5.2 (the version the provider's ``go.mod`` l. 14
pins): ``cli/connhelper/connhelper.go`` ``getConnectionHelper`` (l. 40-72,
``addSSHTimeout`` l. 86-91, ``disablePseudoTerminalAllocation`` l. 95-102) and
``cli/connhelper/ssh/ssh.go`` (``newSpec`` l. 36-73, ``args`` l. 110-139, ``Command``
l. 149-165, quoting with ``internal/syntax/quote.go`` ``Quote``). Every connection the docker
SDK opens runs that exact ``ssh`` argv (the real OpenSSH client, as ``commandconn.New`` does)
and relays bytes both ways.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cluster_sessions.core.names import DEFAULT_DOCKER_HOST as DEFAULT_HOST

SSH_TIMEOUT_FLAG = "-o ConnectTimeout=30"  # one argv element, as connhelper.go l. 88 adds it


class ProviderConfigError(ValueError):
    """The provider refuses its own configuration (before any connection)."""


class EngineUnreachable(ConnectionError):
    """The provider's Ping failed: every resource of this provider fails (config.go l. 196-199)."""


# --- docker/cli internal/syntax Quote, LangPOSIX ------------------------------------------------

_SHELL_CHARS = set(";\"'()$|&><` \t\r\n\\#{~*?[=")
_KEYWORDS = {"!", "[[", "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for",
             "function", "if", "in", "select", "then", "time", "until", "while", "{", "}"}


def quote(s: str) -> str:
    """A word the remote POSIX shell reads back as ``s`` (quote.go ``Quote``, LangPOSIX)."""
    if s == "":
        return "''"
    for offset, ch in enumerate(s):
        if ch == "\x00":
            raise ProviderConfigError(f"cannot quote character at byte {offset}: "
                                      "shell strings cannot contain null bytes")
        if not ch.isprintable():  # Go's unicode.IsPrint: of the spaces only " " is printable
            raise ProviderConfigError(f"cannot quote character at byte {offset}: "
                                      "POSIX shell lacks escape sequences")
    if not (_SHELL_CHARS & set(s)) and s not in _KEYWORDS:
        return s
    if "'" not in s:
        return f"'{s}'"
    return '"' + "".join("\\" + c if c in '"\\`$' else c for c in s) + '"'


# --- ssh.go Spec and connhelper.go getConnectionHelper ------------------------------------------

@dataclass(frozen=True)
class SshSpec:
    user: str
    host: str
    port: str
    path: str


def parse_ssh_url(url: str) -> SshSpec:
    """ssh.go ``newSpec`` (l. 36-73), wrapped as connhelper.go l. 44-46 wraps its error."""
    def refuse(why: str) -> ProviderConfigError:
        return ProviderConfigError(f"ssh host connection is not valid: invalid SSH URL: {why}")

    parts = urlsplit(url)
    if parts.scheme != "ssh":
        raise refuse(f"incorrect scheme: {parts.scheme}" if parts.scheme else "no scheme provided")
    if parts.password is not None:
        raise refuse("plain-text password is not supported")
    host = parts.hostname or ""
    if not host:
        raise refuse("hostname is empty")
    try:
        port = "" if parts.port is None else str(parts.port)
    except ValueError as exc:
        raise ProviderConfigError(f"invalid port in {url!r}: {exc}") from None
    if parts.query:
        raise refuse(f"query parameters are not allowed: {parts.query!r}")
    if parts.fragment:
        raise refuse(f"fragments are not allowed: {parts.fragment!r}")
    return SshSpec(user=parts.username or "", host=host, port=port, path=parts.path)


def ssh_argv(url: str, ssh_opts: list[str] | None = None) -> list[str]:
    """The exact command connhelper runs for each connection to ``url``."""
    spec = parse_ssh_url(url)
    flags = list(ssh_opts or [])
    if "ConnectTimeout" not in "".join(flags):
        flags.append(SSH_TIMEOUT_FLAG)
    if "-T" not in flags:
        flags.append("-T")
    remote = ["docker", "system", "dial-stdio"]
    if spec.path.strip("/"):
        remote = ["docker", f"--host=unix://{spec.path}", "system", "dial-stdio"]
    args: list[str] = []
    if spec.user:
        args += ["-l", quote(spec.user)]
    if spec.port:
        args += ["-p", quote(spec.port)]
    args += flags
    args += ["--", quote(spec.host), " ".join(quote(a) for a in remote)]
    return ["ssh", *args]


class DialStdioRelay:
    """A private unix socket; each connection to it runs ``argv`` and relays bytes both ways
    (what ``commandconn.New(ctx, "ssh", sshArgs...)`` is to the provider's HTTP client)."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.dir = tempfile.mkdtemp(prefix="dial-stdio-")
        self.path = os.path.join(self.dir, "docker.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(16)
        self.procs: list[subprocess.Popen] = []
        self.errors: list[str] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.procs.append(proc)

        def upstream() -> None:
            with contextlib.suppress(OSError):
                while data := conn.recv(65536):
                    proc.stdin.write(data)
                    proc.stdin.flush()
            with contextlib.suppress(OSError):
                proc.stdin.close()

        threading.Thread(target=upstream, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := proc.stdout.read1(65536):
                conn.sendall(data)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
        conn.close()
        err = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0 and err:
            self.errors.append(err)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.server.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- config.go MakeClient ---------------------------------------------------------------------

def config_of(inputs: dict, environ: dict | None = None) -> dict:
    """The provider configuration from a ``docker.Provider``'s registration inputs (camelCase;
    list-valued provider config arrives JSON-encoded, as the engine sends it). A key the
    program leaves unset takes the schema's DefaultFunc from the provider process's
    environment (provider.go l. 45-102), as the bridge applies it at Configure: ``host`` from
    DOCKER_HOST, ``ssh_opts`` from DOCKER_SSH_OPTS (split on whitespace), ``cert_path`` and the
    ``*_material`` from DOCKER_CERT_PATH and DOCKER_*_MATERIAL; a DOCKER_CONTEXT overrides
    ``host`` (l. 204-217), which this emulation refuses rather than read ~/.docker/contexts."""
    env = os.environ if environ is None else environ
    if inputs.get("context") or env.get("DOCKER_CONTEXT"):
        raise ProviderConfigError("context (DOCKER_CONTEXT) is set: the provider would use the "
                                  "context's host instead of the one it was given")
    opts = inputs.get("sshOpts")
    if isinstance(opts, str):
        opts = json.loads(opts)
    if opts is None:
        opts = env.get("DOCKER_SSH_OPTS", "").split()
    return {
        "host": inputs.get("host") or env.get("DOCKER_HOST") or DEFAULT_HOST,
        "ssh_opts": list(opts),
        "cert_path": inputs.get("certPath") or env.get("DOCKER_CERT_PATH") or "",
        "cert_material": inputs.get("certMaterial") or env.get("DOCKER_CERT_MATERIAL") or "",
        "key_material": inputs.get("keyMaterial") or env.get("DOCKER_KEY_MATERIAL") or "",
    }


@dataclass
class Connection:
    client: object
    relay: DialStdioRelay | None = None

    def close(self) -> None:
        self.client.close()
        if self.relay is not None:
            self.relay.close()


def connect(config: dict, timeout: int = 120) -> Connection:
    """A docker SDK client reaching the engine exactly as the provider would, pinged."""
    import docker
    import docker.tls

    host = config["host"]
    if config["cert_material"] or config["key_material"]:
        raise ProviderConfigError("cert_material/key_material: not emulated (the program does "
                                  "not pass them)")
    if host.startswith("tcp://") and not config["cert_path"]:
        # Our policy, stricter than the provider (which would talk plain TCP, l. 182-188):
        # an engine's TCP port is root on that machine, so it needs TLS.
        raise ProviderConfigError(f"{host}: a tcp:// docker host needs cert_path (TLS)")
    relay = None
    if not config["cert_path"] and host.startswith("ssh://"):
        relay = DialStdioRelay(ssh_argv(host, config["ssh_opts"]))
    try:
        # The SDK asks the engine for its API version when it is made: that is the ping.
        if config["cert_path"]:  # config.go l. 153-165: wins over ssh:// too
            path = Path(config["cert_path"])
            tls = docker.tls.TLSConfig(client_cert=(str(path / "cert.pem"),
                                                    str(path / "key.pem")),
                                       ca_cert=str(path / "ca.pem"), verify=True)
            client = docker.DockerClient(base_url=host, tls=tls, timeout=timeout)
        else:
            client = docker.DockerClient(base_url=relay.url if relay else host, timeout=timeout)
        client.ping()
    except Exception as exc:
        detail = "; ".join(relay.errors) if relay and relay.errors else str(exc)
        if relay is not None:
            relay.close()
        raise EngineUnreachable(
            f"Error pinging Docker server, please make sure that {host} is reachable and has a "
            f"'_ping' endpoint. Error: {detail}") from None
    return Connection(client, relay)
