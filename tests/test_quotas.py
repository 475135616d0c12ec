"""Quotas (issue 44, part 2): the decision is core.governance's, a pure function of what the
pool's sessions hold (by project) and what is asked; every violated limit is named at once."""

from __future__ import annotations

from cluster_sessions.core import governance, ledger
from cluster_sessions.core.governance import Held, Use, held_by, quota_violations
from cluster_sessions.core.spec import Quota

from . import factories

GIB = 1024**3


def test_every_violated_limit_is_named_at_once():
    quota = Quota(cpu=8, mem="32g", gpus=8, containers=4, sessions=2)
    holding = Use(millicpu=6000, mem=30 * GIB, gpus=6, containers=3, sessions=2)
    asking = Use(millicpu=4000, mem=4 * GIB, gpus=4, containers=2, sessions=1)
    assert quota_violations("vision", quota, holding, asking) == [
        "project vision: cpu 6 + 4 > 8",
        "project vision: mem 30g + 4g > 32g",
        "project vision: gpus 6 + 4 > 8",
        "project vision: containers 3 + 2 > 4",
        "project vision: sessions 2 + 1 > 2",
    ]


def test_exactly_at_the_limit_is_within_it_and_no_limit_is_no_limit():
    quota = Quota(gpus=8)
    assert quota_violations("vision", quota, Use(gpus=4), Use(gpus=4)) == []
    assert quota_violations("vision", Quota(), Use(gpus=10**6), Use(gpus=4)) == []


def test_a_session_asking_none_of_a_resource_is_not_held_back_by_it():
    """A quota lowered below what is held stops what asks for more of it, not the rest."""
    quota = Quota(gpus=2, sessions=10)
    assert quota_violations("vision", quota, Use(gpus=4, sessions=1), Use(sessions=1)) == []


def test_what_a_project_holds_counts_its_own_containers_and_reservations_only():
    held = [
        Held("vision", "s1", 1000, GIB, 2, 1),
        Held("vision", "s1", 1000, GIB, 2, 1),  # s1's second container
        Held("vision", "s2", 2000, GIB, 4, 0, reserved=True),  # an up under way
        Held("nlp", "s3", 9000, GIB, 8, 1),
        Held("", "s4", 9000, GIB, 8, 1),  # a project label that did not parse: no one's
    ]
    assert held_by("vision", held) == Use(4000, 3 * GIB, 8, 2, 2)
    assert held_by("nlp", held) == Use(9000, GIB, 8, 1, 1)


def test_a_session_seen_as_containers_and_reservation_counts_once():
    """An update holds its reservation while its containers are replaced: the larger."""
    held = [Held("vision", "s1", 1000, GIB, 2, 1),
            Held("vision", "s1", 1000, GIB, 2, 2, reserved=True)]
    assert held_by("vision", held) == Use(1000, GIB, 2, 2, 1)


def test_the_sessions_being_placed_are_left_out():
    held = [Held("vision", "mine", 1000, GIB, 2, 1), Held("vision", "other", 1000, GIB, 2, 1)]
    assert held_by("vision", held, exclude={"mine"}) == Use(1000, GIB, 2, 1, 1)


def test_what_a_definition_asks_is_its_containers_times_their_resources():
    from cluster_sessions.core.spec import Session

    s = Session.model_validate(factories.session("sess-one", size=3, cpu=2, mem="1g")
                               | {"resources": {"cpu": 2, "mem": "1g", "gpu": 1}})
    assert governance.asked([s, s]) == Use(12000, 6 * GIB, 6, 6, 2)


def test_the_pending_limit_counts_the_projects_sessions_queued_before():
    def entry(name, project, arrival):
        return ledger.Entry("queue", name, name, name, name, None, arrival, 60, arrival, {},
                            project=project)

    queue = [entry("a", "vision", 1), entry("b", "nlp", 2), entry("c", "vision", 3),
             entry("me", "vision", 4), entry("d", "vision", 5)]
    me = queue[3]
    waiting = governance.waiting_before(queue, "vision", {"me"}, me)
    assert waiting == 2
    assert governance.pending_violation("vision", Quota(pending=2), waiting) == \
        "project vision: pending 2 + 1 > 2"
    assert governance.pending_violation("vision", Quota(pending=3), waiting) is None


def test_a_project_label_is_parsed_strictly():
    assert ledger.project_label(None) == "default"
    assert ledger.project_label("vision") == "vision"
    for bad in ("Vision", "vision\n", "a" * 80, "../x", 5):
        try:
            ledger.project_label(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was believed")


def test_a_reservations_project_and_containers_come_from_its_labels():
    keys = {"kind": "k", "session": "s", "stack": "st", "holder": "h", "lease": "l",
            "arrival": "a", "holds": "hd", "project": "p", "containers": "c"}
    labels = {"k": "reservation", "s": "sess", "st": "0123456789abcdef", "l": "30",
              "p": "vision", "c": "4"}
    e = ledger.entry_of(labels, keys, "id", "n", 100.0, 60)
    assert (e.project, e.containers, e.malformed) == ("vision", 4, ())
    e = ledger.entry_of({**labels, "p": "No Such", "c": "-1"}, keys, "id", "n", 100.0, 60)
    assert (e.project, e.containers) == ("", 0) and len(e.malformed) == 2
    e = ledger.entry_of({k: v for k, v in labels.items() if k != "p"}, keys, "id", "n", 1.0, 60)
    assert e.project == "default"
