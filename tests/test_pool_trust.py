"""The pool is the operator's trust boundary (issue 32, class 1).

A pool chooses the engines, the SSH identity, ``known_hosts``, TLS material and the host paths
sessions may mount, so a definition only *names* one: its ``pool:`` must resolve (links
resolved) inside a directory the operator keeps pools in (``$CLUSTER_SESSIONS_POOLS``, the
project's ``stacks/pools``); the operator's ``--pool`` and the stack's ``cluster-sessions:pool``
may name any file. Anything else is exit 2 naming the file and ``pool``, without the target
being read; a file that is not an AgentPool is refused without echoing what it holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_sessions.core import loader
from cluster_sessions.core.loader import BUILTIN_POOLS, POOLS_ENV
from cluster_sessions.core.problems import DefinitionError
from cluster_sessions.driver import cli

from . import factories

EVIL_POOL = factories.pool("local", mount_sources=["/"])


@pytest.fixture
def places(tmp_path, monkeypatch):
    """The operator's pool directory (``ops``, holding ``team.yaml``) and an author's folder
    (``author``, holding a pool of the author's own beside the definition); only ``ops`` is
    in ``$CLUSTER_SESSIONS_POOLS``."""
    ops, author = tmp_path / "ops", tmp_path / "author"
    ops.mkdir()
    author.mkdir()
    factories.write(ops / "team.yaml", factories.pool("team"))
    factories.write(author / "local.yaml", EVIL_POOL)
    monkeypatch.setenv(POOLS_ENV, str(ops))
    monkeypatch.chdir(tmp_path)
    return ops, author


def definition(where: Path, pool: str, name: str = "evil-pool") -> Path:
    return factories.write(where / f"{name}.yaml", factories.session(
        name, pool, mounts=[{"source": "/root", "target": "/home/work/root"}]))


def refusals(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.err + out.out


@pytest.mark.parametrize("ref", [
    "author/local.yaml",                 # the issue's: a path beside the definition's folder
    "local.yaml",                        # the same, relative to the definition
    "{tmp}/author/local.yaml",           # any absolute path
    "../ops/../author/local.yaml",       # leaving the operator's directory through '..'
    "{ops}/../author/local.yaml",        # an absolute path that starts inside and leaves
    "/proc/self/status",                 # any readable file
    "/etc/passwd",
])
@pytest.mark.parametrize("verb", [["validate"], ["plan", "--json"], ["render", "--out", "out"]])
def test_a_definitions_pool_outside_the_operators_directories_is_exit_2_naming_file_and_pool(
        places, tmp_path, capsys, ref, verb):
    ops, author = places
    where = author if not ref.startswith("author/") else tmp_path
    path = definition(where, ref.format(tmp=tmp_path, ops=ops))
    code, text = refusals(capsys, verb[0], str(path), *verb[1:])
    assert code == 2, text
    assert text.startswith(f"{path}: pool: "), text
    assert "outside the directories the operator keeps pools in" in text
    assert not (tmp_path / "out").exists()


def test_a_definitions_pool_is_refused_without_its_file_being_read(places, monkeypatch,
                                                                     capsys):
    _, author = places
    read: list[str] = []
    real = loader.read_text
    monkeypatch.setattr(loader, "read_text", lambda p: (read.append(str(p)), real(p))[1])
    for ref in ("local.yaml", "/proc/self/status", str(author / "local.yaml")):
        read.clear()
        path = definition(author, ref)
        code, text = refusals(capsys, "validate", str(path))
        assert code == 2, text
        assert read == [str(path)], f"{ref}: read {read}"


def test_a_pool_name_is_looked_up_only_in_the_operators_directories(places, capsys):
    """``pool: local`` beside an author's ``pools/local.yaml`` (the old lookup looked beside
    the definition first) is the operator's ``local``; ``team`` is found in the operator's
    directory."""
    ops, author = places
    (author / "pools").mkdir()
    factories.write(author / "pools" / "local.yaml", EVIL_POOL)
    sessions = author / "sessions"
    sessions.mkdir()
    for where in (author, sessions):
        path = definition(where, "local")
        code, text = refusals(capsys, "validate", str(path))
        assert code == 2, text  # the operator's local pool lists no mount source for /root
        assert f"{path}: mounts.0.source: " in text, text
        assert factories.load_session(path).pool_file == BUILTIN_POOLS / "local.yaml"
    path = definition(author, "team", "team-pool")
    assert factories.load_session(path).pool_file == ops / "team.yaml"


def test_a_link_out_of_an_operators_directory_is_refused(places, capsys):
    ops, author = places
    (ops / "linked.yaml").symlink_to(author / "local.yaml")
    (ops / "dir").symlink_to(author, target_is_directory=True)
    for ref in ("linked", "linked.yaml", str(ops / "linked.yaml"), str(ops / "dir/local.yaml")):
        path = definition(author, ref)
        code, text = refusals(capsys, "validate", str(path))
        assert code == 2, text
        assert text.startswith(f"{path}: pool: "), text


def test_a_relative_pool_path_that_resolves_inside_an_operators_directory_keeps_working(
        places, tmp_path, capsys):
    """Today's ``../pools/NAME.yaml`` examples: the project's, and one in an operator's."""
    ops, _ = places
    project_sessions = BUILTIN_POOLS.parent / "sessions"
    text = (project_sessions / "solo.yaml").read_text().replace("pool: local",
                                                                "pool: ../pools/local.yaml")
    copy = project_sessions / "zz-test-relative-pool.yaml"
    copy.write_text(text)
    try:
        assert cli.main(["validate", str(copy)]) == 0, capsys.readouterr().err
    finally:
        copy.unlink()
    (ops / "sessions").mkdir()
    path = factories.write(ops / "sessions" / "rel.yaml",
                           factories.session("team-rel", "../team.yaml"))
    assert cli.main(["validate", str(path)]) == 0, capsys.readouterr().err


def test_the_operators_pool_option_may_name_any_pool_file(places, capsys):
    """``--pool`` is the operator's: a pool beside the definition is used when they say so."""
    _, author = places
    path = definition(author, "local")
    code, text = refusals(capsys, "plan", str(path), "--json", "--pool",
                          str(author / "local.yaml"))
    assert code == 0, text


@pytest.mark.parametrize("content", [
    "Name:\tpython3\nUmask:\t0022\nSecretToken: 0123456789abcdef\n",
    "kind: ClusterSession\nname: x\ntoken: s3cr3t-0123\n",
    "s3cr3t-0123: [\n",
    "kind: Secret\npassword: s3cr3t-0123\n",
])
def test_a_file_that_is_not_a_pool_is_refused_without_echoing_what_it_holds(
        places, capsys, content):
    ops, author = places
    (ops / "notapool.yaml").write_text(content)
    for argv in (["validate", str(definition(author, "notapool"))],
                 ["plan", str(definition(author, "local", "other")), "--pool",
                  str(ops / "notapool.yaml")],
                 ["pool", "check", str(ops / "notapool.yaml")]):
        code, text = refusals(capsys, *argv)
        assert code == 2, text
        assert f"{ops / 'notapool.yaml'}: kind: not an AgentPool file" in text, text
        for secret in ("s3cr3t", "0123", "python3", "0022", "Secret", "ClusterSession"):
            assert secret not in text, text


def test_proc_self_status_as_the_operators_pool_prints_none_of_it(places, capsys):
    _, author = places
    code, text = refusals(capsys, "plan", str(definition(author, "local")), "--pool",
                          "/proc/self/status")
    assert code == 2
    assert text == ("/proc/self/status: kind: not an AgentPool file (a pool file says `kind: "
                    "AgentPool`); its content is not shown\n")


def test_the_loader_reads_no_environment_the_caller_passes_the_directories(places):
    """core is pure: the directories come from the driver or the program, never from the
    loader reading ``$CLUSTER_SESSIONS_POOLS`` itself."""
    ops, author = places
    path = definition(author, "team", "team-pool")
    with pytest.raises(DefinitionError) as err:
        loader.load_session(path)  # the environment names ops; the caller passed nothing
    assert [p.path for p in err.value.problems] == ["pool"]
    assert loader.load_session(path, pool_dirs=[ops]).pool_file == ops / "team.yaml"


def test_the_pulumi_program_refuses_a_definitions_pool_and_takes_the_stacks(places, tmp_path,
                                                                           monkeypatch):
    """``pulumi up`` without sessionctl: the same rule, the environment read by the program;
    ``cluster-sessions:pool`` is the operator's (any file)."""
    from cluster_sessions.pulumi_layer import program

    _, author = places
    path = definition(author, "local.yaml")
    with pytest.raises(program.InvalidDefinition) as err:
        program.load(tmp_path, {"definition": str(path)})
    assert f"{path}: pool: " in str(err.value)
    path.write_text(path.read_text().replace("/root", "/srv"))
    loaded = program.load(tmp_path, {"definition": str(path), "pool": str(author / "local.yaml")})
    assert loaded.pool_file == author / "local.yaml"
    monkeypatch.setenv(POOLS_ENV, str(author))  # the operator keeps pools there now
    assert program.load(tmp_path, {"definition": str(path)}).pool_file == author / "local.yaml"


# --- diff: a change of pool, and of what it decides for the session, is a row ----------------


def diff_json(capsys, *argv: str) -> tuple[int, dict]:
    import json

    code = cli.main(["diff", *argv, "--json", "--exit-code"])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out else {"err": out.err}


@pytest.mark.parametrize(("change", "row"), [
    ({"name": "team2"}, "pool"),
    ({"agents": [factories.agent(ssh={"host": "10.0.0.9", "user": "ops"},
                                 docker_host="unix:///var/run/docker.sock")]},
     "pool agent agent1"),
    ({"agents": [factories.agent(ssh={"host": "10.0.0.9", "user": "ops",
                                      "key_file": "/home/ops/.ssh/other"},
                                 docker_host="unix:///var/run/docker.sock")]},
     "pool agent agent1"),
    ({"mount_sources": ["/srv"]}, "pool mount_sources"),
    ({"volumes": ["datasets"]}, "pool volumes"),
    ({"limits": {"pids_limit": 100}}, "pool limits"),
    ({"limits": {"log_max_files": 9}}, "pool limits"),
    ({"privileges": {"no_new_privileges": False}}, "pool privileges"),
    ({"privileges": {"capabilities": ["SETUID", "SETGID"]}}, "pool privileges"),
])
def test_a_change_of_pool_is_a_row_of_the_review(places, capsys, change, row):
    """Containers the same, the pool not: ``diff`` said "no changes" (issue 32)."""
    ops, author = places
    before = factories.pool("team", agents=[factories.agent(
        ssh={"host": "10.0.0.9", "user": "ops", "key_file": "/home/ops/.ssh/id"},
        docker_host="unix:///var/run/docker.sock")] if "agents" in change and
        "key_file" in str(change) else [factories.agent()])
    factories.write(ops / "team.yaml", before)
    factories.write(ops / "team2.yaml", {**before, **change})
    old = factories.write(author / "old.yaml", factories.session("pooled", "team"))
    new = factories.write(author / "new.yaml", factories.session("pooled", "team2"))
    code, review = diff_json(capsys, str(old), str(new))
    assert code == 1, review
    rows = {c["what"]: (c["old"], c["new"]) for c in review["pool"]}
    assert row in rows and rows[row][0] != rows[row][1], rows
    assert review["changed"] is True
    code, review = diff_json(capsys, str(old), str(old))
    assert (code, review["pool"]) == (0, [])


def test_a_pool_s_new_pids_limit_updates_every_container_in_place(places, capsys):
    """The limit is set on the containers through the engine (pulumi_layer/limits.py): no
    container is replaced for it, and the review says why each one changes."""
    ops, author = places
    factories.write(ops / "team.yaml", factories.pool("team"))
    factories.write(ops / "tight.yaml", factories.pool("tight", limits={"pids_limit": 256}))
    old = factories.write(author / "old.yaml", factories.session("pooled", "team", size=2))
    new = factories.write(author / "new.yaml", factories.session("pooled", "tight", size=2))
    code, review = diff_json(capsys, str(old), str(new))
    assert code == 1, review
    assert [(c["host"], c["action"], c["why"]) for c in review["containers"]] == [
        ("main1", "update", ["pids limit"]), ("sub1", "update", ["pids limit"])]
    rows = {c["what"]: (c["old"], c["new"]) for c in review["pool"]}
    assert rows["pool limits"] == ("log 4 x 16m, 8192 tasks per container",
                                   "log 4 x 16m, 256 tasks per container")


def test_the_markdown_review_shows_the_pool_rows(places, capsys):
    ops, author = places
    factories.write(ops / "wide.yaml", factories.pool("wide", mount_sources=["/"]))
    old = factories.write(author / "old.yaml", factories.session("pooled", "team"))
    new = factories.write(author / "new.yaml", factories.session("pooled", "wide"))
    assert cli.main(["diff", str(old), str(new)]) == 0
    text = capsys.readouterr().out
    assert "#### Pool" in text
    assert "| pool | `team` | `wide` |" in text
    assert "| pool mount_sources | `(none)` | `/` |" in text


def test_the_old_side_may_have_its_own_pool_directories(places, tmp_path, capsys):
    """CI compares a base work tree's definition, planned on the base's pools, with the
    head's: ``--old-pools`` names the base's directory."""
    ops, author = places
    base = tmp_path / "base-pools"
    base.mkdir()
    factories.write(base / "team.yaml", factories.pool("team", mount_sources=["/data"]))
    path = factories.write(author / "s.yaml", factories.session("pooled", "team"))
    code, review = diff_json(capsys, str(path), str(path), "--old-pools", str(base))
    assert code == 1
    assert [(c["what"], c["old"], c["new"]) for c in review["pool"]] == [
        ("pool mount_sources", "/data", "(none)")]
