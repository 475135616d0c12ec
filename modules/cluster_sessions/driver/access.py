"""Getting into a session (issue 22): ``sessionctl ssh``, ``sessionctl ssh-config`` and
``sessionctl key``.

The way in is decided once, by :func:`ssh_config`, from the stack's outputs and the pool:

- to the agent over the pool's SSH, as the pool reaches it (:func:`agents.reach.reach_of`: the
  same user, key and known_hosts); skipped when the agent is this machine (a local socket);
- then to main1's sshd, published on the agent's loopback only (``127.0.0.1``, a port the
  engine picked: the stack's ``main1`` output says which);
- a ``subN`` through main1 (``ProxyJump``), on the session network.

Host keys are checked strictly against the session CA: a ``known_hosts`` holding the one
``@cert-authority`` line every container has, with ``HostKeyAlias`` the container's host name
(the principal of its host certificate). The user logs in with *their own* key: its public half
is signed here, with the CA key read from the stack (a secret output), into a user
certificate for the session user valid for an hour. No private key leaves the stack, and
nothing is written into ``~/.ssh`` (``key --out PATH`` writes only where it is told).

``ssh`` writes its files into a private temporary directory and runs the system ``ssh``
(a login replaces this process with a shell that runs ssh, then removes the directory);
``ssh-config`` writes them under ``~/.cache/cluster-sessions/<session>/`` (0700/0600) and prints
an OpenSSH config block for scp, sftp, rsync and editors.
"""

from __future__ import annotations

import argparse
import getpass
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..agents.reach import LOCAL, SSH, Reach, reach_of
from ..core import keys
from ..core.plan import ClusterPlan
from ..core.render import known_hosts
from ..core.spec import SSH_PORT, Pool
from . import stacks
from .errors import CommandError, Exit
from .session_args import EPILOG, add_session_args, needs_pulumi, selected, verb_parser
from .stack_settings import command_error_text, stack_name_for

#: The identities tried when ``--identity`` is not given, in ssh's own order.
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519.pub", "~/.ssh/id_ecdsa.pub", "~/.ssh/id_rsa.pub")
CONFIG = "config"
KNOWN_HOSTS = "known_hosts"
CERTIFICATE = "id-cert.pub"


@dataclass(frozen=True)
class Access:
    """What a way into one session is made of (from its stack, its plan and its pool)."""

    session: str
    hosts: tuple[str, ...]
    user: str
    reach: Reach  # main1's agent, as the pool reaches it
    main1_ip: str  # where main1's sshd is published on its agent (its loopback)
    main1_port: int
    ca: keys.KeyPair  # the session CA (its private half from the stack: a secret)


@dataclass(frozen=True)
class Identity:
    public: Path  # the public key that is certified
    file: Path  # what ssh is given as IdentityFile: the private key, or the public one (agent)


def alias(session: str, host: str) -> str:
    return f"{session}-{host}"


def agent_alias(session: str) -> str:
    return f"{session}-agent"


def _quote(value: str) -> str:
    """A value for an ssh_config line: double-quoted when it has a space (ssh's own rule)."""
    if any(c in value for c in "\"\n\r"):
        raise CommandError(f"cannot be written into an ssh config: {value!r}", Exit.INVALID)
    return f'"{value}"' if any(c.isspace() for c in value) else value


def ssh_config(access: Access, identity: Identity, directory: Path) -> str:
    """The OpenSSH config of the way into ``access``'s session, the certificate and known_hosts
    in ``directory``: ``Host <session>-main1``, ``<session>-sub1``, ... (and, for a remote
    agent, ``<session>-agent``, main1's first hop)."""
    s = access.session
    lines = [f"# cluster session {s} -- written by sessionctl ssh-config; its certificate is "
             "valid for an hour (run ssh-config again)"]
    jump = None
    if access.reach.kind == SSH:
        r = access.reach
        jump = agent_alias(s)
        lines += [f"Host {jump}", f"    HostName {_quote(str(r.host))}"]
        if r.port:
            lines.append(f"    Port {r.port}")
        if r.user:
            lines.append(f"    User {_quote(r.user)}")
        if r.key_file:
            lines += [f"    IdentityFile {_quote(r.key_file)}", "    IdentitiesOnly yes"]
        if r.known_hosts:
            lines.append(f"    UserKnownHostsFile {_quote(r.known_hosts)}")
        lines.append("    StrictHostKeyChecking yes")
    lines += [f"Host {alias(s, 'main1')}", f"    HostName {access.main1_ip}",
              f"    Port {access.main1_port}", "    HostKeyAlias main1"]
    if jump:
        lines.append(f"    ProxyJump {jump}")
    for host in access.hosts[1:]:
        lines += [f"Host {alias(s, host)}", f"    HostName {host}", f"    Port {SSH_PORT}",
                  f"    HostKeyAlias {host}", f"    ProxyJump {alias(s, 'main1')}"]
    lines += [
        "Host " + " ".join(alias(s, h) for h in access.hosts),
        f"    User {_quote(access.user)}",
        f"    IdentityFile {_quote(str(identity.file))}",
        f"    CertificateFile {_quote(str(directory / CERTIFICATE))}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {_quote(str(directory / KNOWN_HOSTS))}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    CheckHostIP no",
        "    UpdateHostKeys no",
    ]
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, 0600 from the first byte, replacing (never following) a link."""
    if path.is_symlink() or path.exists():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def write_files(access: Access, identity: Identity, directory: Path,
                seconds: int = keys.USER_CERT_SECONDS) -> Path:
    """The certificate, known_hosts and config into ``directory`` (0700); the config's path."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.is_symlink() or not directory.is_dir():
        raise CommandError(f"{directory}: not a directory", Exit.INVALID)
    directory.chmod(0o700)
    public = identity.public.read_text()
    try:
        cert = keys.user_certificate(access.ca, public, access.user, key_id=_key_id(),
                                     seconds=seconds)
    except (ValueError, TypeError) as exc:
        raise CommandError(f"{identity.public}: not an OpenSSH public key ({exc})",
                           Exit.INVALID) from None
    write_private(directory / CERTIFICATE, cert + "\n")
    write_private(directory / KNOWN_HOSTS, known_hosts(access.session, access.ca.public_openssh))
    config = directory / CONFIG
    write_private(config, ssh_config(access, identity, directory))
    return config


def _key_id() -> str:
    try:
        who = getpass.getuser()
    except (KeyError, OSError):
        who = str(os.getuid())
    return f"sessionctl:{who}@{socket.gethostname()}"


def find_identity(given: str | None) -> Identity:
    """The user's key: ``--identity`` (a public or a private key file), else the first of
    :data:`DEFAULT_IDENTITIES` that exists."""
    candidates = [given] if given else list(DEFAULT_IDENTITIES)
    for name in candidates:
        path = Path(name).expanduser()
        public = path if path.name.endswith(".pub") else path.with_name(path.name + ".pub")
        private = public.with_name(public.name[:-len(".pub")])
        if public.is_file():
            return Identity(public, private if private.is_file() else public)
        if given:
            raise CommandError(f"--identity {given}: no public key at {public} (make one with "
                               "ssh-keygen -t ed25519)", Exit.INVALID)
    raise CommandError("no key of yours found (" + ", ".join(DEFAULT_IDENTITIES) + "): make "
                       "one with ssh-keygen -t ed25519, or name one with --identity",
                       Exit.INVALID)


# --- from the definition and the stack -------------------------------------------------------

def one_plan(args: argparse.Namespace) -> tuple[ClusterPlan, Pool]:
    sel = selected(args)
    if sel.pending is not None:
        raise CommandError(f"session {sel.pending.name} is pending: {sel.pending.reason}",
                           Exit.PENDING)
    verb = getattr(args, "verb", "ssh")
    return sel.one(f"sessionctl {verb} reaches one session"), sel.loaded.pool


def stack_outputs(stack: str) -> Mapping[str, Any]:
    """The stack's outputs, secrets shown (the Automation API's ``stack_outputs``)."""
    project = stacks.find_project([Path.cwd(), Path(__file__).resolve().parent])
    if project is None:
        raise CommandError(f"no Pulumi project {stacks.PROJECT_NAME!r} (Pulumi.yaml) found",
                           Exit.MISSING)
    stacks.drop_docker_client_env(os.environ)
    settings = stacks.engine_settings(os.environ, project)
    pulumi = stacks.find_pulumi(os.environ)
    if pulumi is None:
        raise CommandError(stacks.how_to_install(), Exit.MISSING)
    from pulumi import automation as auto

    workspace = stacks.open_workspace(project, settings, pulumi)
    try:
        outputs = workspace.stack_outputs(stack)
    except auto.errors.CommandError as exc:  # StackNotFoundError among them
        raise CommandError(f"cannot read the outputs of stack {stack}: "
                           f"{command_error_text(exc)}", Exit.ENGINE) from None
    return {k: getattr(v, "value", v) for k, v in outputs.items()}


def access_of(plan: ClusterPlan, pool: Pool, outputs: Mapping[str, Any], up: str) -> Access:
    """The way into ``plan``'s session, from its stack's outputs (``up``: how to make them)."""
    if not outputs.get("session"):
        raise CommandError(f"session {plan.name} is not up (its stack holds nothing): {up}",
                           Exit.MISSING)
    ca_private, ca_public = outputs.get("ssh_ca_private_key"), outputs.get("ssh_ca_public_key")
    main1 = outputs.get("main1") or {}
    ssh_port = next((p for p in main1.get("ports") or []
                     if p.get("container") == SSH_PORT and p.get("host")), None)
    if not ca_private or not ca_public or ssh_port is None:
        raise CommandError(f"the stack of session {plan.name} was made before sessionctl ssh "
                           f"(no session CA, or main1 publishes no sshd): {up}",
                           Exit.MISSING)
    agent = pool.agent(str(main1.get("agent") or plan.containers[0].agent))
    reach = reach_of(agent)
    ip = str(ssh_port.get("host_ip") or "127.0.0.1")
    if ip in ("0.0.0.0", "::"):
        ip = "127.0.0.1"
    if reach.kind not in (SSH, LOCAL):
        raise CommandError(f"agent {agent.name} is reached over tcp:// without an ssh block: "
                           f"main1's sshd on its loopback ({ip}:{ssh_port['host']}) is out of "
                           "reach; give the agent an ssh block in the pool", Exit.MISSING)
    return Access(plan.name, tuple(outputs.get("hosts") or plan.hosts),
                  plan.session.user.name, reach, ip, int(ssh_port["host"]),
                  keys.KeyPair(str(ca_private), str(ca_public)))


def session_access(args: argparse.Namespace) -> Access:
    plan, pool = one_plan(args)
    stack = stack_name_for(plan.name, getattr(args, "stack", None))
    return access_of(plan, pool, stack_outputs(stack), f"run `sessionctl up {args.file}`")


def cache_dir(session: str, environ: Mapping[str, str] = os.environ) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path("~").expanduser() / ".cache")
    return Path(base) / "cluster-sessions" / session


# --- the verbs -------------------------------------------------------------------------------

def cmd_ssh(args: argparse.Namespace) -> int:
    access = session_access(args)
    host = args.host
    if host not in access.hosts:
        shown = ", ".join(access.hosts[:4]) + (", ..." if len(access.hosts) > 4 else "")
        raise CommandError(f"{host} is not a host of session {access.session} ({shown})",
                           Exit.INVALID)
    identity = find_identity(args.identity)
    ssh = shutil.which("ssh")
    if ssh is None:
        raise CommandError("no ssh client here: install OpenSSH's client (Debian: "
                           "apt-get install openssh-client)", Exit.MISSING)
    directory = Path(tempfile.mkdtemp(prefix="sessionctl-ssh-"))
    try:
        config = write_files(access, identity, directory)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    command = list(args.command or [])
    argv = [ssh, "-F", str(config), *(["-t"] if not command and sys.stdin.isatty() else []),
            "--", alias(access.session, host),
            # each argument one word, as given (docker exec's way, not ssh's joining):
            # `-- sh -c 'a | b'` for a pipeline
            *([" ".join(shlex.quote(a) for a in command)] if command else [])]
    sys.stdout.flush()
    sys.stderr.flush()
    if not command and not args.no_exec:
        # a login: this process becomes a shell that runs ssh on the terminal, then removes
        # the directory (the certificate and config live only as long as the login)
        os.execv("/bin/sh", ["sh", "-c", 'ssh_dir=$1; shift; "$@"; s=$?; rm -rf -- "$ssh_dir"; '
                             'exit "$s"', "sessionctl-ssh", str(directory), *argv])
    try:
        return subprocess.run(argv, check=False).returncode
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def cmd_ssh_config(args: argparse.Namespace) -> int:
    access = session_access(args)
    identity = find_identity(args.identity)
    directory = cache_dir(access.session)
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    config = write_files(access, identity, directory)
    sys.stdout.write(config.read_text())
    print(f"# saved as {config}: `ssh -F {config} {alias(access.session, 'main1')}`, or "
          f"`Include {config}` in ~/.ssh/config", file=sys.stderr)
    return Exit.OK


def cmd_key(args: argparse.Namespace) -> int:
    plan, _pool = one_plan(args)
    stack = stack_name_for(plan.name, getattr(args, "stack", None))
    out = Path(args.out).expanduser()
    if out.exists() or out.is_symlink():
        raise CommandError(f"{out} exists: refusing to overwrite it (remove it first)",
                           Exit.INVALID)
    outputs = stack_outputs(stack)
    private = outputs.get("ssh_private_key")
    if not outputs.get("session") or not private:
        raise CommandError(f"session {plan.name} is not up: run `sessionctl up {args.file}`",
                           Exit.MISSING)
    text = str(private) if str(private).endswith("\n") else f"{private}\n"
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise CommandError(f"{out} exists: refusing to overwrite it", Exit.INVALID) from None
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror}", Exit.INVALID) from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    print(f"sessionctl: warning: {out} is session {plan.name}'s private key (Backend.AI's "
          "id_container): whoever holds it can log into every container of the session as "
          f"{plan.session.user.name} until the session is destroyed; prefer `sessionctl ssh` "
          "(your own key, certified for an hour)", file=sys.stderr)
    return Exit.OK


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "ssh", "log into a container of a session (or run a command there)",
        "Log into HOST (default main1) of the session as its user, or run CMD there (each "
        "argument one word, as given: `-- sh -c 'a | b'` for a pipeline) and exit with its "
        "exit status (255: ssh itself failed). The way in goes over the pool's SSH "
        "to main1's agent (skipped for a local engine), to main1's sshd on the agent's "
        "loopback, and to a sub through main1. Host keys are checked strictly against the "
        "session CA; you log in with your own key (--identity), which is certified for an "
        "hour with the CA key from the stack. Nothing is written into ~/.ssh. Needs the "
        "pulumi CLI (the stack's outputs) and the system ssh client.",
        epilog="exit codes: CMD's own (255: ssh failed), or before ssh runs: 2 invalid input, "
        "3 pending, 4 the session is not up or a prerequisite is missing")
    p.__class__ = _CommandParser  # everything after "--" is CMD
    add_session_args(p)
    p.add_argument("host", metavar="HOST", nargs="?", default="main1",
                   help="main1 (default), sub1, ...")
    p.set_defaults(command=[])
    p.usage = "%(prog)s [options] FILE [HOST] [-- CMD...]"
    _identity_arg(p)
    p.add_argument("--no-exec", action="store_true", help=argparse.SUPPRESS)  # tests
    p.set_defaults(func=cmd_ssh)
    needs_pulumi(p)

    p = verb_parser(
        subparsers, "ssh-config", "print an OpenSSH config for the session (scp, sftp, rsync)",
        "Print an OpenSSH config block, Host <session>-main1, <session>-sub1, ... (with "
        "ProxyJump, CertificateFile, UserKnownHostsFile and HostKeyAlias), and write the "
        "certificate (your own key, certified for an hour) and the session CA's known_hosts "
        "it names under ~/.cache/cluster-sessions/<session>/ (0700; files 0600), so scp, "
        "sftp, rsync -e ssh and editors' remote-SSH work unchanged: `sessionctl ssh-config "
        "FILE > cfg && scp -F cfg x <session>-sub1:`. Nothing is written into ~/.ssh.",
        epilog=EPILOG)
    add_session_args(p)
    _identity_arg(p)
    p.set_defaults(func=cmd_ssh_config)
    needs_pulumi(p)

    p = verb_parser(
        subparsers, "key", "write the session's private user key (Backend.AI's id_container)",
        "Write the session's own private user key to --out PATH (mode 0600; an existing file "
        "is never overwritten), for tools that want Backend.AI's id_container. Whoever holds "
        "it can log into every container until the session is destroyed: `sessionctl ssh` "
        "and `ssh-config` need no copy of it.",
        epilog=EPILOG)
    add_session_args(p)
    p.add_argument("--out", required=True, metavar="PATH", help="the file to write (new)")
    p.set_defaults(func=cmd_key)
    needs_pulumi(p)


class _CommandParser(argparse.ArgumentParser):
    """A verb's parser for which everything after the first ``--`` is the command (``ssh FILE
    sub1 -- ls -l``), never options or arguments of the verb's own."""

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201
        args = list(sys.argv[1:] if args is None else args)
        if "--" not in args:
            return super().parse_known_args(args, namespace)
        cut = args.index("--")
        parsed, extras = super().parse_known_args(args[:cut], namespace)
        parsed.command = args[cut + 1:]
        return parsed, extras


def _identity_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--identity", metavar="KEY", default=None,
                   help="your key, public (.pub) or private (default: the first of "
                   + ", ".join(DEFAULT_IDENTITIES) + ")")


__all__: Sequence[str] = ("cmd_key", "cmd_ssh", "cmd_ssh_config", "register", "ssh_config")
