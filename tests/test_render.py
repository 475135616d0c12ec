"""render: the files each container runs, checked as text (no shell, no engine).

The scripts themselves run in tests/test_cluster_env_sh.py (dash, busybox) and in real
containers in tests/test_runtime.py.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cluster_sessions
from cluster_sessions.core import render as render_module
from cluster_sessions.core.keys import KeyPair, generate_session_keys, new_keypair
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.render import (
    BUNDLE_DIR,
    PRIVSEP_DIR,
    RUN_DIR,
    TEMPLATES,
    RenderedFile,
    certificate,
    compact_shell,
    entrypoint_argv,
    known_hosts,
    pack,
    pack_entrypoint_argv,
    public_key,
    render_container,
    render_session,
    session_hosts_joined,
    shname,
    shquote,
    shwords,
    without_comment_lines,
    word,
)
from cluster_sessions.core.spec import SSH_PORT, Pool, Session

from . import factories
from .conftest import skip_or_fail

POOL = Pool.model_validate({"kind": "AgentPool", "name": "p", "agents": [
    {"name": "a1", "docker_host": "unix:///x", "capacity": {"cpu": 64, "mem": "256g"}}]})
REQUIRED = {"entrypoint.sh", "cluster-env.sh", "static-env.sh", "user-env.sh", "exec-env.sh",
            "save-env.sh", "as-user.sh", "wait-peers.bash", "hostfile", "hostfile.hydra",
            "cluster-hosts.sh",
            "setup.sh", "wait-peers.sh", "command.sh", "ssh-session.sh",
            "profile.sh", "sshd_config", "ssh/config", "ssh/known_hosts", "ssh/authorized_keys",
            "ssh/id_cluster", "ssh/id_cluster.pub", "ssh/ssh_host_ed25519_key",
            "ssh/ssh_host_ed25519_key.pub", "ssh/ssh_host_ed25519_key-cert.pub", "ssh/user_ca.pub"}
SECRET = {"ssh/id_cluster", "ssh/ssh_host_ed25519_key"}


def make_session(size: int = 4, **over) -> Session:
    return Session.model_validate(
        {**factories.session("render-test", "p", size=size, env={"FOO": "bar"}), **over})


def render(size: int = 4, **over):
    plan = build_plan(make_session(size, **over), POOL)
    keys = generate_session_keys(plan.hosts)
    return plan, keys, render_session(plan, keys)


def by_path(files: list[RenderedFile]) -> dict[str, RenderedFile]:
    return {f.path: f for f in files}


def test_every_container_gets_the_whole_bundle_with_modes_and_secrets_flagged():
    plan, _, bundles = render()
    assert list(bundles) == ["main1", "sub1", "sub2", "sub3"]
    for files in bundles.values():
        files = by_path(files)
        assert set(files) == REQUIRED
        for path, f in files.items():
            assert f.secret == (path in SECRET), path
            if f.secret:
                assert f.mode == 0o600, path
            elif path in ("entrypoint.sh", "ssh-session.sh"):
                assert f.mode == 0o755, path
            else:
                assert f.mode == 0o644, path
            assert f.content.endswith("\n"), path


def test_the_file_set_does_not_depend_on_the_keys():
    plan = build_plan(make_session(), POOL)
    one, two = (render_container(plan, plan.containers[1], generate_session_keys(plan.hosts))
                for _ in range(2))
    assert [(f.path, f.mode, f.secret) for f in one] == [(f.path, f.mode, f.secret) for f in two]


def test_no_private_key_text_outside_the_secret_files():
    _, keys, bundles = render()
    private = [keys.user.private_openssh, *(k.private_openssh for k in keys.hosts.values())]
    # every line of every private key's body, so that no part of one leaks either
    fragments = {line for p in private for line in p.splitlines() if len(line) > 20}
    for files in bundles.values():
        for f in files:
            if f.secret:
                continue
            assert "PRIVATE KEY" not in f.content, f.path
            assert not [x for x in fragments if x in f.content], f.path


def test_the_secret_files_hold_the_user_key_and_the_containers_own_host_key():
    _, keys, bundles = render()
    for host, files in bundles.items():
        files = by_path(files)
        assert files["ssh/id_cluster"].content.strip() == keys.user.private_openssh.strip()
        assert files["ssh/id_cluster.pub"].content.strip() == keys.user.public_openssh
        own = keys.hosts[host]
        assert files["ssh/ssh_host_ed25519_key"].content.strip() == own.private_openssh.strip()
        assert files["ssh/ssh_host_ed25519_key.pub"].content.strip() == own.public_openssh


def test_a_rendered_file_never_shows_a_private_key_in_its_repr():
    _, keys, bundles = render()
    secret = by_path(bundles["main1"])["ssh/id_cluster"]
    assert "PRIVATE" not in repr(secret) and keys.user.private_openssh not in repr(secret)


@pytest.mark.parametrize("size", [1, 5, 512])
def test_known_hosts_is_one_cert_authority_line_for_the_session_ca_whatever_the_size(size):
    plan, keys, bundles = render(size=size)
    texts = {by_path(files)["ssh/known_hosts"].content for files in bundles.values()}
    assert len(texts) == 1, "every container has the same known_hosts"
    lines = [line for line in texts.pop().splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1, lines
    marker, patterns, key = lines[0].split(" ", 2)
    assert marker == "@cert-authority" and key == keys.ca.public_openssh
    patterns = patterns.split(",")
    # every host of the largest session matches, on the ssh port and without it (HostKeyAlias)
    for host in ("main1", "sub1", "sub12", "sub512", "sub2047"):
        assert any(fnmatch.fnmatchcase(host, p) for p in patterns), host
        assert any(fnmatch.fnmatchcase(f"[{host}]:{SSH_PORT}", p.replace("[", "[[]"))
                   for p in patterns), host
    for other in ("github.com", "main2", "sub12345", "[main1]:22"):
        assert not any(fnmatch.fnmatchcase(other, p.replace("[", "[[]")) for p in patterns)


def test_authorized_keys_holds_the_session_user_key_only():
    _, keys, bundles = render()
    for files in bundles.values():
        lines = by_path(files)["ssh/authorized_keys"].content.splitlines()
        assert lines == [f"{keys.user.public_openssh} cluster-session:render-test"]


def test_ssh_client_config_names_every_host_with_port_user_key_and_strict_checking():
    plan, _, bundles = render(size=3, user={"name": "alice", "uid": 1234, "gid": 4321})
    config = by_path(bundles["sub1"])["ssh/config"].content
    options = [line.split(None, 1) for line in config.splitlines()
               if line.strip() and not line.lstrip().startswith("#")]
    # every host of any session by pattern (the file does not grow with the session)
    assert options[0] == ["Host", "main1 sub? sub?? sub??? sub???? !*.*"]
    settings = dict((k, v) for k, v in options[1:])
    assert settings["Port"] == str(SSH_PORT)
    assert settings["User"] == "alice"
    assert settings["IdentityFile"] == "~/.ssh/id_cluster"
    assert settings["IdentitiesOnly"] == "yes"
    assert settings["StrictHostKeyChecking"] == "yes"
    assert settings["UserKnownHostsFile"] == "~/.ssh/known_hosts"


def test_sshd_config_is_port_2200_keys_only_no_root_and_runs_every_session_through_the_wrapper():
    _, _, bundles = render(user={"name": "alice", "uid": 1234, "gid": 4321})
    config = by_path(bundles["sub2"])["sshd_config"].content
    settings = dict(line.split(None, 1) for line in config.splitlines()
                    if line.strip() and not line.startswith("#"))
    assert settings["Port"] == "2200"
    assert settings["PermitRootLogin"] == "no"
    assert settings["PasswordAuthentication"] == "no"
    assert settings["KbdInteractiveAuthentication"] == "no"
    assert settings["AuthenticationMethods"] == "publickey"
    assert settings["UsePAM"] == "no"
    assert settings["AllowUsers"] == "alice"
    assert settings["HostKey"] == "/run/cluster-session/ssh/ssh_host_ed25519_key"
    assert settings["ForceCommand"] == "/bin/sh /run/cluster-session/ssh-session.sh"
    # the session key, ready before sshd starts (root's, in the 0711 ssh/), then the user's
    assert settings["AuthorizedKeysFile"] == (
        "/run/cluster-session/ssh/authorized_keys .ssh/authorized_keys")


def test_entrypoint_carries_user_peers_and_readiness_timeout_from_the_definition():
    _, _, bundles = render(size=4, user={"name": "alice", "uid": 1234, "gid": 4321},
                           readiness={"timeout": 42})
    files = by_path(bundles["sub2"])
    script = files["setup.sh"].content
    # the peers are derived at start from BACKENDAI_CLUSTER_HOSTS: no host is named here
    assert '/bin/sh "$bundle/wait-peers.sh" "$run/ssh" $peers || exit\n' in script
    assert '/bin/sh "$bundle/cluster-hosts.sh" "$bundle" "$hosts"' in script
    assert "all 3 peers answer" in script
    for name in ("entrypoint.sh", "setup.sh"):
        assert "sub1" not in files[name].content and "sub3" not in files[name].content
    assert "timeout=42\n" in files["wait-peers.sh"].content
    assert "setpriv --reuid=1234 --regid=4321 --init-groups --" in files["as-user.sh"].content
    assert script.endswith('set -- "$bundle/command.sh" "$home" "$shell" "$@"\n'
                           '. "$bundle/as-user.sh"\n')
    assert "name=alice\n" in script


def test_a_single_container_waits_for_no_peer():
    _, _, bundles = render(size=1)
    script = by_path(bundles["main1"])["setup.sh"].content
    assert '/bin/sh "$bundle/wait-peers.sh"' not in script
    assert "no peers" in script


def test_static_env_holds_the_containers_env_each_only_if_unset():
    plan, _, bundles = render(env={"FOO": "it's $(x)"})
    static = by_path(bundles["sub1"])["static-env.sh"].content
    assert "FOO" not in static
    for name in plan.containers[1].env:
        if name == "BACKENDAI_CLUSTER_HOSTS":  # built by a loop, the file the same for any N
            assert 'if [ -z "${BACKENDAI_CLUSTER_HOSTS+x}" ]; then' in static
            assert "main1,sub" not in static
            continue
        assert f'[ -n "${{{name}+x}}" ] || export {name}=' in static


def test_the_definitions_env_is_only_in_the_bundle_never_in_the_containers_env():
    plan, _, bundles = render(env={"FOO": "it's $(x)", "PATH": "/home/work/bin:/usr/bin",
                                   "LD_PRELOAD": "/x.so"})
    for c in plan.containers:
        assert set(c.env) == {k for k in c.env if k.startswith("BACKENDAI_")}, c.env
        assert dict(c.user_env) == {"FOO": "it's $(x)", "PATH": "/home/work/bin:/usr/bin",
                                    "LD_PRELOAD": "/x.so"}
        assert c.exec_env == {"LD_PRELOAD": "/x.so"}
    user = by_path(bundles["sub1"])["user-env.sh"].content
    assert """\nexport FOO='it'"'"'s $(x)'\n""" in user  # over the container's env, as Docker's
    assert "export PATH=/home/work/bin:/usr/bin\n" in user
    assert "LD_PRELOAD" not in user  # exec-env.sh puts it on the exec only


def test_entrypoint_argv_runs_the_bundled_entrypoint_with_sh():
    assert entrypoint_argv() == ["/bin/sh", "/opt/cluster-session/entrypoint.sh"]
    assert BUNDLE_DIR == "/opt/cluster-session"


def test_missing_host_key_is_refused():
    plan = build_plan(make_session(3), POOL)
    keys = generate_session_keys(["main1", "sub1"])
    with pytest.raises(ValueError, match="sub2"):
        render_session(plan, keys)


def test_a_container_of_another_session_is_refused():
    plan = build_plan(make_session(2), POOL)
    other = build_plan(make_session(2, name="other-session"), POOL)
    with pytest.raises(ValueError, match="not a container"):
        render_container(plan, other.containers[0], generate_session_keys(plan.hosts))


def test_a_malformed_public_key_is_refused():
    plan = build_plan(make_session(2), POOL)
    keys = generate_session_keys(plan.hosts)
    bad = type(keys)(type(keys.user)(new_keypair().private_openssh, "ssh-ed25519 AAA\nx"),
                     keys.hosts, keys.ca, keys.host_certs)
    with pytest.raises(ValueError, match="public key"):
        render_session(plan, bad)


SHELL_TEMPLATE_VALUE = re.compile(
    r"\{\{-?\s*(?P<expr>.*?)\s*-?\}\}", re.DOTALL)


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.j2")))
def test_every_interpolated_value_goes_through_a_quoting_filter(template):
    text = (TEMPLATES / template).read_text()
    if template.endswith((".sh.j2", ".bash.j2")):
        allowed = (r"\|\s*shquote", r"\|\s*shname", r"\|\s*shwords",
                   r"\|\s*map\('shquote'\)\|join\(' '\)")
    else:
        allowed = (r"\|\s*word", r"\|\s*public_key")
    for match in SHELL_TEMPLATE_VALUE.finditer(text):
        expr = match["expr"]
        assert any(re.search(f"{a}$", expr) for a in allowed), f"{template}: {{{{ {expr} }}}}"


def test_no_template_names_the_bundles_directory():
    """The entrypoint finds its files in its own directory, wherever it is mounted: a path to
    the bundle is derived from there (CLUSTER_SESSION_DIR), never written into a template."""
    bundle_dir = BUNDLE_DIR.rstrip("/")
    for template in sorted(TEMPLATES.glob("*.j2")):
        text = template.read_text()
        assert bundle_dir not in text, f"{template.name} hard-codes {bundle_dir}"
        assert not re.search(r"\{\{[^}]*bundle_dir", text), f"{template.name} uses bundle_dir"
    _, _, bundles = render(size=3)
    for files in bundles.values():
        for f in files:
            assert bundle_dir not in f.content, f"{f.path} names {bundle_dir}"


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_every_rendered_script_parses_as_posix_sh(shell, tmp_path):
    found = shutil.which(shell)
    if found is None:
        skip_or_fail(f"{shell} is not installed (apt-get install {shell})")
    _, _, bundles = render(env={"X": "a\n'b'\n$(c)"})
    for f in bundles["sub1"]:
        if f.path.endswith(".sh"):
            path = tmp_path / f.path.replace("/", "_")
            path.write_text(f.content)
            command = [found, "-n", str(path)] if shell == "dash" else [found, "sh", "-n",
                                                                          str(path)]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            assert result.returncode == 0, f"{f.path}: {result.stderr}"


def test_render_imports_no_pulumi_and_touches_nothing():
    code = ("import sys; import cluster_sessions.core.render; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pulumi', 'pulumi_docker', 'docker', 'paramiko')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env={"PYTHONPATH": str(Path(cluster_sessions.__file__)
                                                               .resolve().parents[1])})
    assert result.stdout.strip() == "[]"


# --- pack: the bundle as one sh script (what the Pulumi Session uploads) ------------------------

SHELLS = {"dash": ["dash"], "busybox": ["busybox", "sh"]}
# any text but NUL (a shell word cannot hold it, and no rendered file does), surrogates excluded
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=300)
AWKWARD = ["", "no newline at the end", "it's \"$(rm -rf /)\" `id` $HOME ${x} \\n %s %%",
           "\n\n\r\n\t trailing blanks \n\n", "unicode: \u00e9\u4e2d\U0001f600\n",
           "'", "''\n'", "-n", "--", "\\"]
NAMES = ["entrypoint.sh", "cluster-env.sh", "sshd_config", "ssh/config", "ssh/id_cluster",
         "ssh/known_hosts", "a/b/c", "-dash", "sp ace"]
MODES = [0o600, 0o644, 0o755, 0o700, 0o640]


def shell_command(shell: str) -> list[str]:
    found = shutil.which(SHELLS[shell][0])
    if found is None:
        skip_or_fail(f"{shell} is not installed (apt-get install {shell})")
    return [found, *SHELLS[shell][1:]]


def unpack(command: list[str], script: str, directory: Path,
           check: bool = True) -> subprocess.CompletedProcess:
    path = directory.parent / f"{directory.name}.pack"
    path.write_text(script, encoding="utf-8")
    return subprocess.run([*command, str(path), str(directory)], capture_output=True,
                          check=check, env={"PATH": os.environ["PATH"]})


def assert_unpacked(directory: Path, files: list[RenderedFile]) -> None:
    found = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    assert found == sorted(f.path for f in files)
    for f in files:
        path = directory / f.path
        assert path.read_bytes() == f.content.encode("utf-8"), f.path
        assert path.stat().st_mode & 0o7777 == f.mode, f.path


@st.composite
def bundles(draw) -> list[RenderedFile]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    return [RenderedFile(name, draw(st.one_of(st.sampled_from(AWKWARD), TEXT)),
                         draw(st.sampled_from(MODES)), secret=name.startswith("ssh/id"))
            for name in names]


@pytest.mark.parametrize("shell", sorted(SHELLS))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=bundles())
def test_a_pack_recreates_every_file_byte_for_byte_with_its_mode(shell, files):
    command = shell_command(shell)
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "bundle"
        unpack(command, pack(files), target)
        assert_unpacked(target, files)
        unpack(command, pack(files), target)  # again, over the first (docker restart)
        assert_unpacked(target, files)


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_a_rendered_bundle_unpacks_exactly_and_keeps_private_keys_private(shell, tmp_path):
    command = shell_command(shell)
    _, _, bundles_by_host = render(env={"X": "a\n'b'\n$(c)", "Y": "\u00e9`d`"})
    files = bundles_by_host["sub1"]
    target = tmp_path / "bundle"
    unpack(command, pack(files), target)  # one pack, as the Session sends it
    assert_unpacked(target, files)
    assert (target / "ssh").stat().st_mode & 0o777 == 0o700  # holds the private keys
    assert target.stat().st_mode & 0o777 == 0o755
    assert not [p for p in target.rglob(".*")], "temporary files left behind"


def test_a_pack_is_deterministic_and_refuses_paths_outside_the_bundle():
    files = [RenderedFile("a", "x", 0o644), RenderedFile("ssh/k", "k", 0o600, secret=True)]
    assert pack(files) == pack(list(files))
    for bad in ("/etc/passwd", "../x", "a/../../x", "./a", ""):
        with pytest.raises(ValueError, match="outside the bundle"):
            pack([RenderedFile(bad, "x", 0o644)])


def test_a_pack_that_cannot_write_fails(tmp_path):
    command = shell_command("dash")
    blocker = tmp_path / "bundle"
    blocker.write_text("a file where the directory should be")
    result = unpack(command, pack([RenderedFile("a", "x", 0o644)]), blocker, check=False)
    assert result.returncode != 0


def test_a_first_unpack_starts_no_rm_and_a_later_one_replaces_a_planted_link(tmp_path):
    # Each program a pack starts costs the container CPU before sshd listens (issue 22): into
    # an empty directory it needs only mkdir and chmod.
    command = shell_command("dash")
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("mkdir", "chmod"):
        (tools / tool).symlink_to(shutil.which(tool))
    files = [RenderedFile("entrypoint.sh", "x\n", 0o755),
             RenderedFile("ssh/k", "k\n", 0o600, secret=True)]
    target = tmp_path / "bundle"
    target.mkdir()
    script = tmp_path / "bundle.pack"
    script.write_text(pack(files))
    first = subprocess.run([*command, str(script), str(target)], capture_output=True,
                           text=True, check=False, env={"PATH": str(tools)})
    assert first.returncode == 0, first.stderr
    assert_unpacked(target, files)
    victim = tmp_path / "victim"
    victim.write_text("v")
    (target / "ssh" / "k").unlink()
    (target / "ssh" / "k").symlink_to(victim)
    unpack(command, pack(files), target)
    assert victim.read_text() == "v"
    assert_unpacked(target, files)


def pack_entrypoint(tmp: Path) -> tuple[list[str], Path, Path]:
    """pack_entrypoint_argv with its directories moved under ``tmp``, for running it here: the
    packs' (BUNDLE_DIR, made), the bundle's (RUN_DIR) and sshd's (PRIVSEP_DIR)."""
    argv = pack_entrypoint_argv()
    packs, run = tmp / "packs", tmp / "run"
    packs.mkdir()
    run.mkdir()  # the container's tmpfs
    script = argv[2]
    for old, new in ((BUNDLE_DIR, packs), (RUN_DIR, run), (PRIVSEP_DIR, tmp / "privsep")):
        assert old in script
        script = script.replace(old, str(new))
    return [*argv[:2], script, *argv[3:]], packs, run


def current_umask() -> str:
    mask = os.umask(0)
    os.umask(mask)
    return f"{mask:04o}"


def test_pack_entrypoint_argv_unpacks_then_sources_setup_with_the_command(tmp_path):
    argv = pack_entrypoint_argv()
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3] == "entrypoint"
    assert argv[2].endswith(f' {RUN_DIR} "$(umask)" "${{BACKENDAI_CLUSTER_HOSTS-}}" "$@"')
    assert argv[2].count('. "$bundle/setup.sh"') == 1  # the same process goes on
    assert entrypoint_argv() == ["/bin/sh", f"{BUNDLE_DIR}/entrypoint.sh"]  # for mounts
    if os.geteuid() != 0:
        pytest.skip("the pack entrypoint insists on root, as the entrypoint does")
    argv, packs, run = pack_entrypoint(tmp_path)
    setup = RenderedFile("setup.sh", 'printf "%s|" "$@"; cat "$1/ssh/k"; . "$2"'
                         '; printf "|%s" "$X"\n', 0o644)
    (packs / "public.pack").write_text(pack([setup]))
    (packs / "secret.pack").write_text(pack([RenderedFile("ssh/k", "K", 0o600, secret=True)]))
    # the command as docker appends it; the container's env is saved exactly as it came
    out = subprocess.run([*argv, "sleep", "a b", "$x"], capture_output=True, text=True,
                         check=False, env={"PATH": os.environ["PATH"], "X": "it's\n$(x)",
                                           "BACKENDAI_CLUSTER_HOSTS": "main1,sub1"})
    assert (out.returncode, out.stdout, out.stderr) == (
        0, f"{run}|{run}/container-env|{current_umask()}|main1,sub1|sleep|a b|$x|K|"
        "it's\n$(x)", "")
    assert (run / "ssh").stat().st_mode & 0o777 == 0o711  # sshd reads authorized_keys there
    assert (run / "ssh" / "k").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "privsep").stat().st_mode & 0o777 == 0o711
    assert (run / "container-env").stat().st_mode & 0o777 == 0o640

    (packs / "secret.pack").write_text("exit 3\n")
    out = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    assert out.returncode == 70
    assert "cannot unpack" in out.stderr and "secret.pack" in out.stderr

    for p in packs.glob("*.pack"):
        p.unlink()
    out = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    assert out.returncode == 70 and "no *.pack" in out.stderr


def test_a_real_sshd_accepts_the_rendered_config(tmp_path):
    """The entrypoint no longer runs ``sshd -t`` at every start: the config is checked here."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.access(sshd, os.X_OK):
        skip_or_fail("no sshd here (apt-get install openssh-server)")
    if os.geteuid() != 0:
        pytest.skip("sshd -t checks its privilege-separation directory as root")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    _, _, bundles = render(size=2)
    files = by_path(bundles["sub1"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = files["sshd_config"].content.replace(RUN_DIR, str(run_dir))
    assert str(run_dir) in config
    (run_dir / "sshd_config").write_text(config)
    (run_dir / "ssh").mkdir(mode=0o711)
    key = run_dir / "ssh" / "ssh_host_ed25519_key"
    key.write_text(files["ssh/ssh_host_ed25519_key"].content)
    key.chmod(0o600)
    for name in ("ssh_host_ed25519_key-cert.pub", "user_ca.pub", "authorized_keys"):
        (run_dir / "ssh" / name).write_text(files[f"ssh/{name}"].content)
    result = subprocess.run([sshd, "-t", "-f", str(run_dir / "sshd_config")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr  # no deprecated or unknown option either
    broken = run_dir / "broken_config"
    broken.write_text(config + "NoSuchOption yes\n")
    result = subprocess.run([sshd, "-t", "-f", str(broken)], capture_output=True, text=True,
                            check=False)
    assert result.returncode != 0


def test_files_the_same_in_every_container_are_rendered_once_per_session():
    plan, keys, bundles = render(size=3)
    shared = {path: [by_path(files)[path].content for files in bundles.values()]
              for path in ("ssh/config", "ssh/known_hosts", "ssh/authorized_keys", "hostfile",
                           "hostfile.hydra")}
    for path, texts in shared.items():
        assert all(t is texts[0] for t in texts), f"{path} rendered once per container"
    # another session, or the same plan with other keys, never gets the first one's files
    other_keys = generate_session_keys(plan.hosts)
    again = by_path(render_container(plan, plan.containers[0], other_keys))
    assert again["ssh/known_hosts"].content != shared["ssh/known_hosts"][0]
    assert again["ssh/authorized_keys"].content != shared["ssh/authorized_keys"][0]
    assert other_keys.ca.public_openssh in again["ssh/known_hosts"].content
    bigger, _, bundles4 = render(size=4)
    assert "sub3" in by_path(bundles4["main1"])["hostfile"].content
    assert bigger is not plan


@pytest.mark.parametrize("directory", [True, False], ids=["render-out", "uploaded"])
def test_every_rendered_shell_file_passes_shellcheck(tmp_path, directory):
    """Every shell file a container runs: the bundle's scripts, a pack of the bundle and the
    pack entrypoint (SC1091, "not following a sourced file", only says the sourced files are
    checked on their own); as ``render --out`` writes them and as a container is sent them
    (without the comment lines)."""
    found = shutil.which("shellcheck")
    if found is None:
        skip_or_fail("shellcheck is not installed (apt-get install shellcheck)")
    plan = build_plan(make_session(3, env={"X": "a\n'b'\n$(c)", "LD_PRELOAD": "/x.so",
                                           "BASH_ENV": "`y`"}), POOL)
    bundles = render_session(plan, generate_session_keys(plan.hosts), directory=directory)
    files = bundles["sub1"]
    scripts = [f for f in files if f.path.endswith(".sh")]
    assert {f.path for f in scripts} >= {"entrypoint.sh", "setup.sh", "wait-peers.sh",
                                         "command.sh", "cluster-env.sh",
                                         "static-env.sh", "user-env.sh", "exec-env.sh",
                                         "save-env.sh", "as-user.sh", "ssh-session.sh",
                                         "profile.sh"}
    paths = []
    for f in scripts:
        path = tmp_path / f.path
        path.write_text(f.content)
        paths.append(path)
    job = by_path(render(size=2, type="batch", command=["sh", "-c", "exit 3"])[2]["main1"])
    assert "job exited with code" in job["command.sh"].content
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "command.sh").write_text(job["command.sh"].content)
    paths.append(tmp_path / "job" / "command.sh")
    (tmp_path / "bundle.pack").write_text(pack(files))
    (tmp_path / "pack-entrypoint.sh").write_text(pack_entrypoint_argv()[2])
    paths += [tmp_path / "bundle.pack", tmp_path / "pack-entrypoint.sh"]
    result = subprocess.run([found, "--shell=sh", "--exclude=SC1091", "--format=gcc",
                             *map(str, paths)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    bash = tmp_path / "wait-peers.bash"
    bash.write_text(by_path(files)["wait-peers.bash"].content)
    result = subprocess.run([found, "--shell=bash", "--format=gcc", str(bash)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.sh"
    broken.write_text('x=$1\nrm -rf $x/*\n')
    assert subprocess.run([found, "--shell=sh", str(broken)], capture_output=True,
                          check=False).returncode != 0


@pytest.mark.parametrize("over, slots", [
    ({}, 1),
    ({"resources": {"gpu": 2}}, 2),
    ({"resources": {"gpu": 4}, "distributed": {"slots": 3}}, 3),
    ({"distributed": {"slots": 8}}, 8),
])
def test_hostfiles_list_every_host_in_rank_order_with_its_slots(over, slots):
    plan, _, bundles = render(size=3, **over)
    assert [c.slots for c in plan.containers] == [slots] * 3
    for files in bundles.values():
        files = by_path(files)
        assert files["hostfile"].content == "".join(
            f"{h} slots={slots}\n" for h in ("main1", "sub1", "sub2"))
        assert files["hostfile.hydra"].content == "".join(
            f"{h}:{slots}\n" for h in ("main1", "sub1", "sub2"))
        assert files["hostfile"].mode == 0o644 and not files["hostfile"].secret


# --- the pure parts, value by value (mutation testing found them unchecked) ----------------------

def test_a_rendered_files_repr_shows_its_size_or_that_it_is_secret():
    assert repr(RenderedFile("a b", "xyz\n", 0o644)) == (
        "RenderedFile('a b', <4 characters>, mode=644, secret=False)")
    assert repr(RenderedFile("ssh/k", "KEY", 0o600, secret=True)) == (
        "RenderedFile('ssh/k', <secret>, mode=600, secret=True)")


def test_the_quoting_filters_quote_each_value_as_one_word():
    assert shquote(3) == "3" and shquote("a b") == "'a b'" and shquote("") == "''"
    assert shquote("it's") == "'it'\"'\"'s'"
    assert shwords(["a b", 1, "", "$x"]) == "'a b' 1 '' '$x'"
    assert shwords([]) == ""
    assert shname("_A1") == "_A1" and word("user@host:/p,q+r=s~t-u_v.w") == (
        "user@host:/p,q+r=s~t-u_v.w")
    key = "ssh-ed25519 AAAAC3Nza+/9=="
    assert public_key(f"  {key}\n") == key
    assert certificate(" ssh-ed25519-cert-v01@openssh.com AAAA/+1=\n") == (
        "ssh-ed25519-cert-v01@openssh.com AAAA/+1=")


@pytest.mark.parametrize("check, value, message", [
    (shname, "1A", "not a shell variable name: '1A'"),
    (shname, "A-B", "not a shell variable name: 'A-B'"),
    (shname, "", "not a shell variable name: ''"),
    (word, "a b", "cannot be written into an ssh configuration file: 'a b'"),
    (word, "a#b", "cannot be written into an ssh configuration file: 'a#b'"),
    (word, "", "cannot be written into an ssh configuration file: ''"),
    (public_key, "ssh-rsa AAAA", "not an ssh-ed25519 public key in OpenSSH format"),
    (public_key, "ssh-ed25519 AAAA=== x", "not an ssh-ed25519 public key in OpenSSH format"),
    (public_key, "ssh-ed25519-cert-v01@openssh.com AAAA",
     "not an ssh-ed25519 public key in OpenSSH format"),
    (certificate, "ssh-ed25519 AAAA", "not an ssh-ed25519 certificate in OpenSSH format"),
    (certificate, "ssh-ed25519-cert-v01@opensshXcom AAAA",
     "not an ssh-ed25519 certificate in OpenSSH format"),
])
def test_the_filters_refuse_what_their_format_cannot_carry(check, value, message):
    with pytest.raises(ValueError) as refused:
        check(value)
    assert str(refused.value) == message


@pytest.mark.parametrize("hosts, joined", [
    (["main1"], "main1"),
    (["main1", "sub1", "sub2"], "main1,sub1,sub2"),
    ([], ""),
    (["main1", "sub2"], ""),
    (["main1", "sub1", "sub3"], ""),
    (["main2", "sub1"], ""),
    (["sub1", "main1"], ""),
    (["main1", "main1"], ""),
])
def test_session_hosts_are_spelled_out_only_when_they_are_the_usual_names(hosts, joined):
    assert session_hosts_joined(hosts) == joined


@pytest.mark.parametrize("source, kept", [
    ("#!/bin/sh\n# a comment\n  # indented\n\t# tabbed\necho 1 # not a whole line\n"
     "# shellcheck disable=SC2016\n#!not the first line\nx='\n# in a value\n'\n#\n#last",
     "#!/bin/sh\necho 1 # not a whole line\n# shellcheck disable=SC2016\n#!not the first line\n"
     "x='\n'\n#last"),
    ("# what made this file\n# more\nPort 2200\n", "# what made this file\nPort 2200\n"),
    ("# only a first line", "# only a first line"),
    ("", ""),
    ("a\n#shellcheck without a space\n", "a\n"),
])
def test_without_comment_lines_keeps_the_first_line_and_shellcheck_directives(source, kept):
    assert without_comment_lines(source) == kept


def test_a_container_is_sent_its_files_without_comment_lines_and_without_hostfiles():
    plan = build_plan(make_session(3), POOL)
    keys = generate_session_keys(plan.hosts)
    out = by_path(render_container(plan, plan.containers[1], keys, directory=True))
    sent = by_path(render_container(plan, plan.containers[1], keys))  # the default
    assert set(out) - set(sent) == {"hostfile", "hostfile.hydra"} and set(sent) <= set(out)
    for path, f in sent.items():
        # run by /bin/sh in a container: no execute bits, so unpacking needs no chmod
        assert f.mode == out[path].mode & 0o666 and f.secret == out[path].secret, path
        assert f.mode == (0o600 if f.secret else 0o644), path
        first, *rest = f.content.splitlines()
        assert first == out[path].content.splitlines()[0], path
        comments = [line for line in rest if line.lstrip().startswith("#")
                    and not line.lstrip().startswith(("#!", "# shellcheck "))]
        assert comments == [], path
        if path in ("entrypoint.sh", "ssh/known_hosts", "sshd_config"):
            assert len(out[path].content) > len(f.content), path
    # the session-wide files of one kind are never given out as the other's
    again = by_path(render_container(plan, plan.containers[2], keys, directory=True))
    assert again["ssh/known_hosts"].content == out["ssh/known_hosts"].content
    assert by_path(render_container(plan, plan.containers[0], keys))[
        "ssh/known_hosts"].content == sent["ssh/known_hosts"].content
    assert render_session(plan, keys, directory=False)["sub1"] == list(sent.values())


def test_known_hosts_is_what_every_container_is_sent():
    plan = build_plan(make_session(2), POOL)
    keys = generate_session_keys(plan.hosts)
    sent = by_path(render_container(plan, plan.containers[0], keys))["ssh/known_hosts"]
    text = known_hosts("render-test", keys.ca.public_openssh)
    assert text == sent.content
    port = SSH_PORT
    assert text == (
        "# the session CA of render-test -- rendered by cluster_sessions.render. It signed every\n"
        f"@cert-authority main1,sub?,sub??,sub???,sub????,[main1]:{port},[sub?]:{port},"
        f"[sub??]:{port},[sub???]:{port},[sub????]:{port} {keys.ca.public_openssh}\n")


def test_the_secret_files_hold_each_private_key_exactly_with_one_final_newline():
    plan = build_plan(make_session(2), POOL)
    keys = generate_session_keys(plan.hosts)
    files = by_path(render_container(plan, plan.containers[1], keys))
    assert keys.user.private_openssh.endswith("\n")
    assert files["ssh/id_cluster"].content == keys.user.private_openssh
    assert files["ssh/ssh_host_ed25519_key"].content == keys.hosts["sub1"].private_openssh
    assert files["ssh/ssh_host_ed25519_key-cert.pub"].content == keys.host_certs["sub1"] + "\n"
    assert files["ssh/user_ca.pub"].content == keys.ca.public_openssh + "\n"
    bare = dataclasses.replace(keys, user=KeyPair(keys.user.private_openssh.rstrip("\n"),
                                                  keys.user.public_openssh))
    files = by_path(render_container(plan, plan.containers[1], bare))
    assert files["ssh/id_cluster"].content == keys.user.private_openssh


NO_CA = "the session keys have no CA or not every host certificate (keys.with_hosts adds them)"


def test_keys_without_a_host_key_a_ca_or_a_certificate_are_refused_word_for_word():
    plan = build_plan(make_session(4), POOL)
    complete = generate_session_keys(plan.hosts)
    render_container(plan, plan.containers[0], complete)  # checked once, then remembered
    few = generate_session_keys(["main1", "sub2"])
    cases = [
        (few, "the session keys have no host key for sub1, sub3"),
        (dataclasses.replace(complete, ca=None),
         "the session keys have no CA or not every host certificate (keys.with_hosts adds them)"),
        (dataclasses.replace(complete, host_certs={h: c for h, c in complete.host_certs.items()
                                                   if h != "sub3"}),
         "the session keys have no CA or not every host certificate (keys.with_hosts adds them)"),
    ]
    for keys, message in cases:
        with pytest.raises(ValueError) as refused:
            render_container(plan, plan.containers[0], keys)
        assert str(refused.value) == message
    bigger = build_plan(make_session(6), POOL)  # the remembered keys, another plan: checked
    with pytest.raises(ValueError) as refused:
        render_container(bigger, bigger.containers[0], complete)
    assert str(refused.value) == "the session keys have no host key for sub4, sub5"


@pytest.mark.parametrize("rank", [-1, 2, 3])
def test_a_container_whose_rank_is_not_its_place_in_the_plan_is_refused(rank):
    plan = build_plan(make_session(2), POOL)
    keys = generate_session_keys(plan.hosts)
    stray = dataclasses.replace(plan.containers[1], local_rank=rank)
    with pytest.raises(ValueError) as refused:
        render_container(plan, stray, keys)
    assert str(refused.value) == "sub1 is not a container of session 'render-test'"


SMALL = [RenderedFile("run", "#!/bin/sh\n", 0o755), RenderedFile("ssh/config", "c", 0o644),
         RenderedFile("ssh/k", "k", 0o600, secret=True), RenderedFile("ssh/k.pub", "p\n", 0o644),
         RenderedFile("docs/a b", "it's", 0o640), RenderedFile("bin/x", "", 0o700)]


def test_a_pack_is_this_script():
    """The whole script, for a bundle with a secret, an executable and a public directory:
    one rm, a umask per change of mode, a chmod per executable mode."""
    assert pack(SMALL) == """\
# cluster-session pack, written by cluster_sessions.core.render.pack: /bin/sh PACK DIR
# shellcheck disable=SC1003,SC2016
set -eu
if [ "$#" -ne 1 ] || [ -z "$1" ]; then echo "usage: /bin/sh PACK DIR" >&2; exit 64; fi
[ -d "$1" ] || (umask 022 && mkdir -p -- "$1")
[ ! -L "$1"/ssh ] || rm -f -- "$1"/ssh
[ -d "$1"/ssh ] || mkdir -m 700 -- "$1"/ssh
[ ! -L "$1"/docs ] || rm -f -- "$1"/docs
[ -d "$1"/docs ] || mkdir -m 755 -- "$1"/docs
[ ! -L "$1"/bin ] || rm -f -- "$1"/bin
[ -d "$1"/bin ] || mkdir -m 755 -- "$1"/bin
set -- "$1" "$1"/run "$1"/ssh/config "$1"/ssh/k "$1"/ssh/k.pub "$1"/'docs/a b' "$1"/bin/x
d=$1
shift
for f do if [ -e "$f" ] || [ -L "$f" ]; then rm -f -- "$@"; break; fi; done
set -- "$d"
umask 022
printf '%s' '#!/bin/sh
' > "$1"/run
printf '%s' c > "$1"/ssh/config
umask 066
printf '%s' k > "$1"/ssh/k
umask 022
printf '%s' 'p
' > "$1"/ssh/k.pub
umask 026
printf '%s' 'it'"'"'s' > "$1"/'docs/a b'
umask 066
printf '%s' '' > "$1"/bin/x
chmod 700 -- "$1"/bin/x
chmod 755 -- "$1"/run
"""
    assert pack([]) == "\n".join(pack(SMALL).splitlines()[:5]) + "\n"


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_a_pack_makes_its_directories_and_modes_whatever_the_umask_and_says_nothing(shell,
                                                                                   tmp_path):
    command = shell_command(shell)
    files = [*SMALL, RenderedFile("a/b/x", "1", 0o645), RenderedFile("a/c/y", "2", 0o4644),
             RenderedFile("a/b/z/w", "3", 0o2640), RenderedFile("t", "4", 0o1604),
             RenderedFile("u", "5", 0o604)]
    script = tmp_path / "bundle.pack"
    script.write_text(pack(files))
    target = tmp_path / "new" / "bundle"
    for _ in range(2):  # into nothing, then over the first (docker restart)
        done = subprocess.run(["sh", "-c", 'umask 077 && exec "$@"', "sh", *command,
                               str(script), str(target)], capture_output=True, text=True,
                              check=False)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
        assert_unpacked(target, files)
        modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o7777
                 for p in (tmp_path / "new").rglob("*") if p.is_dir()}
        assert modes == {"new/bundle": 0o755, "new/bundle/ssh": 0o700,
                         "new/bundle/docs": 0o755, "new/bundle/bin": 0o755,
                         "new/bundle/a": 0o755, "new/bundle/a/b": 0o755,
                         "new/bundle/a/c": 0o755, "new/bundle/a/b/z": 0o755}


@pytest.mark.parametrize("args", [[], ["a", "b"], [""]], ids=["none", "two", "empty"])
def test_a_pack_run_without_one_directory_says_how_to_run_it(args, tmp_path):
    command = shell_command("dash")
    script = tmp_path / "bundle.pack"
    script.write_text(pack(SMALL))
    done = subprocess.run([*command, str(script), *args], capture_output=True, text=True,
                          check=False, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (64, "", "usage: /bin/sh PACK DIR\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle.pack"]


@pytest.mark.parametrize("path", [".", "..", "/etc/passwd", "../x", "a/../../x", "./a", "",
                                  "a//b", "a/", "a/.", ".."])
def test_a_pack_refuses_paths_outside_the_bundle_word_for_word(path):
    with pytest.raises(ValueError) as refused:
        pack([RenderedFile("ok", "x", 0o644), RenderedFile(path, "x", 0o644)])
    assert str(refused.value) == f"refusing to pack a path outside the bundle: {path!r}"


def test_the_pack_entrypoint_unpacks_with_a_fixed_path_and_nothing_else_and_says_nothing(
        tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the pack entrypoint insists on root, as the entrypoint does")
    argv, packs, run = pack_entrypoint(tmp_path)
    # a pack is any sh script: this one shows what the packs run with
    (packs / "a.pack").write_text(
        'printf "%s|" "$#" "$1" "$PATH" "${LC_ALL-unset}" "${HOME-unset}" "${X-unset}" '
        '> "$1/seen"\n')
    (packs / "b.pack").write_text(pack([RenderedFile(
        "setup.sh", 'echo "$@" "${HOME-unset}" "${X-unset}"\n', 0o644)]))
    # the container's env may name anything: nothing in it steers the unpacking
    out = subprocess.run([*argv, "a", "b"], capture_output=True, text=True,
                         check=False, env={"PATH": os.environ["PATH"], "HOME": "/h", "X": "x",
                                           "env": "/bin/false", "found": "1", "saved": "1",
                                           "euid": "0"})
    assert (out.returncode, out.stdout, out.stderr) == (
        0, f"{run} {run}/container-env {current_umask()}  a b unset unset\n", "")
    assert (run / "seen").read_text() == (
        f"1|{run}|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|C|unset|unset|")
    saved = (run / "container-env").read_text()
    assert "export HOME='/h'\n" in saved and "export env='/bin/false'\n" in saved


def test_the_pack_entrypoint_refusals_word_for_word(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux)")
    argv, packs, run = pack_entrypoint(tmp_path)
    (packs / "a.pack").write_text(pack([RenderedFile("setup.sh", "echo ran\n", 0o644)]))
    (packs / "b.pack").write_text("exit 3\n")
    (packs / "c.pack").write_text(pack([RenderedFile("c", "c\n", 0o644)]))
    out = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout, out.stderr) == (
        70, "", f"cluster-session: error: cannot unpack {packs}/b.pack into {run}\n")
    assert not (run / "c").exists(), "went on after a pack failed"

    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = subprocess.run([*nobody, *argv, "true"], capture_output=True,
                         text=True, check=False)
    assert (out.returncode, out.stdout, out.stderr) == (
        64, "", "cluster-session: error: must run as root (it creates the user and starts sshd);"
        " do not set the container's user\n")

    if shutil.which("unshare"):  # no /proc/self/status: not root, whatever the env says
        no_proc = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs none /proc && exec "$@"', "sh"]
        out = subprocess.run([*no_proc, *argv, "true"], capture_output=True,
                             text=True, check=False, env={"PATH": os.environ["PATH"],
                                                          "euid": "0"})
        if "mount" not in out.stderr:
            assert out.returncode == 64, out.stderr
            assert out.stderr.endswith("do not set the container's user\n"), out.stderr

    run.rename(tmp_path / "elsewhere")  # no tmpfs: nowhere to save the env
    out = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout, out.stderr) == (
        70, "", f"cluster-session: error: cannot save the container's environment into {run}"
        " (the Pulumi program gives every container a tmpfs there)\n")
    assert not run.exists()
    (tmp_path / "elsewhere").rename(run)

    for p in packs.glob("*.pack"):
        p.unlink()
    (packs / "dir.pack").mkdir()  # not a pack
    out = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout, out.stderr) == (
        70, "", f"cluster-session: error: no *.pack in {packs}\n")


@pytest.mark.parametrize("compact", [False, True], ids=["render-out", "uploaded"])
def test_the_template_environment_keeps_shell_text_literal_and_refuses_unknown_names(compact):
    env = render_module._environment(compact=compact)
    template = env.from_string(
        "{## a template comment, ${#x} and #} in it ##}\n"
        "{% for v in values %}\n"
        "    {% if v %}\n"
        "x={{ v|shquote }} <&'\"> ${#x} {# not a comment #} {{ values|shwords }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "end\n")
    assert template.render(values=["a b", ""]) == (
        "x='a b' <&'\"> ${#x} {# not a comment #} 'a b' ''\nend\n")
    with pytest.raises(jinja2.UndefinedError):
        template.render()
    names = ("shquote", "shwords", "shname", "word", "public_key", "certificate")
    assert {n: env.filters.get(n) for n in names} == {n: getattr(render_module, n)
                                                      for n in names}
    source = (TEMPLATES / "sshd_config.j2").read_text()
    loaded = env.loader.get_source(env, "sshd_config.j2")[0]
    assert loaded == (without_comment_lines(source) if compact else source)
    assert render_module._environment().loader.get_source(env, "sshd_config.j2")[0] == source


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_a_link_planted_in_place_of_a_directory_is_replaced_not_followed(shell, tmp_path):
    command = shell_command(shell)
    files = [RenderedFile("ssh/config", "c\n", 0o644),
             RenderedFile("ssh/k", "k\n", 0o600, secret=True),
             RenderedFile("docs/a", "a\n", 0o644)]
    target = tmp_path / "bundle"
    unpack(command, pack(files), target)
    victims = {}
    for name in ("ssh", "docs"):
        victim = tmp_path / f"victim-{name}"
        victim.mkdir(mode=0o755)
        (victim / "config").write_text("v")
        shutil.rmtree(target / name)
        (target / name).symlink_to(victim)
        victims[name] = victim
    done = unpack(command, pack(files), target)
    assert (done.stdout, done.stderr) == (b"", b"")
    assert_unpacked(target, files)
    for name, victim in victims.items():
        assert not (target / name).is_symlink(), name
        assert sorted(p.name for p in victim.iterdir()) == ["config"], name
        assert (victim / "config").read_text() == "v" and victim.stat().st_mode & 0o777 == 0o755
    assert (target / "ssh").stat().st_mode & 0o777 == 0o700
    assert (target / "docs").stat().st_mode & 0o777 == 0o755


def test_each_session_of_any_size_gets_its_static_env_without_a_list_of_hosts():
    lines = []
    for size in (3, 5, 3):  # one session after another, as a program rendering several
        plan, _, bundles = render(size=size)
        static = by_path(bundles["sub1"])["static-env.sh"].content
        assert "main1,sub" not in static, size
        lines.append(len(static.splitlines()))
    assert lines[0] == lines[1] == lines[2], lines


def test_the_shared_files_follow_the_plan_and_the_keys_they_are_rendered_for():
    """The session-wide files are made once per (plan, keys): a second plan with the same keys
    (a session grown from 2 to 3), or the same plan with other keys, gets its own."""
    small, grown = build_plan(make_session(2), POOL), build_plan(make_session(3), POOL)
    keys = generate_session_keys(grown.hosts)
    first = by_path(render_container(small, small.containers[0], keys, directory=True))
    second = by_path(render_container(grown, grown.containers[0], keys, directory=True))
    assert first["hostfile"].content.count("slots=") == 2
    assert second["hostfile"].content.count("slots=") == 3
    other = generate_session_keys(grown.hosts)
    third = by_path(render_container(grown, grown.containers[0], other, directory=True))
    assert third["ssh/authorized_keys"].content != second["ssh/authorized_keys"].content
    assert third["ssh/authorized_keys"].content.split()[1] == \
        other.user.public_openssh.split()[1]


# --- the sent scripts' compaction (compact_shell) -----------------------------------------------

def test_a_sent_script_is_indented_with_tabs_and_loses_comments_after_commands():
    source = ("f() {  # what f does\n"
              "    if [ ${#1} -gt 0 ]; then  # a comment\n"
              "        echo '#not a comment' \"a # b\" $#  # gone\n"
              "    fi\n"
              "}\n")
    assert compact_shell(source) == ("f() {\n"
                                     "\tif [ ${#1} -gt 0 ]; then\n"
                                     "\t\techo '#not a comment' \"a # b\" $#\n"
                                     "\tfi\n"
                                     "}\n")


def test_a_quoted_string_over_several_lines_keeps_its_spaces_and_its_hashes():
    source = ("    IFS='\n"
              "     # not a comment'\n"
              "    x=\"one\n"
              "        two  # still the string\"  # a comment\n")
    assert compact_shell(source) == ("\tIFS='\n"
                                     "     # not a comment'\n"
                                     "\tx=\"one\n"
                                     "        two  # still the string\"  # a comment\n")


def test_jinja_tags_are_not_read_as_shell_and_unclosed_quotes_leave_a_template_whole():
    tagged = '    gate={{ ("/bin/sh " ~ x)|shquote }}  # for main1\n'
    assert compact_shell(tagged) == "\tgate={{ (\"/bin/sh \" ~ x)|shquote }}\n"
    unclosed = "    echo 'never closed\n    # and so on\n"
    assert compact_shell(unclosed) == unclosed


def test_the_rendered_bundle_per_container_stays_under_48_kib_at_96():
    """Issue 46, part 4: every container's files as ``render_session`` writes them to a
    directory (comments, hostfiles listing every host) sum to under 48 KiB at N = 96 (65,210
    bytes on main1 before: the readiness scripts' notes, repeated in every copy). A template's
    long notes are Jinja comments, kept in the template and in none of its rendered copies."""
    plan = build_plan(make_session(96), POOL)
    material = generate_session_keys(plan.hosts)
    sizes = {host: sum(len(f.content.encode()) for f in files)
             for host, files in render_session(plan, material).items()}
    assert len(sizes) == 96
    assert max(sizes.values()) < 48 * 1024, max(sizes.items(), key=lambda kv: kv[1])


def test_a_template_s_jinja_notes_reach_no_rendered_copy():
    """The "{##" ... "##}" notes of the templates: in no file of a directory or a sent bundle,
    and their end line is not taken for a shell comment (which would leave the note open)."""
    plan = build_plan(make_session(3), POOL)
    material = generate_session_keys(plan.hosts)
    for directory in (True, False):
        for files in render_session(plan, material, directory).values():
            for f in files:
                assert "{##" not in f.content and "##}" not in f.content, f.path
    assert without_comment_lines("x\n# a\n##}\n# b\n") == "x\n##}\n"
