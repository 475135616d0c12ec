"""The idle decision of ``pool reap`` (core/idleness.py): each clause can keep a session."""

from __future__ import annotations

import pytest

from cluster_sessions.core.idleness import (
    Sample,
    expired,
    format_samples,
    idle_verdict,
    kept_samples,
    parse_samples,
)
from cluster_sessions.core.spec import IdlePolicy

POLICY = IdlePolicy(timeout=600, cpu_below=5, gpu_below=5, grace=300)
NOW = 10_000.0
STARTED = NOW - 3600
QUIET = [Sample(NOW - 900, 1.0, None), Sample(NOW - 300, 2.0, None), Sample(NOW, 0.5, None)]


def verdict(**over):
    args = {"session_type": "interactive", "policy": POLICY, "started": STARTED, "now": NOW,
            "last_login": NOW - 1200, "connections": 0, "samples": QUIET, "holds_gpus": False}
    args.update(over)
    return idle_verdict(**args)


def test_a_quiet_interactive_session_past_its_window_is_idle_with_its_figures():
    v = verdict()
    assert v.end and v.kind == "idle", v
    assert "no login or connection for 20m" in v.reason and "cpu 1.2 % < 5 %" in v.reason


@pytest.mark.parametrize(("over", "said"), [
    ({"session_type": "batch"}, "batch"),
    ({"policy": None}, "no idle rule"),
    ({"started": None}, "does not run"),
    ({"started": NOW - 200}, "grace period"),
    ({"connections": 1}, "connection(s) open"),
    ({"last_login": NOW - 100}, "last login was 100s ago"),
    ({"last_login": None, "started": NOW - 400}, "its start was 400s ago"),
    ({"samples": [Sample(NOW - 300, 0.0), Sample(NOW, 0.0)]}, "measured for 5m"),
    ({"samples": []}, "measured for 0s"),
    ({"samples": [Sample(NOW - 900, None), Sample(NOW, None)]}, "could not be measured"),
    ({"samples": [Sample(NOW - 900, 1.0), Sample(NOW - 300, 20.0), Sample(NOW, 0.0)]},
     "busy: cpu 7.0 %"),
    ({"holds_gpus": True}, "cannot be told"),
    ({"holds_gpus": True, "samples": [Sample(NOW - 900, 0.0, 50.0), Sample(NOW, 0.0, 0.0)]},
     "busy: gpu 25.0 %"),
])
def test_each_clause_keeps_the_session_and_says_why(over, said):
    v = verdict(**over)
    assert not v.end, v
    assert said in v.reason, v.reason


def test_quiet_gpus_are_idle_too():
    v = verdict(holds_gpus=True, samples=[Sample(NOW - 700, 0.0, 1.0), Sample(NOW, 0.0, 3.0)])
    assert v.end and "gpu 2.0 % < 5 %" in v.reason, v


def test_the_window_is_the_last_timeout_opened_by_the_newest_sample_before_it():
    # a busy sample before the window's opening sample does not count
    samples = [Sample(NOW - 2000, 90.0), Sample(NOW - 700, 1.0), Sample(NOW, 1.0)]
    assert verdict(samples=samples).end
    assert kept_samples(samples, NOW, 600, STARTED) == samples[1:]


def test_samples_of_a_run_before_a_restart_or_from_the_future_are_dropped():
    samples = [Sample(STARTED - 10, 0.0), Sample(STARTED + 5, 0.0), Sample(NOW + 50, 0.0)]
    assert kept_samples(samples, NOW, 600, STARTED) == [Sample(STARTED + 5, 0.0)]


def test_samples_round_trip_and_anything_else_is_no_samples():
    samples = [Sample(1.5, 2.0, None), Sample(3.0, None, 4.5)]
    assert parse_samples(format_samples(samples)) == samples
    for bad in ("", "{}", "[[1, 2]]", '[["x", 1, 2]]', "[[1, true, 2]]", "[[1, NaN, 2]]",
                "[[1, \"2\", null]]"):
        assert parse_samples(bad) == [], bad


def test_an_expired_session_is_ended_whatever_its_type():
    v = expired(NOW - 90, NOW)
    assert v is not None and v.end and v.kind == "expired" and "90s ago" in v.reason
    assert expired(NOW + 1, NOW) is None
    assert expired(None, NOW) is None
