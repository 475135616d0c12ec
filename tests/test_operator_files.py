"""The operator's own files and terminal (issue 21, class 10): a damaged known_hosts or key file
is one line naming the file and the agent, on every verb that reaches agents (``pool check``,
``plan --probe``, ``status``); output in a latin-1 or ASCII locale degrades, never crashes."""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit

from . import factories

SESSION_NAME = "files-test"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_with(tmp_path: Path, port: int, **ssh) -> Path:
    """A session on one agent reached over SSH at 127.0.0.1:``port`` with ``ssh`` settings."""
    agent = factories.agent("a1", "unix:///var/run/docker.sock",
                            ssh={"host": "127.0.0.1", "port": port, "user": "ops", **ssh})
    return factories.write_pair(tmp_path, factories.session(SESSION_NAME, size=1),
                                factories.pool("files", agent))


def ed25519_line(host: str = "127.0.0.1") -> tuple[str, str]:
    key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
    if key is None:  # paramiko cannot generate ed25519: go through cryptography
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        public = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
        return public.split()[0], public.split()[1]
    return key.get_name(), key.get_base64()


def blob_of(key_type: str, payload: bytes) -> str:
    name = key_type.encode()
    return base64.b64encode(len(name).to_bytes(4, "big") + name + payload).decode()


KIND, B64 = ed25519_line()
RAW = base64.b64decode(B64)
DAMAGED = {
    "garbage line": ("this is not a known_hosts line at all\n", "line 1: the third field is "
                     "not a base64 key"),
    "too few fields": ("127.0.0.1 ssh-ed25519\n", "line 1: expected `HOSTS KEY-TYPE"),
    "bad base64": (f"127.0.0.1 {KIND} {B64[:-3]}!!\n", "line 1: the third field is not a "
                   "base64 key"),
    "bad padding": (f"# pinned\n127.0.0.1 {KIND} {B64[:-1]}\n", "line 2: the third field is "
                    "not a base64 key"),
    "truncated key": (f"127.0.0.1 {KIND} {base64.b64encode(RAW[:20]).decode()}\n",
                      "line 1: the ssh-ed25519 key is damaged"),
    "truncated type": (f"127.0.0.1 {KIND} {base64.b64encode(RAW[:6]).decode()}\n",
                       "line 1: the ssh-ed25519 key is truncated"),
    "mismatched key type": (f"127.0.0.1 ssh-rsa {B64}\n", "line 1: says ssh-rsa but holds a "
                            "ssh-ed25519 key"),
    "unknown key type": (f"127.0.0.1 ssh-foo {B64}\n", "line 1: says ssh-foo but holds"),
    "not utf-8": (b"127.0.0.1\xff ssh-ed25519 AAAA\n", "line 1 is not UTF-8 text"),
    "unknown marker": (f"@trusted 127.0.0.1 {KIND} {B64}\n", "line 1: unknown marker"),
    "directory": (None, "is a directory, not a known_hosts file"),
    "fifo": ("fifo", "is not a regular file"),
    "socket": ("socket", "No such device or address"),
}


def make_known_hosts(path: Path, content) -> None:
    if content is None:
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)  # reading it would wait forever for a writer
    elif content == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


VERBS = {  # argv after the file, and the exit code a misconfigured agent gives there
    "pool check": (["pool", "check"], Exit.ENGINE),
    "plan --probe": (["plan", "--probe"], Exit.MISSING),
    "status": (["status"], Exit.ENGINE),
}


def run_verb(verb: str, session: Path) -> tuple[int, str]:
    argv, _ = VERBS[verb]
    target = session.parent / "pool.yaml" if verb == "pool check" else session
    return main([*argv[:2], str(target), *argv[2:]] if verb == "pool check"
                else [argv[0], str(target), *argv[1:]]), ""


@pytest.mark.parametrize("verb", list(VERBS))
@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_known_hosts_is_one_line_naming_the_file_and_the_agent(tmp_path, capsys,
                                                                          case, verb):
    content, why = DAMAGED[case]
    known = tmp_path / "known_hosts"
    make_known_hosts(known, content)
    session = session_with(tmp_path, closed_port(), known_hosts=str(known))
    code, _ = run_verb(verb, session)
    out, err = capsys.readouterr()
    assert code == VERBS[verb][1], err
    assert "internal error" not in err and "Traceback" not in err
    mentions = [line for line in err.splitlines() if str(known) in line]
    assert len(mentions) == 1, err
    assert "a1" in mentions[0] and "misconfigured" in mentions[0] and why in mentions[0], err
    assert B64[8:40] not in out + err  # the file's contents are not printed


def test_lines_openssh_writes_that_paramiko_cannot_use_are_not_errors(tmp_path, capsys):
    """A well-formed line of a key type paramiko lacks, a CA line and a hashed host name load;
    the check then fails on the closed port, not on the file."""
    known = tmp_path / "known_hosts"
    salted = paramiko.HostKeys.hash_host("127.0.0.1")
    known.write_text(f"other {'sk-ssh-ed25519@openssh.com'} "
                     f"{blob_of('sk-ssh-ed25519@openssh.com', RAW[19:] + b'ssh:')}\n"
                     f"@cert-authority *.example {KIND} {B64}\n"
                     f"{salted} {KIND} {B64}\n")
    session = session_with(tmp_path, closed_port(), known_hosts=str(known))
    assert main(["pool", "check", str(session.parent / "pool.yaml")]) == Exit.ENGINE
    err = capsys.readouterr().err
    assert "agent a1: unreachable: " in err and "misconfigured" not in err, err


@pytest.mark.parametrize("content, why", [
    (b"not a key\n", "is not a private key paramiko can read"),
    (b"", "is not a private key paramiko can read"),
    (b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n",
     "is not a private key paramiko can read"),
    (None, "is a directory, not a private key file"),
])
@pytest.mark.parametrize("verb", list(VERBS))
def test_a_damaged_key_file_is_one_line_naming_the_file_and_the_agent(tmp_path, capsys, verb,
                                                                      content, why):
    key = tmp_path / "id_agent"
    if content is None:
        key.mkdir()
    else:
        key.write_bytes(content)
    known = tmp_path / "known_hosts"
    known.write_text("")
    session = session_with(tmp_path, closed_port(), known_hosts=str(known), key_file=str(key))
    code, _ = run_verb(verb, session)
    err = capsys.readouterr().err
    assert code == VERBS[verb][1], err
    assert "internal error" not in err
    mentions = [line for line in err.splitlines() if str(key) in line]
    assert len(mentions) == 1 and "a1" in mentions[0] and why in mentions[0], err


# --- a real SSH server (paramiko's own), offering a key the file does not pin -------------------


@pytest.fixture
def ssh_server():
    """127.0.0.1:port speaking SSH with a fresh host key; each connection gets as far as the
    client lets it."""
    host_key = paramiko.RSAKey.generate(2048)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    transports = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            transports.append(t)
            with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
                t.start_server(server=paramiko.ServerInterface())

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], host_key
    server.close()
    for t in transports:
        t.close()


def test_a_changed_host_key_is_one_line_with_both_fingerprints(tmp_path, capsys, ssh_server):
    from cluster_sessions.agents.connectors import fingerprint

    port, offered = ssh_server
    pinned = paramiko.RSAKey.generate(2048)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} ssh-rsa {pinned.get_base64()}\n")
    session = session_with(tmp_path, port, known_hosts=str(known))
    for verb in VERBS:
        code, _ = run_verb(verb, session)
        err = capsys.readouterr().err
        assert code == VERBS[verb][1], err
        line = next(line for line in err.splitlines() if "host key changed" in line)
        assert "a1" in line and str(known) in line
        assert fingerprint(pinned) in line and fingerprint(offered) in line
        assert "internal error" not in err and pinned.get_base64()[:40] not in err


def test_a_key_marked_revoked_is_refused_even_when_pinned(tmp_path, capsys, ssh_server):
    port, offered = ssh_server
    known = tmp_path / "known_hosts"
    name = f"[127.0.0.1]:{port}"
    known.write_text(f"{name} ssh-rsa {offered.get_base64()}\n"
                     f"@revoked {paramiko.HostKeys.hash_host(name)} ssh-rsa "
                     f"{offered.get_base64()}\n")
    session = session_with(tmp_path, port, known_hosts=str(known))
    assert main(["pool", "check", str(session.parent / "pool.yaml")]) == Exit.ENGINE
    err = capsys.readouterr().err
    assert f"which {known} marks @revoked" in err and "agent a1: host key changed" in err, err


def test_the_cli_in_a_process_of_its_own_prints_no_traceback(tmp_path):
    """What an operator's terminal shows (no pytest capture, paramiko's logging as it is)."""
    known = tmp_path / "known_hosts"
    known.write_text(f"127.0.0.1 {KIND} {B64[:-3]}!!\n")
    session = session_with(tmp_path, closed_port(), known_hosts=str(known))
    for argv in (["status", str(session)], ["plan", str(session), "--probe"],
                 ["pool", "check", str(session.parent / "pool.yaml")]):
        proc = subprocess.run([sys.executable, "-m", "cluster_sessions.driver.cli", *argv],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode in (Exit.ENGINE, Exit.MISSING), proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        assert f"known_hosts {known}: line 1: the third field is not a base64 key" in (
            proc.stderr)


# --- a terminal that cannot show every character -----------------------------------------------

LOCALES = {
    "latin-1": {"PYTHONIOENCODING": "latin-1"},
    "ascii": {"PYTHONIOENCODING": "ascii"},
    "C locale": {"LANG": "C", "LC_ALL": "C"},
    "C locale, no UTF-8 mode": {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0",
                                "PYTHONCOERCECLOCALE": "0"},
}
PAIRS = Path(__file__).parent / "fixtures" / "diff"


@pytest.mark.parametrize("locale", list(LOCALES))
def test_output_degrades_instead_of_crashing_where_the_terminal_lacks_characters(tmp_path,
                                                                                 locale):
    """The diff's arrows and ellipses, env values and file names that are not ASCII: each verb
    exits as it would in a UTF-8 terminal, and what the encoding lacks is spelled as escapes."""
    pool = PAIRS / "pools" / "one.yaml"
    text = (PAIRS / "env" / "new.yaml").read_text().replace("pool: ../pools/one.yaml",
                                                            f"pool: {pool}")
    new = tmp_path / "naïve→new.yaml"
    new.write_text(text.replace('"lr sweep | 2"', '"naïve → ≥ ☃ ' + "x" * 100 + '"'))
    old = tmp_path / "old.yaml"
    old.write_text((PAIRS / "env" / "old.yaml").read_text().replace(
        "pool: ../pools/one.yaml", f"pool: {pool}"))
    bad = tmp_path / "bad→.yaml"
    bad.write_text(text.replace("image:", "ïmage:"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIO", "LANG"))}
    env.update(LOCALES[locale])
    for argv, code in ((["diff", str(old), str(new)], Exit.OK),
                       (["plan", str(new), "--json"], Exit.OK),
                       (["plan", str(new)], Exit.OK),
                       (["validate", str(new), str(bad)], Exit.INVALID),
                       (["plan", str(bad)], Exit.INVALID),
                       (["render", str(new), "--out", str(tmp_path / "out")], Exit.OK)):
        proc = subprocess.run([sys.executable, "-m", "cluster_sessions.driver.cli", *argv],
                              capture_output=True, env=env, timeout=60)
        err = proc.stderr.decode("latin-1")
        assert proc.returncode == code, (argv, err)
        assert "Error" not in err and "internal error" not in err, (argv, err)
        shown = proc.stdout.decode("latin-1")
        if argv[0] == "diff":
            assert "\\u2192" in shown or "→".encode() in proc.stdout
        if argv[0] == "validate":
            assert "ïmage" in err or "\\xefmage" in err or "ïmage".encode() in proc.stderr
