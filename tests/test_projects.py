"""Projects and who may claim them (issue 44, part 1; DESIGN contract 8).

A pool lists its projects, each with a policy, and a default policy for definitions that name
none. A definition may claim a project only from a directory the project's policy lists
(relative to the pool file, links resolved); the operator's ``--project`` /
``$CLUSTER_SESSIONS_PROJECT`` wins over the definition. Anything else is exit 2 naming
``project`` (with did-you-mean), and every engine object carries the project.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_sessions.core import governance
from cluster_sessions.core.names import PROJECT_LABEL
from cluster_sessions.core.plan import build_plans, container_labels, network_labels, with_identity
from cluster_sessions.driver import cli
from cluster_sessions.driver.session_args import load_definition

from . import factories

POLICIES = {
    "default": {"max_lifetime": "24h"},
    "projects": {
        "vision": {"definitions": ["sessions/vision"], "max_lifetime": "72h",
                   "quota": {"gpus": 8, "sessions": 4}, "max_priority": 50},
        "nlp": {"definitions": ["sessions/nlp"]},
        "ops": {},  # no directory: only the operator grants it
    },
}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """An operator's pool directory holding the governed pool, and the repository layout CI
    reviews beside it: sessions/vision, sessions/nlp, sessions/other."""
    monkeypatch.delenv(governance.PROJECT_ENV, raising=False)
    ops = tmp_path / "ops"
    for d in ("sessions/vision", "sessions/nlp", "sessions/other"):
        (ops / d).mkdir(parents=True)
    factories.write(ops / "gov.yaml", factories.pool("gov", policies=POLICIES))
    monkeypatch.setenv("CLUSTER_SESSIONS_POOLS", str(ops))
    return ops


def definition(repo: Path, where: str, name: str = "sess-one", **over) -> Path:
    return factories.write(repo / where / f"{name}.yaml", factories.session(name, "gov", **over))


def run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.err + out.out


def test_a_definition_in_its_projects_directory_may_claim_it(repo):
    loaded = load_definition(definition(repo, "sessions/vision", project="vision"))
    assert loaded.session.project == "vision"


def test_a_definition_naming_no_project_runs_under_the_default_policy(repo):
    loaded = load_definition(definition(repo, "sessions/other"))
    assert loaded.session.project is None
    assert loaded.pool.policies.of(loaded.session.project).max_lifetime == 24 * 3600


def test_a_claim_from_outside_the_projects_directories_is_exit_2_naming_project(repo, capsys):
    path = definition(repo, "sessions/other", project="vision")
    code, text = run(capsys, "validate", str(path))
    assert code == 2, text
    assert f"{path}: project: this definition may not claim project 'vision'" in text


def test_a_link_into_the_projects_directory_does_not_grant_it(repo, capsys):
    """The author's file outside, linked from inside: links are resolved, so it is where it
    really is."""
    real = definition(repo, "sessions/other", project="vision")
    link = repo / "sessions/vision/linked.yaml"
    link.symlink_to(real)
    code, text = run(capsys, "validate", str(link))
    assert code == 2 and "may not claim project 'vision'" in text, text


def test_dotdot_out_of_the_projects_directory_does_not_grant_it(repo, capsys):
    definition(repo, "sessions/other", project="vision")
    path = repo / "sessions/vision/../other/sess-one.yaml"
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and "may not claim project 'vision'" in text, text


def test_a_project_with_no_directories_is_granted_by_the_operator_only(repo, capsys):
    path = definition(repo, "sessions/other", project="ops")
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and "may not claim project 'ops'" in text, text
    code, text = run(capsys, "validate", "--project", "ops", str(path))
    assert code == 0, text


def test_an_unknown_project_is_exit_2_with_did_you_mean(repo, capsys):
    path = definition(repo, "sessions/vision", project="visoin")
    code, text = run(capsys, "validate", str(path))
    assert code == 2, text
    assert "project: 'visoin' is not a project of pool gov; did you mean 'vision'?" in text


def test_the_operators_project_wins_over_the_definitions(repo, capsys, monkeypatch):
    path = definition(repo, "sessions/vision", project="vision")
    assert load_definition(path, project="nlp").session.project == "nlp"
    monkeypatch.setenv(governance.PROJECT_ENV, "nlp")
    assert load_definition(path).session.project == "nlp"
    # the flag wins over the environment
    assert load_definition(path, project="vision").session.project == "vision"


def test_the_operators_project_must_be_one_the_pool_lists(repo, capsys, monkeypatch):
    path = definition(repo, "sessions/vision", project="vision")
    monkeypatch.setenv(governance.PROJECT_ENV, "nlpp")
    code, text = run(capsys, "plan", str(path))
    assert code == 2, text
    assert "project: 'nlpp', the operator's project" in text and "did you mean 'nlp'?" in text


def test_a_pool_without_projects_refuses_every_claim(tmp_path, capsys):
    pool = factories.write(tmp_path / "plain.yaml", factories.pool("plain"))
    path = factories.write(tmp_path / "s.yaml", factories.session("sess-one", str(pool),
                                                                   project="vision"))
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and "lists: no projects" in text, text


def test_a_priority_above_the_projects_max_is_exit_2_naming_priority(repo, capsys):
    path = definition(repo, "sessions/vision", project="vision", priority=51)
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and "priority: 51 is above project vision's max_priority (50)" in text
    path = definition(repo, "sessions/other", "sess-two", priority=1)
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and "max_priority (0)" in text, text


def test_a_lifetime_longer_than_the_policys_is_exit_2_naming_lifetime(repo, capsys):
    path = definition(repo, "sessions/other", lifetime="25h")
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and "lifetime: 25h is longer than project default's max_lifetime (24h)" \
        in text, text


@pytest.mark.parametrize("field, value, message", [
    ("lifetime", "8 hours", "is not a duration"),
    ("lifetime", 0, "greater than zero"),
    ("priority", 101, "less than or equal to 100"),
    ("priority", "5", "integer"),
    ("preemptible", "yes", "bool"),
    ("project", "Vision!", "must be a project name"),
])
def test_bad_governance_values_of_a_definition_are_exit_2_named(repo, capsys, field, value,
                                                                  message):
    path = definition(repo, "sessions/other", **{field: value})
    code, text = run(capsys, "validate", str(path))
    assert code == 2, text
    assert f"{path}: {field}:" in text and message in text, text
    assert "Traceback" not in text


def test_preemptible_is_for_batch_sessions_only(repo, capsys):
    path = definition(repo, "sessions/other", preemptible=True)
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and f"{path}: preemptible: applies to batch sessions only" in text, text
    batch = definition(repo, "sessions/other", preemptible=True, type="batch",
                       command=["true"])
    code, text = run(capsys, "validate", str(batch))
    assert code == 0, text


def test_a_misspelt_preemptible_is_exit_2_with_a_hint(repo, capsys):
    path = definition(repo, "sessions/other", preemtible=True, type="batch", command=["true"])
    code, text = run(capsys, "validate", str(path))
    assert code == 2 and f"{path}: preemtible:" in text, text
    assert "did you mean 'preemptible'?" in text, text


@pytest.mark.parametrize("policies, where, message", [
    ({"projects": {"default": {}}}, "policies.projects.default", "is the policy of sessions"),
    ({"projects": {"Bad Name": {}}}, "policies.projects.Bad Name", "must be a project name"),
    ({"default": {"definitions": ["x"]}}, "policies.default.definitions", "default policy"),
    ({"default": {"max_lifetime": "1h", "default_lifetime": "2h"}},
     "policies.default.default_lifetime", "above max_lifetime"),
    ({"projects": {"a": {"quota": {"gpus": -1}}}}, "policies.projects.a.quota.gpus", "0"),
    ({"projects": {"a": {"idle": {"timeout": "2h", "cpu_below": 101}}}},
     "policies.projects.a.idle.cpu_below", "100"),
    ({"projects": {"a": {"max_priority": 200}}}, "policies.projects.a.max_priority", "100"),
    ({"preemtion": True}, "policies.preemtion", "did you mean 'preemption'?"),
    ({"preemption": "yes"}, "policies.preemption", "bool"),
])
def test_bad_pool_policies_are_exit_2_named(tmp_path, capsys, policies, where, message):
    pool = factories.write(tmp_path / "bad.yaml", factories.pool("bad", policies=policies))
    code, text = run(capsys, "validate", str(pool))
    assert code == 2, text
    assert f"{pool}: {where}:" in text and message in text, text


def test_the_schema_lists_the_governance_fields(capsys):
    assert cli.main(["schema", "ClusterSession"]) == 0
    session = json.loads(capsys.readouterr().out)
    assert {"project", "lifetime", "priority", "preemptible"} <= set(session["properties"])
    assert cli.main(["schema", "AgentPool"]) == 0
    pool = json.loads(capsys.readouterr().out)
    assert "policies" in pool["properties"]
    policies = pool["$defs"]["Policies"]["properties"]
    assert policies["preemption"]["type"] == "boolean", policies
    assert session["properties"]["preemptible"]["type"] == "boolean"


def test_every_object_of_a_project_carries_the_project(repo):
    loaded = load_definition(definition(repo, "sessions/vision", project="vision"))
    plan = with_identity(build_plans(loaded.session, loaded.pool)[0], "0123456789abcdef",
                         "sess-one")
    assert container_labels(plan, plan.containers[0])[PROJECT_LABEL] == "vision"
    assert network_labels(plan)[PROJECT_LABEL] == "vision"
    default = load_definition(definition(repo, "sessions/other", "sess-two"))
    plan = with_identity(build_plans(default.session, default.pool)[0], "0123456789abcdef",
                         "sess-two")
    assert PROJECT_LABEL not in container_labels(plan, plan.containers[0])


def test_plan_json_names_project_and_priority(repo, capsys):
    path = definition(repo, "sessions/vision", project="vision", priority=20)
    assert cli.main(["plan", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["project"] == "vision" and doc["priority"] == 20


def test_the_shipped_governed_examples_claim_as_the_readme_says(capsys, monkeypatch):
    from .conftest import PROJECT

    monkeypatch.delenv(governance.PROJECT_ENV, raising=False)
    pool = PROJECT / "examples/governance/pool.yaml"
    good = PROJECT / "examples/governance/sessions/vision/train.yaml"
    bad = PROJECT / "examples/governance/sessions/nlp/claims-vision.yaml"
    assert run(capsys, "plan", str(good), "--pool", str(pool))[0] == 0
    code, text = run(capsys, "plan", str(bad), "--pool", str(pool))
    assert code == 2 and "may not claim project 'vision'" in text, text
    assert run(capsys, "plan", str(bad), "--pool", str(pool), "--project", "vision")[0] == 0
