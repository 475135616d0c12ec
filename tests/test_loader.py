"""Loading and validating definitions: every bad input is a problem with file and path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster_sessions.core import loader
from cluster_sessions.core.loader import (
    BUILTIN_POOLS,
    POOLS_ENV,
    PoolNotFound,
    as_json_numbers,
    load_file,
    named_by_file,
    operator_pool_dirs,
    parse_yaml,
    pools_in,
    read_text,
    to_model,
)
from cluster_sessions.core.problems import DefinitionError
from cluster_sessions.core.spec import Session
from cluster_sessions.driver.session_args import validate_files

POOL = """\
kind: AgentPool
name: lab
mount_sources: [/a, /b, /srv/data]
agents:
  - {name: a1, docker_host: "unix:///var/run/docker.sock", capacity: {cpu: 8, mem: 32g}}
"""

SESSION = """\
kind: ClusterSession
name: train-demo
pool: lab
image: example/pytorch:2.3
cluster: {mode: single-node, size: 2}
resources: {cpu: 2, mem: 4g, shmem: 1g, gpu: 0}
"""


@pytest.fixture
def tree(tmp_path: Path):
    """A stacks/ layout: stacks/pools/lab.yaml and a writer for stacks/sessions/*.yaml."""
    (tmp_path / "pools").mkdir()
    (tmp_path / "sessions").mkdir()
    (tmp_path / "pools" / "lab.yaml").write_text(POOL)

    def write(text: str, name: str = "s.yaml", where: str = "sessions") -> Path:
        path = tmp_path / where / name
        path.write_text(text)
        return path

    return write


def operator_dirs() -> tuple[Path, ...]:
    """The pool directories the driver passes: this test's (conftest), then the project's."""
    return operator_pool_dirs(os.environ.get(POOLS_ENV))


def load_session(path: Path, pool: Path | None = None) -> loader.Loaded:
    """The loader as the driver calls it, with the operator's pool directories."""
    return loader.load_session(path, pool, pool_dirs=operator_dirs())


def with_pool(session: Session, path: Path) -> loader.Loaded:
    return loader.with_pool(session, path, pool_dirs=operator_dirs())


def find_pool(ref: str, session: Path | None = None, *, given: bool = False) -> Path:
    return loader.find_pool(ref, session, given=given, allowed=operator_dirs())


def pool_candidates(session: Path | None, ref: str) -> list[Path]:
    return loader.pool_candidates(session, ref, operator_dirs())


def problems_of(path: Path) -> list[str]:
    return [f"{p.path}: {p.message}" for p in validate_files([path])]


def test_valid_session_loads_with_its_pool_by_name(tree):
    loaded = load_session(tree(SESSION))
    assert loaded.session.resources.mem == 4 * 1024**3
    assert loaded.pool.name == "lab"
    assert loaded.pool_file.name == "lab.yaml"


def test_pool_given_as_relative_path_is_resolved_from_the_session_file(tree):
    path = tree(SESSION.replace("pool: lab", "pool: ../pools/lab.yaml"))
    assert load_session(path).pool.name == "lab"


def test_missing_pool_names_where_it_looked(tree):
    path = tree(SESSION.replace("pool: lab", "pool: nowhere"))
    [problem] = problems_of(path)
    assert problem.startswith("pool: no pool 'nowhere' found")
    assert "pools/nowhere.yaml" in problem


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        (("resources: {", "resources: {typo: 1, "), "resources.typo", "unknown key"),
        (("image:", "imagee: x\nimage:"), "imagee", "did you mean 'image'"),
        (("size: 2", "size: 0"), "cluster.size", "greater than or equal to 1"),
        (("size: 2", "size: two"), "cluster.size", "integer"),
        (("size: 2", "size: 1.5"), "cluster.size", "integer"),
        (("shmem: 1g", "shmem: 4g"), "resources.shmem", "smaller than resources.mem"),
        (("shmem: 1g", "shmem: 8g"), "resources.shmem", "smaller than resources.mem"),
        (("mem: 4g", "mem: lots"), "resources.mem", "not a size"),
        (("mem: 4g", "mem: -1g"), "resources.mem", "not a size"),
        (("name: train-demo", "name: abc"), "name", "4-64 characters"),
        (("name: train-demo", "name: -train"), "name", "4-64 characters"),
        (("name: train-demo", "name: train-"), "name", "4-64 characters"),
        (("name: train-demo", "name: " + "x" * 65), "name", "4-64 characters"),
        (("name: train-demo", "name: 'bad name'"), "name", "4-64 characters"),
        (("name: train-demo", "name: 1234"), "name", "string"),
        (("mode: single-node", "mode: multi"), "cluster.mode", "'single-node' or 'multi-node'"),
        (("kind: ClusterSession", "kind: Session"), "kind", "unknown kind"),
    ],
)
def test_bad_session_fields_are_named(tree, change, path, words):
    found = problems_of(tree(SESSION.replace(*change)))
    assert any(p.startswith(f"{path}: ") and words in p for p in found), found


@pytest.mark.parametrize("port", [80, 1023, 32768, 40000, 65535])
def test_master_port_must_be_below_the_ephemeral_range(tree, port):
    found = problems_of(tree(SESSION + f"distributed: {{master_port: {port}}}\n"))
    assert [p for p in found if p.startswith("distributed.master_port: ")], found


@pytest.mark.parametrize("port", [1024, 29500, 32767])
def test_master_port_in_range_is_accepted(tree, port):
    assert problems_of(tree(SESSION + f"distributed: {{master_port: {port}}}\n")) == []


@pytest.mark.parametrize(
    ("env", "path", "words"),
    [
        ("{1ABC: x}", "env.1ABC", "not a valid variable name"),
        ("{'A-B': x}", "env.A-B", "not a valid variable name"),
        ("{'A B': x}", "env.A B", "not a valid variable name"),
        ("{BACKENDAI_CLUSTER_SIZE: '9'}", "env.BACKENDAI_CLUSTER_SIZE", "cannot be overridden"),
        # every BACKENDAI_* variable, not only BACKENDAI_CLUSTER_* (issue 25)
        ("{BACKENDAI_SESSION_NAME: x}", "env.BACKENDAI_SESSION_NAME", "cannot be overridden"),
        ("{BACKENDAI_KERNEL_ID: x}", "env.BACKENDAI_KERNEL_ID", "cannot be overridden"),
        ("{BACKENDAI_DIST_MASTER_PORT: '1'}", "env.BACKENDAI_DIST_MASTER_PORT",
         "cannot be overridden"),
        ("{BACKENDAI_: x}", "env.BACKENDAI_", "cannot be overridden"),
        ("{FOO: 1}", "env.FOO", "quote it"),
        ("{FOO: [a]}", "env.FOO", "string"),
    ],
)
def test_bad_env_is_named(tree, env, path, words):
    found = problems_of(tree(SESSION + f"env: {env}\n"))
    assert any(p.startswith(f"{path}: ") and words in p for p in found), found


@pytest.mark.parametrize("name", ["SSH_ORIGINAL_COMMAND", "SSH_CONNECTION", "SSH_AUTH_SOCK",
                                  "SSH_ASKPASS", "SSH_TTY"])
def test_names_sshd_sets_for_each_session_are_refused(tree, name):
    """sshd owns SSH_*: a definition's value would replace what sshd set in the saved
    environment, steering the session's ssh wrapper and the user's ssh."""
    found = problems_of(tree(SESSION + f"env: {{{name}: 'echo steered'}}\n"))
    assert [p for p in found if p.startswith(f"env.{name}: SSH_* variables are set by sshd")], found


@pytest.mark.parametrize("name", ["PYTHONPATH", "PYTHONSTARTUP", "PERL5OPT", "NODE_OPTIONS",
                                  "RUBYOPT", "JAVA_TOOL_OPTIONS", "LD_PRELOAD", "BASH_ENV"])
def test_runtime_and_loader_hooks_are_the_users_to_set(tree, name):
    """Inert for root (no definition value is ever in a root process's environment), so the
    user may set them for the user's own programs."""
    assert problems_of(tree(SESSION + f"env: {{{name}: /opt/x}}\n")) == []


def test_multi_node_across_agents_needs_a_swarm_manager_in_the_pool(tree):
    tree(POOL + '  - {name: a2, docker_host: "unix:///a2.sock", capacity: {cpu: 8, mem: 32g}}\n',
         "lab.yaml", "pools")
    path = tree(SESSION.replace("single-node", "multi-node").replace("size: 2", "size: 5"))
    [problem] = problems_of(path)
    assert problem.startswith("cluster.mode: multi-node needs a swarm manager")
    # what no number of agents would hold is pending on capacity (the plan says so), not this
    assert problems_of(tree(SESSION.replace("single-node", "multi-node")
                            .replace("size: 2", "size: 9"))) == []


def test_pool_problems_are_reported_against_the_pool_file(tree):
    bad = POOL + "swarm: {manager: ghost}\n"
    pool = tree(bad, "lab.yaml", "pools")
    [problem] = validate_files([tree(SESSION)])
    assert problem.file == str(pool)
    assert problem.path == "swarm.manager"


@pytest.mark.parametrize(
    ("agents", "path", "words"),
    [
        ("[{name: a, docker_host: 'unix:///s', capacity: {cpu: 1, mem: 1g}},"
         " {name: a, docker_host: 'unix:///s', capacity: {cpu: 1, mem: 1g}}]",
         "agents.1.name", "duplicate agent name"),
        ("[{name: a, docker_host: 'unix:///s', capacity: {cpu: 1, mem: 1g, gpus: [0, 1, 0]}}]",
         "agents.0.capacity.gpus", "listed twice"),
        ("[{name: a, docker_host: 'http://x', capacity: {cpu: 1, mem: 1g}}]",
         "agents.0.docker_host", "unix://"),
        ("[{name: a, docker_host: 'unix:///s'}]", "agents.0.capacity", "required"),
        ("[]", "agents", "at least 1"),
    ],
)
def test_bad_pool_fields_are_named(tree, agents, path, words):
    found = problems_of(tree(f"kind: AgentPool\nname: p\nagents: {agents}\n", "p.yaml", "pools"))
    assert any(p.startswith(f"{path}: ") and words in p for p in found), found


def test_yaml_syntax_error_names_the_line(tree):
    path = tree(SESSION + "env: {FOO: [bar\n")
    [problem] = validate_files([path])
    assert problem.path.startswith("line 8")
    assert "invalid YAML" in problem.message


def test_duplicate_keys_are_an_error_not_last_one_wins(tree):
    [problem] = validate_files([tree(SESSION + "image: other\n")])
    assert "'image' appears twice (first on line 4)" in problem.message
    assert problem.path.startswith("line 7")


def test_yaml_aliases_are_refused(tree):
    bomb = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n"
    [problem] = validate_files([tree(bomb)])
    assert "aliases" in problem.message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "exactly one YAML document"),
        (SESSION + "---\n" + POOL, "exactly one YAML document"),
        ("- a\n- b\n", "expected a mapping"),
        ("just text\n", "expected a mapping"),
        ("name: x\n", "kind: required"),
        ("a: " + "[" * 500_000 + "]" * 500_000 + "\n", "nested deeper than 64 levels"),
        ("? [a, b]\n: c\n", "a key must be a plain value"),
        ("kind: !!python/object:os.system ls\n", "invalid YAML"),
    ],
)
def test_documents_of_the_wrong_shape(tree, text, words):
    [problem] = validate_files([tree(text)])
    assert words in str(problem)


def test_unreadable_inputs_are_problems_not_tracebacks(tmp_path: Path):
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00kind")
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (1024 * 1024 + 1))
    found = validate_files([tmp_path / "missing.yaml", tmp_path, binary, big])
    messages = [p.message for p in found]
    assert messages == ["no such file", "is a directory, not a file",
                        messages[2], "file is larger than 1 MiB"]
    assert messages[2].startswith("not UTF-8")


def test_load_file_checks_the_expected_kind(tree):
    with pytest.raises(DefinitionError) as err:
        load_session(tree(POOL))
    assert "expected ClusterSession, got AgentPool" in str(err.value)


def test_definitions_are_immutable(tree):
    session = load_file(tree(SESSION))
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type is internal
        session.name = "other"
    assert isinstance(session.mounts, tuple)


def test_every_problem_of_every_file_is_reported(tree):
    a = tree(SESSION.replace("size: 2", "size: 0"), "a.yaml")
    b = tree(SESSION.replace("mem: 4g", "mem: x"), "b.yaml")
    found = validate_files([a, b])
    assert {p.file for p in found} == {str(a), str(b)}


def test_an_empty_command_is_refused_rather_than_silently_defaulted(tree):
    found = problems_of(tree(SESSION + "command: []\n"))
    assert any(p.startswith("command: ") and "at least 1" in p for p in found), found


def test_mount_sources_are_absolute_paths_or_volume_names(tree):
    found = problems_of(tree(SESSION + "mounts: [{source: rel/path, target: /data/x},"
                             " {source: data-vol, target: /data/y}]\n"))
    assert found == ["mounts.0.source: must be an absolute host path or a volume name"]


def test_multi_node_that_fits_one_agent_needs_no_swarm(tree):
    path = tree(SESSION.replace("single-node", "multi-node"))  # 2 x 2 cpu on an 8-cpu agent
    assert problems_of(path) == []


@pytest.mark.parametrize(
    ("extra", "path", "words"),
    [
        ("mounts: [{source: /a, target: /opt/cluster-session}]", "mounts.0.target",
         "not where a user's data goes"),
        ("mounts: [{source: /a, target: /run}]", "mounts.0.target", "not where a user's data"),
        ("mounts: [{source: /a, target: /data}, {source: /b, target: /data/}]",
         "mounts.1.target", "mounted twice"),
        ("mounts: [{source: /a, target: '/data/c:ro'}]", "mounts.0.target", "':'"),
        ("ports: [{container: 22, host: 8080}, {container: 23, host: 8080}]", "ports.1.host",
         "used twice"),
        ("ports: [{container: 80, host_ip: 'not an ip'}]", "ports.0.host_ip",
         "not an IP address"),
        ('ports: [{container: 80, host_ip: "fe80::1%\\x1b[2J"}]', "ports.0.host_ip",
         "not an IP address"),
        ("", "name", "start with a letter or digit"),
    ],
)
def test_definitions_docker_would_refuse_are_caught_early(tree, extra, path, words):
    text = SESSION + extra + "\n"
    if not extra:
        text = text.replace("name: train-demo", "name: _train")
    found = problems_of(tree(text))
    assert any(p.startswith(f"{path}: ") and words in p for p in found), found


@pytest.mark.parametrize("cpu", [".inf", ".nan", "1.0e+400"])
def test_pool_capacity_must_be_a_finite_number(tree, cpu):
    pool = POOL.replace("cpu: 8", f"cpu: {cpu}")
    found = problems_of(tree(pool, "p.yaml", "pools"))
    assert any(p.startswith("agents.0.capacity.cpu: ") for p in found), found


def test_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    [problem] = validate_files([fifo])
    assert problem.message == "not a regular file"


# --- issue 9: definitions that defeat the checks or mean something other than they say ---------


NOT_DATA = "not where a user's data goes"


@pytest.mark.parametrize(
    "target",
    ["//opt/cluster-session", "//run/cluster-session/", "/opt/./cluster-session", "/", "//",
     "/proc", "/proc/sys/kernel", "//sys", "/dev/shm", "/etc/ld.so.preload", "/usr/local/bin",
     "/run/sshd", "/var/run", "/home/work", "//home/work/", "/home", "/home/work/.ssh",
     "/home/work/.ssh/authorized_keys", "/home/work/./.ssh", "//data/../etc",
     # below the bundle and the run directory, not only at them (issue 25)
     "/opt/cluster-session/entrypoint.sh", "/opt/cluster-session/ssh",
     "/run/cluster-session/env", "/opt/cluster-session/ssh/authorized_keys"],
)
@pytest.mark.parametrize("read_only", ["true", "false"])
def test_mount_targets_are_checked_as_docker_cleans_them(tree, target, read_only):
    found = problems_of(tree(SESSION + f"mounts: [{{source: /a, target: '{target}', "
                             f"read_only: {read_only}}}]\n"))
    assert any(p.startswith("mounts.0.target: ") and (NOT_DATA in p or "'..'" in p)
               for p in found), found


@pytest.mark.parametrize(
    "target",
    ["/run/utmp", "/var/log", "/var/log/auth.log", "/var/lib/data", "/var/spool/cron", "/tmp",
     "/root", "/opt/tools", "/srv", "/procfs", "/datax", "/mntx", "/home/other/data",
     "/lib/x86_64-linux-gnu/security", "/boot", "/media"],
)
def test_mount_targets_off_the_allowlist_are_refused(tree, target):
    """Issue 21 class 2: a target is allowed where a user's data goes, not merely where the
    blocklist of system directories did not reach (``/run/utmp``, ``/var/log`` were taken)."""
    found = problems_of(tree(SESSION + f"mounts: [{{source: /a, target: '{target}'}}]\n"))
    assert any(p.startswith("mounts.0.target: ") and NOT_DATA in p for p in found), found


@pytest.mark.parametrize(("field", "value"), [("target", "/data/../var/log"),
                                              ("target", "/home/work/x/../../work"),
                                              ("source", "/a/../etc"), ("source", "/srv/data/..")])
def test_dot_dot_is_refused_in_mount_paths(tree, field, value):
    mount = {"source": "/a", "target": "/data/x", field: value}
    found = problems_of(tree(SESSION + f"mounts: [{{source: '{mount['source']}', "
                             f"target: '{mount['target']}'}}]\n"))
    assert any(p.startswith(f"mounts.0.{field}: ") and "'..'" in p for p in found), found


@pytest.mark.parametrize("source", ["/etc", "/", "/var/run/docker.sock", "/srv/datax",
                                    "/srv", "/ab", "//etc/"])
def test_host_paths_outside_the_pools_mount_sources_are_refused(tree, source):
    found = problems_of(tree(SESSION + f"mounts: [{{source: '{source}', target: /data/x}}]\n"))
    assert any(p.startswith("mounts.0.source: ") and "mount_sources" in p for p in found), found


@pytest.mark.parametrize("source", ["/a", "/a/", "//a", "/a/deep/er", "/srv/data/set1",
                                    "/b/./x", "my-volume"])
def test_host_paths_under_the_pools_mount_sources_and_volumes_are_allowed(tree, source):
    assert problems_of(tree(SESSION + f"mounts: [{{source: '{source}', target: /data/x}}]\n")) \
        == []


def test_a_pool_without_mount_sources_allows_no_host_path(tree):
    tree(POOL.replace("mount_sources: [/a, /b, /srv/data]\n", ""), "lab.yaml", "pools")
    path = tree(SESSION + "mounts: [{source: /a, target: /data/x}, {source: vol, target: /mnt}]\n")
    [problem] = validate_files([path])
    assert (problem.file, problem.path) == (str(path), "mounts.0.source")
    assert "no host path" in problem.message


@pytest.mark.parametrize("entry", ["relative/dir", "/srv/../etc", '"/srv\\nx"', "'/a,b'"])
def test_a_pools_mount_sources_are_absolute_directories(tree, entry):
    pool = tree(POOL.replace("[/a, /b, /srv/data]", f"[{entry}]"), "lab.yaml", "pools")
    found = validate_files([pool])
    assert [p.path for p in found] == ["mount_sources.0"], found


def test_the_home_that_is_refused_is_the_session_users(tree):
    text = SESSION + "user: {name: alice}\nmounts: [{source: /a, target: /home/alice/data}]\n"
    assert problems_of(tree(text)) == []
    for target in ("/home/alice/", "/home/work/data"):
        found = problems_of(tree(text.replace("target: /home/alice/data", f"target: {target}")))
        assert [p for p in found if p.startswith("mounts.0.target: ")], found


@pytest.mark.parametrize("target", ["/home/work/data", "/data", "/mnt/x", "/mnt", "/workspace",
                                    "/scratch/run1", "/home/work/.sshx", "/home/work/.cache",
                                    "//data/set/"])
def test_ordinary_mount_targets_stay_allowed(tree, target):
    assert problems_of(tree(SESSION + f"mounts: [{{source: /a, target: '{target}'}}]\n")) == []


@pytest.mark.parametrize(("first", "second"),
                         [("/data", "//data"), ("/data", "/data/"), ("/data", "/data/./"),
                          ("//data/", "/data/.")])
def test_one_target_spelled_two_ways_is_mounted_twice(tree, first, second):
    found = problems_of(tree(SESSION + f"mounts: [{{source: /a, target: '{first}'}}, "
                             f"{{source: /b, target: '{second}'}}]\n"))
    assert any(p.startswith("mounts.1.target: ") and "mounted twice" in p for p in found), found


@pytest.mark.parametrize("name", ["root", "daemon", "bin", "sys", "sync", "games", "man", "lp",
                                  "mail", "news", "uucp", "proxy", "www-data", "backup", "list",
                                  "irc", "gnats", "nobody", "_apt", "sshd", "systemd-network",
                                  "systemd-timesync", "messagebus", "_chrony"])
def test_system_accounts_are_refused_as_the_session_user(tree, name):
    found = problems_of(tree(SESSION + f"user: {{name: '{name}'}}\n"))
    assert [p for p in found if p.startswith("user.name: ")], found


@pytest.mark.parametrize("field", ["uid", "gid"])
@pytest.mark.parametrize("value", [0, 1, 33, 999, 60000, 64999, 65534, 65535, 2**31 - 1])
def test_system_ids_are_refused_for_the_session_user(tree, field, value):
    """Issue 21 class 3: Debian's system (0-999) and reserved (60000-65535, nobody) ranges."""
    found = problems_of(tree(SESSION + f"user: {{{field}: {value}}}\n"))
    assert any(p.startswith(f"user.{field}: ") and "1000-59999" in p for p in found), found


@pytest.mark.parametrize("value", [1000, 9001, 59999, 65536, 2**31 - 2])
def test_user_account_ids_stay_allowed(tree, value):
    assert problems_of(tree(SESSION + f"user: {{uid: {value}, gid: {value}}}\n")) == []


@pytest.mark.parametrize("name", ["dialout", "shadow", "utmp", "staff", "operator", "nogroup",
                                  "kmem", "sasl", "fax", "src", "wheel", "cron", "ping",
                                  "ubuntu", "guest", "ssh_keys", "systemd-journal", "abuild"])
def test_names_a_base_image_reserves_are_refused_as_the_session_user(tree, name):
    """Issue 21 class 3: users and groups of Debian's base-passwd, Alpine's baselayout,
    RHEL's setup and Ubuntu's image, not just the examples a list once held."""
    found = problems_of(tree(SESSION + f"user: {{name: '{name}'}}\n"))
    assert any(p.startswith("user.name: ") and "base image" in p for p in found), found


def test_the_reserved_names_cover_debians_base_passwd_files():
    """The constant is generated from base-passwd's master files; it must still cover this
    machine's copies (the check itself never reads them)."""
    from cluster_sessions.core.accounts import RESERVED_NAMES

    masters = [Path("/usr/share/base-passwd") / f for f in ("passwd.master", "group.master")]
    if not all(m.is_file() for m in masters):
        pytest.skip("base-passwd is not installed here")
    names = {line.split(":", 1)[0] for m in masters for line in m.read_text().splitlines()
             if line and not line.startswith("#")}
    assert names and names <= RESERVED_NAMES, sorted(names - RESERVED_NAMES)


def test_ordinary_users_stay_allowed(tree):
    text = SESSION + "user: {name: alice, uid: 1000, gid: 1000}\n"
    assert problems_of(tree(text)) == []
    assert problems_of(tree(SESSION + "user: {name: work}\n")) == []


@pytest.mark.parametrize(
    ("yaml_text", "path", "words"),
    [
        ("user: {uid: 01750}", "user.uid", "octal"),
        ("cluster: {size: 1:30}", "cluster.size", "base-60"),
        ("ports: [{container: 0443}]", "ports.0.container", "octal"),
        ("ports: [{container: 0x1f}]", "ports.0.container", "hexadecimal"),
        ("ports: [{container: 0b101}]", "ports.0.container", "binary"),
        ("ports: [{container: 1_000}]", "ports.0.container", "'_'"),
        ("ports: [{container: +5}]", "ports.0.container", "'+'"),
        ("readiness: {timeout: .inf}", "readiness.timeout", "finite"),
        ("readiness: {timeout: .NaN}", "readiness.timeout", "finite"),
        ("resources: {cpu: 1_0.5}", "resources.cpu", "decimal number"),
        ("resources: {cpu: 1:30.5}", "resources.cpu", "decimal number"),
        ("resources: {cpu: 2, mem: 0x100000000}", "resources.mem", "hexadecimal"),
    ],
)
def test_yaml_1_1_number_spellings_are_refused_with_how_to_write_them(tree, yaml_text, path,
                                                                       words):
    text = SESSION.replace("cluster: {mode: single-node, size: 2}\n", "")
    text = text.replace("resources: {cpu: 2, mem: 4g, shmem: 1g, gpu: 0}\n", "")
    found = problems_of(tree(text + yaml_text + "\n"))
    mine = [p for p in found if p.startswith(f"{path}: ")]
    assert mine and words in mine[0] and "line 5" in mine[0], found
    if path.startswith(("user.", "ports.", "cluster.")):
        assert "plain decimal" in mine[0]


def test_yaml_1_1_numbers_are_refused_in_the_pool_too(tree):
    pool = POOL.replace("gpus: []", "").replace("mem: 32g}", "mem: 32g, gpus: [0, 010]}")
    found = problems_of(tree(pool, "p.yaml", "pools"))
    assert any(p.startswith("agents.0.capacity.gpus.1: ") and "(8)" in p for p in found), found


def test_plain_decimal_numbers_and_quoted_look_alikes_stay_valid(tree):
    text = SESSION + ("user: {uid: 1750, gid: 0001750}\n").replace("0001750", "2000")
    text += "env: {A: '01750', B: '0x1f', C: '1:30', D: 0o17, E: 1e3}\n"
    text += "ports: [{container: 8080}]\n"
    loaded = load_session(tree(text))
    assert (loaded.session.user.uid, loaded.session.user.gid) == (1750, 2000)
    assert loaded.session.env == {"A": "01750", "B": "0x1f", "C": "1:30", "D": "0o17",
                                  "E": "1e3"}


def test_a_string_where_an_integer_is_meant_says_how_to_write_it(tree):
    found = problems_of(tree(SESSION + "user: {uid: 0o17}\n"))
    assert any(p.startswith("user.uid: ") and "decimal" in p for p in found), found


@pytest.mark.parametrize(("port", "size"), [(2200, 2), (2199, 2), (2197, 4), (1024, 1177)])
def test_master_ports_whose_derived_ports_hit_sshd_are_refused(tree, port, size):
    text = SESSION.replace("size: 2", f"size: {size}")
    found = problems_of(tree(text + f"distributed: {{master_port: {port}}}\n"))
    assert any(p.startswith("distributed.master_port: ") and "2200" in p for p in found), found


@pytest.mark.parametrize(("port", "size"), [(2201, 2), (2198, 2), (1024, 1176), (2200, 1)])
def test_master_ports_clear_of_sshd_are_accepted(tree, port, size):
    text = SESSION.replace("size: 2", f"size: {size}")
    pool = POOL.replace("cpu: 8, mem: 32g", "cpu: 9000, mem: 9000g")
    tree(pool, "lab.yaml", "pools")
    assert problems_of(tree(text + f"distributed: {{master_port: {port}}}\n")) == []


def test_a_users_master_port_is_the_base_cluster_env_derives_from(tree):
    found = problems_of(tree(SESSION + "env: {MASTER_PORT: '2199'}\n"))
    assert any(p.startswith("env.MASTER_PORT: ") and "2200" in p for p in found), found
    assert problems_of(tree(SESSION + "env: {MASTER_PORT: '2201'}\n")) == []


def test_env_values_beyond_the_kernels_string_limit_are_refused(tree):
    limit = 128 * 1024 - 1  # NAME=value, without the NUL the kernel counts too
    fits = "x" * (limit - len("FOO="))
    assert problems_of(tree(SESSION + f"env: {{FOO: '{fits}'}}\n")) == []
    found = problems_of(tree(SESSION + f"env: {{FOO: '{fits}x'}}\n"))
    assert any(p.startswith("env.FOO: ") and "131071" in p for p in found), found
    wide = "\u00e9" * (limit // 2)  # two bytes each: the limit is in bytes
    found = problems_of(tree(SESSION + f"env: {{FOO: '{wide}'}}\n"))
    assert [p for p in found if p.startswith("env.FOO: ")], found


def _env_of_total(total: int) -> str:
    """A YAML env mapping whose bytes, as the bound counts them (NAME=value, NUL, pointer),
    add up to exactly ``total``: 100,000-byte entries and one that makes up the rest."""
    entries, left, i = [], total, 0
    while left:
        cost = min(left, 100_000)
        if 0 < left - cost < 20:  # keep the last entry long enough for its name
            cost -= 20
        name = f"V{i:03d}"
        entries.append(f"{name}: '{'x' * (cost - len(name) - 2 - 8)}'")
        left -= cost
        i += 1
    return "env: {" + ", ".join(entries) + "}\n"


def test_an_env_beyond_its_total_per_container_is_refused_naming_env(tree):
    """Issue 21 class 7: the kernel's ARG_MAX bound on argv + envp in all, not only its
    per-string limit; and the bound that keeps plan and render of the worst case small."""
    from cluster_sessions.core.spec import MAX_ENV_BYTES

    assert problems_of(tree(SESSION + _env_of_total(MAX_ENV_BYTES))) == []
    found = problems_of(tree(SESSION + _env_of_total(MAX_ENV_BYTES + 1)))
    assert any(p.startswith("env: ") and str(MAX_ENV_BYTES) in p for p in found), found


def test_an_env_repeated_beyond_the_work_bound_is_refused_naming_env(tree):
    """The plan and every container's files repeat the env: its bytes times the containers
    are bounded, so the worst accepted definition plans and renders in bounded work."""
    from cluster_sessions.core.spec import MAX_PLANNED_ENV

    text = SESSION.replace("size: 2", "size: 128")  # pending on this pool: still valid
    per = MAX_PLANNED_ENV // 128
    assert problems_of(tree(text + _env_of_total(per))) == []
    found = problems_of(tree(text + _env_of_total(per + 1)))
    assert any(p.startswith("env: ") and str(MAX_PLANNED_ENV) in p for p in found), found
    counted = SESSION.replace("size: 2", "size: 64") + "count: 2\n"
    found = problems_of(tree(counted + _env_of_total(per + 1)))
    assert any(p.startswith("env: ") and "128 containers" in p for p in found), found


def test_mounts_and_command_repeated_per_container_are_bounded(tree):
    from cluster_sessions.core.spec import MAX_ENV_BYTES, MAX_MOUNTS

    def mounts(n: int) -> str:
        return "mounts: [" + ", ".join(f"{{source: v{i}, target: /data/{i}}}"
                                        for i in range(n)) + "]\n"

    assert problems_of(tree(SESSION + mounts(MAX_MOUNTS))) == []
    found = problems_of(tree(SESSION + mounts(MAX_MOUNTS + 1)))
    assert any(p.startswith("mounts: ") and str(MAX_MOUNTS) in p for p in found), found
    long = "/data/" + "x" * 5000
    found = problems_of(tree(SESSION + f"mounts: [{{source: v, target: '{long}'}}]\n"))
    assert any(p.startswith("mounts.0.target: ") and "PATH_MAX" in p for p in found), found
    wide = "mounts: [" + ", ".join(f"{{source: v, target: '/data/{i}{'x' * 3000}'}}"
                                   for i in range(6)) + "]\n"
    found = problems_of(tree(SESSION + wide))
    assert any(p.startswith("mounts: ") and "16384" in p for p in found), found
    args = ", ".join(["'" + "x" * 100_000 + "'"] * 3)
    found = problems_of(tree(SESSION + f"command: [{args}]\n"))
    assert any(p.startswith("command: ") and str(MAX_ENV_BYTES) in p for p in found), found


def test_an_env_with_too_many_variables_is_refused_naming_env(tree):
    from cluster_sessions.core.spec import MAX_ENV_ENTRIES

    def env(n: int) -> str:
        return "env: {" + ", ".join(f"V{i}: x" for i in range(n)) + "}\n"

    assert problems_of(tree(SESSION + env(MAX_ENV_ENTRIES))) == []
    found = problems_of(tree(SESSION + env(MAX_ENV_ENTRIES + 1)))
    assert any(p.startswith("env: ") and str(MAX_ENV_ENTRIES) in p for p in found), found


def test_a_command_argument_beyond_the_kernels_string_limit_is_refused(tree):
    found = problems_of(tree(SESSION + f"command: [echo, '{'x' * 131072}']\n"))
    assert any(p.startswith("command.1: ") and "MAX_ARG_STRLEN" in p for p in found), found


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ('image: "ex/img:1\\x1b[2J"', "image"),
        ('image: "ex/img\\u202e:1"', "image"),
        ('command: [echo, "a\\x07b"]', "command.1"),
        ('command: ["sle\\0ep"]', "command.0"),
        ('mounts: [{source: "/a\\nb", target: /x}]', "mounts.0.source"),
        ('mounts: [{source: /a, target: "/x\\ty"}]', "mounts.0.target"),
        ('pool: "lab\\x1b"', "pool"),
    ],
)
def test_control_characters_are_refused_where_a_value_names_or_runs_something(tree, extra,
                                                                              path):
    key = extra.split(":", 1)[0]
    text = "\n".join(line for line in SESSION.splitlines() if not line.startswith(key + ":"))
    found = problems_of(tree(text + "\n" + extra + "\n"))
    assert any(p.startswith(f"{path}: ") and "control characters" in p for p in found), found


def test_newlines_and_tabs_stay_allowed_in_commands_and_env_values(tree):
    text = SESSION + ('command: [bash, -c, "for i in 1 2; do\\n\\techo $i\\ndone"]\n'
                      'env: {A: "line1\\nline2\\ttab\\x1b[0m\\r"}\n')
    loaded = load_session(tree(text))
    assert loaded.session.command[2] == "for i in 1 2; do\n\techo $i\ndone"
    assert loaded.session.env["A"] == "line1\nline2\ttab\x1b[0m\r"  # byte for byte


@pytest.mark.parametrize(
    ("mem", "words"),
    [("2", "below the minimum of 6m"), ("6291455", "below the minimum of 6m"),
     ("5m", "below the minimum of 6m"), ("9223372036854775807", "too large"),
     ("8388608t", "too large"), ("'" + "9" * 400 + ".5g'", "too large")],
)
def test_memory_docker_cannot_take_is_refused(tree, mem, words):
    found = problems_of(tree(SESSION.replace("mem: 4g, shmem: 1g", f"mem: {mem}, shmem: 1m")))
    assert any(p.startswith("resources.mem: ") and words in p for p in found), found


def test_memory_at_dockers_bounds_is_accepted(tree):
    assert problems_of(tree(SESSION.replace("mem: 4g, shmem: 1g", "mem: 6m, shmem: 1m"))) == []
    pool = POOL.replace("mem: 32g", "mem: 8796093022207m")
    assert problems_of(tree(pool, "p.yaml", "pools")) == []


def test_shared_memory_below_one_mib_is_refused(tree):
    found = problems_of(tree(SESSION.replace("shmem: 1g", "shmem: 1000k")))
    assert any(p.startswith("resources.shmem: ") and "minimum of 1m" in p for p in found), found


@pytest.mark.parametrize("mem", ["2", "9223372036854775807", "'" + "9" * 400 + "g'"])
def test_pool_capacity_docker_cannot_express_is_refused(tree, mem):
    found = problems_of(tree(POOL.replace("mem: 32g", f"mem: {mem}"), "p.yaml", "pools"))
    assert [p for p in found if p.startswith("agents.0.capacity.mem: ")], found


# --- issue 9 item 10: invalid input is a problem with file and field, never exit 1 ---------------


def test_a_huge_integer_is_a_problem_not_a_crash(tree):
    found = problems_of(tree(SESSION.replace("size: 2", "size: " + "9" * 5000)))
    assert [p for p in found if p.startswith("cluster.size: ") and "too large" in p], found


def test_an_unhashable_kind_is_a_problem(tree):
    found = problems_of(tree(SESSION.replace("kind: ClusterSession", "kind: [ClusterSession]")))
    assert [p for p in found if p.startswith("kind: ") and "unknown kind" in p], found


def test_a_pool_under_an_unknown_users_home_is_a_problem(tree):
    found = problems_of(tree(SESSION.replace("pool: lab", "pool: ~nosuchuser/p.yaml")))
    assert found == ["pool: '~nosuchuser/p.yaml': there is no user 'nosuchuser' for "
                     "'~nosuchuser'"]


def test_a_pool_name_too_long_for_a_file_name_is_a_problem(tree):
    found = problems_of(tree(SESSION.replace("pool: lab", "pool: " + "p" * 300)))
    assert found == ["pool: is too long for a pool name (a file name: at most 250 bytes)"]


def test_a_pool_path_too_long_for_the_system_is_a_problem(tree):
    found = problems_of(tree(SESSION.replace("pool: lab", "pool: " + "q" * 300 + "/p.yaml")))
    [problem] = found
    assert problem.startswith("pool: no pool ") and "File name too long" in problem


def test_a_deleted_working_directory_is_a_problem(tree, tmp_path, monkeypatch):
    path = tree(SESSION.replace("pool: lab", "pool: elsewhere"))
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    [problem] = problems_of(path)
    assert problem.startswith("pool: no pool 'elsewhere' found")
    assert "the working directory no longer exists" in problem
    assert load_session(tree(SESSION)).pool.name == "lab"  # found next to the session


def _without_dac_override() -> None:
    """In the child: give up root's right to read and search any directory (CI runs as
    root), so that a directory of mode 000 is unreadable as it is to everyone else."""
    import ctypes
    import os

    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_an_unreadable_pools_directory_is_a_problem(tmp_path):
    import subprocess
    import sys

    (tmp_path / "pools").mkdir()
    (tmp_path / "sessions").mkdir()
    (tmp_path / "pools" / "lab.yaml").write_text(POOL)
    session = tmp_path / "sessions" / "s.yaml"
    session.write_text(SESSION)
    (tmp_path / "pools").chmod(0)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "cluster_sessions.driver.cli", "validate", str(session)],
            capture_output=True, text=True, preexec_fn=_without_dac_override, cwd="/",
            check=False)
    finally:
        (tmp_path / "pools").chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"{session}: pool: no pool 'lab' found"), proc.stderr
    assert "Permission denied" in proc.stderr


def test_the_size_limit_counts_what_is_read_not_what_stat_reports(tree):
    kallsyms = Path("/proc/kallsyms")
    if not kallsyms.exists() or kallsyms.stat().st_size != 0:
        pytest.skip("needs /proc/kallsyms (a file that reports size 0)")
    with pytest.raises(DefinitionError) as err:  # the operator's --pool may name any file
        load_session(tree(SESSION), kallsyms)
    assert [(p.file, p.message) for p in err.value.problems] == [("/proc/kallsyms",
                                                                  "file is larger than 1 MiB")]


def test_a_file_growing_past_the_limit_is_refused(tmp_path, monkeypatch):
    """The limit holds even when stat() says the file is small."""
    import os

    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (1024 * 1024 + 1))
    real = os.stat

    def small(path, *args, **kwargs):
        result = real(path, *args, **kwargs)
        if str(path) == str(big):
            return os.stat_result((result.st_mode, *result[1:6], 10, *result[7:]))
        return result

    monkeypatch.setattr(os, "stat", small)
    [problem] = validate_files([big])
    assert problem.message == "file is larger than 1 MiB"


@pytest.mark.parametrize(
    ("agent", "path", "words"),
    [
        ("docker_host: 'ssh://-oProxyCommand=touch${IFS}/tmp/x'", "docker_host", "'-'"),
        ("docker_host: 'ssh://ops@-oProxyCommand=x'", "docker_host", "'-'"),
        ("docker_host: 'ssh://-oProxyCommand=x@host'", "docker_host", "'-'"),
        ("docker_host: 'ssh://%2DoProxyCommand=x@host'", "docker_host", "'-'"),
        ("docker_host: 'ssh://host:notaport'", "docker_host", "port"),
        ("docker_host: \"unix:///var/run/docker.sock\\x1b\"", "docker_host", "control"),
        ("docker_host: 'unix://relative/sock'", "docker_host", "unix:///"),
        ("docker_host: 'tcp://ops@host:2376'", "docker_host", "no user"),
        ("{ssh: {host: '-oProxyCommand=x'}}", "ssh.host", "'-'"),
        ("{ssh: {host: 'a host'}}", "ssh.host", "host name"),
        ("{ssh: {host: h, user: '-oProxyCommand=x'}}", "ssh.user", "'-'"),
        ("{ssh: {host: h, user: 'a b'}}", "ssh.user", "whitespace"),
        ("{ssh: {host: h, user: \"a\\nb\"}}", "ssh.user", "control"),
        ("{ssh: {host: h, key_file: \"/k\\x1b\"}}", "ssh.key_file", "control"),
        ("{address: '-oProxyCommand=x'}", "address", "'-'"),
    ],
)
def test_agent_hosts_and_users_ssh_would_read_as_options_are_refused(tree, agent, path, words):
    fields = agent[1:-1] + ", docker_host: 'ssh://h'" if agent.startswith("{") else agent
    pool = (f"kind: AgentPool\nname: lab\nagents:\n  - {{name: a1, {fields}, "
            f"capacity: {{cpu: 8, mem: 32g}}}}\n")
    found = problems_of(tree(pool, "p.yaml", "pools"))
    assert any(p.startswith(f"agents.0.{path}: ") and words in p for p in found), found


@pytest.mark.parametrize("fields", [
    "docker_host: 'ssh://ops@10.0.0.1:2222'", "docker_host: 'ssh://agent-1.example'",
    "docker_host: 'ssh://[fe80::1]:22'", "docker_host: 'unix:///run/docker.sock'",
    "docker_host: 'tcp://10.0.0.2:2376', tls: {cert_path: ~/.docker/agents}",
    # a remote agent as a real pool is: the socket on the agent, or its default
    "docker_host: 'unix:///run/user/1000/docker.sock', ssh: {host: agent-1.example, user: ops}",
    "ssh: {host: agent-1.example, user: ops, key_file: ~/.ssh/id_pool}",
])
def test_ordinary_docker_hosts_stay_valid(tree, fields):
    pool = (f"kind: AgentPool\nname: lab\nagents:\n  - {{name: a1, {fields}, "
            f"capacity: {{cpu: 8, mem: 32g}}}}\n")
    assert problems_of(tree(pool, "p.yaml", "pools")) == []


@pytest.mark.parametrize(("fields", "path", "words"), [
    # an ssh block means "reach the agent over ssh": docker_host is the socket there
    ("docker_host: 'ssh://ops@h', ssh: {host: h}", "docker_host", "socket on the agent"),
    ("docker_host: 'tcp://h:2376', ssh: {host: h}", "docker_host", "socket on the agent"),
    # engines a pool may name: an allowlist of schemes
    ("docker_host: 'npipe:////./pipe/docker_engine'", "docker_host", "must be unix:///PATH"),
    ("docker_host: 'fd://'", "docker_host", "must be unix:///PATH"),
    ("docker_host: 'http://h:2375'", "docker_host", "must be unix:///PATH"),
    ("docker_host: 'tcp://h:2375'", "docker_host", "without TLS"),
    ("docker_host: 'tcp://h'", "docker_host", "needs a port"),
    ("docker_host: 'tcp://h', tls: {cert_path: /c}", "docker_host", "needs a port"),
    ("docker_host: 'tcp://h:0', tls: {cert_path: /c}", "docker_host", "port 0"),
    ("docker_host: 'ssh://ops@h:0'", "docker_host", "port 0"),
    ("docker_host: 'unix:///s', tls: {cert_path: /c}", "tls", "tcp://"),
    ("ssh: {host: h, key_file: '/keys/my key'}", "ssh.key_file", "whitespace"),
    ("ssh: {host: h, known_hosts: '/kh/%d'}", "ssh.known_hosts", "'%'"),
])
def test_how_an_agent_is_reached_must_mean_one_thing(tree, fields, path, words):
    pool = (f"kind: AgentPool\nname: lab\nagents:\n  - {{name: a1, {fields}, "
            f"capacity: {{cpu: 8, mem: 32g}}}}\n")
    found = problems_of(tree(pool, "p.yaml", "pools"))
    assert any(p.startswith(f"agents.0.{path}: ") and words in p for p in found), found


def test_a_password_in_an_ssh_url_is_refused_without_being_echoed(tree):
    pool = ("kind: AgentPool\nname: lab\nagents:\n  - {name: a1, docker_host: "
            "'ssh://ops:hunter2@h:22', capacity: {cpu: 8, mem: 32g}}\n")
    found = problems_of(tree(pool, "p.yaml", "pools"))
    assert any(p.startswith("agents.0.docker_host: ") and "password" in p for p in found), found
    assert not any("hunter2" in p for p in found)


def test_a_cluster_beyond_the_maximum_size_is_refused_with_the_limit(tree):
    from cluster_sessions.core.spec import MAX_CLUSTER_SIZE

    assert MAX_CLUSTER_SIZE == 2048  # the documented limit (README, docs/design-notes.md)
    def sized(size: int) -> str:
        return SESSION.replace("size: 2}", f"size: {size}}}")

    assert problems_of(tree(sized(MAX_CLUSTER_SIZE))) == []
    assert problems_of(tree(sized(MAX_CLUSTER_SIZE + 1))) == [
        f"cluster.size: must be less than or equal to {MAX_CLUSTER_SIZE}"]


def test_the_built_in_local_pool_is_found_from_a_copy_anywhere(tmp_path, monkeypatch):
    """A copy of an example outside the project still finds ``pool: local`` (issue 12)."""
    from cluster_sessions.core.loader import BUILTIN_POOLS

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copy = elsewhere / "train-demo.yaml"
    copy.write_text((BUILTIN_POOLS.parent / "sessions" / "train-demo.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    loaded = load_session(copy)
    assert loaded.pool.name == "local" and loaded.pool_file == BUILTIN_POOLS / "local.yaml"


def test_pools_are_looked_up_in_the_directories_of_the_environment_first(tree, tmp_path,
                                                                          monkeypatch):
    mine = tmp_path / "my-pools"
    mine.mkdir()
    (mine / "local.yaml").write_text(POOL.replace("name: lab", "name: local"))
    session = tree(SESSION.replace("pool: lab", "pool: local"), where=".")
    monkeypatch.setenv("CLUSTER_SESSIONS_POOLS", f"/nonexistent:{mine}")
    assert load_session(session).pool_file == mine / "local.yaml"
    monkeypatch.delenv("CLUSTER_SESSIONS_POOLS")
    assert load_session(session).pool_file != mine / "local.yaml"


# --- issue 11: hostfile slots ---------------------------------------------------------------------


@pytest.mark.parametrize(("slots", "gpu", "words"), [
    ("0", 0, "greater than or equal to 1"),
    ("-2", 0, "greater than or equal to 1"),
    ("1.5", 0, "integer"),
    ("'4'", 0, "integer"),
    ("four", 0, "integer"),
    ("04", 0, "04"),  # YAML 1.1 would read an octal 4: refused, with how to write it
    ("1:30", 0, "1:30"),  # ... and a sexagesimal 90
    ("5", 4, "at most 4"),
    ("1025", 0, "less than or equal to 1024"),
])
def test_bad_slots_are_refused_with_the_field_named(tree, slots, gpu, words):
    text = SESSION.replace("gpu: 0", f"gpu: {gpu}") + f"distributed: {{slots: {slots}}}\n"
    found = problems_of(tree(text))
    assert any(p.startswith("distributed.slots: ") and words in p for p in found), found


@pytest.mark.parametrize(("slots", "gpu"), [("1", 0), ("8", 0), ("4", 4), ("2", 4)])
def test_good_slots_are_accepted(tree, slots, gpu):
    text = SESSION.replace("gpu: 0", f"gpu: {gpu}") + f"distributed: {{slots: {slots}}}\n"
    assert problems_of(tree(text)) == []


@pytest.mark.parametrize(("cpu", "near"), [("0.01", "0.011"), ("0.05", "0.051"),
                                           ("0.001", "0.011"), ("707.001", "707")])
def test_cpu_values_the_provider_reads_back_differently_are_refused(tree, cpu, near):
    found = problems_of(tree(SESSION.replace("cpu: 2", f"cpu: {cpu}")))
    assert any(p.startswith("resources.cpu: ") and "every up would replace" in p
               and p.endswith(f"such as {near}") for p in found), found


@pytest.mark.parametrize("cpu", ["0.1", "0.011", "1", "10", "2.5"])
def test_cpu_values_that_survive_the_read_back_are_accepted(tree, cpu):
    assert problems_of(tree(SESSION.replace("cpu: 2", f"cpu: {cpu}"))) == []


@pytest.mark.parametrize(("count", "words"), [
    ("0", "greater than or equal to 1"), ("-2", "greater than or equal to 1"),
    ("101", "less than or equal to 100"), ('"3"', "plain decimal"),
    ("2.5", "must be a valid integer"), ("0x3", "hexadecimal"), ("true", "valid integer"),
])
def test_count_must_be_a_whole_number_of_sessions(tree, count, words):
    found = problems_of(tree(SESSION + f"count: {count}\n"))
    assert any(p.startswith("count: ") and words in p for p in found), found


def test_count_whose_last_name_is_too_long_is_refused_naming_the_longest(tree):
    name = "n" * 62
    found = problems_of(tree(SESSION.replace("name: train-demo", f"name: {name}")
                             + "count: 10\n"))
    assert found == [f"count: 10 sessions are named {name}-1 .. {name}-10, longer than the 64 "
                     "characters a session name may have: shorten the name or lower the count"]
    assert problems_of(tree(SESSION.replace("name: train-demo", f"name: {name}")
                            + "count: 9\n")) == []


def test_count_with_a_fixed_host_port_is_refused(tree):
    text = SESSION + "count: 2\nports: [{container: 8888, host: 18888}, {container: 6006}]\n"
    assert problems_of(tree(text)) == [
        "ports.0.host: host port 18888 is fixed, but count makes 2 sessions that may share an "
        "agent and cannot all publish it: leave host unset (the engine picks a free port)"]


@pytest.mark.parametrize(("agent", "address"), [
    ({"address": "10.0.0.5", "ssh": {"host": "h"}, "docker_host": "ssh://u@d"}, "10.0.0.5"),
    ({"ssh": {"host": "h.example"}, "docker_host": "ssh://u@d"}, "h.example"),
    ({"docker_host": "tcp://10.1.1.1:2376"}, "10.1.1.1"),
    ({"docker_host": "unix:///var/run/docker.sock"}, None),
])
def test_an_agent_is_reached_at_one_address_for_the_swarm_and_published_ports(agent, address):
    from cluster_sessions.core.spec import Agent, agent_address

    assert agent_address(Agent.model_validate(
        {"name": "a", "capacity": {"cpu": 1, "mem": "1g"}, **agent})) == address


def test_a_count_is_bounded_by_the_containers_it_plans_in_all(tree):
    """count × size is what one definition makes plan, render and the program build: the same
    limit as one cluster's (2,048), so a definition cannot ask for 100 × 2,048 containers."""
    def counted(count: int, size: int) -> str:
        return SESSION.replace("size: 2}", f"size: {size}}}") + f"count: {count}\n"

    assert problems_of(tree(counted(2, 1024))) == []
    assert problems_of(tree(counted(100, 2048))) == [
        "count: 100 sessions of 2048 containers are 204800 containers, more than the 2048 one "
        "definition may plan: lower the count or the size"]
    assert problems_of(tree(counted(3, 683))) == [
        "count: 3 sessions of 683 containers are 2049 containers, more than the 2048 one "
        "definition may plan: lower the count or the size"]


def test_an_unknown_pool_name_lists_the_pools_that_exist_with_a_hint(tree):
    path = tree(SESSION.replace("pool: lab", "pool: lob"))
    [problem] = problems_of(path)
    assert "did you mean 'lab'?" in problem
    assert "pools that exist: " in problem and "lab" in problem.split("pools that exist: ")[1]


def test_a_session_without_a_name_is_named_after_its_file(tree):
    path = tree(SESSION.replace("name: train-demo\n", ""), name="night-run.yaml")
    loaded = load_session(path)
    assert loaded.session.name == "night-run"
    assert loaded.name_from_file


def test_a_name_from_the_file_is_checked_like_a_written_one_and_says_so(tree):
    path = tree(SESSION.replace("name: train-demo\n", ""), name="x.yaml")
    [problem] = problems_of(path)
    assert problem.startswith("name: must be 4-64 characters")
    assert "from the file name" in problem


def test_a_written_name_is_not_from_the_file(tree):
    assert not load_session(tree(SESSION)).name_from_file


INTEGERS = ("; write integers in plain decimal without leading zeros, signs or separators "
            "(e.g. 1750), or quote the value if you mean text (line 1)")


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("? [a]\n: 1\n", "line 1, column 3", "invalid YAML: a key must be a plain value"),
        ("a: 1\nb: 2\na: 3\n", "line 3, column 1",
         "invalid YAML: key 'a' appears twice (first on line 1)"),
        ("a: &x 1\nb: *x\n", "line 2, column 4", "invalid YAML: aliases (*name) are not allowed"),
        ("[" * 65 + "]" * 65, "line 1, column 65", "invalid YAML: nested deeper than 64 levels"),
        ("a: b: c\n", "line 1, column 5",
         "invalid YAML: mapping values are not allowed in this context"),
        ("", "(whole file)", "expected exactly one YAML document, found 0"),
        ("---\na: 1\n---\nb: 2\n", "(whole file)", "expected exactly one YAML document, found 2"),
        ("a: 0x1f\n", "a", "'0x1f' is hexadecimal (31)" + INTEGERS),
        ("a: !!int -0X1f\n", "a", "'-0X1f' is hexadecimal" + INTEGERS),
        ("a: !!int +0x1\n", "a", "'+0x1' is hexadecimal (1)" + INTEGERS),
        ("a: 0b11\n", "a", "'0b11' is binary (3)" + INTEGERS),
        ("a: !!int 0B11\n", "a", "'0B11' is binary" + INTEGERS),
        ("a: !!int x\n", "a", "'x' is not a plain decimal integer" + INTEGERS),
        ("a: !!int X01\n", "a", "'X01' is not a plain decimal integer" + INTEGERS),
        ("a: !!int '-'\n", "a", "'-' is not a plain decimal integer" + INTEGERS),
        ("a: !!int 1_0x\n", "a", "'1_0x' is written with '_' separators" + INTEGERS),
        ("a: !!float 1e3\n", "a", "'1e3' is not a plain decimal number; write numbers such as "
         "2 or 0.5, without signs, separators or ':' (quote it if you mean text) (line 1)"),
        ("a: 017\n", "a", "'017' is octal in YAML 1.1 (a leading zero) (15)" + INTEGERS),
        ("a: 01\n", "a", "'01' is octal in YAML 1.1 (a leading zero) (1)" + INTEGERS),
        ("a: +0\n", "a", "'+0' is written with a '+' sign (0)" + INTEGERS),
        ("a: 1_000\n", "a", "'1_000' is written with '_' separators (1000)" + INTEGERS),
        ("a: +5\n", "a", "'+5' is written with a '+' sign (5)" + INTEGERS),
        ("a: +1_0\n", "a", "'+1_0' is written with '_' separators (10)" + INTEGERS),
        ("a: -1_0\n", "a", "'-1_0' is written with '_' separators (-10)" + INTEGERS),
        ("a: 1:30\n", "a", "'1:30' is a base-60 (sexagesimal) number in YAML 1.1 (90)"
         + INTEGERS),
        ("a: !!int 0:0x1\n", "a", "'0:0x1' is a base-60 (sexagesimal) number in YAML 1.1"
         + INTEGERS),
        ("a: -0\n", "a", None),
        ("a: 0\n", "a", None),
        ("a: 9223372036854775807\n", "a", None),
        ("a: -9223372036854775807\n", "a", None),
        ("a: 9223372036854775808\n", "a",
         "an integer of 19 digits is too large (at most 9223372036854775807) (line 1)"),
        ("a: -9223372036854775808\n", "a",
         "an integer of 19 digits is too large (at most 9223372036854775807) (line 1)"),
        ("a: " + "1" * 5000 + "\n", "a",
         "an integer of 5000 digits is too large (at most 9223372036854775807) (line 1)"),
        ("a: 1000000000000000000\n", "a", None),
        ("a: 12345678901234567890\n", "a",
         "an integer of 20 digits is too large (at most 9223372036854775807) (line 1)"),
        ("a: -0000000000000000001\n", "a", "'-0000000000000000001' is octal in YAML 1.1 "
         "(a leading zero) (-1)" + INTEGERS),
        # a value beyond int64 is not shown; nor is one of more than 100 characters
        ("a: 0x8000000000000000\n", "a", "'0x8000000000000000' is hexadecimal" + INTEGERS),
        ("a: 0x7fffffffffffffff\n", "a",
         "'0x7fffffffffffffff' is hexadecimal (9223372036854775807)" + INTEGERS),
        ("a: -0x7fffffffffffffff\n", "a",
         "'-0x7fffffffffffffff' is hexadecimal (-9223372036854775807)" + INTEGERS),
        ("a: 0b" + "0" * 97 + "1\n", "a", f"'0b{'0' * 97}1' is binary (1)" + INTEGERS),
        ("a: 0b" + "0" * 98 + "1\n", "a", f"'0b{'0' * 98}1' is binary" + INTEGERS),
        ("a: yes\n", "a", "'yes' is a boolean (true) only in YAML 1.1; write true or false, or "
         "quote the value if you mean text (line 1)"),
        ("a: On\n", "a", "'On' is a boolean (true) only in YAML 1.1; write true or false, or "
         "quote the value if you mean text (line 1)"),
        ("a: NO\n", "a", "'NO' is a boolean (false) only in YAML 1.1; write true or false, or "
         "quote the value if you mean text (line 1)"),
        ("a: off\n", "a", "'off' is a boolean (false) only in YAML 1.1; write true or false, or "
         "quote the value if you mean text (line 1)"),
        ("a: !!bool y\n", "a", "'y' is a boolean (true) only in YAML 1.1; write true or false, "
         "or quote the value if you mean text (line 1)"),
        ("a: !!bool n\n", "a", "'n' is a boolean (false) only in YAML 1.1; write true or false, "
         "or quote the value if you mean text (line 1)"),
        ("a: TRUE\n", "a", None),
        ("---\n---\na: 1\n", "a", None),  # an empty document is no document
        ("[" + "[], " * 100 + "]", "", None),  # 100 collections side by side, each 2 deep
        ("a: False\n", "a", None),
        ("a: 1.5\n", "a", None),
        ("a: -.5\n", "a", None),
        ("a: 1.5e-3\n", "a", None),
        ("a: .inf\n", "a", "'.inf' is not a finite number; write a decimal number such as 2 or "
         "0.5 (quote it if you mean text) (line 1)"),
        ("a: -.Inf\n", "a", "'-.Inf' is not a finite number; write a decimal number such as 2 or "
         "0.5 (quote it if you mean text) (line 1)"),
        ("a: .NaN\n", "a", "'.NaN' is not a finite number; write a decimal number such as 2 or "
         "0.5 (quote it if you mean text) (line 1)"),
        ("a: +1.5\n", "a", "'+1.5' is not a plain decimal number; write numbers such as 2 or "
         "0.5, without signs, separators or ':' (quote it if you mean text) (line 1)"),
        ("0x10\n", "(whole file)", "'0x10' is hexadecimal (16)" + INTEGERS),
        ("[1, 0x10]\n", "1", "'0x10' is hexadecimal (16)" + INTEGERS),
        ("{0x1: a}\n", "0x1", "'0x1' is hexadecimal (1)" + INTEGERS),
        ("a: {b: [x, 0x1]}\n", "a.b.1", "'0x1' is hexadecimal (1)" + INTEGERS),
        ("? [b]\n: 0x1\n", "?", "'0x1' is hexadecimal (1)" + INTEGERS[:-2] + "2)"),
        ("{[b]: 0x1}\n", "?", "'0x1' is hexadecimal (1)" + INTEGERS),
    ],
)
def test_yaml_refusals_word_for_word(text, where, message):
    """What the loader prints after the file: where, and the message, exactly."""
    if message is None:
        assert parse_yaml(text, "f.yaml") is not None
        return
    with pytest.raises(DefinitionError) as err:
        parse_yaml(text, "f.yaml")
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        ("f.yaml", where, message)]


BASE = {"kind": "ClusterSession", "name": "train-demo", "pool": "lab", "image": "img"}
KINDS_WANTED = "expected one of ClusterSession, AgentPool"


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        ([1], "(whole file)", "expected a mapping with a 'kind' key"),
        ({"name": "x"}, "kind", "required; " + KINDS_WANTED),
        ({"kind": "Session"}, "kind", "unknown kind 'Session'; " + KINDS_WANTED),
        ({"kind": 5}, "kind", "unknown kind 5; " + KINDS_WANTED),
        ({"kind": ["a"]}, "kind", "unknown kind ['a']; " + KINDS_WANTED),
        ({**BASE, "imagee": "x"}, "imagee", "unknown key; did you mean 'image'? (allowed: kind, "
         "name, pool, image, type, count, cluster, resources, mounts, env, distributed, user, "
         "command, ports, services, readiness, restart, project, lifetime, priority, preemptible)"),
        ({**BASE, "resources": {"typo": 1}}, "resources.typo",
         "unknown key (allowed: cpu, mem, shmem, gpu)"),
        ({**BASE, "mounts": [{"sourc": "/a", "target": "/data"}]}, "mounts.0.sourc",
         "unknown key; did you mean 'source'? (allowed: source, folder, storage, target, "
         "read_only)"),
        ({**BASE, "distributed": {"master_prt": 1}}, "distributed.master_prt",
         "unknown key; did you mean 'master_port'? (allowed: master_port, slots)"),
        ({**BASE, "ports": [{"container": 1, "x": 1}]}, "ports.0.x",
         "unknown key (allowed: container, host, host_ip, protocol, public)"),
        ({"kind": "AgentPool", "name": "p", "agents": [
            {"name": "a", "capacity": {"cpu": 1, "mem": "1g"}, "ssh": {"host": "h", "hst": "x"}}]},
         "agents.0.ssh.hst", "unknown key; did you mean 'host'? (allowed: host, port, user, "
         "key_file, known_hosts)"),
        ({**BASE, "cluster": {"mode": "multi"}}, "cluster.mode",
         "must be 'single-node' or 'multi-node', got 'multi'; did you mean 'multi-node'?"),
        ({**BASE, "cluster": {"mode": "both"}}, "cluster.mode",
         "must be 'single-node' or 'multi-node', got 'both'"),
        ({"kind": "AgentPool", "name": "p", "scheduler": {"selector": "concentrate"},
          "agents": [{"name": "a", "capacity": {"cpu": 1, "mem": "1g"}}]},
         "scheduler.selector", "must be 'concentrated', 'dispersed' or 'roundrobin', got "
         "'concentrate'; did you mean 'concentrated'?"),
        ({"kind": "AgentPool", "name": "p", "scheduler": {"selector": ["dispersed"]},
          "agents": [{"name": "a", "capacity": {"cpu": 1, "mem": "1g"}}]},
         "scheduler.selector", "must be 'concentrated', 'dispersed' or 'roundrobin', got "
         "['dispersed']"),
        ({"kind": "AgentPool", "name": "p", "scheduler": {"selectr": "dispersed"},
          "agents": [{"name": "a", "capacity": {"cpu": 1, "mem": "1g"}}]},
         "scheduler.selectr",
         "unknown key; did you mean 'selector'? (allowed: selector, backfill_for)"),
        ({**BASE, "cluster": {"size": "4"}}, "cluster.size",
         "must be an integer written in plain decimal (e.g. 1750), got '4'"),
        ({**BASE, "cluster": {"size": 2.5}}, "cluster.size", "must be a valid integer"),
        ({**BASE, "cluster": {"size": [1]}}, "cluster.size", "must be a valid integer"),
        ({**BASE, "cluster": {"size": 0}}, "cluster.size", "must be greater than or equal to 1"),
        ({**BASE, "cluster": 5}, "cluster",
         "must be a valid dictionary or instance of ClusterShape"),
        ({**BASE, "name": 1234}, "name", "must be a string, got 1234 (quote it in YAML)"),
        ({**BASE, "name": {"a": 1}}, "name", "must be a valid string"),
        ({**BASE, "name": [1]}, "name", "must be a valid string"),
        ({**BASE, "env": {"A": {"x": 1}}}, "env.A", "must be a valid string"),
        ({**BASE, "env": {5: "x"}}, "env.5", "must be a string, got 5 (quote it in YAML)"),
        ({**BASE, "user": {"uid": 5}}, "user.uid", "must be a user account's id, 1000-59999 or "
         "65536-2147483646: 0-999 are system accounts, 60000-65535 are reserved (Debian "
         "policy), 65534 is nobody"),
        ({**BASE, "command": []}, "command", "must have at least 1 item, not 0"),
        ({**BASE, "mounts": [{"source": "v", "target": f"/data/{i}"} for i in range(65)]},
         "mounts", "must have at most 64 items, not 65"),
        ({**BASE, "mounts": [{"target": "/data", "read_only": "yes"}]}, "mounts.0.read_only",
         "must be a valid boolean"),
        ({k: v for k, v in BASE.items() if k != "image"}, "image", "required"),
    ],
)
def test_model_refusals_word_for_word(data, path, message):
    with pytest.raises(DefinitionError) as err:
        to_model(data, "s.yaml")
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        ("s.yaml", path, message)]


def test_the_kind_a_caller_expects_is_checked_word_for_word():
    with pytest.raises(DefinitionError) as err:
        to_model(BASE, "s.yaml", expect="AgentPool")
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        ("s.yaml", "kind", "expected AgentPool, got ClusterSession")]
    assert isinstance(to_model(BASE, "s.yaml", expect="ClusterSession"), Session)
    assert isinstance(to_model(BASE, "s.yaml", expect=None), Session)


def test_a_name_from_the_file_says_so_only_on_the_name():
    data = {"kind": "ClusterSession", "pool": "lab", "image": "a b"}
    with pytest.raises(DefinitionError) as err:
        to_model(data, "stacks/ab.yaml")
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        ("stacks/ab.yaml", "name", "must be 4-64 characters of letters, digits, '_', '.' or "
         "'-', starting and ending with a letter, digit or '_' (the name comes from the file "
         "name: add a `name:` or rename the file)"),
        ("stacks/ab.yaml", "image", "must not contain whitespace")]
    with pytest.raises(DefinitionError) as err:  # a model error on the name says so too
        to_model({**data, "image": "img", "cluster": 5}, "stacks/12.yaml")
    assert [(p.path, p.message) for p in err.value.problems] == [
        ("cluster", "must be a valid dictionary or instance of ClusterShape")]
    with pytest.raises(DefinitionError) as err:  # a written name is the writer's
        to_model({**data, "name": "ab"}, "stacks/ab.yaml")
    assert [(p.path, p.message) for p in err.value.problems][0] == (
        "name", "must be 4-64 characters of letters, digits, '_', '.' or '-', starting and "
        "ending with a letter, digit or '_'")
    assert to_model({**data, "image": "img"}, "stacks/night-run.yaml").name == "night-run"


def test_only_a_session_without_a_name_is_named_by_its_file():
    assert named_by_file({"kind": "ClusterSession"})
    assert not named_by_file({"kind": "ClusterSession", "name": "x"})
    assert not named_by_file({"kind": "AgentPool"})
    assert not named_by_file({})
    assert not named_by_file(["kind", "ClusterSession"])


def test_whole_floats_are_integers_as_json_schema_reads_them():
    out = as_json_numbers({"a": [2.0, 2.5, {"b": 3.0}], "c": True, "d": "2.0", "e": -0.0})
    assert out == {"a": [2, 2.5, {"b": 3}], "c": True, "d": "2.0", "e": 0}
    assert [type(v) for v in (out["a"][0], out["a"][1], out["a"][2]["b"], out["e"])] == [
        int, float, int, int]
    assert out["c"] is True


def test_pool_directories_in_the_order_they_are_searched(tmp_path, monkeypatch):
    """The operator's directories only: $CLUSTER_SESSIONS_POOLS, then the project's; never the
    working directory's or the definition's folder (whose author may have written a pool)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert operator_pool_dirs(f"/e1::/e2{os.pathsep}/e1") == (Path("/e1"), Path("/e2"),
                                                             BUILTIN_POOLS)
    assert operator_pool_dirs(None) == operator_pool_dirs("") == (BUILTIN_POOLS,)
    assert Path(loader.__file__).resolve().parents[3] / "stacks" / "pools" == BUILTIN_POOLS


def test_where_a_pool_reference_may_point(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session = tmp_path / "s" / "x.yaml"
    assert pool_candidates(session, "p/lab") == [tmp_path / "s" / "p" / "lab",
                                                 tmp_path / "p" / "lab"]
    assert pool_candidates(session, "lab.yml") == [tmp_path / "s" / "lab.yml",
                                                   tmp_path / "lab.yml"]
    assert pool_candidates(None, "lab.yaml") == [tmp_path / "lab.yaml"]
    assert pool_candidates(session, "/abs/lab") == [Path("/abs/lab")]
    assert pool_candidates(session, "~/lab.yaml") == [Path.home() / "lab.yaml"]
    pools = operator_dirs()  # conftest: the test's directories, then the project's
    assert pools[:2] == (tmp_path, tmp_path / "pools") and pools[-1] == BUILTIN_POOLS
    assert pool_candidates(session, "lab") == [d / n for d in pools
                                               for n in ("lab.yaml", "lab.yml")]
    with pytest.raises(PoolNotFound) as err:
        pool_candidates(session, "~nosuchuser/x/lab.yaml")
    assert str(err.value) == ("'~nosuchuser/x/lab.yaml': there is no user 'nosuchuser' for "
                              "'~nosuchuser'")


def test_a_missing_pool_is_refused_word_for_word(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CLUSTER_SESSIONS_POOLS", str(tmp_path / "env"))
    session = tmp_path / "env" / "s" / "x.yaml"
    (tmp_path / "env" / "s").mkdir(parents=True)
    for name in ("lab.yaml", "lob.yml", "zeta.yaml", "notes.txt"):
        (tmp_path / "env" / name).write_text(POOL.replace("name: lab", f"name: {Path(name).stem}"))
    (tmp_path / "env" / "dir.yaml").mkdir()
    # a definition beside the pools is no pool: never listed among them
    (tmp_path / "env" / "s.yaml").write_text(SESSION)
    looked = ", ".join(f"{d}/nope{ext}" for d in (tmp_path / "env", BUILTIN_POOLS)
                       for ext in (".yaml", ".yml"))
    builtin = [name for name, _ in pools_in(BUILTIN_POOLS)]
    exist = ", ".join(dict.fromkeys(["lab", "lob", "zeta", *builtin]))
    with pytest.raises(PoolNotFound) as err:
        find_pool("nope", session)
    assert str(err.value) == f"no pool 'nope' found (looked for {looked}) (pools that exist: " \
                             f"{exist})"
    with pytest.raises(PoolNotFound) as err:
        find_pool("zetta", session)
    assert str(err.value).endswith(f"); did you mean 'zeta'? (pools that exist: {exist})")
    with pytest.raises(PoolNotFound) as err:  # a path: no list of names; only the candidate
        find_pool("p/lab", session)           # inside the operator's directories is named
    assert str(err.value) == f"no pool 'p/lab' found (looked for {tmp_path}/env/s/p/lab)"
    assert find_pool("lob", session) == tmp_path / "env" / "lob.yml"
    assert find_pool("../lab.yaml", session) == tmp_path / "env" / "s" / "../lab.yaml"
    for ref in ("s/nope", "nope.yaml", "nope.yml"):
        with pytest.raises(PoolNotFound) as err:
            find_pool(ref, session)
        assert str(err.value) == f"no pool '{ref}' found (looked for {tmp_path}/env/s/{ref})"


def test_a_pool_is_found_by_its_name_not_only_its_file_s(tmp_path, monkeypatch):
    """Issue 41, item 12: `pool.yaml` holding `name: ncpool` is the pool `ncpool`; the
    did-you-mean lists pools by their names, and no definition."""
    monkeypatch.chdir(tmp_path)
    pools = tmp_path / "env"
    pools.mkdir()
    monkeypatch.setenv("CLUSTER_SESSIONS_POOLS", str(pools))
    (pools / "pool.yaml").write_text(POOL.replace("name: lab", "name: ncpool"))
    (pools / "s.yaml").write_text(SESSION)
    allowed = operator_pool_dirs(str(pools))
    assert loader.find_pool("ncpool", allowed=allowed) == pools / "pool.yaml"
    with pytest.raises(PoolNotFound) as err:
        loader.find_pool("ncpol", allowed=allowed)
    assert "did you mean 'ncpool'?" in str(err.value)
    listed = str(err.value).split("pools that exist: ")[1].rstrip(")").split(", ")
    assert "ncpool" in listed and "pool" not in listed and "s" not in listed
    # a link in an operator's directory to a pool outside it is not found for a definition
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(POOL.replace("name: lab", "name: sneaky"))
    (pools / "link.yaml").symlink_to(outside)
    with pytest.raises(PoolNotFound):
        loader.find_pool("sneaky", tmp_path / "def.yaml", allowed=allowed)


def test_where_nothing_can_be_looked_the_message_says_so(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(PoolNotFound) as err:
        find_pool("p/lab")
    assert str(err.value) == ("no pool 'p/lab' found (looked for nowhere); the working "
                              "directory no longer exists")


def test_a_deleted_working_directory_is_noted_after_what_could_not_be_looked_at(
        tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    ref = "/" + "x" * 300 + ".yaml"
    with pytest.raises(PoolNotFound) as err:
        find_pool(ref, given=True)
    assert str(err.value) == (f"no pool '{ref}' found (looked for {ref}); cannot look at "
                              f"{ref}: File name too long; the working directory no longer "
                              "exists")


def test_a_relative_definition_in_a_deleted_working_directory_has_no_folder(
        tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.delenv("CLUSTER_SESSIONS_POOLS", raising=False)
    assert pool_candidates(Path("s.yaml"), "p/lab") == []
    assert pool_candidates(Path("s.yaml"), "local") == [BUILTIN_POOLS / "local.yaml",
                                                        BUILTIN_POOLS / "local.yml"]


def test_a_candidate_named_twice_is_listed_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref = "x" * 300 + ".yaml"
    with pytest.raises(PoolNotFound) as err:
        find_pool(ref, tmp_path / "s.yaml")
    assert str(err.value) == (f"no pool '{ref}' found (looked for {tmp_path}/{ref}); cannot "
                              f"look at {tmp_path}/{ref}: File name too long")


def test_a_pool_on_the_command_line_may_be_a_file_without_yaml(tree, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").write_text(POOL.replace("name: lab", "name: mine"))
    loaded = load_session(tree(SESSION), Path("mine"))
    assert (loaded.pool.name, loaded.pool_file) == ("mine", Path("mine"))


def test_a_relative_pool_on_the_command_line_is_found_from_the_definition_too(
        tree, tmp_path, monkeypatch):
    elsewhere = tmp_path / "a" / "b"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    loaded = load_session(tree(SESSION), Path("../pools/lab.yaml"))
    assert loaded.pool_file == tmp_path / "sessions" / "../pools/lab.yaml"


def test_a_session_checked_with_its_pool_names_its_file(tree):
    path = tree("kind: ClusterSession\nname: [\n")
    with pytest.raises(DefinitionError) as err:
        load_file(path)
    assert [(p.file, p.path) for p in err.value.problems] == [(str(path), "line 3, column 1")]
    path = tree("kind: ClusterSession\nname: [\n")
    with pytest.raises(DefinitionError) as err:
        load_session(path)
    assert [(p.file, p.path) for p in err.value.problems] == [(str(path), "line 3, column 1")]
    session = load_file(tree(SESSION))
    loaded = with_pool(session, tree(SESSION))
    assert (loaded.session, loaded.pool.name, loaded.name_from_file) == (session, "lab", False)


def test_no_pools_anywhere_gives_no_list(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PoolNotFound) as err:
        loader.find_pool("lab", allowed=[tmp_path / "none"])
    assert str(err.value) == (f"no pool 'lab' found (looked for {tmp_path}/none/lab.yaml, "
                              f"{tmp_path}/none/lab.yml)")


def test_keys_of_a_place_that_is_no_model_are_none():
    """The 'allowed' list of an unknown key comes from the model at the key's place; a place
    that is not a model's (a mapping of names, a string, an unknown field) has none."""
    assert loader._allowed_keys(Session, ("resources",)) == ["cpu", "mem", "shmem", "gpu"]
    assert loader._allowed_keys(Session, ("env",)) == []
    assert loader._allowed_keys(Session, ("env", "A")) == []
    assert loader._allowed_keys(Session, ("name",)) == []
    assert loader._allowed_keys(Session, ("nope", "x")) == []


def test_a_pool_given_on_the_command_line_is_the_file_it_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lab").write_text(POOL)
    assert find_pool("lab", given=True) == Path("lab")
    with pytest.raises(PoolNotFound):
        find_pool("lab")
    (tmp_path / "lab").unlink()
    (tmp_path / "lab").mkdir()
    with pytest.raises(PoolNotFound):
        find_pool("lab", given=True)


def test_candidates_that_cannot_be_looked_at_are_named_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    long = "x" * 300
    with pytest.raises(PoolNotFound) as err:
        find_pool(f"{long}.yaml", given=True)
    assert str(err.value) == (f"no pool '{long}.yaml' found (looked for {tmp_path}/{long}.yaml)"
                              f"; cannot look at {long}.yaml: File name too long; cannot look "
                              f"at {tmp_path}/{long}.yaml: File name too long")


def test_a_pool_on_the_command_line_replaces_the_definitions(tree, tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text(POOL.replace("name: lab", "name: other"))
    loaded = load_session(tree(SESSION), other)
    assert (loaded.pool.name, loaded.pool_file, loaded.name_from_file) == (
        "other", other, False)
    with pytest.raises(DefinitionError) as err:
        load_session(tree(SESSION), tmp_path / "nope.yaml")
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        (str(tree(SESSION)), "pool",
         f"no pool '{tmp_path}/nope.yaml' found (looked for {tmp_path}/nope.yaml)")]
    with pytest.raises(DefinitionError) as err:
        load_session(tree(SESSION.replace("pool: lab", "pool: ../sessions/s.yaml")))
    assert [(p.path, p.message) for p in err.value.problems] == [
        ("kind", "not an AgentPool file (a pool file says `kind: AgentPool`); its content is "
                 "not shown")]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "not UTF-8 text (invalid start byte at byte 0)"),
        (b"ok: \xc3", "not UTF-8 text (unexpected end of data at byte 4)"),
        (b"x" * (1024 * 1024 + 1), "file is larger than 1 MiB"),
        (b"x" * (1024 * 1024), None),  # 1 MiB itself is read
    ],
)
def test_file_refusals_word_for_word(tmp_path, data, message):
    path = tmp_path / "f.yaml"
    path.write_bytes(data)
    if message is None:
        assert read_text(path) == data.decode()
        return
    with pytest.raises(DefinitionError) as err:
        read_text(path)
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        (str(path), "(whole file)", message)]


def test_a_file_that_cannot_be_read_says_why(tmp_path):
    with pytest.raises(DefinitionError) as err:
        read_text(tmp_path / ("x" * 300))
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        (str(tmp_path / ("x" * 300)), "(whole file)", "cannot read: File name too long")]


def test_nesting_of_64_levels_is_read_and_yaml_a_reader_refuses_is_a_problem():
    nested: list = []
    for _ in range(63):
        nested = [nested]
    assert parse_yaml("[" * 64 + "]" * 64, "f.yaml") == nested
    with pytest.raises(DefinitionError) as err:
        parse_yaml("a: \x07\n", "f.yaml")
    assert [(p.path, p.message) for p in err.value.problems] == [
        ("(whole file)", "invalid YAML: unacceptable character #x0007: control characters are "
         "not allowed\n  in \"<unicode string>\", position 3")]


def test_a_device_is_refused_as_not_a_regular_file():
    with pytest.raises(DefinitionError) as err:
        read_text(Path("/dev/null"))
    assert [(p.file, p.path, p.message) for p in err.value.problems] == [
        ("/dev/null", "(whole file)", "not a regular file")]


def test_a_huge_file_is_refused_without_being_read_whole(tmp_path):
    """At most 1 MiB and a byte is read: a sparse file of a terabyte is refused at once."""
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as stream:
        stream.truncate(2**40)
    with pytest.raises(DefinitionError) as err:
        read_text(huge)
    assert [p.message for p in err.value.problems] == ["file is larger than 1 MiB"]


def test_a_missing_file_or_a_directory_is_named_with_the_whole_file(tmp_path):
    found = []
    for path in (tmp_path / "missing.yaml", tmp_path):
        with pytest.raises(DefinitionError) as err:
            read_text(path)
        found += [(p.file, p.path, p.message) for p in err.value.problems]
    assert found == [(str(tmp_path / "missing.yaml"), "(whole file)", "no such file"),
                     (str(tmp_path), "(whole file)", "is a directory, not a file")]


def test_the_nesting_depth_is_counted_back_down_exactly_at_each_close():
    """A closed list gives its levels back one by one: depth after ``[[]]`` inside a deep list
    is where it was, so a deep list after it is measured from there, not from the top."""
    inner_then_deep = "[" * 30 + "[]," + "[" * 40 + "]" * 40 + "]" * 30
    with pytest.raises(DefinitionError, match="nested deeper than 64 levels"):
        parse_yaml(inner_then_deep, "f.yaml")
    shallow_twice = "a: " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 60 + "]" * 60 + "\n"
    assert set(parse_yaml(shallow_twice, "f.yaml")) == {"a", "b"}  # 60 after 40 closed: fine
    deep_after = "a: " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 70 + "]" * 70 + "\n"
    with pytest.raises(DefinitionError, match="nested deeper than 64 levels"):
        parse_yaml(deep_after, "f.yaml")


def test_every_number_of_a_list_is_named_not_only_the_last():
    with pytest.raises(DefinitionError) as refused:
        parse_yaml("a: [0x1, 2, 0b1]\n", "f.yaml")
    assert [p.path for p in refused.value.problems] == ["a.0", "a.2"]


def test_a_character_yaml_cannot_read_is_a_problem_of_the_named_file():
    with pytest.raises(DefinitionError) as refused:
        parse_yaml("a: \x00\n", "f.yaml")
    (problem,) = refused.value.problems
    assert (problem.file, problem.path) == ("f.yaml", "(whole file)")
    assert problem.message.startswith("invalid YAML: unacceptable character #x0000")
