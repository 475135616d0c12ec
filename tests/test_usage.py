"""Allocated against declared capacity per agent (``pool usage``, the summary under ``ls``)."""

from __future__ import annotations

from cluster_sessions.agents.facts import HeldContainer
from cluster_sessions.core.spec import Capacity
from cluster_sessions.core.usage import agent_usage, usage_text, usage_to_dict


def held(session: str, state: str, cpu: float, mem: int, gpus: tuple[int, ...] = ()):
    return HeldContainer("id", f"{session}-x", session, "sid", "main1", state,
                         round(cpu * 1000), mem, gpus)


CAP = Capacity(cpu=8, mem="16g", gpus=[0, 1, 2, 3])
G = 2**30


def test_running_containers_are_allocated_and_stopped_ones_counted_apart():
    u = agent_usage("a1", CAP, [held("s1", "running", 1.5, 2 * G, (0,)),
                                held("s1", "restarting", 0.5, G, (1,)),
                                held("s2", "running", 2, 4 * G),
                                held("s3", "exited", 4, 8 * G, (2,))])
    assert (u.millicpu, u.mem, u.gpus, u.containers, u.stopped) == (4000, 7 * G, (0, 1), 3, 1)
    assert u.sessions == ("s1", "s2")
    assert (u.declared_millicpu, u.declared_mem, u.declared_gpus) == (8000, 16 * G,
                                                                      (0, 1, 2, 3))
    assert not u.over
    assert usage_text(u) == ("a1: cpu 4/8, mem 7g/16g, gpus 2/4, 3 containers of 2 sessions "
                             "(1 stopped)")
    doc = usage_to_dict(u)
    assert doc["allocated"] == {"cpu": 4.0, "mem": 7 * G, "gpus": [0, 1], "containers": 3}
    assert doc["declared"] == {"cpu": 8.0, "mem": 16 * G, "gpus": [0, 1, 2, 3]}


def test_an_idle_agent_allocates_nothing():
    u = agent_usage("a1", CAP, [])
    assert usage_text(u) == "a1: cpu 0/8, mem 0/16g, gpus 0/4, 0 containers of 0 sessions"


def test_more_than_declared_is_said():
    u = agent_usage("a1", Capacity(cpu=1, mem="1g"), [held("s", "running", 2, G)])
    assert u.over and usage_text(u).endswith("over the declared capacity")
    gpu = agent_usage("a1", Capacity(cpu=8, mem="8g"), [held("s", "running", 1, G, (5,))])
    assert gpu.over


def test_an_unknown_declaration_counts_as_nothing_declared():
    u = agent_usage("a1", None, [held("s", "running", 1, G)])
    assert (u.declared_millicpu, u.declared_mem, u.over) == (0, 0, True)


def test_one_container_of_one_session_is_said_in_the_singular():
    u = agent_usage("a1", CAP, [held("s1", "running", 1, G), held("s1", "exited", 1, G)])
    assert usage_text(u) == ("a1: cpu 1/8, mem 1g/16g, gpus 0/4, 1 container of 1 session "
                             "(1 stopped)")
    two = agent_usage("a1", CAP, [held("s1", "running", 1, G), held("s1", "running", 1, G)])
    assert usage_text(two).endswith("2 containers of 1 session")


def test_the_json_of_an_agent_has_every_key_ls_and_pool_usage_print():
    u = agent_usage("a1", Capacity(cpu=1, mem="1g"), [held("s2", "running", 2, G),
                                                      held("s1", "exited", 1, G)])
    assert usage_to_dict(u) == {
        "agent": "a1",
        "declared": {"cpu": 1.0, "mem": G, "gpus": []},
        "allocated": {"cpu": 2.0, "mem": G, "gpus": [], "containers": 1},
        "sessions": ["s2"],
        "stopped_containers": 1,
        "over": True,
    }
