"""The idle decision of ``pool reap`` (core/idleness.py): each clause can keep a session."""

from __future__ import annotations

import pytest

from cluster_sessions.core.idleness import (
    Sample,
    Verdict,
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


LEFT = "less than idle timeout 10m"
LATER = "of the idle window (10m): the next pass judges it"


@pytest.mark.parametrize(("over", "said"), [
    ({"session_type": "batch"}, "a batch session: its job ends it (exempt from idleness)"),
    ({"policy": None}, "its project's policy has no idle rule"),
    ({"started": None}, "main1 does not run"),
    ({"started": NOW - 200}, "in its grace period (5m from its start, 100s left)"),
    ({"connections": 1}, "1 connection(s) open to main1's sshd or services"),
    ({"last_login": NOW - 100}, f"its last login was 100s ago, {LEFT}"),
    ({"last_login": None, "started": NOW - 400}, f"its start was 400s ago, {LEFT}"),
    # the grace period is over at grace: the next clause speaks
    ({"started": NOW - 300}, f"its start was 5m ago, {LEFT}"),
    # a login at main1's start is its last login
    ({"started": NOW - 300, "last_login": NOW - 300}, f"its last login was 5m ago, {LEFT}"),
    ({"samples": [Sample(NOW - 300, 0.0), Sample(NOW, 0.0)]}, f"measured for 5m {LATER}"),
    ({"samples": []}, f"measured for 0s {LATER}"),
    # a sample of the run before main1's (re)start does not open the window
    ({"started": NOW - 640, "last_login": None,
      "samples": [Sample(NOW - 650, 90.0), Sample(NOW - 300, 1.0), Sample(NOW, 1.0)]},
     f"measured for 5m {LATER}"),
    ({"samples": [Sample(NOW - 900, None), Sample(NOW, None)]},
     "its cpu use could not be measured over the window"),
    ({"samples": [Sample(NOW - 900, 1.0), Sample(NOW - 300, 20.0), Sample(NOW, 0.0)]},
     "busy: cpu 7.0 % of its allocation over the last 10m (idle below 5 %)"),
    ({"samples": [Sample(NOW - 900, 5.0), Sample(NOW, 5.0)]},  # at the threshold: busy
     "busy: cpu 5.0 % of its allocation over the last 10m (idle below 5 %)"),
    ({"holds_gpus": True}, "its GPUs' use cannot be told (no nvidia-smi): not idle"),
    ({"holds_gpus": True, "samples": [Sample(NOW - 900, 0.0, 50.0), Sample(NOW, 0.0, 0.0)]},
     "busy: gpu 25.0 % over the last 10m (idle below 5 %)"),
    ({"holds_gpus": True, "samples": [Sample(NOW - 900, 0.0, 5.0), Sample(NOW, 0.0, 5.0)]},
     "busy: gpu 5.0 % over the last 10m (idle below 5 %)"),
])
def test_each_clause_keeps_the_session_and_says_why(over, said):
    v = verdict(**over)
    assert (v.end, v.reason, v.kind) == (False, said, "")


def test_the_idle_verdict_says_its_figures():
    assert verdict() == Verdict(
        True, "idle: no login or connection for 20m, cpu 1.2 % < 5 % over the last 10m",
        "idle")
    # a login exactly the idle timeout ago, a first sample exactly at the window's opening
    v = verdict(last_login=NOW - 600, samples=[Sample(NOW - 600, 1.0), Sample(NOW, 2.0)])
    assert v == Verdict(True, "idle: no login or connection for 10m, cpu 1.5 % < 5 % over "
                        "the last 10m", "idle")


def test_quiet_gpus_are_idle_too():
    v = verdict(holds_gpus=True, samples=[Sample(NOW - 700, 0.0, 1.0), Sample(NOW, 0.0, 3.0)])
    assert v == Verdict(True, "idle: no login or connection for 20m, cpu 0.0 % < 5 %, gpu "
                        "2.0 % < 5 % over the last 10m", "idle")


def test_the_window_is_the_last_timeout_opened_by_the_newest_sample_before_it():
    # a busy sample before the window's opening sample does not count
    samples = [Sample(NOW - 2000, 90.0), Sample(NOW - 700, 1.0), Sample(NOW, 1.0)]
    assert verdict(samples=samples).end
    assert kept_samples(samples, NOW, 600, STARTED) == samples[1:]


def test_samples_of_a_run_before_a_restart_or_from_the_future_are_dropped():
    samples = [Sample(STARTED - 10, 0.0), Sample(STARTED + 5, 0.0), Sample(NOW + 50, 0.0)]
    assert kept_samples(samples, NOW, 600, STARTED) == [Sample(STARTED + 5, 0.0)]
    # a sample taken at main1's start is of this run; without a start, all are
    assert kept_samples([Sample(STARTED, 1.0)], NOW, 600, STARTED) == [Sample(STARTED, 1.0)]
    assert kept_samples(samples, NOW, 4000, None) == samples[:2]


def test_a_sample_at_the_windows_opening_opens_it_once():
    at_open = [Sample(NOW - 900, 9.0), Sample(NOW - 600, 1.0), Sample(NOW, 2.0)]
    assert kept_samples(at_open, NOW, 600, STARTED) == at_open[1:]


def test_samples_round_trip_and_anything_else_is_no_samples():
    samples = [Sample(1.5, 2.0, None), Sample(3.0, None, 4.5)]
    assert parse_samples(format_samples(samples)) == samples
    assert format_samples([Sample(1.23456, 2.0, None)]) == "[[1.235,2.0,null]]"  # compact
    for bad in ("", "{}", "[[1, 2]]", '[["x", 1, 2]]', "[[1, true, 2]]", "[[1, NaN, 2]]",
                "[[1, \"2\", null]]", "[[1, 1e300, 2]]", "[[1e12, 1, 2]]",
                "[[1, Infinity, 2]]"):
        assert parse_samples(bad) == [], bad
    assert parse_samples("[[999999999999.0, 1, 2]]") == [Sample(999999999999.0, 1.0, 2.0)]


def test_an_expired_session_is_ended_whatever_its_type():
    v = expired(NOW - 90, NOW)
    assert v is not None and v.end and v.kind == "expired" and "90s ago" in v.reason
    assert expired(NOW + 1, NOW) is None
    assert expired(NOW, NOW) == Verdict(True, "expired: its lifetime ended 0s ago", "expired")
    assert expired(NOW - 7200, NOW).reason == "expired: its lifetime ended 2h ago"
    assert expired(None, NOW) is None
