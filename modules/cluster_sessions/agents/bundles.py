"""Bundles on an agent's scratch root (issue 45, core/bundles.py): the one delivery per agent
per ``up``, its removal, the root's creation and the sweep of stacks that are gone.

Every step is one POSIX sh script run through the agent's connector with
:meth:`~.connectors.Connector.run_script` (over SSH the script travels on the channel's stdin,
locally on the shell's stdin): the archive of the bundles, which holds private keys, is in the
script as base64 and so never in a process's arguments. Nothing of a definition reaches a
script but host names (the plan's checked names) and the stack id (16 hex digits); every value
is shell-quoted all the same.

What a script checks before it writes, on the agent, every time (a path may be a link someone
else made): the scratch root is a directory, reached through no link (``cd -P`` lands on the
path as written), owned by the user the script runs as, with no permission for group or others;
``<stack id>/`` is a directory of that user, not a link. A delivery is written into
``<stack id>/.new-<agent>-<pid>/`` and each host's directory is moved into place with one
``rename`` (the old one first moved aside to ``.old-<agent>-...``): a container mounts
``<stack id>/<host>`` only, so it sees a whole bundle or none (a bind mount of a missing
source fails; the provider's ``mounts`` never create one). An interrupted delivery leaves only
``.new-``/``.old-`` names, which the next delivery from that agent removes and no container
mounts.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

from ..core.bundles import HOST_DIR_MODE, OLD_PREFIX, PARTIAL_PREFIX, archive
from .connectors import COMMAND_FAILED, AgentError, Connector

SCRIPT_TIMEOUT = 120.0
# \Z, not $: "$" also matches before a final newline
STACK_ID = re.compile(r"^[0-9a-f]{16}\Z")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
# a line of stacks_on's script: a stack id and its age in seconds (negative: a clock ahead)
_AGE = re.compile(r"^([0-9a-f]{16}) (-?[0-9]+)\Z")
FIX_HINT = "`sessionctl pool check --fix POOL` makes it, or as root: install -d -m 0700 -o USER"

# The checks every script starts with ($root is set); exit 3 is "the root is not usable".
_ROOT_CHECK = r"""
fail() { printf '%s\n' "$*" >&2; exit 3; }
[ -d "$root" ] || fail "scratch root $root is missing"
real=$(cd -P -- "$root" 2>/dev/null && pwd) || fail "scratch root $root cannot be entered"
[ "$real" = "$root" ] || fail "scratch root $root is reached through a link (to $real)"
set -- $(ls -ldn -- "$root")
[ "$3" = "$(id -u)" ] ||
  fail "scratch root $root belongs to uid $3, not to $(id -un) (uid $(id -u))"
case "$1" in
  d???------*) ;;
  *) fail "scratch root $root has mode $1: group and others must have no access (0700)";;
esac
"""


def _check_names(stack_id: str, agent: str, hosts: Iterable[str]) -> None:
    if not STACK_ID.match(stack_id):
        raise ValueError(f"stack id {stack_id!r} is not 16 hex digits")
    for name in (agent, *hosts):
        if not SAFE_NAME.match(name):
            raise ValueError(f"{name!r} is not a plain name")


def _run(conn: Connector, script: str, what: str) -> str:
    rc, out, err = conn.run_script(script, timeout=SCRIPT_TIMEOUT)
    if rc != 0:
        lines = (err.strip() or out.strip() or f"exit {rc}").splitlines()
        hint = f" ({FIX_HINT})" if rc == 3 and "missing" in lines[-1] else ""
        raise AgentError(conn.agent, COMMAND_FAILED, f"{what}: {' / '.join(lines[-3:])}{hint}")
    return out


def _clear(pattern: str) -> str:
    """sh lines removing what ``pattern`` (a glob in ``$d``) names: made writable first (host
    directories are 0500); never following a link (``chmod -R`` and ``rm -r`` do not). A glob
    that matches nothing stays as written: no such path, which ``rm -f`` passes over."""
    return (f'for x in "$d"/{pattern}; do\n'
            '  [ -L "$x" ] || chmod -R u+rwx -- "$x" 2>/dev/null\n'
            '  rm -rf -- "$x" || exit 4\n'
            "done\n")


def deliver_script(scratch: str, stack_id: str, agent: str, bundles: Mapping[str, str],
                   gone: Sequence[str] = ()) -> str:
    """The script that writes ``bundles`` ({host: pack}) into ``<scratch>/<stack id>/`` and
    removes the directories of ``gone`` hosts (a session that shrank)."""
    _check_names(stack_id, agent, [*bundles, *gone])
    q = shlex.quote
    payload = base64.encodebytes(archive(bundles)).decode()
    lines = [f"root={q(scratch)}", "umask 077", _ROOT_CHECK,
             f"d=\"$root\"/{q(stack_id)}",
             'if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then '
             'fail "$d is not a directory"; fi',
             # agents on one shared filesystem deliver into one <stack id>/ at once: the
             # other agent's mkdir may win the race, and its directory is as good as ours
             'err=$(mkdir -m 700 -- "$d" 2>&1) || { [ -d "$d" ] && [ ! -L "$d" ]; } || '
             '{ printf "%s\\n" "$err" >&2; exit 4; }',
             _clear(f"{q(PARTIAL_PREFIX + agent)}-*"), _clear(f"{q(OLD_PREFIX + agent)}-*"),
             f'new="$d"/{q(PARTIAL_PREFIX + agent)}-$$',
             'mkdir -m 700 -- "$new" || exit 4',
             # the body follows the line with <<, so the whole command is on that line
             "base64 -d <<'CLUSTER_SESSIONS_ARCHIVE' | "
             'tar -xzf - -C "$new" --no-same-owner -p || { chmod -R u+rwx -- "$new"; '
             'rm -rf -- "$new"; printf "cannot write the bundles into %s\\n" "$d" >&2; exit 4; }',
             # base64's lines, each ending in a newline, then the heredoc's terminator
             payload + "CLUSTER_SESSIONS_ARCHIVE"]
    for host in bundles:
        lines += [f"h={q(host)}",
                  f'if [ -e "$d/$h" ] || [ -L "$d/$h" ]; then '
                  f'mv -- "$d/$h" "$d"/{q(OLD_PREFIX + agent)}-$$-"$h" || exit 4; fi',
                  'mv -- "$new/$h" "$d/$h" || exit 4',
                  f'chmod {HOST_DIR_MODE:o} -- "$d/$h" || exit 4']
    lines += ['rmdir -- "$new"']
    for host in gone:
        lines += [f"h={q(host)}", _clear('"$h"')]
    lines += [_clear(f"{q(OLD_PREFIX + agent)}-$$-*"), "exit 0"]
    return "\n".join(lines) + "\n"


def remove_script(scratch: str, stack_id: str, agent: str, hosts: Sequence[str]) -> str:
    """The script that removes the hosts' directories (and this agent's leftovers), then
    ``<stack id>/`` itself once nothing is left in it (other agents of a shared filesystem
    may still have theirs there). A missing root or stack directory: nothing to remove."""
    _check_names(stack_id, agent, hosts)
    q = shlex.quote
    lines = [f"root={q(scratch)}", f'd="$root"/{q(stack_id)}',
             '[ -d "$root" ] && [ -d "$d" ] && [ ! -L "$d" ] || exit 0', _ROOT_CHECK]
    for host in hosts:
        lines += [f"h={q(host)}", _clear('"$h"')]
    lines += [_clear(f"{q(PARTIAL_PREFIX + agent)}-*"), _clear(f"{q(OLD_PREFIX + agent)}-*"),
              'rmdir -- "$d" 2>/dev/null', "exit 0"]
    return "\n".join(lines) + "\n"


def deliver(conn: Connector, scratch: str, stack_id: str, bundles: Mapping[str, str],
            gone: Sequence[str] = ()) -> None:
    """Every container's bundle of this agent in one archive, in one script (one round trip);
    an error names the agent and the path (the root missing, not the SSH user's, a full
    disk)."""
    _run(conn, deliver_script(scratch, stack_id, conn.agent, bundles, gone),
         f"cannot deliver the bundles into {scratch}/{stack_id}")


def remove(conn: Connector, scratch: str, stack_id: str, hosts: Sequence[str]) -> None:
    _run(conn, remove_script(scratch, stack_id, conn.agent, hosts),
         f"cannot remove the bundles from {scratch}/{stack_id}")


def check_root(conn: Connector, scratch: str) -> None:
    """The root as a delivery needs it (AgentError naming agent and path), and room on its
    disk: at least ``MIN_FREE_KB``."""
    script = "\n".join([f"root={shlex.quote(scratch)}", _ROOT_CHECK,
                        'set -- $(df -Pk -- "$root" | tail -n 1)',
                        f'[ "$4" -ge {MIN_FREE_KB} ] 2>/dev/null || '
                        'fail "scratch root $root has only ${4}k free"', "exit 0"])
    _run(conn, script + "\n", "scratch root not usable")


MIN_FREE_KB = 1024


def make_root(conn: Connector, scratch: str) -> str:
    """``pool check --fix``: the root made if missing, the SSH user's, 0700 (``made`` or
    ``kept``). The user makes it where it may; where only root may (``/var/lib``), through
    ``sudo -n`` if that works without a password; else an error saying what root must run."""
    q = shlex.quote(scratch)
    script = "\n".join([
        f"root={q}",
        'if [ -e "$root" ] || [ -L "$root" ]; then echo kept; else',
        '  u=$(id -u); g=$(id -g)',
        '  if mkdir -p -m 700 -- "$root" 2>/dev/null; then :',
        '  elif [ "$u" != 0 ] && sudo -n true 2>/dev/null; then',
        '    sudo -n install -d -m 0700 -o "$u" -g "$g" -- "$root" || exit 5',
        '  else echo "cannot make $root as $(id -un): as root, run: '
        'install -d -m 0700 -o $(id -un) -g $(id -gn) $root" >&2; exit 5; fi',
        '  chmod 700 -- "$root"; echo made',
        "fi", _ROOT_CHECK, "exit 0"])
    out = _run(conn, script + "\n", "scratch root")
    # the last word, not the first line: an SSH login shell's rc file may print lines first
    return "made" if out.split()[-1:] == ["made"] else "kept"


def stacks_on(conn: Connector, scratch: str) -> dict[str, float]:
    """The stack ids that have a directory under the root, each with its age in seconds (of
    the directory's last change: a delivery renames into it); other names are left alone."""
    script = "\n".join([f"root={shlex.quote(scratch)}",
                        '[ -d "$root" ] || exit 0', _ROOT_CHECK, 'now=$(date +%s)',
                        'for x in "$root"/*; do [ -d "$x" ] && [ ! -L "$x" ] && '
                        'printf "%s %s\\n" "${x##*/}" "$((now - $(stat -c %Y -- "$x")))"; '
                        "done", "exit 0"])
    out = _run(conn, script + "\n", "scratch root")
    found = {}
    for line in out.splitlines():
        # the whole line: a name with a space before or after a stack id is not that stack
        if m := _AGE.match(line):
            found[m[1]] = float(m[2])
    return found


def sweep_stack(conn: Connector, scratch: str, stack_id: str) -> None:
    """``<stack id>/`` removed whole (``pool sweep``: a stack that no longer exists)."""
    if not STACK_ID.match(stack_id):
        raise ValueError(f"stack id {stack_id!r} is not 16 hex digits")
    script = "\n".join([f"root={shlex.quote(scratch)}", _ROOT_CHECK,
                        f"d=\"$root\"/{shlex.quote(stack_id)}",
                        '[ -d "$d" ] && [ ! -L "$d" ] || exit 0',
                        'chmod -R u+rwx -- "$d" && rm -rf -- "$d"'])
    _run(conn, script + "\n", f"cannot remove {scratch}/{stack_id}")
