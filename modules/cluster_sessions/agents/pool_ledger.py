"""The pool's ledger on its own engine: the lock that orders placements, the reservations of
sessions being placed, and the queue of ``up --wait`` (docs/scheduling.md).

Every client of a pool sees the pool's engines, whatever state backend it uses, so that is
where these live: on the *ledger agent* (the swarm manager, else the pool's first agent), as
never-started containers of an empty image (``MARKER_IMAGE``, imported on first use). A
container name is reserved atomically by the engine (a second create of the name is refused
with 409), which makes the lock a create-if-absent; labels carry the holder (host, pid,
session, verb) and the lease. Leases are judged on the engine's own clock (its ``SystemTime``
against the marker's ``Created``), so clients with skewed clocks agree; a holder on this host
whose process is gone is known dead at once.

- lock: one container per pool, held only while a placement is decided and its reservation
  written (seconds), its lease ``LOCK_LEASE``; an expired lock is broken (removed by id).
- reservation: one per session being placed, holding what its placement takes per agent,
  renewed by its holder every ``RESERVATION_LEASE / 3`` (a new marker, then the old removed),
  removed when the ``up`` ends; a killed ``up``'s runs out after ``RESERVATION_LEASE``.
- queue: one entry per waiting ``up --wait``, renewed like a reservation, carrying its arrival
  time (the engine's, from its first entry): first come, first served.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import secrets
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..core.errors import EngineFailure
from ..core.names import (
    LEDGER_ARRIVAL_LABEL,
    LEDGER_HOLDER_LABEL,
    LEDGER_HOLDS_LABEL,
    LEDGER_KIND_LABEL,
    LEDGER_LEASE_LABEL,
    LEDGER_POOL_LABEL,
    LEDGER_SESSION_LABEL,
    LEDGER_STACK_LABEL,
    PROJECT,
)
from ..core.spec import Agent, Pool
from . import engine
from .connectors import AgentError
from .engine import MarkerFacts
from .errors import AgentsUnusable

MARKER_IMAGE = f"{PROJECT}/marker:1"
LOCK_LEASE = 60.0  # seconds; a decision takes a probe of the pool and one create
RESERVATION_LEASE = 90.0
QUEUE_LEASE = 90.0
MAX_LEASE = 300.0  # the most any marker's label is believed

KIND_LABEL = LEDGER_KIND_LABEL
POOL_LABEL = LEDGER_POOL_LABEL
ENTRY_SESSION_LABEL = LEDGER_SESSION_LABEL
ENTRY_STACK_LABEL = LEDGER_STACK_LABEL
HOLDER_LABEL = LEDGER_HOLDER_LABEL
LEASE_LABEL = LEDGER_LEASE_LABEL
ARRIVAL_LABEL = LEDGER_ARRIVAL_LABEL
HOLDS_LABEL = LEDGER_HOLDS_LABEL


class PoolBusy(EngineFailure):
    """The pool's lock stayed held by another live client; the message names it."""


class LedgerUnreachable(AgentsUnusable):
    """The agent that keeps the pool's ledger does not answer: no placement can be decided."""


def ledger_agent(pool: Pool) -> Agent:
    """Where the pool's ledger lives: the swarm manager (every multi-node placement needs it
    anyway), else the first agent."""
    name = pool.swarm.manager if pool.swarm is not None else pool.agents[0].name
    return pool.agent(name)


def _pool_key(pool: str) -> str:
    """A pool name as a container-name part (pool names are free text)."""
    return hashlib.sha256(pool.encode()).hexdigest()[:16]


def lock_name(pool: str) -> str:
    return f"{PROJECT}-lock-{_pool_key(pool)}"


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, reservation or queue entry."""

    session: str
    verb: str = "up"
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    user: str = field(default_factory=lambda: os.environ.get("USER") or str(os.getuid()))

    def label(self) -> str:
        return json.dumps({"session": self.session, "verb": self.verb, "host": self.host,
                           "pid": self.pid, "user": self.user}, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            doc = json.loads(text)
            return cls(str(doc["session"]), str(doc["verb"]), str(doc["host"]),
                       int(doc["pid"]), str(doc["user"]))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return (f"sessionctl {self.verb} of session {self.session} ({self.user}@{self.host}, "
                f"pid {self.pid})")

    def dead(self) -> bool:
        """Known dead: on this host, and its process is gone (elsewhere only its lease tells)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


@dataclass(frozen=True)
class Entry:
    """One marker of the ledger, as the engine shows it."""

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

    def expired(self, now: float) -> bool:
        return now > self.created + self.lease or (self.holder is not None
                                                   and self.holder.dead())

    @property
    def until(self) -> float:
        return self.created + self.lease


def engine_time(text: str) -> float:
    """An engine timestamp (RFC 3339 with nanoseconds, ``Z``) as seconds since the epoch."""
    text = text.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    head, _, rest = text.partition(".")
    if rest:
        digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]
        zone = rest[len(digits):]
        text = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text).timestamp()


def _seconds(text: str | None, default: float) -> float:
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


def entry_of(marker: MarkerFacts) -> Entry:
    """A ledger entry from what the engine shows of its marker (agents.engine)."""
    labels = marker.labels
    holds: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(ValueError):
        parsed = json.loads(labels.get(HOLDS_LABEL) or "{}")
        for agent, held in (parsed.items() if isinstance(parsed, dict) else ()):
            if isinstance(held, dict):
                holds[str(agent)] = {"cpu": _count(held.get("cpu")),
                                     "mem": _count(held.get("mem")),
                                     "gpus": [g for g in held.get("gpus") or []
                                              if type(g) is int and g >= 0],
                                 "ports": [p for p in held.get("ports") or []
                                           if type(p) is int and 0 < p < 65536]}
    created = engine_time(marker.created)
    # a lease is at most MAX_LEASE whatever a label says: a marker cannot hold a pool forever
    lease = min(_seconds(labels.get(LEASE_LABEL), 0.0), MAX_LEASE)
    arrival = _seconds(labels.get(ARRIVAL_LABEL), created)
    return Entry(kind=labels.get(KIND_LABEL, ""), container_id=marker.container_id,
                 name=marker.name, session=labels.get(ENTRY_SESSION_LABEL, ""),
                 stack_id=labels.get(ENTRY_STACK_LABEL, ""),
                 holder=Holder.parse(labels.get(HOLDER_LABEL, "")), created=created,
                 lease=lease, arrival=arrival, holds=holds)


def _empty_tar() -> bytes:
    out = io.BytesIO()
    tarfile.open(fileobj=out, mode="w").close()
    return out.getvalue()


class Ledger:
    """The ledger of ``pool``, through one Docker client of its ledger agent."""

    def __init__(self, pool: Pool, client: Any):
        self.pool = pool
        self.client = client
        self._image_ready = False

    @classmethod
    @contextlib.contextmanager
    def open(cls, pool: Pool, timeout: float = 30) -> Iterator[Ledger]:
        from .engine import close_client, open_client

        agent = ledger_agent(pool)
        try:
            client = open_client(agent, timeout)
        except Exception as exc:  # the SDK's many ways of saying "no engine"
            raise LedgerUnreachable(
                f"pool {pool.name}: agent {agent.name}: does not answer ({exc}), and it is "
                "where the pool's placements are decided one at a time; nothing was created"
                ) from None
        try:
            yield cls(pool, client)
        finally:
            close_client(client)

    # --- engine calls -----------------------------------------------------------------------

    def now(self) -> float:
        """The engine's clock."""
        return engine_time(self.client.api.info()["SystemTime"])

    def _ensure_image(self) -> None:
        if self._image_ready:
            return
        import docker

        try:
            self.client.api.inspect_image(MARKER_IMAGE)
        except docker.errors.ImageNotFound:
            repo, tag = MARKER_IMAGE.rsplit(":", 1)
            self.client.api.import_image_from_data(_empty_tar(), repository=repo, tag=tag)
        self._image_ready = True

    def _create(self, name: str, labels: Mapping[str, str]) -> str | None:
        """Create marker ``name``; its id, or None when the name is taken (409)."""
        import docker

        self._ensure_image()
        try:
            made = self.client.api.create_container(
                MARKER_IMAGE, command=["ledger-marker-never-started"], name=name,
                labels={KIND_LABEL: labels[KIND_LABEL], POOL_LABEL: self.pool.name, **labels},
                host_config=self.client.api.create_host_config(network_mode="none"),
                network_disabled=True)
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                return None
            raise
        return made["Id"]

    def _remove(self, container_id: str) -> None:
        import docker

        with contextlib.suppress(docker.errors.NotFound):
            self.client.api.remove_container(container_id, force=True)

    def entries(self, kind: str | None = None) -> list[Entry]:
        """Every marker of this pool (of ``kind``), oldest first."""
        labels = [f"{POOL_LABEL}={self.pool.name}"] + ([f"{KIND_LABEL}={kind}"] if kind else [])
        found = [entry_of(m) for m in engine.ledger_markers(self.client, labels)]
        return sorted(found, key=lambda e: (e.arrival, e.created, e.name))

    def live(self, kind: str, now: float | None = None) -> list[Entry]:
        """The unexpired entries of ``kind``, one per session (the newest: a renewal makes
        the new marker before it removes the old), oldest arrival first; expired ones are
        removed on the way."""
        now = self.now() if now is None else now
        newest: dict[str, Entry] = {}
        for entry in self.entries(kind):
            if entry.expired(now):
                self._remove(entry.container_id)
            elif entry.session not in newest or entry.created > newest[entry.session].created:
                newest[entry.session] = entry
        return sorted(newest.values(), key=lambda e: (e.arrival, e.created, e.name))

    # --- the lock ---------------------------------------------------------------------------

    def lock_holder(self) -> Entry | None:
        marker = engine.inspect_marker(self.client, lock_name(self.pool.name))
        return entry_of(marker) if marker is not None else None

    @contextlib.contextmanager
    def locked(self, holder: Holder, timeout: float = 300,
               on_wait: Callable[[str], None] | None = None) -> Iterator[float]:
        """Hold the pool's lock; yields the engine time it was taken at. An expired or dead
        holder's lock is broken; a live one is waited for (``on_wait`` told once, with whom),
        up to ``timeout`` seconds, then :class:`PoolBusy`."""
        name = lock_name(self.pool.name)
        deadline = time.monotonic() + timeout
        told = False
        while True:
            made = self._create(name, {KIND_LABEL: "lock", HOLDER_LABEL: holder.label(),
                                       LEASE_LABEL: f"{LOCK_LEASE:g}",
                                       ENTRY_SESSION_LABEL: holder.session})
            if made is not None:
                break
            current = self.lock_holder()
            if current is None:
                continue  # released meanwhile
            if current.expired(self.now()):
                self._remove(current.container_id)
                continue
            who = current.holder.describe() if current.holder else "another client"
            if time.monotonic() > deadline:
                raise PoolBusy(f"pool {self.pool.name} stayed locked by {who} for "
                               f"{timeout:g}s; nothing was created")
            if not told and on_wait is not None:
                on_wait(who)
                told = True
            time.sleep(0.1)
        taken = self._entry(made).created
        try:
            yield taken
        finally:
            self._remove(made)

    def _entry(self, container_id: str) -> Entry:
        marker = engine.inspect_marker(self.client, container_id)
        if marker is None:
            raise AgentError(ledger_agent(self.pool).name, "ledger",
                             f"marker {container_id[:12]} vanished as it was made")
        return entry_of(marker)

    def last_agent(self) -> str | None:
        """The agent the pool's last placement chose (a roundrobin pool goes on after it)."""
        marker = engine.inspect_marker(self.client, f"{PROJECT}-last-{_pool_key(self.pool.name)}")
        return (marker.labels.get(LEDGER_SESSION_LABEL) or None) if marker else None

    def set_last_agent(self, agent: str) -> None:
        """Record the agent this decision chose (call under the lock: one writer at a time)."""
        name = f"{PROJECT}-last-{_pool_key(self.pool.name)}"
        old = engine.inspect_marker(self.client, name)
        if old is not None:
            self._remove(old.container_id)
        self._create(name, {KIND_LABEL: "last", ENTRY_SESSION_LABEL: agent})

    def still_locked(self, taken: float) -> bool:
        """The lock taken at ``taken`` has not run out (check before writing a decision)."""
        return self.now() < taken + LOCK_LEASE

    # --- reservations and the queue -------------------------------------------------------

    def renewed(self, kind: str, session: str, stack_id: str, holder: Holder, lease: float,
                holds: Mapping[str, Any] | None = None,
                arrival: float | None = None) -> Renewed:
        """A reservation or queue entry of ``session``, kept alive until closed."""
        return Renewed(self, kind, session, stack_id, holder, lease, holds or {}, arrival)


class Renewed:
    """A ledger entry its holder keeps alive: a thread makes a fresh marker every lease/3
    (then removes the old one), so readers always see one unexpired entry; ``close`` removes
    it. A holder that dies stops renewing, and the entry runs out."""

    def __init__(self, ledger: Ledger, kind: str, session: str, stack_id: str, holder: Holder,
                 lease: float, holds: Mapping[str, Any], arrival: float | None):
        self.ledger = ledger
        self.kind = kind
        self.labels = {KIND_LABEL: kind, ENTRY_SESSION_LABEL: session,
                       ENTRY_STACK_LABEL: stack_id, HOLDER_LABEL: holder.label(),
                       LEASE_LABEL: f"{lease:g}",
                       HOLDS_LABEL: json.dumps(dict(holds), sort_keys=True,
                                               separators=(",", ":"))}
        self.lease = lease
        self.current = self._make(arrival)
        entry = ledger._entry(self.current)
        self.arrival = arrival if arrival is not None else entry.created
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._renew, name=f"ledger-{kind}",
                                        daemon=True)
        self._thread.start()

    def _make(self, arrival: float | None) -> str:
        labels = dict(self.labels)
        if arrival is not None:
            labels[ARRIVAL_LABEL] = repr(arrival)
        name = f"{PROJECT}-{self.kind}-{secrets.token_hex(6)}"
        made = self.ledger._create(name, labels)
        if made is None:  # 48 random bits taken: try once more
            made = self.ledger._create(f"{name}{secrets.token_hex(2)}", labels)
        if made is None:
            raise AgentError(self.ledger.pool.name, "ledger", f"could not create {name}")
        return made

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    fresh = self._make(self.arrival)
                except Exception:  # the engine gone for now: the next round tries again
                    continue
                old, self.current = self.current, fresh
                with contextlib.suppress(Exception):
                    self.ledger._remove(old)

    def close(self) -> None:
        self._stop.set()
        with self._lock, contextlib.suppress(Exception):
            self.ledger._remove(self.current)
        self._thread.join(timeout=5)
