"""Priority in the pool's queue (issue 44, part 5, the order only): a higher priority waits
ahead of a lower one, arrival orders a priority, and a queue entry's priority is believed only
up to its project's max_priority (a marker anyone can make cannot jump the queue)."""

from __future__ import annotations

import pytest

from cluster_sessions.core import ledger
from cluster_sessions.core.spec import Pool
from cluster_sessions.driver.placing import believed_priority

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def entry(name: str, arrival: float, priority: int = 0, project: str = "default"):
    return ledger.Entry("queue", name, name, name, name * 4, None, arrival, 60, arrival, {},
                        project=project, priority=priority)


def prio(e):
    return e.priority


def test_a_higher_priority_waits_ahead_of_earlier_lower_ones():
    low1, low2, high = entry("low1", 1), entry("low2", 2), entry("high", 3, 50)
    queue = [low1, low2, high]
    assert ledger.ahead(queue, {high.identity}, high, prio) == []
    assert ledger.ahead(queue, {low2.identity}, low2, prio) == [low1, high]
    assert ledger.ahead(queue, {low1.identity}, low1, prio) == [high]


def test_within_a_priority_first_come_first_served_so_none_is_overtaken_by_its_peers():
    a, b, c = entry("a", 1, 20), entry("b", 2, 20), entry("c", 3, 20)
    queue = [a, b, c]
    assert ledger.ahead(queue, {c.identity}, c, prio) == [a, b]
    assert ledger.ahead(queue, {a.identity}, a, prio) == []
    # a later arrival of the same priority never waits ahead of an earlier one
    late = entry("late", 9, 20)
    assert late not in ledger.ahead([*queue, late], {a.identity}, a, prio)


def test_without_priorities_the_queue_is_first_come_first_served_as_before():
    a, b = entry("a", 1, 70), entry("b", 2, 0)
    assert ledger.ahead([a, b], {a.identity}, a) == []
    assert ledger.ahead([a, b], {b.identity}, b) == [a]
    assert ledger.ahead([a, b], {"x"}, None) == [a, b]


def test_a_queue_entrys_priority_is_believed_up_to_its_projects_max_priority():
    pool = Pool.model_validate(factories.pool("p", policies={
        "default": {"max_priority": 10},
        "projects": {"vision": {"max_priority": 50}}}))
    assert believed_priority(pool, entry("v", 1, 100, "vision")) == 50
    assert believed_priority(pool, entry("v", 1, 30, "vision")) == 30
    assert believed_priority(pool, entry("d", 1, 100)) == 10
    assert believed_priority(pool, entry("x", 1, 100, "nosuch")) == 0
    assert believed_priority(pool, entry("y", 1, 100, "")) == 0  # its project did not parse


def test_a_queue_entrys_priority_label_is_parsed_strictly():
    keys = {"kind": "k", "session": "s", "stack": "st", "holder": "h", "lease": "l",
            "arrival": "a", "holds": "hd", "priority": "p"}
    labels = {"k": "queue", "s": "sess", "st": "0123456789abcdef", "l": "30", "p": "40"}
    assert ledger.entry_of(labels, keys, "id", "n", 1.0, 60).priority == 40
    for bad in ("101", "-1", "1e2", " 5", "x"):
        e = ledger.entry_of({**labels, "p": bad}, keys, "id", "n", 1.0, 60)
        assert e.priority == 0 and e.malformed, bad


@pytest.mark.docker
def test_a_higher_priority_queued_later_runs_first_on_the_real_engine(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    import asyncio
    import threading
    import time

    from cluster_sessions.core.names import SESSION_LABEL
    from cluster_sessions.driver import cli

    (tmp_path / "vision").mkdir()
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        unique("prio"), factories.agent("local", cpu=64, mem="1000g"),
        policies={"projects": {"vision": {"definitions": ["vision"], "max_priority": 50}}}))
    names = [unique("holder"), unique("low"), unique("high")]

    def definition(name, where=".", **over):
        return str(factories.write(tmp_path / where / f"{name}.yaml", factories.session(
            name, pool=str(pool), image=image, cpu=0.1, mem="600g", shmem="8m", **over)))

    holder, low = definition(names[0]), definition(names[1])
    high = definition(names[2], "vision", project="vision", priority=40)

    def made(name):
        return docker_client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={name}"})

    assert cli.main(["up", holder, "--yes"]) == 0, capfd.readouterr().err
    codes: dict[str, int] = {}

    def wait_up(path):
        asyncio.set_event_loop(asyncio.new_event_loop())
        codes[path] = cli.main(["up", path, "--yes", "--wait", "150s"])

    threads = {p: threading.Thread(target=wait_up, args=(p,)) for p in (low, high)}
    try:
        threads[low].start()
        time.sleep(4)  # low arrives first
        threads[high].start()
        time.sleep(4)
        assert not made(names[1]) and not made(names[2])
        assert cli.main(["destroy", holder, "--yes"]) == 0
        threads[high].join(timeout=120)
        assert codes.get(high) == 0, codes
        assert made(names[2]) and not made(names[1])  # low still waits: one fits at a time
        assert cli.main(["destroy", high, "--yes"]) == 0
        threads[low].join(timeout=120)
        assert codes.get(low) == 0, codes
    finally:
        for t in threads.values():
            t.join(timeout=150)
        for f in (holder, low, high):
            cli.main(["destroy", f, "--yes"])
