"""The queue's order and small-fits-first (issue 44, part 5; core/admission.py): priority,
then the projects' dominant share of what they hold now (DRF), then arrival; a session may
pass those ahead of it only while none of them has waited scheduler.backfill_for."""

from __future__ import annotations

import pytest

from cluster_sessions.core import admission, ledger
from cluster_sessions.core.governance import Held, Use
from cluster_sessions.core.spec import Pool

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def entry(name: str, arrival: float, priority: int = 0, project: str = "default",
          asks: tuple[int, int, int] | None = (8000, 600 * 2**30, 0)):
    return ledger.Entry("queue", name, name, name, name * 4, None, arrival, 60, arrival, {},
                        project=project, priority=priority, asks=asks)


def prio(e):
    return e.priority


POOL = Pool.model_validate(factories.pool(
    "drf", factories.agent("a1", cpu=10, mem="100g"), factories.agent("a2", cpu=10, mem="100g",
                                                                      gpus=[0, 1, 2, 3])))


def test_the_dominant_share_is_the_largest_fraction_of_the_pool_held():
    total = admission.pool_total(POOL)
    assert total == Use(millicpu=20_000, mem=200 * 2**30, gpus=4)
    assert admission.dominant_share(Use(millicpu=2000, mem=100 * 2**30, gpus=1), total) == 0.5
    assert admission.dominant_share(Use(gpus=3), total) == 0.75
    assert admission.dominant_share(Use(millicpu=5), Use(millicpu=10)) == 0.5  # no mem, gpus
    assert admission.dominant_share(Use(), Use()) == 0.0


def test_within_a_priority_the_project_holding_less_goes_first_then_arrival():
    held = [Held("vision", "v1", 10_000, 0, 0, 1), Held("nlp", "n1", 2000, 0, 0, 1)]
    share = admission.project_shares(POOL, [], held, ["vision", "nlp", "default"])
    assert share == {"vision": 0.5, "nlp": 0.1, "default": 0.0}
    v, n, d = entry("v", 1, project="vision"), entry("n", 2, project="nlp"), entry("d", 3)
    queue = [v, n, d]

    def before(me):
        return admission.ahead(queue, {me.identity}, me, prio, share.get)
    assert before(d) == []  # holds nothing: first, though it came last
    assert before(n) == [d]
    assert before(v) == [n, d]
    # a higher priority still goes before any share
    high = entry("h", 9, priority=10, project="vision")
    assert admission.ahead([*queue, high], {d.identity}, d, prio, share.get) == [high]
    # the same share: arrival
    a, b = entry("a", 1), entry("b", 2)
    assert admission.ahead([a, b], {b.identity}, b, prio, lambda p: 0.0) == [a]
    assert admission.ahead([a, b], {a.identity}, a, prio, lambda p: 0.0) == []



def test_two_stacks_alike_in_all_but_identity_are_still_one_before_the_other():
    """The order is total: without the identity in the key, two stacks' entries of one name
    made at one moment were each not ahead of the other, and both were placed first."""
    import dataclasses

    first, second = (dataclasses.replace(entry("s", 5), stack_id=sid)
                     for sid in ("1" * 16, "2" * 16))
    assert admission.ahead([first, second], {second.identity}, second, prio,
                           lambda p: 0.0) == [first]
    assert admission.ahead([first, second], {first.identity}, first, prio,
                           lambda p: 0.0) == []


SMALL = Use(millicpu=1000, mem=100 * 2**30)


def test_a_smaller_session_that_fits_passes_only_larger_ones_that_waited_less_than_the_bound():
    young, old = entry("young", 100), entry("old", 40)
    assert admission.holding_back([young], SMALL, now=130, backfill_for=60) == []
    assert admission.holding_back([young, old], SMALL, now=130, backfill_for=60) == [old]
    assert admission.holding_back([young], SMALL, now=160, backfill_for=60) == [young]  # bound
    assert admission.waited_too_long([young, old], now=130, backfill_for=60) == [old]
    # not larger: the same size, more of one resource, or a size not known
    same = entry("same", 100, asks=(1000, 100 * 2**30, 0))
    gpus = entry("gpus", 100, asks=(8000, 600 * 2**30, 0))
    unknown = entry("unknown", 100, asks=None)
    assert admission.holding_back([same, unknown], SMALL, now=101, backfill_for=60) == [
        same, unknown]
    assert admission.holding_back([gpus], Use(millicpu=1000, gpus=1), 101, 60) == [gpus]


def test_smaller_means_no_more_of_any_resource_and_less_of_one():
    assert admission.smaller(Use(1000, 10, 0), (2000, 10, 0))
    assert not admission.smaller(Use(1000, 10, 0), (1000, 10, 0))
    assert not admission.smaller(Use(1000, 10, 1), (9000, 90, 0))
    assert not admission.smaller(Use(), None)


def test_a_queue_entrys_ask_is_read_from_its_label_strictly():
    keys = {"kind": "k", "session": "s", "stack": "t", "holder": "h", "lease": "l",
            "arrival": "a", "holds": "o", "asks": "x"}

    def asks(text):
        labels = {"k": "queue", "s": "one", "l": "60"} | ({"x": text} if text is not None else {})
        return ledger.entry_of(labels, keys, "id", "n", 10.0, 300).asks
    assert asks("1000,2048,1") == (1000, 2048, 1)
    for bad in (None, "", "1,2", "1,2,3,4", "a,b,c", "-1,2,3", "1.5,2,3"):
        assert asks(bad) is None, bad


@pytest.mark.parametrize(("value", "ok"), [("10m", True), ("0s", False), ("soon", False)])
def test_backfill_for_is_a_duration_in_the_pool_file(tmp_path, value, ok):
    from cluster_sessions.core.loader import load_pool_file
    from cluster_sessions.core.problems import DefinitionError

    path = factories.write(tmp_path / "pool.yaml", factories.pool(
        "p", factories.agent(), scheduler={"backfill_for": value}))
    if ok:
        assert load_pool_file(path).scheduler.backfill_for == 600
        return
    with pytest.raises(DefinitionError) as err:
        load_pool_file(path)
    assert [p.path for p in err.value.problems] == ["scheduler.backfill_for"]
    assert str(path) in str(err.value.problems[0])


@pytest.mark.docker
def test_a_small_session_that_fits_passes_a_waiting_large_one_until_it_waited_backfill_for(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    import asyncio
    import threading
    import time

    from cluster_sessions.core.names import SESSION_LABEL
    from cluster_sessions.driver import cli

    backfill = 40  # a real `up` takes 8-12 s here: the small one's must end well within it
    pool_name = unique("fill")

    def write_pool(backfill_for: str):
        return factories.write(tmp_path / "pool.yaml", factories.pool(
            pool_name, factories.agent("local", cpu=64, mem="1000g"),
            scheduler={"backfill_for": backfill_for}))

    pool = write_pool(f"{backfill}s")
    names = [unique("holder"), unique("large"), unique("small"), unique("later")]
    holder, large, small, later = (str(factories.write(tmp_path / f"{n}.yaml", factories.session(
        n, pool=str(pool), image=image, cpu=0.1, mem=mem, shmem="8m")))
        for n, mem in zip(names, ("600g", "600g", "100g", "100g"), strict=True))

    def made(name):
        return docker_client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={name}"})

    assert cli.main(["up", holder, "--yes"]) == 0, capfd.readouterr().err
    codes: dict[str, int] = {}

    def wait_up(path):
        asyncio.set_event_loop(asyncio.new_event_loop())
        codes[path] = cli.main(["up", path, "--yes", "--wait", "150s"])

    waiter = threading.Thread(target=wait_up, args=(large,))
    try:
        waiter.start()
        queued_at = time.time()
        time.sleep(2)
        assert not made(names[1])
        capfd.readouterr()
        # the large one waits (it does not fit); the small one fits now: it goes first
        assert cli.main(["up", small, "--yes"]) == 0, capfd.readouterr().err
        assert "placed ahead of 1 waiting session" in capfd.readouterr().err
        assert time.time() - queued_at < backfill, "too slow to test the bound: rerun alone"
        assert made(names[2]) and not made(names[1])
        # once the large one has waited backfill_for, nothing passes it, though it would fit:
        # the operator shortens the bound to what it has waited already (each `up` reads the
        # pool file afresh), rather than the test sleeping out the 40 s
        waited = time.time() - queued_at
        write_pool(f"{max(1, int(waited) - 2)}s")
        assert cli.main(["up", later, "--yes"]) == 3
        err = capfd.readouterr().err
        assert "longer than scheduler.backfill_for" in err and names[1] in err, err
        assert not made(names[3])
        # and it runs as soon as what it waits for is free
        assert cli.main(["destroy", holder, "--yes"]) == 0
        waiter.join(timeout=120)
        assert codes.get(large) == 0, codes
        assert made(names[1])
    finally:
        for f in (holder, small, later):  # the waiter gets its place, or gives up, then goes
            cli.main(["destroy", f, "--yes"])
        waiter.join(timeout=150)
        cli.main(["destroy", large, "--yes"])
