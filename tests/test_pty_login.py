"""Interactive logins with a pseudo-terminal (issue 41, item 1): sshd allocates a pty, the
user types a command and reads its output, into main1 and from main1's interactive shell into a
sub, under bash, dash and busybox images, with the pool's default capabilities only.

Before the fix every such login ended right after ``Accepted publickey`` with ``Connection to
... closed by remote host.``: Debian's sshd is built with Linux audit support and, running as
root, refuses a session with a tty when it may not write the login's audit record
(``linux_audit_write_entry failed: Operation not permitted``, openssh's audit-linux.c). Commands
without a pty worked, which is all the other tests tried."""

from __future__ import annotations

import os
import shutil
import subprocess

import pexpect  # noqa: E402 (after the fixtures it uses)
import pytest

from .conftest import skip_or_fail
from .test_readiness import SHELLS
from .test_runtime import (  # noqa: F401 # image, session_factory: fixtures
    Running,
    image,
    session_def,
    session_factory,
    unique,
)

pytestmark = pytest.mark.docker


def main1_address(running: Running) -> str:
    container = running.containers["main1"]
    container.reload()
    return container.attrs["NetworkSettings"]["Networks"][running.plan.network.name]["IPAddress"]


def type_and_read(child, line: str, expect: str, timeout: float = 30) -> None:
    """Type ``line`` at the shell, then wait for ``expect`` (which the echo of the typed line
    does not contain: the test computes it in the shell)."""
    child.sendline(line)
    child.expect_exact(expect, timeout=timeout)


def interactive_walk(child) -> None:
    """In main1: a command, then ``ssh sub1`` from the interactive shell, a command there, and
    back out of both; the login's exit status passes through."""
    type_and_read(child, 'echo "on-$(hostname)-tty-$(tty | cut -c1-8)-$((6*7))"',
                  "on-main1-tty-/dev/pts-42")
    type_and_read(child, "ssh sub1", "")  # nothing to wait for but the next answer
    type_and_read(child, 'echo "on-$(hostname)-$(id -un)-tty-$(tty | cut -c1-8)-$((6*7))"',
                  "on-sub1-work-tty-/dev/pts-42")
    child.sendline("exit")
    child.expect_exact("Connection to sub1 closed.", timeout=30)  # nothing typed ahead
    type_and_read(child, 'echo "back-$(hostname)-$((6*7))"', "back-main1-42")
    child.sendline("exit 3")
    child.expect(pexpect.EOF, timeout=30)
    child.close()


@pytest.fixture(scope="module", params=list(SHELLS))
def pair(request, session_factory):  # noqa: F811
    """main1 and sub1 under each shell, the pool's default privileges."""
    if shutil.which("ssh") is None:
        skip_or_fail("no ssh client here (apt-get install openssh-client)")
    running = session_factory(session_def(unique(f"pty-{request.param}"), 2),
                              before=SHELLS[request.param])
    return running, request.param


def test_a_pty_login_into_main1_and_from_there_into_a_sub(pair, tmp_path):
    running, shell = pair
    key = tmp_path / "id_session"
    key.write_text(running.keys.user.private_openssh)
    os.chmod(key, 0o600)
    child = pexpect.spawn(
        "ssh", ["-tt", "-i", str(key), "-p", "2200", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "IdentitiesOnly=yes", f"work@{main1_address(running)}"],
        encoding="utf-8", timeout=30, dimensions=(24, 200), use_poll=True)
    try:
        interactive_walk(child)
    finally:
        if child.isalive():
            child.close(force=True)
    logs = running.logs("main1").decode(errors="replace")
    assert child.exitstatus == 3, f"{shell}: {child.before!r}\n{logs}"
    assert "audit" not in logs


def test_the_pty_is_the_user_s_and_nobody_else_may_write_to_it(pair):
    """What sshd does with the tty it allocated (with CHOWN and FOWNER): the user's, mode 0620
    or tighter, so another session user cannot write into it."""
    running, shell = pair
    done = subprocess.run(
        ["docker", "exec", "-u", "work", running.containers["main1"].name, "ssh", "-tt", "sub1",
         "stat -c '%U %a' $(tty)"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{shell}: {done.stderr}"
    owner, mode = done.stdout.split()
    assert owner == "work"
    assert int(mode, 8) & 0o002 == 0, mode
