"""poll_until: the one wait for what settles asynchronously."""

from __future__ import annotations

import time

from cluster_sessions.agents.polling import poll_until


def test_it_returns_the_first_result_that_is_done():
    seen = iter(["pending", "pending", "active", "never asked"])
    assert poll_until(lambda: next(seen), lambda s: s != "pending", 5, interval=0) == "active"


def test_it_gives_up_after_the_timeout_with_the_last_result():
    started = time.monotonic()
    assert poll_until(lambda: "pending", lambda s: s != "pending", 0.3, interval=0.05) == \
        "pending"
    assert 0.25 < time.monotonic() - started < 2


def test_it_asks_at_least_once_even_with_no_time():
    calls = []
    assert poll_until(lambda: calls.append(1) or len(calls), bool, 0) == 1


def test_between_runs_after_each_probe_that_is_not_the_last():
    results = iter([3, 2, 0])
    retried = []
    assert poll_until(lambda: next(results), lambda n: n == 0, 5, interval=0,
                      between=retried.append) == 0
    assert retried == [3, 2]
