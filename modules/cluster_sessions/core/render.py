"""What runs inside each container: a finished plan and the session keys, rendered to files.

One container's files (its *bundle*) are mounted or uploaded at :data:`BUNDLE_DIR` by default,
which may be read-only; the entrypoint finds them next to itself wherever they are (no template
names the bundle's directory) and copies what must have a particular owner or mode into
place. The templates live in the project's ``templates/`` directory (jinja2).

Pure: no pulumi, no network, no file writes; the only I/O is reading the templates.

Every value interpolated into a shell template goes through the ``shquote`` filter
(:func:`shlex.quote`) or, for a variable name, ``shname`` (which refuses anything that is not
a plain identifier). Values in the ssh configuration files go through ``word`` or ``line``,
which refuse characters those formats cannot carry. A test checks that no template
interpolates a value without one of these filters.
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .clusterenv import split_user_env
from .keys import KeyPair, SessionKeys
from .names import DEFAULT_MASTER_PORT
from .plan import ClusterPlan, ContainerPlan, runs_job
from .spec import BUNDLE_DIR, DEFAULT_COMMAND, RUN_DIR, SSH_PORT

TEMPLATES = Path(__file__).resolve().parents[3] / "templates"


# PATH of every program started as root in a container (the definition's PATH never is)
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SECRET_MODE = 0o600
PUBLIC_MODE = 0o644
EXEC_MODE = 0o755

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
WORD = re.compile(r"[A-Za-z0-9_.,:/@+=~-]+")
PUBLIC_KEY = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]+={0,2}")
CERTIFICATE = re.compile(r"ssh-ed25519-cert-v01@openssh\.com [A-Za-z0-9+/]+={0,2}")


@dataclass(frozen=True)
class RenderedFile:
    """One file of a container's bundle.

    path: relative to the bundle directory, e.g. ``entrypoint.sh``, ``ssh/id_cluster``.
    mode: the file's permission bits. secret: it holds a private key (keep it out of logs,
    previews and world-readable places).
    """

    path: str
    content: str
    mode: int
    secret: bool = False

    def __repr__(self) -> str:  # never show a private key in a traceback or a log line
        shown = "<secret>" if self.secret else f"<{len(self.content)} characters>"
        return f"RenderedFile({self.path!r}, {shown}, mode={self.mode:o}, secret={self.secret})"


# (path, template, mode): the bundle's layout, the same for every container and every key.
LAYOUT: tuple[tuple[str, str, int], ...] = (
    ("entrypoint.sh", "entrypoint.sh.j2", EXEC_MODE),
    ("cluster-env.sh", "cluster-env.sh.j2", PUBLIC_MODE),
    ("static-env.sh", "static-env.sh.j2", PUBLIC_MODE),
    ("user-env.sh", "user-env.sh.j2", PUBLIC_MODE),
    ("exec-env.sh", "exec-env.sh.j2", PUBLIC_MODE),
    ("save-env.sh", "save-env.sh.j2", PUBLIC_MODE),
    ("setup.sh", "setup.sh.j2", PUBLIC_MODE),
    ("as-user.sh", "as-user.sh.j2", PUBLIC_MODE),
    ("wait-peers.sh", "wait-peers.sh.j2", PUBLIC_MODE),
    ("wait-peers.bash", "wait-peers.bash.j2", PUBLIC_MODE),
        ("command.sh", "command.sh.j2", PUBLIC_MODE),
    ("ssh-session.sh", "ssh-session.sh.j2", EXEC_MODE),
    ("profile.sh", "profile.sh.j2", PUBLIC_MODE),
    ("sshd_config", "sshd_config.j2", PUBLIC_MODE),
    ("ssh/config", "ssh_config.j2", PUBLIC_MODE),
    ("ssh/known_hosts", "known_hosts.j2", PUBLIC_MODE),
    ("ssh/authorized_keys", "authorized_keys.j2", PUBLIC_MODE),
    ("cluster-hosts.sh", "cluster-hosts.sh.j2", PUBLIC_MODE),
)
# The session's lifetime (issue 44, core/governance.py): only in the bundle of a session that
# has one; setup.sh sources it in place of starting CMD itself.
LIFETIME = ("lifetime.sh", "lifetime.sh.j2", PUBLIC_MODE)
LIFETIME_EXIT = 124
"""main1's (every container's) exit code when the session's lifetime ended it: as timeout(1)
says a time limit ended a command."""
LIFETIME_GRACE = 10
"""Seconds between the TERM at the expiry and the KILL."""
# Files that list every host: the entrypoint derives them at start from BACKENDAI_CLUSTER_HOSTS
# (cluster-hosts.sh), so the bundle a container is sent does not grow with the session. Only a
# bundle written to a directory (``sessionctl render --out``, which may be mounted read-only)
# has them rendered too (``render_container(..., directory=True)``).
HOSTFILES: tuple[tuple[str, str, int], ...] = (
    ("hostfile", "hostfile.j2", PUBLIC_MODE),
    ("hostfile.hydra", "hostfile.hydra.j2", PUBLIC_MODE),
)


def _disconnect(text: str) -> str:
    """An ssh client's polite leaving, as a printf format (octal escapes): its identification
    line, then SSH_MSG_DISCONNECT (1) with reason 11 and ``text``, unencrypted (padding to a
    multiple of 8, at least 4 bytes). sshd logs it as ``Received disconnect from ADDR port
    P:11: TEXT [preauth]``, and no error."""
    payload = b"\x01" + (11).to_bytes(4, "big") + len(text).to_bytes(4, "big") + text.encode() \
        + (0).to_bytes(4, "big")
    padding = -(5 + len(payload)) % 8
    padding += 8 if padding < 4 else 0
    packet = (1 + len(payload) + padding).to_bytes(4, "big") + bytes([padding]) + payload \
        + bytes(padding)
    return "SSH-2.0-cluster-session-probe\\r\\n" + "".join(
        chr(b) if chr(b).isalnum() or chr(b) in " -" else f"\\{b:03o}" for b in packet)


@dataclass(frozen=True)
class ReadinessProtocol:
    """The readiness protocol's values shared by its two shells' scripts (wait-peers.sh and
    wait-peers.bash) and setup.sh, decided here once: docs/design-notes.md, "The readiness
    protocol, in one table", says which rule each is in. The templates read them as ``ready``."""

    ask_after: int = 5
    """Rule 10: a sub not probed this many seconds after its start logs in to main1's gate
    (main1 probes a peer still missing at least every second, and starts a probe unanswered
    for 3 s again: so main1 is done already, or not there, or cannot say go)."""
    margin: int = 2
    """Rules 10, 11: a probed sub waits for the go until this many seconds before its
    readiness.timeout (at N = 32 on the lab, a sub probed early waited 25 s for the last
    agent's containers: any shorter patience sends those subs to the gate), and then asks the
    gate, which waits until as long after it, so that main1's reasons are what it reports."""
    deciding: int = 30
    """Rule 11: the seconds more a gate waits while main1 works out its reasons."""
    tries: int = 3
    """Rule 5: the go, said up to this many times..."""
    try_pause: str = "0.2"
    """... this many seconds apart."""
    code: int = 75
    """Rule 12: the exit code of a wait whose time is up (EX_TEMPFAIL)."""
    go_text: str = "cluster-session-go"
    """Rule 5: the go's text, as the sub's sshd logs it."""
    probe_text: str = "readiness probe"
    """Rules 4, 12, 13: the text of a probe that leaves without a go."""

    @property
    def go(self) -> str:
        return _disconnect(self.go_text)

    @property
    def bye(self) -> str:
        return _disconnect(self.probe_text)


READINESS = ReadinessProtocol()
USER_KEY = "ssh/id_cluster"
HOST_KEY = "ssh/ssh_host_ed25519_key"
HOST_CERT = HOST_KEY + "-cert.pub"
USER_CA = "ssh/user_ca.pub"


def shquote(value: object) -> str:
    return _quote(str(value))


@functools.lru_cache(maxsize=8192)
def _quote(text: str) -> str:  # cached: every container's peer list quotes the same host names
    return shlex.quote(text)


def shwords(values: Sequence[object]) -> str:
    """Values as shell words: each one quoted, separated by spaces."""
    return " ".join(shquote(v) for v in values)


def shname(value: object) -> str:
    text = str(value)
    if not IDENTIFIER.fullmatch(text):
        raise ValueError(f"not a shell variable name: {text!r}")
    return text


def word(value: object) -> str:
    """A value for sshd_config / ssh_config / known_hosts: no spaces, quotes or '#'."""
    text = str(value)
    if not WORD.fullmatch(text):
        raise ValueError(f"cannot be written into an ssh configuration file: {text!r}")
    return text


def public_key(value: object) -> str:
    text = str(value).strip()
    if not PUBLIC_KEY.fullmatch(text):
        raise ValueError("not an ssh-ed25519 public key in OpenSSH format")
    return text


def certificate(value: object) -> str:
    text = str(value).strip()
    if not CERTIFICATE.fullmatch(text):
        raise ValueError("not an ssh-ed25519 certificate in OpenSSH format")
    return text


def session_hosts_joined(hosts: Sequence[str]) -> str:
    """``main1,sub1,...`` when ``hosts`` are the session's usual names in order, else ``""``:
    static-env.sh then builds the list with a loop instead of spelling it out."""
    usual = hosts[:1] == ["main1"] and all(h == f"sub{i}" for i, h in enumerate(hosts) if i)
    return ",".join(hosts) if usual else ""


# A whole line of shell or ssh-file comment, except a shellcheck directive: dropped from the
# templates of the bundle a container is sent (it keeps each file's first line, which says what
# made it), so the upload stays small (issue 22: at most 32 KiB, whatever the session's size).
# Only the templates' own text is touched, never an interpolated value. A template's long notes
# are Jinja comments ("{##" ... "##}" lines around them): kept in the template, in no rendered
# copy; the "##}" that ends one is Jinja's, not a shell comment.
_COMMENT_LINE = re.compile(r"^[ \t]*#(?!!| shellcheck |#\})[^\n]*\n", re.MULTILINE)


def without_comment_lines(source: str) -> str:
    """A template's source without its comment lines but the first (see ``_COMMENT_LINE``)."""
    first, newline, rest = source.partition("\n")
    return first + newline + _COMMENT_LINE.sub("", rest)


_JINJA_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}")


def _scan(line: str, quote: str | None) -> tuple[str | None, int | None]:
    """(the shell quote open at the end of ``line``: ``'``, ``"`` or None, where a comment
    starts in it or None), given the quote open at its start; Jinja's tags are skipped (their
    text is not the shell's). Enough of sh's lexer for the templates (none has a here-document)."""
    i = 0
    while i < len(line):
        tag = _JINJA_TAG.match(line, i) if line.startswith(("{{", "{%"), i) else None
        if tag:
            i = tag.end()
            continue
        c = line[i]
        if quote is None:
            if c == "\\":
                i += 1
            elif c == "#" and (i == 0 or line[i - 1] in " \t;(|&"):
                return None, i
            elif c in "'\"":
                quote = c
        elif quote == "'":
            if c == "'":
                quote = None
        elif c == "\\":
            i += 1
        elif c == '"':
            quote = None
        i += 1
    return quote, None


def compact_shell(source: str) -> str:
    """A shell template as a container is sent it, after :func:`without_comment_lines`: on
    the lines that begin outside a quoted string (where sh never sees them) the indentation as
    tabs, four spaces each, and a comment after a command left out, so that the scripts stay
    readable and the upload under issue 22's 32 KiB. A line inside a quoted string is kept as
    it is; a template whose quotes do not close is left whole."""
    out: list[str] = []
    quote = None
    for line in source.split("\n"):
        if quote is None:
            body = line.lstrip(" ")
            indent = len(line) - len(body)
            line = "\t" * (indent // 4) + " " * (indent % 4) + body
            quote, comment = _scan(line, None)
            if comment is not None and line[:comment].strip() \
                    and not line[comment:].startswith("# shellcheck "):
                line = line[:comment].rstrip()
        else:
            quote, _ = _scan(line, quote)
        out.append(line)
    return "\n".join(out) if quote is None else source


class _CompactLoader(jinja2.FileSystemLoader):
    def get_source(self, environment, template):  # noqa: ANN001, ANN201 (jinja2's signature)
        source, filename, uptodate = super().get_source(environment, template)
        source = without_comment_lines(source)
        if template.endswith((".sh.j2", ".bash.j2")):
            source = compact_shell(source)
        return source, filename, uptodate


def _environment(compact: bool = False) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=(_CompactLoader if compact else jinja2.FileSystemLoader)(TEMPLATES),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # "{#" starts a jinja comment by default, and shell scripts say ${#var}
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters.update(shquote=shquote, shwords=shwords, shname=shname, word=word,
                       public_key=public_key, certificate=certificate)
    return env


_ENV = _environment()
_COMPACT_ENV = _environment(compact=True)  # the bundle a container is sent


def entrypoint_argv() -> list[str]:
    """The container's entrypoint; the session command is the container's command (CMD)."""
    return ["/bin/sh", f"{BUNDLE_DIR}/entrypoint.sh"]


def public_digest(files: Sequence[RenderedFile]) -> str:
    """The SHA-256 of :func:`pack` of the files that are not secret: what every container
    carries as its bundle-digest label (pulumi_layer/session.py), so a preview shows a change
    of the entrypoint or any public file, and what ``sessionctl diff`` compares (core/review.py)
    to say whether ``up`` sends another bundle. Never changes with a private key."""
    return hashlib.sha256(pack([f for f in files if not f.secret]).encode()).hexdigest()


def pack(files: Sequence[RenderedFile]) -> str:
    """A POSIX sh script that, run as ``/bin/sh PACK DIR``, writes ``files`` under ``DIR``.

    Each file gets its exact text (``printf '%s'`` of a single-quoted word: quotes, ``$(...)``,
    backticks, newlines and a missing final newline survive byte for byte; the text holds no
    NUL) and its mode. The old files are removed first (one ``rm``, none when there are none),
    so every file is created afresh, never written through a link (a link in place of a
    directory is removed too), with its mode from the umask it is created under: a
    private key is never readable by others, not even for a moment. Only modes with execute
    bits need a ``chmod`` (one per mode). A directory created for a file is 0755, one holding a
    secret file 0700 (as ``sessionctl render`` makes them); one that exists is kept as it is
    (:func:`pack_entrypoint_argv` makes ``ssh/`` 0711 before unpacking). Few processes on
    purpose: a pack runs at every container start, before sshd listens. Deterministic: the same
    files give the same script. Exits non-zero at the first step that fails.

    Used where the files cannot be mounted: the Pulumi ``Session`` uploads one pack of the
    whole bundle, and :func:`pack_entrypoint_argv` unpacks it
    (into a directory only root can write: nobody reads a file while it is being replaced).
    """
    lines = [
        "# cluster-session pack, written by cluster_sessions.core.render.pack: /bin/sh PACK DIR",
        # the files' texts are single-quoted words: literal on purpose
        "# shellcheck disable=SC1003,SC2016",
        "set -eu",
        'if [ "$#" -ne 1 ] || [ -z "$1" ]; then echo "usage: /bin/sh PACK DIR" >&2; exit 64; fi',
        '[ -d "$1" ] || (umask 022 && mkdir -p -- "$1")',
    ]
    private_dirs = {posixpath.dirname(f.path) for f in files if f.secret}
    made: set[str] = set()
    targets: list[str] = []
    writes: list[str] = []
    by_mode: dict[int, list[str]] = {}
    umask = None
    for f in files:
        path = posixpath.normpath(f.path)
        if path.startswith(("/", "../")) or path in (".", "..") or path != f.path:
            raise ValueError(f"refusing to pack a path outside the bundle: {f.path!r}")
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            parent = "/".join(parts[:depth])
            if parent in made:
                continue
            made.add(parent)
            where = '"$1"/' + shlex.quote(parent)
            # a link in place of a directory is removed, never followed (by chmod, by a file)
            lines.append(f"[ ! -L {where} ] || rm -f -- {where}")
            mode = 0o700 if parent in private_dirs else 0o755
            lines.append(f"[ -d {where} ] || mkdir -m {mode:o} -- {where}")
        target = '"$1"/' + shlex.quote(path)
        targets.append(target)
        mode = f.mode & 0o7777
        wanted = 0o666 & ~mode  # a file is created 0666 & ~umask
        if wanted != umask:
            writes.append(f"umask {wanted:03o}")
            umask = wanted
        writes.append(f"printf '%s' {shlex.quote(f.content)} > {target}")
        if mode & 0o7111:
            by_mode.setdefault(mode, []).append(target)
    if targets:  # one rm, and none at the first start (no program when nothing is there)
        lines += ['set -- "$1" ' + " ".join(targets), 'd=$1', "shift",
                  'for f do if [ -e "$f" ] || [ -L "$f" ]; then rm -f -- "$@"; break; fi; done',
                  'set -- "$d"']
    lines += writes
    lines += [f"chmod {mode:o} -- " + " ".join(paths) for mode, paths in sorted(by_mode.items())]
    return "\n".join(lines) + "\n"


# sshd's privilege-separation directory (OpenSSH's compiled-in path on Debian, Ubuntu, Fedora,
# Alpine): sshd refuses to start without it
PRIVSEP_DIR = "/run/sshd"


def pack_entrypoint_argv() -> list[str]:
    """The container's entrypoint when the bundle arrives as packs (``BUNDLE_DIR/*.pack``).

    In the first shell, with the container's env as docker gave it, built-ins only: saves that
    env (``export -p`` into ``RUN_DIR/container-env``, 0640: the container's own tmpfs, empty at
    every start, so nothing can have put a link there) and checks it runs as root
    (``/proc/self/status``; exit 64 if not). Then one shell under ``env -i`` with a fixed PATH,
    nothing of the container's env in effect: it makes the bundle's ``ssh/`` (0711: sshd
    reads ``authorized_keys`` there as the user; the private keys in it are 0600) and sshd's
    privilege-separation directory in one ``mkdir`` (none at a restart), unpacks every pack
    into :data:`RUN_DIR` (the container's tmpfs, ``spec.RUN_TMPFS``; exit 70 with a message
    if one fails) and sources the bundled ``setup.sh`` with the container's command (docker
    appends CMD after the ``sh -c`` script's ``$0``): the same process goes on to sshd and
    CMD, so that before sshd listens a container starts sh, env, sh, mkdir, chown, setpriv, sh
    and sshd, nothing else (issue 22). Unpacking again at every start (docker restart) rewrites
    the same files.
    """
    packs, run = shlex.quote(BUNDLE_DIR), shlex.quote(RUN_DIR)
    ssh_dir = posixpath.dirname(USER_KEY)
    unpack = "\n".join([  # under env -i: no variable is set but PATH and LC_ALL
        f'[ -d "$1"/{ssh_dir} ] && [ -d {PRIVSEP_DIR} ] || mkdir -p -m 711 "$1"/{ssh_dir}'
        f" {PRIVSEP_DIR} || exit 70",
        f'for pack in {packs}/*.pack; do',
        '  [ -f "$pack" ] || continue',
        "  found=1",
        '  (set -- "$1" && . "$pack")',
        '  [ "$?" -eq 0 ] || { echo "cluster-session: error: cannot unpack $pack into $1" >&2;'
        " exit 70; }",
        "done",
        f'[ -n "$found" ] || {{ echo "cluster-session: error: no *.pack in {packs}" >&2;'
        " exit 70; }",
        'bundle=$1',
        "shift",
        'set -- "$bundle" "$bundle/container-env" "$@"',
        '. "$bundle/setup.sh"',
    ])
    script = "\n".join([
        "# shellcheck disable=SC2016 # the unpacking script is one literal word for sh -c",
        "(",
        "  umask 027",
        # first, before this shell assigns any variable: the env exactly as the container got it
        f"  command export -p 2>/dev/null > {run}/container-env",
        "  saved=$?",
        "  euid=''",
        "  while read -r key _ euid _; do [ \"$key\" != Uid: ] || break; done < /proc/self/status",
        '  [ "$euid" = 0 ] || { echo "cluster-session: error: must run as root'
        ' (it creates the user and starts sshd); do not set the container\'s user" >&2;'
        ' exit 64; }',
        '  [ "$saved" -eq 0 ] || { echo "cluster-session: error: cannot save the container\'s'
        f' environment into {run} (the Pulumi program gives every container a tmpfs there)"'
        " >&2; exit 70; }",
        ") || exit",
        "env=/usr/bin/env",
        '[ -x "$env" ] || env=/bin/env',
        f'exec "$env" -i PATH={ROOT_PATH} LC_ALL=C /bin/sh -c {shlex.quote(unpack)} entrypoint'
        f' {run} "$(umask)" "${{BACKENDAI_CLUSTER_HOSTS-}}" "$@"',
    ])
    return ["/bin/sh", "-c", script, "entrypoint"]


def _private(key: KeyPair) -> str:
    text = key.private_openssh
    return text if text.endswith("\n") else text + "\n"


_last_checked: list = []  # [plan, keys]: the last (plan, keys) found complete


def _host_keys(plan: ClusterPlan, keys: SessionKeys) -> Mapping[str, KeyPair]:
    """``keys.hosts``, checked once per (plan, keys): every host has a key and a certificate,
    and there is a CA (checking per container would make rendering a session O(N^2))."""
    if _last_checked and _last_checked[0] is plan and _last_checked[1] is keys:
        return keys.hosts
    missing = [h for h in plan.hosts if h not in keys.hosts]
    if missing:
        raise ValueError(f"the session keys have no host key for {', '.join(missing)}")
    if keys.ca is None or any(h not in keys.host_certs for h in plan.hosts):
        raise ValueError("the session keys have no CA or not every host certificate "
                         "(keys.with_hosts adds them)")
    _last_checked[:] = [plan, keys]
    return keys.hosts


# Files that are the same in every container of a session, and list every host: rendered once
# per session, not once per container (render time grows linearly with the size).
SHARED = frozenset({"ssh/config", "ssh/known_hosts", "ssh/authorized_keys", "hostfile",
                    "hostfile.hydra"})
_TEMPLATES = {path: template for path, template, _ in LAYOUT + HOSTFILES + (LIFETIME,)}
_last_shared: list = []  # [plan, keys, env, {path: text}]: the last session rendered


def _shared(plan: ClusterPlan, keys: SessionKeys, context: dict,
            env: jinja2.Environment) -> dict[str, str]:
    """The session-wide files, made once per (plan, keys)."""
    if (_last_shared and _last_shared[0] is plan and _last_shared[1] is keys
            and _last_shared[2] is env):
        return _last_shared[3]
    texts = {path: env.get_template(template).render(context)
             for path, template in _TEMPLATES.items() if path in SHARED}
    _last_shared[:] = [plan, keys, env, texts]
    return texts


def render_container(plan: ClusterPlan, container: ContainerPlan,
                     keys: SessionKeys, directory: bool = False) -> list[RenderedFile]:
    """The bundle of one container, in a fixed order that does not depend on the keys.

    As a container is sent it (``directory`` false): its size does not depend on the
    session's (what lists every host is derived at start by ``cluster-hosts.sh`` and
    ``static-env.sh``, and one ``@cert-authority`` line is every ``known_hosts``), and the
    templates' comment lines are left out (:func:`without_comment_lines`). For a directory
    (``sessionctl render --out``, which may be mounted read-only, so the entrypoint cannot
    write there): the files with their comments, and the hostfiles rendered too."""
    rank = container.local_rank
    if not (0 <= rank < len(plan.containers) and plan.containers[rank] == container):
        raise ValueError(f"{container.host} is not a container of session {plan.name!r}")
    host_keys = _host_keys(plan, keys)
    session = plan.session
    context = {
        "session": plan.name,
        "host": container.host,
        "hosts": plan.hosts,
        "size": len(plan.containers),
        "env": list(container.env.items()),
        "user_env": list(split_user_env(container.user_env)[0].items()),
        "exec_env": list(container.exec_env.items()),
        "user": session.user,
        "ssh_port": SSH_PORT,
        "run_dir": RUN_DIR,
        # A sent bundle is unpacked by root into RUN_DIR and sshd reads it there; a directory
        # may be mounted anywhere, read-only, owned by anyone: what sshd reads is copied.
        "copies": directory,
        "slots": container.slots,
        "job": runs_job(plan, container),
        "root_path": ROOT_PATH,
        "readiness_timeout": session.readiness.timeout,
        "ready": READINESS,
        "default_command": list(DEFAULT_COMMAND),
        "default_master_port": DEFAULT_MASTER_PORT,
        "user_public_key": keys.user.public_openssh,
        "ca_public_key": keys.ca.public_openssh,
        "expires_at": plan.expires_at,
        "grace": LIFETIME_GRACE,
        "code": LIFETIME_EXIT,
    }
    context["hosts_joined"] = _hosts_joined(plan)
    env = _ENV if directory else _COMPACT_ENV
    shared = _shared(plan, keys, context, env)
    layout = LAYOUT + HOSTFILES if directory else LAYOUT
    if plan.expires_at is not None:
        layout += (LIFETIME,)
    # a sent bundle's scripts are all run by /bin/sh: no mode that needs a chmod at unpacking
    files = [RenderedFile(path, shared[path] if path in shared
                          else env.get_template(template).render(context),
                          mode if directory else mode & ~0o111)
             for path, template, mode in layout]
    own = host_keys[container.host]
    files += [
        RenderedFile(USER_KEY + ".pub", public_key(keys.user.public_openssh) + "\n", PUBLIC_MODE),
        RenderedFile(USER_KEY, _private(keys.user), SECRET_MODE, secret=True),
        RenderedFile(HOST_KEY + ".pub", public_key(own.public_openssh) + "\n", PUBLIC_MODE),
        RenderedFile(HOST_KEY, _private(own), SECRET_MODE, secret=True),
        RenderedFile(HOST_CERT, certificate(keys.host_certs[container.host]) + "\n",
                     PUBLIC_MODE),
        RenderedFile(USER_CA, public_key(keys.ca.public_openssh) + "\n", PUBLIC_MODE),
    ]
    return files


_last_joined: list = []  # [plan, text]


def _hosts_joined(plan: ClusterPlan) -> str:
    if not (_last_joined and _last_joined[0] is plan):
        _last_joined[:] = [plan, session_hosts_joined(list(plan.hosts))]
    return _last_joined[1]


def known_hosts(session: str, ca_public_key: str) -> str:
    """The ``known_hosts`` every container of ``session`` has: one ``@cert-authority`` line for
    the session CA (``sessionctl ssh`` checks the containers' host keys with it too)."""
    return _COMPACT_ENV.get_template("known_hosts.j2").render(
        session=session, ssh_port=SSH_PORT, ca_public_key=ca_public_key)


def render_session(plan: ClusterPlan, keys: SessionKeys,
                   directory: bool = True) -> dict[str, list[RenderedFile]]:
    """Every container's bundle, by host, in host order: for directories, unless ``directory``
    is false (then exactly what the Pulumi program sends each container)."""
    return {c.host: render_container(plan, c, keys, directory) for c in plan.containers}
