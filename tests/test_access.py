"""Getting into a session (issue 22): ``sessionctl ssh``, ``ssh-config`` and ``key`` on a
session that ``sessionctl up`` built on the real engine (emulated Automation API), with the
system ssh client, the user's own key certified by the session CA, host keys checked against
the CA, and nothing written into ~/.ssh."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from cluster_sessions.core import keys
from cluster_sessions.core.spec import Pool
from cluster_sessions.driver import access, cli

from . import factories
from .conftest import skip_or_fail
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file()}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A HOME of the test's own with the user's key in ~/.ssh; no agent, no XDG cache."""
    if shutil.which("ssh") is None or shutil.which("sftp") is None:
        skip_or_fail("no ssh client here (apt-get install openssh-client)")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me",
                    "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return home


@pytest.fixture
def session_up(real_engine, image, home, tmp_path, capfd):  # noqa: F811
    """A 3-container session built by `sessionctl up` on the local engine: its file and name."""
    name = unique("ssh")
    doc = factories.session(name, image=image, size=3, cpu=0.5, mem="512m")
    path = str(factories.write(tmp_path / f"{name}.yaml", doc))
    before = tree(home / ".ssh")
    assert cli.main(["up", path, "--yes"]) == 0, capfd.readouterr().err
    capfd.readouterr()
    deadline = time.time() + 120  # until every entrypoint says ready (sshd up, peers answer)
    while time.time() < deadline:
        out = subprocess.run(["docker", "logs", f"{name}-main1"], capture_output=True,
                             text=True, check=False)
        if "ready:" in out.stderr:
            break
        time.sleep(0.5)
    yield path, name
    assert tree(home / ".ssh") == before, "something was written into ~/.ssh"


@pytest.mark.docker
def test_ssh_runs_a_command_in_main1_and_in_a_sub_passing_its_exit_status_through(
        session_up, capfd):
    path, name = session_up
    code = cli.main(["ssh", path, "--", "sh", "-c", 'echo "on $(hostname) as $(id -un)"; '
                     'echo "master $MASTER_ADDR"; exit 7'])
    out, err = capfd.readouterr()
    assert code == 7, err
    assert "on main1 as work" in out and "master main1" in out
    assert cli.main(["ssh", path, "sub2", "--", "hostname"]) == 0
    out, err = capfd.readouterr()
    assert out.strip() == "sub2", err
    # from inside, ssh between containers still checks host keys against the CA
    code = cli.main(["ssh", path, "sub1", "--", "ssh", "main1", "cat", "~/.ssh/known_hosts"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()
            if line and not line.startswith("#")] == ["@cert-authority"]


@pytest.mark.docker
def test_a_login_runs_ssh_on_the_terminal_and_removes_its_files_after(
        session_up, monkeypatch, capfd):
    path, name = session_up
    seen: list[list[str]] = []

    def fake_execv(program, argv):  # what the login would run, run here with our input
        seen.append([program, *argv[1:]])
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_execv)
    with pytest.raises(SystemExit):
        cli.main(["ssh", path, "sub1"])
    program, *argv = seen[0]
    directory = Path(argv[3])
    assert directory.is_dir() and stat.S_IMODE(directory.stat().st_mode) == 0o700
    done = subprocess.run([program, *argv], input="echo login on $(hostname); exit 3\n",
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "login on sub1" in done.stdout
    assert not directory.exists(), "the login's certificate and config were left behind"


@pytest.mark.docker
def test_sftp_puts_and_gets_through_the_printed_config(session_up, home, tmp_path, capfd):
    path, name = session_up
    assert cli.main(["ssh-config", path]) == 0
    config_text, err = capfd.readouterr()
    assert f"Host {name}-main1" in config_text and f"Host {name}-sub2" in config_text
    assert f"ProxyJump {name}-main1" in config_text and "HostKeyAlias sub1" in config_text
    cache = home / ".cache" / "cluster-sessions" / name
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    for f in cache.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    config = tmp_path / "printed.cfg"
    config.write_text(config_text)
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(100_000))
    batch = tmp_path / "batch"
    batch.write_text(f"put {payload} up.bin\nget up.bin {tmp_path / 'back.bin'}\n")
    done = subprocess.run(["sftp", "-F", str(config), "-b", str(batch), f"{name}-sub1"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "back.bin").read_bytes() == payload.read_bytes()
    # it went to sub1 (not main1): the file is there
    assert cli.main(["ssh", path, "sub1", "--", "cmp", "up.bin", "up.bin"]) == 0
    assert cli.main(["ssh", path, "main1", "--", "test", "!", "-e", "up.bin"]) == 0


@pytest.mark.docker
def test_sessionctl_ssh_gives_an_interactive_shell_on_a_pseudo_terminal(
        real_engine, image, home, tmp_path):  # noqa: F811
    """Issue 41, item 1: ``sessionctl ssh FILE`` with no command, on a terminal, as a user
    runs it (the verb in its own process; the pool's default capabilities)."""
    import pexpect

    from .test_pty_login import interactive_walk

    name = unique("pty")
    path = str(factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, image=image, size=2, cpu=0.5, mem="512m")))
    sessionctl = real_engine.sessionctl
    up = subprocess.run([*sessionctl, "up", path, "--yes"], capture_output=True, text=True,
                        check=False, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        child = pexpect.spawn(sessionctl[0], [*sessionctl[1:], "ssh", path], encoding="utf-8",
                              timeout=60, dimensions=(24, 200), use_poll=True)
        try:
            interactive_walk(child)
        finally:
            child.close(force=True)
        assert child.exitstatus == 3, child.before
    finally:
        subprocess.run([*sessionctl, "destroy", path, "--yes"], capture_output=True,
                       check=False, timeout=300)


@pytest.mark.docker
def test_ssh_with_the_printed_config_gives_an_interactive_shell(session_up, home, tmp_path,
                                                                capfd):
    """``ssh -F <ssh-config> <session>-main1`` with no command, and ``ssh -tt ... CMD``."""
    import pexpect

    from .test_pty_login import interactive_walk

    path, name = session_up
    assert cli.main(["ssh-config", path]) == 0
    config = tmp_path / "printed.cfg"
    config.write_text(capfd.readouterr().out)
    child = pexpect.spawn("ssh", ["-F", str(config), f"{name}-main1"], encoding="utf-8",
                          timeout=60, dimensions=(24, 200), use_poll=True)
    try:
        interactive_walk(child)
    finally:
        child.close(force=True)
    assert child.exitstatus == 3, child.before
    done = subprocess.run(["ssh", "-tt", "-F", str(config), f"{name}-sub2", "tty; exit 4"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 4, done.stderr
    assert done.stdout.startswith("/dev/pts/"), done.stdout


def ssh_with(config: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(config), f"{name}-main1", "true"],
                          capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.docker
def test_a_certificate_of_another_ca_or_an_expired_one_is_refused(session_up, home, capfd):
    path, name = session_up
    assert cli.main(["ssh-config", path]) == 0
    capfd.readouterr()
    cache = home / ".cache" / "cluster-sessions" / name
    config = cache / "config"
    assert ssh_with(config, name).returncode == 0
    mine = (home / ".ssh" / "id_ed25519.pub").read_text()
    cert = cache / "id-cert.pub"
    good = cert.read_text()
    other_ca = keys.generate_session_keys(["main1"]).ca
    cert.write_text(keys.user_certificate(other_ca, mine, "work", "x") + "\n")
    done = ssh_with(config, name)
    assert done.returncode == 255 and "Permission denied" in done.stderr, done.stderr
    ca = keys.KeyPair(*_stack_ca(name))
    cert.write_text(keys.user_certificate(ca, mine, "work", "x", seconds=3600,
                                          now=time.time() - 7300) + "\n")
    done = ssh_with(config, name)
    assert done.returncode == 255 and "Permission denied" in done.stderr, done.stderr
    cert.write_text(keys.user_certificate(ca, mine, "root", "x") + "\n")  # another principal
    assert ssh_with(config, name).returncode == 255
    cert.write_text(good)
    assert ssh_with(config, name).returncode == 0
    # a known_hosts naming another CA: the containers' host keys are refused
    known = cache / "known_hosts"
    known.write_text(known.read_text().replace(ca.public_openssh, other_ca.public_openssh))
    done = ssh_with(config, name)
    assert done.returncode == 255 and "Host key verification failed" in done.stderr, done.stderr


def _stack_ca(name: str) -> tuple[str, str]:
    outputs = access.stack_outputs(name)
    return outputs["ssh_ca_private_key"], outputs["ssh_ca_public_key"]


@pytest.mark.docker
def test_key_writes_the_session_key_0600_once_and_warns(session_up, tmp_path, capfd):
    path, name = session_up
    out = tmp_path / "id_container"
    assert cli.main(["key", path, "--out", str(out)]) == 0
    _, err = capfd.readouterr()
    assert "warning" in err and "private key" in err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "OPENSSH PRIVATE KEY" in out.read_text()
    first = out.read_bytes()
    assert cli.main(["key", path, "--out", str(out)]) == 2
    assert "refusing to overwrite" in capfd.readouterr().err
    assert out.read_bytes() == first
    # Backend.AI's way works with it: the session key is in every authorized_keys
    port = next(p["host"] for p in access.stack_outputs(name)["main1"]["ports"]
                if p["container"] == 2200)
    done = subprocess.run(
        ["ssh", "-i", str(out), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", f"UserKnownHostsFile={tmp_path / 'kh'}",
         "-p", str(port), "work@127.0.0.1", "hostname"],
        capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "main1", done.stderr


# --- without the engine ------------------------------------------------------------------------

def remote_access() -> access.Access:
    pool = Pool.model_validate({"kind": "AgentPool", "name": "p", "agents": [
        {"name": "gpu1", "capacity": {"cpu": 8, "mem": "8g"},
         "ssh": {"host": "10.0.0.11", "port": 2222, "user": "ops", "key_file": "~/.ssh/id_pool",
                 "known_hosts": "~/.ssh/kh pool"}}]})
    from cluster_sessions.agents.reach import reach_of

    return access.Access("demo", ("main1", "sub1", "sub2"), "work",
                         reach_of(pool.agents[0]), "127.0.0.1", 49153,
                         keys.generate_session_keys(["main1"]).ca)


def test_the_config_reaches_main1_through_the_agents_ssh_and_subs_through_main1(tmp_path):
    identity = access.Identity(tmp_path / "id.pub", tmp_path / "id")
    text = access.ssh_config(remote_access(), identity, tmp_path / "c")
    blocks = {}
    for line in text.splitlines():
        if line.startswith("Host "):
            current = blocks.setdefault(line[5:], {})
        elif line.startswith("    "):
            key, value = line.split(None, 1)
            current[key] = value
    assert blocks["demo-agent"] == {"HostName": "10.0.0.11", "Port": "2222", "User": "ops",
                                    "IdentityFile": "~/.ssh/id_pool", "IdentitiesOnly": "yes",
                                    "UserKnownHostsFile": '"~/.ssh/kh pool"',
                                    "StrictHostKeyChecking": "yes"}
    assert blocks["demo-main1"] == {"HostName": "127.0.0.1", "Port": "49153",
                                    "HostKeyAlias": "main1", "ProxyJump": "demo-agent"}
    assert blocks["demo-sub2"] == {"HostName": "sub2", "Port": "2200", "HostKeyAlias": "sub2",
                                   "ProxyJump": "demo-main1"}
    common = blocks["demo-main1 demo-sub1 demo-sub2"]
    assert common["CertificateFile"] == str(tmp_path / "c" / "id-cert.pub")
    assert common["UserKnownHostsFile"] == str(tmp_path / "c" / "known_hosts")
    assert common["StrictHostKeyChecking"] == "yes" and common["User"] == "work"


def test_the_known_hosts_written_is_the_containers_one_line(tmp_path):
    acc = remote_access()
    (tmp_path / "id.pub").write_text(keys.new_keypair().public_openssh + "\n")
    access.write_files(acc, access.Identity(tmp_path / "id.pub", tmp_path / "id.pub"),
                       tmp_path / "c")
    lines = [line for line in (tmp_path / "c" / "known_hosts").read_text().splitlines()
             if not line.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith("@cert-authority ")
    assert lines[0].endswith(acc.ca.public_openssh)


def test_the_identity_defaults_to_the_usual_keys_and_refuses_a_missing_one(home):
    found = access.find_identity(None)
    assert found.public == home / ".ssh" / "id_ed25519.pub"
    assert found.file == home / ".ssh" / "id_ed25519"
    with pytest.raises(access.CommandError, match="no public key"):
        access.find_identity(str(home / "nope"))


def test_every_access_verb_has_help(capsys):
    for verb in ("ssh", "ssh-config", "key"):
        with pytest.raises(SystemExit) as done:
            cli.main([verb, "--help"])
        assert done.value.code == 0
        assert "usage: sessionctl " + verb in capsys.readouterr().out
