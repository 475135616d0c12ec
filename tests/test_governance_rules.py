"""core/governance's pure rules one by one, on hand-built policies (issue 46, part 6: what
``scripts/mutation.py core --only governance`` found no test of): the lifetime a session gets,
what it may ask of its project's policy, how far ``extend`` may move its end, where a
project's definitions may live."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_sessions.core import governance
from cluster_sessions.core.spec import Policy, Session

from . import factories


def policy(**fields) -> Policy:
    return Policy.model_validate(fields)


def session(**over) -> Session:
    return Session.model_validate(factories.session(**over))


def test_a_session_lives_what_it_asks_else_the_default_else_the_longest():
    assert governance.lifetime_of(session(lifetime="1h"), policy(max_lifetime="2h")) == 3600
    assert governance.lifetime_of(session(), policy(max_lifetime="2h",
                                                    default_lifetime="30m")) == 1800
    assert governance.lifetime_of(session(), policy(max_lifetime="2h")) == 7200
    assert governance.lifetime_of(session(), policy()) is None


def test_asking_more_than_the_policy_names_each_field_and_both_limits():
    f = Path("d.yaml")
    over = governance.policy_problems(session(lifetime="3h", priority=20), f, "vision",
                                      policy(max_lifetime="2h", max_priority=10))
    assert [(p.file, p.path, p.message) for p in over] == [
        ("d.yaml", "lifetime", "3h is longer than project vision's max_lifetime (2h)"),
        ("d.yaml", "priority", "20 is above project vision's max_priority (10)")]
    at = governance.policy_problems(session(lifetime="2h", priority=10), f, "vision",
                                    policy(max_lifetime="2h", max_priority=10))
    assert at == []  # at the limits: allowed
    assert governance.policy_problems(session(lifetime="9h"), f, "p", policy()) == []


def test_extend_is_refused_past_the_longest_lifetime_counted_from_the_start():
    p = policy(max_lifetime="2h")
    # started at 0, expires at 3600, now 1800: +3600 ends at 7200, exactly the longest
    assert governance.extension_problem(3600, 1800, 3600, 0, p, "vision") is None
    assert governance.extension_problem(3600, 1800, 3601, 0, p, "vision") == (
        "the session would live 7201s from its start, more than project vision's "
        "max_lifetime (2h)")
    # already expired: counted from now, not from the old end
    assert governance.extension_problem(100, 5000, 2300, 0, p, "vision") is not None
    assert governance.extension_problem(100, 5000, 2200, 0, p, "vision") is None
    assert governance.extension_problem(0, 10**9, 10**9, 0, policy(), "vision") is None


def test_a_project_s_definitions_are_relative_to_the_pool_file_unless_absolute(tmp_path):
    pool_file = tmp_path / "pools" / "pool.yaml"
    dirs = governance.definition_dirs(pool_file, policy(definitions=["sessions/vision",
                                                                     "/srv/defs"]))
    assert dirs == [tmp_path / "pools" / "sessions" / "vision", Path("/srv/defs")]
    home = governance.definition_dirs(pool_file, policy(definitions=["~/defs"]))
    assert home == [Path("~/defs").expanduser()]


def test_extend_counts_the_lifetime_from_the_session_s_own_start():
    p = policy(max_lifetime="2h")
    # started at 1000: an end at 8200 is 7200 s after it, the longest allowed
    assert governance.extension_problem(4600, 2000, 3600, 1000, p, "vision") is None
    assert governance.extension_problem(4600, 2000, 3601, 1000, p, "vision") == (
        "the session would live 7201s from its start, more than project vision's "
        "max_lifetime (2h)")


def governed_pool(tmp_path, **projects):
    from cluster_sessions.core.spec import Pool

    return Pool.model_validate(factories.pool("lab", policies={"projects": projects})), \
        tmp_path / "pool.yaml"


def test_a_claim_the_pool_does_not_allow_is_a_problem_of_the_definition_s_file(tmp_path):
    pool, pool_file = governed_pool(tmp_path, vision={"definitions": []},
                                    nlp={"definitions": ["a", "b"]})
    f = tmp_path / "elsewhere" / "d.yaml"
    known = " (pool lab lists: vision, nlp)"
    project, [p] = governance.claim_problems(session(), f, pool, pool_file, "visoin")
    assert (project, p.file, p.path) == ("visoin", str(f), "project")
    assert p.message.startswith("'visoin', the operator's project (--project or "
                                "$CLUSTER_SESSIONS_PROJECT), is not a project of pool lab")
    assert p.message.endswith(known)
    project, [p] = governance.claim_problems(session(project="nope"), f, pool, pool_file, None)
    assert (project, p.file) == ("nope", str(f))
    assert p.message == "'nope' is not a project of pool lab" + known
    _, [p] = governance.claim_problems(session(project="vision"), f, pool, pool_file, None)
    assert p.file == str(f)
    assert "(nowhere: the operator grants it)" in p.message
    _, [p] = governance.claim_problems(session(project="nlp"), f, pool, pool_file, None)
    assert f"({tmp_path / 'a'}, {tmp_path / 'b'})" in p.message


def test_a_pool_with_no_projects_says_so_when_one_is_claimed(tmp_path):
    from cluster_sessions.core.spec import Pool

    pool = Pool.model_validate(factories.pool("lab"))
    _, [p] = governance.claim_problems(session(project="x"), tmp_path / "d.yaml", pool,
                                       tmp_path / "pool.yaml", None)
    assert p.message.endswith(" (pool lab lists: no projects)")


def entry(name: str, arrival: float, created: float, project: str = "vision"):
    from cluster_sessions.core.ledger import Entry

    return Entry(kind="wait", container_id=name, name=name, session=name, stack_id=name,
                 holder=None, created=created, lease=0, arrival=arrival, holds={},
                 project=project)


def test_waiting_before_counts_only_the_sessions_that_arrived_strictly_earlier():
    me = entry("c", 2, 2)
    queue = [entry("a", 1, 1), entry("b", 2, 1), me, entry("d", 3, 3),
             entry("e", 0, 0, project="nlp")]
    assert governance.waiting_before(queue, "vision", (), me) == 2
    assert governance.waiting_before(queue, "vision", (), None) == 4


def test_governed_names_the_definition_s_file_in_a_policy_problem(tmp_path):
    from cluster_sessions.core.loader import Loaded
    from cluster_sessions.core.problems import DefinitionError
    from cluster_sessions.core.spec import Pool

    pool = Pool.model_validate(factories.pool("lab", policies={"default": {
        "max_lifetime": "1h"}}))
    f = tmp_path / "d.yaml"
    loaded = Loaded(session(lifetime="2h"), f, pool, tmp_path / "pool.yaml")
    with pytest.raises(DefinitionError) as caught:
        governance.governed(loaded, None)
    [problem] = caught.value.problems
    assert (problem.file, problem.path) == (str(f), "lifetime")
