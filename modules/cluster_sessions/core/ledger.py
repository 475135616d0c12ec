"""What the pool's ledger markers and our resource labels mean (issue 47): plain functions of
the data the engines show, tested offline. ``agents/pool_ledger.py`` only reads and writes
markers and ``agents/engine.py`` only reads labels; what they mean is decided here.

Every label value is another tenant's data: whoever can reach a pool's engine can create a
container with any label. So:

- **One strict parser** (:func:`integer`, :func:`decimal`) for every number a label
  carries: plain decimal digits (no sign, exponent, ``inf``, ``nan``, spaces), finite,
  non-negative, at most a bound, an integer where the unit is one (bytes, GPU ids, ports,
  pids). A value that is not one is *malformed*, never clamped into something believable.
- **A malformed container** holds what the engine itself enforces on it (its HostConfig's
  CPU and memory limits and device requests, read by the same parser), else nothing; it
  never adds capacity, and it is reported (agent, object, label) by ``pool check`` and
  ``pool usage``: the agent is then suspect, and the operator looks.
- **A malformed marker** (reservation or queue entry whose holdings or times do not parse)
  holds nothing, claims no name and waits in no queue; it is reported like a container.
- **Entries are per stack**, not per session name (:func:`identity`): a reservation or queue
  entry of one stack never replaces, hides or removes another stack's entry of the same name.
- **Liveness is the lease alone**, on the ledger engine's clock: an entry is live while
  ``now < created + lease`` (the lease at most the reader's bound). No pid or host name is
  believed: two runners on one host name, or in other pid namespaces, look alike.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .spec import DEFAULT_PROJECT, PROJECT_NAME
from .stats import parse_time

MAX_CORES = 10**6  # a million cores: far above any agent, far below float trouble
MAX_MILLICPU = MAX_CORES * 1000
MAX_MEM = 2**60  # bytes (1 EiB)
MAX_GPU_ID = 4095
MAX_PORT = 65535
MAX_TIME = 10**11  # seconds (since the epoch: year 5138): arrival times and leases
MAX_PID = 2**31
MAX_CONTAINERS = 10**6
MAX_PRIORITY = 100
MAX_TEXT = 200  # characters of a label's free text kept (a name, a host, a user)
SHOWN = 40  # characters of a bad value a message shows

_DECIMAL = re.compile(r"(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,9})?")
_INTEGER = re.compile(r"0|[1-9][0-9]{0,18}")


def _shown(value: object) -> str:
    return repr(str(value)[:SHOWN])


def _text(value: object) -> str:
    return str(value)[:MAX_TEXT]


def _number(value: object, maximum: float, pattern: re.Pattern[str], convert: type,
            kinds: tuple[type, ...], what: str) -> Any:
    if isinstance(value, str) and pattern.fullmatch(value):
        parsed = convert(value)
    elif type(value) in kinds:
        parsed = value
    else:
        parsed = math.nan
    if not (math.isfinite(parsed) and 0 <= parsed <= maximum):
        raise ValueError(f"{_shown(value)} is not {what} from 0 to {maximum:g}")
    return parsed


def integer(value: object, maximum: int) -> int:
    """``value`` (a label's text, or a JSON number) as an integer in ``[0, maximum]``:
    decimal digits only; ValueError, saying what is wrong, for anything else."""
    return _number(value, maximum, _INTEGER, int, (int,), "an integer")


def decimal(value: object, maximum: float) -> float:
    """``value`` as a number in ``[0, maximum]``: decimal digits, at most one point (no sign,
    exponent, ``inf``, ``nan``, spaces); ValueError for anything else."""
    return _number(value, maximum, _DECIMAL, float, (int, float), "a plain decimal number")


def cpu_label(text: object) -> int:
    """A CPU label (cores, as the plan writes ``f"{cpu:g}"``) as millicpu."""
    return round(decimal(text, MAX_CORES) * 1000)


def mem_label(text: object) -> int:
    return integer(text, MAX_MEM)


def gpus_label(text: object) -> tuple[int, ...]:
    """A GPU label: ids joined by commas ("" for none), each once."""
    if not isinstance(text, str):
        raise ValueError(f"{_shown(text)} is not a list of GPU ids")
    if text == "":
        return ()
    ids = tuple(integer(part, MAX_GPU_ID) for part in text.split(","))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{_shown(text)} names a GPU twice")
    return ids


@dataclass(frozen=True)
class Holds:
    """What one container holds by the rule above, and why any of it was not believed."""

    millicpu: int
    mem: int
    gpus: tuple[int, ...]
    malformed: tuple[str, ...] = ()  # "LABEL: why" per label not believed


def container_holds(labels: Mapping[str, Any], host_config: Mapping[str, Any], cpu_key: str,
                    mem_key: str, gpus_key: str) -> Holds:
    """What a container holds: its labels where they parse; where a label is absent (made
    before labels) or malformed, what its HostConfig enforces (0 where that does not parse
    either). A malformed label is named in ``malformed``."""
    bad: list[str] = []

    def enforced(read, value, default):
        try:
            return read(value)
        except (ValueError, TypeError):
            return default

    def label(key, read, fallback):
        if key not in labels:
            return fallback()
        try:
            return read(labels[key])
        except (ValueError, TypeError) as exc:
            bad.append(f"{key}: {exc}")
            return fallback()

    millicpu = label(cpu_key, cpu_label, lambda: enforced(
        lambda v: integer(v, MAX_MILLICPU * 10**6) // 1_000_000, host_config.get("NanoCpus"), 0))
    mem = label(mem_key, mem_label, lambda: enforced(
        lambda v: integer(v, MAX_MEM), host_config.get("Memory"), 0))

    def requested() -> tuple[int, ...]:
        ids = []
        for req in host_config.get("DeviceRequests") or ():
            for g in (req.get("DeviceIDs") or ()) if isinstance(req, Mapping) else ():
                ids.append(enforced(lambda v: integer(v, MAX_GPU_ID), g, None))
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    gpus = label(gpus_key, gpus_label, requested)
    return Holds(millicpu, mem, gpus, tuple(bad))


def project_label(text: object) -> str:
    """A project label (core/governance.py): a project name as a pool spells one; absent
    (None) is the default policy's. ValueError for anything else: a container or marker
    whose project does not parse counts towards no project's quota (it still holds what it
    holds on its agent)."""
    if text is None or text == "":
        return DEFAULT_PROJECT
    if not isinstance(text, str) or not PROJECT_NAME.fullmatch(text):
        raise ValueError(f"{_shown(text)} is not a project name")
    return text


def expiry_label(text: object) -> int | None:
    """A container's ``expires-at`` label (epoch seconds), None when absent or malformed (a
    malformed one never makes a container hold less)."""
    if text is None:
        return None
    try:
        return integer(text, int(MAX_TIME))
    except ValueError:
        return None


GAVE_BACK_STATES = frozenset({"exited", "dead", "created", "restarting"})


def gave_back(state: str, expires_at: int | None, now: float,
              started_at: str | None = None) -> bool:
    """A container whose session's lifetime ended and that does not run holds nothing: its
    command was ended at the expiry (templates/lifetime.sh) and a restart exits at once
    without running it; so one "running" since after the expiry (``started_at``, the engine's
    StartedAt) is that restart, seen between two exits. A container running since before
    holds what it holds until it stops (the grace)."""
    if expires_at is None or now < expires_at:
        return False
    started = parse_time(started_at)
    return state in GAVE_BACK_STATES or (started is not None and started >= expires_at)


# --- the ledger's markers -------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """Who says they hold a lock, reservation or queue entry (its label: believed only as
    text to show; no liveness is read from it)."""

    session: str
    verb: str
    host: str
    pid: int
    user: str

    def label(self) -> str:
        return json.dumps({"session": self.session, "verb": self.verb, "host": self.host,
                           "pid": self.pid, "user": self.user}, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            doc = json.loads(text)
            return cls(_text(doc["session"]), _text(doc["verb"]), _text(doc["host"]),
                       integer(doc["pid"], MAX_PID), _text(doc["user"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def describe(self) -> str:
        return (f"sessionctl {self.verb} of session {self.session} ({self.user}@{self.host}, "
                f"pid {self.pid})")

    @property
    def sessions(self) -> tuple[str, ...]:
        """The session names it says it places (a definition's count: several)."""
        return tuple(s for s in self.session.split(", ") if s)


@dataclass(frozen=True)
class Entry:
    """One marker of the ledger, as the engine shows it, and what it means."""

    kind: str
    container_id: str
    name: str
    session: str
    stack_id: str
    holder: Holder | None
    created: float  # the engine's clock, seconds since the epoch
    lease: float
    arrival: float  # queue entries: when the first entry of this wait was made
    holds: Mapping[str, Any]
    malformed: tuple[str, ...] = field(default=())
    project: str = DEFAULT_PROJECT  # core/governance.py; "" when its label does not parse
    containers: int = 0  # a reservation: the containers its session will have
    priority: int = 0  # a queue entry: as its label says (the reader caps it: ahead)
    asks: tuple[int, int, int] | None = None  # a queue entry: millicpu, mem, GPUs in all

    def expired(self, now: float) -> bool:
        return now >= self.created + self.lease

    @property
    def until(self) -> float:
        return self.created + self.lease

    @property
    def identity(self) -> str:
        return identity(self.stack_id, self.session)

    @property
    def sessions(self) -> frozenset[str]:
        """Every session name this entry claims (its own, and those its holder places)."""
        return frozenset({self.session, *(self.holder.sessions if self.holder else ())})

    def who(self) -> str:
        """Who it is, for a message: its stack id and holder (escaped by the caller)."""
        stack = f"stack id {self.stack_id}" if self.stack_id else "a stack without an id"
        return f"{stack}, {self.holder.describe() if self.holder else 'an unnamed holder'}"


def identity(stack_id: str, session: str) -> str:
    """Whose an entry is: its stack (a marker written before stack ids: its session name)."""
    return stack_id or f"session:{session}"


def _holds(text: str) -> dict[str, dict[str, Any]]:
    """A reservation's holdings (agent -> cpu, mem, gpus, ports); ValueError if any part is
    malformed: a marker holds all it says or nothing."""
    parsed = json.loads(text) if text else {}
    if not isinstance(parsed, dict):
        raise ValueError("not an object")
    holds: dict[str, dict[str, Any]] = {}
    for agent, held in parsed.items():
        where = f"agent {_shown(agent)}"
        if not isinstance(held, dict) or set(held) - {"cpu", "mem", "gpus", "ports"}:
            raise ValueError(f"{where}: not cpu, mem, gpus, ports")
        gpus, ports = held.get("gpus", []), held.get("ports", [])
        if not isinstance(gpus, list) or not isinstance(ports, list):
            raise ValueError(f"{where}: gpus and ports must be lists")
        holds[_text(agent)] = {
            "cpu": integer(held["cpu"], MAX_MILLICPU) if "cpu" in held else 0,
            "mem": integer(held["mem"], MAX_MEM) if "mem" in held else 0,
            "gpus": [integer(g, MAX_GPU_ID) for g in gpus],
            "ports": [integer(p, MAX_PORT) for p in ports]}
        if 0 in holds[_text(agent)]["ports"]:
            raise ValueError(f"{where}: port 0")
    return holds


def entry_of(labels: Mapping[str, str], keys: Mapping[str, str], container_id: str, name: str,
             created: float, max_lease: float) -> Entry:
    """A ledger entry from its marker's labels (``keys``: kind, session, stack, holder,
    lease, arrival, holds -> the label names) and the engine's ``created`` time. A lease is
    believed up to ``max_lease``; a malformed one is 0 (expired: removed by the next reader);
    a malformed holding holds nothing; an arrival after the marker was made is its making."""
    bad: list[str] = []

    def read(key: str, parse, default):
        if keys[key] not in labels:
            return default
        try:
            return parse(labels[keys[key]])
        except (ValueError, TypeError) as exc:
            bad.append(f"{keys[key]}: {exc}")
            return default

    lease = read("lease", lambda t: decimal(t, MAX_TIME), 0.0)
    arrival = read("arrival", lambda t: decimal(t, MAX_TIME), created)
    holds = read("holds", _holds, {})
    holder = read("holder", lambda t: Holder.parse(t) or _no_holder(), None)
    project = DEFAULT_PROJECT
    if "project" in keys and keys["project"] in labels:  # absent: the default policy's
        project = read("project", project_label, "")  # malformed: no project's
    containers = (read("containers", lambda t: integer(t, MAX_CONTAINERS), 0)
                  if "containers" in keys else 0)
    priority = read("priority", lambda t: integer(t, MAX_PRIORITY), 0) if "priority" in keys else 0
    asks = _asks(labels[keys["asks"]]) if "asks" in keys and keys["asks"] in labels else None
    return Entry(kind=_text(labels.get(keys["kind"], "")), container_id=container_id,
                 name=name, session=_text(labels.get(keys["session"], "")),
                 stack_id=_text(labels.get(keys["stack"], "")), holder=holder,
                 created=created, lease=min(lease, max_lease), arrival=min(arrival, created),
                 holds=holds, malformed=tuple(bad), project=project, containers=containers,
                 priority=priority, asks=asks)


def _asks(text: str) -> tuple[int, int, int] | None:
    """A queue entry's ask (``MILLICPU,MEM,GPUS``); None when absent or not that: a size
    not known, which nobody passes (core.admission)."""
    parts = text.split(",")
    if len(parts) != 3:
        return None
    try:
        return (integer(parts[0], MAX_MILLICPU), integer(parts[1], MAX_MEM),
                integer(parts[2], MAX_CONTAINERS * 64))
    except (ValueError, TypeError):
        return None


def _no_holder() -> Holder:
    raise ValueError("not a holder sessionctl writes")


def order(entries: Iterable[Entry]) -> list[Entry]:
    """First come, first served: by arrival, then making, then marker name."""
    return sorted(entries, key=lambda e: (e.arrival, e.created, e.name))


@dataclass(frozen=True)
class Live:
    """The live entries (one per stack: the newest, a renewal makes the new marker before it
    removes the old), in :func:`order`; the expired ones (for the reader to remove); the
    malformed ones (live or not: they count for nothing, ``pool usage`` shows them)."""

    entries: tuple[Entry, ...]
    expired: tuple[Entry, ...]
    malformed: tuple[Entry, ...]


def live(entries: Iterable[Entry], now: float) -> Live:
    newest: dict[tuple[str, str], Entry] = {}
    expired, malformed = [], []
    for entry in entries:
        if entry.expired(now):
            expired.append(entry)
            continue
        if entry.malformed:
            malformed.append(entry)
            continue
        key = (entry.kind, entry.identity)  # max: the first of a tie stays
        newest[key] = max(newest.get(key, entry), entry, key=lambda e: (e.created, e.name))
    return Live(tuple(order(newest.values())), tuple(expired), tuple(malformed))


def claims(entries: Iterable[Entry], mine: Mapping[str, str],
           before: Entry | None = None) -> list[Entry]:
    """The entries of *other* stacks that claim a name of ``mine`` (session -> its stack
    id): a reservation always; a queue entry when it came before ``before`` (our own queue
    entry; none: every queue entry), so that of two waiters for one name the first keeps it."""
    ours = {identity(stack, session) for session, stack in mine.items()}
    found = []
    for e in entries:
        if e.identity in ours or not e.sessions & set(mine):
            continue
        if e.kind == "queue" and before is not None and not _earlier(e, before):
            continue
        found.append(e)
    return found


def _earlier(a: Entry, b: Entry) -> bool:
    return (a.arrival, a.created, a.name) < (b.arrival, b.created, b.name)


def ahead(queue: Sequence[Entry], mine: Iterable[str], me: Entry | None,
          priority: Callable[[Entry], int] = lambda e: 0) -> list[Entry]:
    """The queue entries of other stacks (``mine``: our identities) that wait before ``me``
    (our own entry; none: every one of them): a higher ``priority`` first (issue 44: the
    reader's reading of an entry's priority, capped by its project's policy), then first
    come, first served. Within a priority nothing overtakes: a session waits only behind
    those that arrived before it at its priority or above, so none starves behind later
    arrivals of its own priority."""
    ours = set(mine)

    def key(e: Entry) -> tuple:
        return (-priority(e), e.arrival, e.created, e.name)

    return [e for e in queue
            if e.identity not in ours and (me is None or key(e) < key(me))]
