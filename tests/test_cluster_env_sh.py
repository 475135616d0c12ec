"""The rendered shell scripts, run for real under dash and busybox sh (no container needed).

``cluster-env.sh`` (contract 3): the derived variables, their precedence, nothing for a single
container, and nothing else changed in the sourcing shell. Then the whole chain an env value
goes through -- the container's env saved by the entrypoint, ``save-env.sh`` (run as the user:
``static-env.sh``, ``user-env.sh``, ``cluster-env.sh``), ``command.sh``'s load and
``ssh-session.sh`` (sshd's ForceCommand) -- is checked byte for byte on arbitrary values with
hypothesis.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_sessions.core.clusterenv import split_user_env
from cluster_sessions.core.keys import generate_session_keys
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.render import DEFAULT_MASTER_PORT, render_container
from cluster_sessions.core.spec import Pool, Session

from . import factories
from .conftest import skip_or_fail

DERIVED = ("MASTER_ADDR", "MASTER_PORT", "TF_CONFIG",
           "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
           "CLUSTER_SESSION_HOSTFILE", "OMPI_MCA_orte_default_hostfile",
           "PRTE_MCA_prte_default_hostfile", "HYDRA_HOST_FILE",
           "OMPI_MCA_btl_vader_single_copy_mechanism", "OMPI_MCA_btl_tcp_if_include",
           "OMPI_MCA_oob_tcp_if_include")
NEVER = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
# Prints the process environment as {name: hex of the value}: exact bytes, whatever they are.
DUMP = ("import json, os, sys; json.dump({k.decode('utf-8', 'surrogateescape'): v.hex() "
        "for k, v in os.environb.items()}, sys.stdout)")


@pytest.fixture(scope="module", params=["dash", "busybox"])
def shell(request, tmp_path_factory) -> str:
    """The path of a POSIX sh to test with; busybox is reached through a link named ``sh``."""
    found = shutil.which(request.param)
    if found is None:
        skip_or_fail(f"{request.param} is not installed (apt-get install {request.param})")
    if request.param == "dash":
        return found
    link = tmp_path_factory.mktemp("busybox") / "sh"
    link.symlink_to(found)
    return str(link)


def make_session(size: int = 4, env: dict[str, str] | None = None,
                 master_port: int | None = None) -> Session:
    data = factories.session("envtest", "p", size=size, env=env or {})
    if master_port is not None:
        data["distributed"] = {"master_port": master_port}
    return Session.model_validate(data)


POOL = Pool.model_validate({"kind": "AgentPool", "name": "p", "agents": [
    {"name": "a1", "docker_host": "unix:///x", "capacity": {"cpu": 1000, "mem": "1000g"}}]})


KEYS = generate_session_keys(["main1"] + [f"sub{i}" for i in range(1, 4)])


def bundle(directory: Path, session: Session, host: str = "sub2") -> tuple[Path, dict]:
    """Render ``host``'s files into ``directory``; return it and the env cluster-env.sh is
    sourced with in save-env.sh: the container's static env, CLUSTER_SESSION_DIR and the
    definition's variables a shell assigns (not the start-up names: clusterenv.read_at_startup).
    """
    plan = build_plan(session, POOL)
    container = next(c for c in plan.containers if c.host == host)
    directory.mkdir(parents=True, exist_ok=True)
    for f in render_container(plan, container, KEYS):
        if not f.secret:
            path = directory / f.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f.content)
    return directory, {**container.env, "CLUSTER_SESSION_DIR": str(directory),
                       **split_user_env(session.env)[0]}


def run(shell: str, script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([shell, "-c", script], env=env, cwd=cwd, capture_output=True,
                          timeout=30, check=False)


def env_after(shell: str, directory: Path, env: dict[str, str], options: str = "") -> dict:
    """The environment a program sees after ``. ./cluster-env.sh`` in ``shell``."""
    script = f"{options}\n. ./cluster-env.sh\nexec {sys.executable} -c \"$DUMP\""
    result = run(shell, script, {**env, "DUMP": DUMP}, directory)
    assert result.returncode == 0, result.stderr.decode()
    seen = {k: bytes.fromhex(v).decode("utf-8", "surrogateescape")
            for k, v in json.loads(result.stdout).items()}
    seen.pop("DUMP")
    # set by the shells themselves, or by Python (PEP 538 locale coercion)
    for name in ("PWD", "SHLVL", "_", "OLDPWD", "PATH", "LC_CTYPE"):
        if name not in env:
            seen.pop(name, None)
    return seen


def expected_derived(env: dict[str, str]) -> dict[str, str]:
    """What cluster-env.sh adds, written out again in Python (DESIGN.md, contract 3)."""

    def number(text: str | None) -> bool:
        return (text is not None and text.isascii() and text.isdigit() and len(text) <= 9
                and (text == "0" or not text.startswith("0")))

    def port(text: str | None) -> bool:
        return number(text) and 1 <= int(text) <= 65535

    size = env.get("BACKENDAI_CLUSTER_SIZE")
    if not number(size) or int(size) <= 1:
        return {}
    now = dict(env)
    hosts = env.get("BACKENDAI_CLUSTER_HOSTS", "")
    rank = env.get("BACKENDAI_CLUSTER_LOCAL_RANK")
    rank = rank if number(rank) else None
    dist = env.get("BACKENDAI_DIST_MASTER_PORT") or str(DEFAULT_MASTER_PORT)
    if "MASTER_ADDR" not in now and hosts:
        now["MASTER_ADDR"] = hosts.split(",")[0]
    if "MASTER_PORT" not in now:
        now["MASTER_PORT"] = dist
    if "TF_CONFIG" not in now and hosts and rank is not None:
        base = now["MASTER_PORT"] if port(now["MASTER_PORT"]) else dist
        base = int(base) if port(base) else DEFAULT_MASTER_PORT
        workers = [f"{h}:{base + i}" for i, h in enumerate(hosts.split(","))]
        now["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(rank)}},
            separators=(",", ":"), ensure_ascii=False)
    now.setdefault("PET_NNODES", size)
    if rank is not None:
        now.setdefault("PET_NODE_RANK", rank)
    if "MASTER_ADDR" in now:
        now.setdefault("PET_MASTER_ADDR", now["MASTER_ADDR"])
    now.setdefault("PET_MASTER_PORT", now["MASTER_PORT"])
    bundle_dir = env.get("CLUSTER_SESSION_DIR")
    if bundle_dir:
        now.setdefault("CLUSTER_SESSION_HOSTFILE", f"{bundle_dir}/hostfile")
    if "CLUSTER_SESSION_HOSTFILE" in now:
        now.setdefault("OMPI_MCA_orte_default_hostfile", now["CLUSTER_SESSION_HOSTFILE"])
        now.setdefault("PRTE_MCA_prte_default_hostfile", now["CLUSTER_SESSION_HOSTFILE"])
    if bundle_dir:
        now.setdefault("HYDRA_HOST_FILE", f"{bundle_dir}/hostfile.hydra")
    now.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    now.setdefault("OMPI_MCA_btl_tcp_if_include", "eth0")
    now.setdefault("OMPI_MCA_oob_tcp_if_include", "eth0")
    return {k: v for k, v in now.items() if k not in env}


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> tuple[Path, dict]:
    """sub2 of a 4-container session, no distributed block."""
    return bundle(tmp_path_factory.mktemp("four"), make_session(4))


def test_derives_every_variable_for_a_cluster(shell, four):
    directory, env = four
    seen = env_after(shell, directory, env)
    assert {k: seen[k] for k in DERIVED} == {
        "MASTER_ADDR": "main1",
        "MASTER_PORT": "29500",
        "TF_CONFIG": '{"cluster":{"worker":["main1:29500","sub1:29501","sub2:29502",'
                     '"sub3:29503"]},"task":{"type":"worker","index":2}}',
        "PET_NNODES": "4",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "main1",
        "PET_MASTER_PORT": "29500",
        "CLUSTER_SESSION_HOSTFILE": f"{directory}/hostfile",
        "OMPI_MCA_orte_default_hostfile": f"{directory}/hostfile",
        "PRTE_MCA_prte_default_hostfile": f"{directory}/hostfile",
        "HYDRA_HOST_FILE": f"{directory}/hostfile.hydra",
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMPI_MCA_btl_tcp_if_include": "eth0",
        "OMPI_MCA_oob_tcp_if_include": "eth0",
    }
    assert json.loads(seen["TF_CONFIG"])["task"] == {"type": "worker", "index": 2}
    assert seen == {**env, **expected_derived(env)}


def test_never_sets_world_size_rank_or_local_rank(shell, four):
    directory, env = four
    seen = env_after(shell, directory, env)
    assert not set(NEVER) & set(seen)


def test_distributed_master_port_moves_master_port_and_every_tf_port(shell, tmp_path):
    directory, env = bundle(tmp_path, make_session(3, master_port=23456), host="main1")
    seen = env_after(shell, directory, env)
    assert seen["MASTER_PORT"] == seen["PET_MASTER_PORT"] == "23456"
    assert json.loads(seen["TF_CONFIG"]) == {
        "cluster": {"worker": ["main1:23456", "sub1:23457", "sub2:23458"]},
        "task": {"type": "worker", "index": 0}}


@pytest.mark.parametrize("preset", [
    {"MASTER_PORT": "31000"},
    {"MASTER_ADDR": "head.example"},
    {"MASTER_ADDR": ""},  # set but empty still counts as set
    {"TF_CONFIG": '{"mine": true}'},
    {"PET_NNODES": "2", "PET_NODE_RANK": "7"},
    {"PET_MASTER_ADDR": "elsewhere", "PET_MASTER_PORT": "1"},
    {"CLUSTER_SESSION_HOSTFILE": "/home/work/my hosts"},  # the launchers follow the user's file
    {"OMPI_MCA_orte_default_hostfile": "", "HYDRA_HOST_FILE": "x"},
    {"OMPI_MCA_btl_vader_single_copy_mechanism": "cma"},
    {"MASTER_PORT": "not a port"},
    {name: f"user's {name}" for name in DERIVED},
], ids=lambda preset: ",".join(preset))
def test_a_value_already_set_wins(shell, four, preset):
    directory, env = four
    env = {**env, **preset}
    seen = env_after(shell, directory, env)
    for name, value in preset.items():
        assert seen[name] == value
    assert seen == {**env, **expected_derived(env)}


TRAPPED = ["sed", "printf", "cat", "env", "id", "grep", "cut", "tr", "awk", "expr", "head",
           "mkdir", "hostname", "sh", "test", "["]


def test_starts_no_program_whatever_path_says(shell, four, tmp_path):
    """The root entrypoint sources it with the container's env, whose PATH is the definition's:
    a program found on that PATH would run as root. Even a hand-made host list that needs JSON
    escaping is handled with built-ins."""
    directory, env = four
    traps = tmp_path / "traps"
    traps.mkdir()
    marks = tmp_path / "marks"
    for name in TRAPPED:
        trap = traps / name
        trap.write_text(f"#!/bin/sh\n: > {marks}.{name.strip('[')}\n")
        trap.chmod(0o755)
    hosts = 'main1,sub"1,sub\\2,sub3'
    env = {**env, "BACKENDAI_CLUSTER_HOSTS": hosts}
    result = subprocess.run([shell, "-c", '. ./cluster-env.sh; printf "%s" "$TF_CONFIG"'],
                            env={**env, "PATH": str(traps)}, cwd=directory,
                            capture_output=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert not list(tmp_path.glob("marks.*"))
    assert json.loads(result.stdout)["cluster"]["worker"] == [
        "main1:29500", 'sub"1:29501', "sub\\2:29502", "sub3:29503"]


def test_a_user_master_port_is_the_base_of_the_tf_ports_and_reaches_torchrun(shell, four):
    directory, env = four
    seen = env_after(shell, directory, {**env, "MASTER_PORT": "31000"})
    assert seen["PET_MASTER_PORT"] == "31000"
    assert json.loads(seen["TF_CONFIG"])["cluster"]["worker"] == [
        "main1:31000", "sub1:31001", "sub2:31002", "sub3:31003"]


@pytest.mark.parametrize("size", ["1", "", "0", "x", "1x", None])
def test_a_single_container_or_a_missing_size_gets_none_of_them(shell, four, size):
    directory, env = four
    env = {k: v for k, v in env.items() if k != "BACKENDAI_CLUSTER_SIZE"}
    if size is not None:
        env["BACKENDAI_CLUSTER_SIZE"] = size
    seen = env_after(shell, directory, env)
    assert seen == env


def test_single_container_session_renders_a_script_that_sets_nothing(shell, tmp_path):
    directory, env = bundle(tmp_path, make_session(1), host="main1")
    assert env["BACKENDAI_CLUSTER_SIZE"] == "1"
    assert env_after(shell, directory, env) == env


# The shell state cluster-env.sh must leave exactly as it found it. Unsetting the variables it
# was expected to add must give back the state from before, byte for byte.
STATE = """
_cs_state() (  # a subshell: the state dump must not change the state itself
    set
    export -p
    echo "options=$- args=$# [$*] IFS=${IFS+set}[${IFS-}]"
    trap
    umask
    pwd
    for f in _cs_num _cs_port _cs_export; do
        if command -v "$f" >/dev/null 2>&1; then echo "function $f is defined"; fi
    done
)
"""


@pytest.mark.parametrize("options, ifs", [
    ("set -eu", None),
    ("set -u", "unset IFS"),
    ("set -e", "IFS=':,'"),
    ("set -f -C", "IFS=''"),
    ("", "IFS=' \t\n'"),
], ids=["eu", "u-unset-ifs", "e-odd-ifs", "noglob-empty-ifs", "plain"])
def test_changes_nothing_else_in_the_sourcing_shell(shell, four, tmp_path, options, ifs):
    directory, env = four
    added = " ".join(expected_derived(env))
    script = f"""{STATE}
{options}
{ifs or ''}
set -- "one arg" two
trap 'echo bye' USR1
_cs_state > {tmp_path}/before
. ./cluster-env.sh
unset {added}
_cs_state > {tmp_path}/after
"""
    result = run(shell, script, env, directory)
    assert result.returncode == 0, result.stderr.decode()
    before = (tmp_path / "before").read_bytes()
    after = (tmp_path / "after").read_bytes()
    assert b"function _cs" not in after
    assert after == before


def test_sourcing_twice_changes_nothing_the_second_time(shell, four, tmp_path):
    directory, env = four
    script = f". ./cluster-env.sh; export -p > {tmp_path}/one; . ./cluster-env.sh; " \
             f"export -p > {tmp_path}/two"
    result = run(shell, script, env, directory)
    assert result.returncode == 0, result.stderr.decode()
    assert (tmp_path / "one").read_bytes() == (tmp_path / "two").read_bytes()


def test_a_large_cluster_is_quick_and_lists_every_worker(shell, tmp_path):
    session = make_session(500)
    plan = build_plan(session, POOL)
    last = plan.containers[-1]
    env = dict(last.env)
    (tmp_path / "cluster-env.sh").write_text(next(
        f.content for f in render_container(plan, last, generate_session_keys(plan.hosts))
        if f.path == "cluster-env.sh"))
    seen = env_after(shell, tmp_path, env)
    workers = json.loads(seen["TF_CONFIG"])["cluster"]["worker"]
    assert workers[0] == "main1:29500" and workers[-1] == "sub499:29999" and len(workers) == 500
    assert json.loads(seen["TF_CONFIG"])["task"]["index"] == 499


# --- every env value survives the whole chain, byte for byte --------------------------------

HOSTILE = [
    "", " ", "'", '"', "\\", "'\\''", "$(touch /tmp/pwned)", "`id`", "${HOME}", "$1 $@ $*",
    "a\nb", "\n", "trailing\n\n", "\r\n", "\t tab", "ünï©ødé ✓ 日本", "-n", "-e \\n", "*", "?",
    "[a]", "~", "#not a comment", "a;b&&c||d|e", "%s%n", "\x01\x1b[31m\x7f", "=", "a=b",
    "\u200b\ufeff", "😀", "export X=1", "'; exit 1; '",
]
SHELL_OWNED = {"IFS", "OPTIND", "PPID", "LINENO", "PS1", "PS2", "PS4", "PWD", "OLDPWD", "SHLVL",
               "_", "ENV", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "MAIL", "HOSTNAME",
               "SSH_ORIGINAL_COMMAND", "DUMP", "LC_CTYPE"}
names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True),
    # the names cluster-env.sh uses inside its subshell, and the ones it derives
    st.sampled_from(["size", "hosts", "rank", "base", "workers", "i", "rest", "host",
                     "_cs_rest", "_cs_done", "_cs_c", "PATH", "MASTER_PORT", "MASTER_ADDR",
                     "CLUSTER_SESSION_HOSTFILE", "OMPI_MCA_orte_default_hostfile",
                     "PRTE_MCA_prte_default_hostfile", "HYDRA_HOST_FILE",
                     "OMPI_MCA_btl_vader_single_copy_mechanism",
                     "OMPI_MCA_btl_tcp_if_include"]),
).filter(lambda n: n not in SHELL_OWNED and not n.startswith("BACKENDAI_"))
# Names a shell or the dynamic loader reads at start-up: kept out of the container's env and
# given to the user's processes only (exec-env.sh); their values must survive byte for byte too.
STARTUP = ["BASH_ENV", "ENV", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "CDPATH", "GLOBIGNORE",
           "BASH_COMPAT", "BASH_LOADABLES_PATH", "EXECIGNORE", "MUSL_LOCPATH", "POSIXLY_CORRECT",
           "PROMPT_COMMAND", "TMPDIR", "LD_PRELOAD", "LD_LIBRARY_PATH"]
startup_names = st.sampled_from(STARTUP)
values = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
            max_size=30),
)


def check_chain(shell: str, directory: Path, static: dict[str, str],
                at_exec: dict[str, str] | None = None) -> None:
    """The entrypoint's chain, step by step: the container's env, the user's environment worked
    out with built-ins only, then the command (command.sh's load) and an ssh session."""
    at_exec = at_exec or {}
    expected = {**static, **expected_derived(static)}

    # The engine passed the env (docker run -e): the entrypoint's own shell sources both.
    seen = env_after(shell, directory, static)
    assert seen == expected
    expected.update(at_exec)

    # The entrypoint saves the container's env as root (built-ins; nothing of the definition's
    # is in it); save-env.sh, run as the user in a clean environment (setup.sh's env -i), works
    # out the command's and ssh's files from it and the bundle. With nothing passed (a bundle
    # started without the env), static-env.sh fills the container's static env in.
    container = {k: v for k, v in static.items() if k.startswith("BACKENDAI_")}
    command_env, saved = directory / "command-env", directory / "environment"
    for passed in ({}, container):
        result = run(shell, 'export -p > ./container-env', passed, directory)
        assert result.returncode == 0, result.stderr.decode()
        result = subprocess.run(
            [shell, "-c", '"$0" "$1" ./container-env > "$2" 3> "$3"', shell,
             str(directory / "save-env.sh"), str(command_env), str(saved)],
            env={}, cwd=directory, capture_output=True, timeout=30, check=False)
        assert result.returncode == 0, result.stderr.decode()

        # The command, as command.sh loads it: in a clean environment, as the user, with the
        # start-up names put on the exec by exec-env.sh.
        script = '. "$1"; shift; . "$0"; exec "$@"'
        result = subprocess.run([shell, "-c", script, str(directory / "exec-env.sh"),
                                 str(command_env), sys.executable, "-c", DUMP], env={},
                                capture_output=True, timeout=30, check=False)
        assert result.returncode == 0, result.stderr.decode()
        got = {k: bytes.fromhex(v).decode("utf-8", "surrogateescape")
               for k, v in json.loads(result.stdout).items()}
        if passed:
            assert {k: got.get(k) for k in expected} == expected
        else:  # a shell always has a PATH
            assert {k: got.get(k) for k in expected if k != "PATH"} == {
                k: v for k, v in expected.items() if k != "PATH"}

    # An ssh session: ssh-session.sh (as sshd runs it, in a clean environment with only
    # sshd's variables) loads the saved environment and runs the command.
    sshd_env = {"HOME": "/nonexistent", "USER": "work", "LOGNAME": "work", "SHELL": shell,
                "PATH": "/usr/bin:/bin", "SSH_CONNECTION": "10.0.0.1 1 10.0.0.2 2200",
                "SSH_ORIGINAL_COMMAND": f'exec {sys.executable} -c "$DUMP"', "DUMP": DUMP}
    shutil.copyfile(directory / "exec-env.sh", directory / "exec-env")  # as setup.sh installs it
    result = subprocess.run([shell, str(directory / "ssh-session.sh")], env=sshd_env,
                            capture_output=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr.decode()
    got = {k: bytes.fromhex(v).decode("utf-8", "surrogateescape")
           for k, v in json.loads(result.stdout).items()}
    # the command runs under the user's shell ($SHELL -c), which sets IFS afresh at start-up
    # whatever the environment says: that is the shell's rule, not ours
    expected.pop("IFS", None)
    assert {k: got.get(k) for k in expected} == expected


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(user_env=st.dictionaries(names, values, max_size=6),
       startup_env=st.dictionaries(startup_names, values, max_size=3),
       size=st.sampled_from([1, 2, 4]),
       master_port=st.one_of(st.none(), st.integers(1024, 32767)))
def test_every_env_value_survives_rendering_byte_for_byte(shell, tmp_path, user_env, startup_env,
                                                          size, master_port):
    host = "main1" if size == 1 else "sub1"
    directory, static = bundle(tmp_path / os.urandom(4).hex(),
                               make_session(size, {**user_env, **startup_env}, master_port),
                               host=host)
    for name, value in user_env.items():
        assert static[name] == value
    assert not set(startup_env) & set(static)
    assert not (set(user_env) | set(startup_env)) & set(build_plan(
        make_session(size, {**user_env, **startup_env}, master_port), POOL).containers[0].env)
    check_chain(shell, directory, static, startup_env)


def test_hostile_values_survive_the_chain(shell, tmp_path):
    user_env = {f"V{i}": value for i, value in enumerate(HOSTILE)}
    startup_env = {name: HOSTILE[i % len(HOSTILE)] for i, name in enumerate(STARTUP)}
    directory, static = bundle(tmp_path, make_session(4, {**user_env, **startup_env}))
    check_chain(shell, directory, static, startup_env)
    assert not Path("/tmp/pwned").exists()


def test_the_ssh_wrapper_runs_what_sshd_asked_whatever_the_saved_environment_says(shell,
                                                                                   tmp_path):
    """sshd's ForceCommand decides what to run from sshd's SSH_ORIGINAL_COMMAND and SHELL alone,
    before it loads the saved environment: a saved value for them (validation refuses SSH_* in
    a definition; an image's env may still hold one) steers nothing."""
    directory, _ = bundle(tmp_path, make_session(2), host="main1")
    (directory / "environment").write_text(
        "export SSH_ORIGINAL_COMMAND='echo steered'\nexport SHELL=/bin/false\n")
    sshd_env = {"HOME": "/nonexistent", "USER": "work", "SHELL": shell, "PATH": "/usr/bin:/bin",
                "SSH_ORIGINAL_COMMAND": "echo asked"}
    result = subprocess.run([shell, str(directory / "ssh-session.sh")], env=sshd_env,
                            capture_output=True, timeout=30, check=False)
    assert (result.returncode, result.stdout) == (0, b"asked\n"), result.stderr.decode()


def test_what_sshd_sets_per_session_is_left_out_of_the_saved_environment(shell, tmp_path):
    """An image's env that carries sshd's or a login's names never replaces sshd's values."""
    directory, _ = bundle(tmp_path, make_session(2), host="main1")
    owned = {"SSH_ORIGINAL_COMMAND": "echo steered", "SSH_CONNECTION": "1 2 3 4",
             "SSH_CLIENT": "1 2 3", "SSH_TTY": "/dev/pts/9", "SSH_AUTH_SOCK": "/tmp/agent",
             "HOME": "/root", "SHELL": "/bin/false", "TERM": "dumb"}
    result = run(shell, "export -p > ./container-env", owned, directory)
    assert result.returncode == 0, result.stderr.decode()
    result = subprocess.run(
        [shell, "-c", '"$0" "$1" ./container-env > /dev/null 3> ./environment', shell,
         str(directory / "save-env.sh")], env={}, cwd=directory, capture_output=True,
        timeout=30, check=False)
    assert result.returncode == 0, result.stderr.decode()
    saved = (directory / "environment").read_text()
    assert not [name for name in owned if f"{name}=" in saved], saved
