"""Loading and validating definitions: every bad input is a problem with file and path."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_sessions.loader import load_file, load_session, validate_files
from cluster_sessions.problems import DefinitionError

POOL = """\
kind: AgentPool
name: lab
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
        ("{FOO: 1}", "env.FOO", "quote it"),
        ("{FOO: [a]}", "env.FOO", "string"),
    ],
)
def test_bad_env_is_named(tree, env, path, words):
    found = problems_of(tree(SESSION + f"env: {env}\n"))
    assert any(p.startswith(f"{path}: ") and words in p for p in found), found


def test_multi_node_across_agents_needs_a_swarm_manager_in_the_pool(tree):
    path = tree(SESSION.replace("single-node", "multi-node").replace("size: 2", "size: 5"))
    [problem] = problems_of(path)
    assert problem.startswith("cluster.mode: multi-node needs a swarm manager")


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
    found = problems_of(tree(SESSION + "mounts: [{source: rel/path, target: /x},"
                             " {source: data-vol, target: /y}]\n"))
    assert found == ["mounts.0.source: must be an absolute host path or a volume name"]


def test_multi_node_that_fits_one_agent_needs_no_swarm(tree):
    path = tree(SESSION.replace("single-node", "multi-node"))  # 2 x 2 cpu on an 8-cpu agent
    assert problems_of(path) == []


@pytest.mark.parametrize(
    ("extra", "path", "words"),
    [
        ("mounts: [{source: /a, target: /opt/cluster-session}]", "mounts.0.target",
         "hide the session's own files"),
        ("mounts: [{source: /a, target: /run}]", "mounts.0.target", "hide the session's own"),
        ("mounts: [{source: /a, target: /data}, {source: /b, target: /data/}]",
         "mounts.1.target", "mounted twice"),
        ("mounts: [{source: /a, target: '/c:ro'}]", "mounts.0.target", "':'"),
        ("ports: [{container: 22, host: 8080}, {container: 23, host: 8080}]", "ports.1.host",
         "used twice"),
        ("ports: [{container: 80, host_ip: 'not an ip'}]", "ports.0.host_ip",
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
