"""When a session may be ended by ``sessionctl pool reap`` (issue 44, part 4): expired, or
idle by its project's ``idle`` policy. Plain data in, a verdict with its reason out; reading
the engines and ending sessions is the driver's (driver/reap_verb.py).

An interactive session is **idle** when all of these hold (each clause can keep it):

1. it is not a batch session (a batch session's job ends it: exempt);
2. its policy has an ``idle`` block;
3. main1 runs, and started at least ``grace`` ago;
4. nothing is connected now to main1's sshd or a service port it publishes;
5. no login reached main1 for ``timeout`` (its start counts as the last one when there was
   none);
6. the reaper's samples cover the last ``timeout`` (one sample at least ``timeout`` old):
   the samples are kept in main1 between passes (:func:`parse_samples`,
   :func:`format_samples`), each pass adds one, as Backend.AI's utilisation checker keeps
   its samples over its window;
7. the mean of the samples' cpu % (of the allocated cores, the session's containers' mean)
   over the window is under ``cpu_below``, and, when the session holds GPUs, the mean of its
   GPUs' utilisation under ``gpu_below`` (GPUs whose use cannot be told keep the session:
   unknown is not idle).

A session whose lifetime ended (``expires_at`` passed) is **expired**, whatever its type:
its containers gave the capacity back already; reaping removes what is left.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from .spec import IdlePolicy
from .units import format_duration

MAX_SAMPLES = 512  # kept in main1: a pass every minute over a window of 8 h


@dataclass(frozen=True)
class Sample:
    """One reaper pass's look at a session: when, its containers' mean cpu % of their
    allocation, and its GPUs' mean utilisation (None: no GPUs, or not known)."""

    at: float
    cpu: float | None
    gpu: float | None = None


@dataclass(frozen=True)
class Verdict:
    """Whether ``pool reap`` ends a session (``end``), why (``kind``: ``expired`` | ``idle``),
    or why it keeps it (``reason``)."""

    end: bool
    reason: str
    kind: str = ""


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if value == value and abs(value) < 1e12 else None  # no NaN, no inf


def parse_samples(text: str) -> list[Sample]:
    """The samples kept in main1 (JSON ``[[at, cpu, gpu], ...]``); a text that is not that
    (a first pass: none; a file another hand wrote) is no samples: the window starts anew."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    if not isinstance(data, list):
        return []
    found = []
    for item in data[-MAX_SAMPLES:]:
        if not isinstance(item, list) or len(item) != 3:
            return []
        at = _number(item[0])
        if at is None or any(v is not None and _number(v) is None for v in item[1:]):
            return []
        found.append(Sample(at, _number(item[1]), _number(item[2])))
    return sorted(found, key=lambda s: s.at)


def format_samples(samples: Sequence[Sample]) -> str:
    return json.dumps([[round(s.at, 3), s.cpu, s.gpu] for s in samples[-MAX_SAMPLES:]],
                      separators=(",", ":"))


def kept_samples(samples: Sequence[Sample], now: float, timeout: float,
                 started: float | None) -> list[Sample]:
    """What to keep for the next pass: the samples since main1's start (an older one is of a
    run before a restart) and in the window, plus the newest one before the window (it opens
    it); none from the future."""
    mine = sorted((s for s in samples if s.at <= now
                   and (started is None or s.at >= started)), key=lambda s: s.at)
    start = now - timeout
    before = [s for s in mine if s.at <= start]
    return before[-1:] + [s for s in mine if s.at > start]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def expired(expires_at: float | None, now: float) -> Verdict | None:
    if expires_at is not None and expires_at <= now:
        return Verdict(True, f"expired: its lifetime ended {format_duration(int(now - expires_at))}"
                       " ago", "expired")
    return None


def idle_verdict(session_type: str, policy: IdlePolicy | None, started: float | None,
                 now: float, last_login: float | None, connections: int,
                 samples: Sequence[Sample], holds_gpus: bool) -> Verdict:
    """Whether an interactive session is idle now (every clause of the module's list), from
    main1's start, its last login and its open connections, and the reaper's ``samples``
    (this pass's included)."""
    if session_type == "batch":
        return Verdict(False, "a batch session: its job ends it (exempt from idleness)")
    if policy is None:
        return Verdict(False, "its project's policy has no idle rule")
    if started is None:
        return Verdict(False, "main1 does not run")
    timeout = policy.timeout
    if now - started < policy.grace:
        return Verdict(False, f"in its grace period ({format_duration(policy.grace)} from its "
                       f"start, {format_duration(int(started + policy.grace - now))} left)")
    if connections > 0:
        return Verdict(False, f"{connections} connection(s) open to main1's sshd or services")
    last = max(started, last_login) if last_login is not None else started
    if now - last < timeout:
        what = "its last login" if last_login is not None and last_login >= started else \
            "its start"
        return Verdict(False, f"{what} was {format_duration(int(now - last))} ago, less than "
                       f"idle timeout {format_duration(timeout)}")
    window = kept_samples(samples, now, timeout, started)
    if not window or window[0].at > now - timeout:
        covered = int(now - window[0].at) if window else 0
        return Verdict(False, f"measured for {format_duration(covered)} of the idle window "
                       f"({format_duration(timeout)}): the next pass judges it")
    cpu = _mean([s.cpu for s in window])
    if cpu is None:
        return Verdict(False, "its cpu use could not be measured over the window")
    if cpu >= policy.cpu_below:
        return Verdict(False, f"busy: cpu {cpu:.1f} % of its allocation over the last "
                       f"{format_duration(timeout)} (idle below {policy.cpu_below:g} %)")
    gpu_text = ""
    if holds_gpus:
        gpu = _mean([s.gpu for s in window])
        if gpu is None:
            return Verdict(False, "its GPUs' use cannot be told (no nvidia-smi): not idle")
        if gpu >= policy.gpu_below:
            return Verdict(False, f"busy: gpu {gpu:.1f} % over the last "
                           f"{format_duration(timeout)} (idle below {policy.gpu_below:g} %)")
        gpu_text = f", gpu {gpu:.1f} % < {policy.gpu_below:g} %"
    return Verdict(True, f"idle: no login or connection for {format_duration(int(now - last))}"
                   f", cpu {cpu:.1f} % < {policy.cpu_below:g} %{gpu_text} over the last "
                   f"{format_duration(timeout)}", "idle")
