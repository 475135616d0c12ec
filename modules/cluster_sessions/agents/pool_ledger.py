"""The pool's ledger on its own engine: the lock that orders placements, the reservations of
sessions being placed, and the queue of ``up --wait`` (docs/scheduling.md).

Every client of a pool sees the pool's engines, whatever state backend it uses, so that is
where these live: on the *ledger agent* (the swarm manager, else the pool's first agent), as
never-started containers of an empty image (``MARKER_IMAGE``, imported on first use). A
container name is reserved atomically by the engine (a second create of the name is refused
with 409), which makes the lock a create-if-absent; labels carry the holder (host, pid,
session, verb) and the lease. Leases are judged on the engine's own clock (its ``SystemTime``
against the marker's ``Created``), so clients with skewed clocks agree; a holder is dead only
when its lease ran out (no pid or host name is believed: issue 47). What the markers mean
(live per stack, the queue's order, what a malformed one counts as) is core.ledger's; this
module only reads and writes them.

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
import getpass
import hashlib
import io
import json
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

from ..core import ledger as ledger_core
from ..core.errors import EngineFailure
from ..core.names import (
    LEDGER_ARRIVAL_LABEL,
    LEDGER_ASKS_LABEL,
    LEDGER_CONTAINERS_LABEL,
    LEDGER_HOLDER_LABEL,
    LEDGER_HOLDS_LABEL,
    LEDGER_KIND_LABEL,
    LEDGER_LEASE_LABEL,
    LEDGER_POOL_LABEL,
    LEDGER_PRIORITY_LABEL,
    LEDGER_PROJECT_LABEL,
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
REAP_LEASE = 300.0  # a reaper's claim on one session: its destroy takes seconds to minutes
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


def who_runs_this() -> str:
    """This process's user name as ``whoami`` says it (``$USER`` is unset under sudo -i, cron
    and containers: its uid alone read as ``0@vm``); the uid only without a passwd entry."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


@dataclass(frozen=True)
class Holder(ledger_core.Holder):
    """Who holds a lock, reservation or queue entry: by default this process (its host, pid
    and user are shown to others, never believed: liveness is the lease's,
    core.ledger)."""

    session: str
    verb: str = "up"
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    user: str = field(default_factory=who_runs_this)


Entry = ledger_core.Entry


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


_KEYS = {"kind": KIND_LABEL, "session": ENTRY_SESSION_LABEL, "stack": ENTRY_STACK_LABEL,
         "holder": HOLDER_LABEL, "lease": LEASE_LABEL, "arrival": ARRIVAL_LABEL,
         "holds": HOLDS_LABEL, "project": LEDGER_PROJECT_LABEL,
         "containers": LEDGER_CONTAINERS_LABEL, "priority": LEDGER_PRIORITY_LABEL,
         "asks": LEDGER_ASKS_LABEL}


def entry_of(marker: MarkerFacts, max_lease: float = MAX_LEASE) -> Entry:
    """A ledger entry from what the engine shows of its marker (agents.engine); what its
    labels mean is core.ledger's (a lease is at most ``max_lease`` whatever a label says: a
    marker cannot hold a pool forever)."""
    return ledger_core.entry_of(marker.labels, _KEYS, marker.container_id, marker.name,
                                engine_time(marker.created), max_lease)


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
        """Every marker of this pool (of ``kind``), first come first served."""
        labels = [f"{POOL_LABEL}={self.pool.name}"] + ([f"{KIND_LABEL}={kind}"] if kind else [])
        return ledger_core.order(entry_of(m) for m in engine.ledger_markers(self.client, labels))

    def read(self, kind: str, now: float | None = None) -> ledger_core.Live:
        """The entries of ``kind`` as core.ledger judges them (live per stack, expired,
        malformed); the expired ones are removed on the way."""
        now = self.now() if now is None else now
        judged = ledger_core.live(self.entries(kind), now)
        for entry in judged.expired:
            self._remove(entry.container_id)
        return judged

    def live(self, kind: str, now: float | None = None) -> list[Entry]:
        """The live entries of ``kind``, one per stack, oldest arrival first."""
        return list(self.read(kind, now).entries)

    # --- the lock ---------------------------------------------------------------------------

    def lock_holder(self) -> Entry | None:
        marker = engine.inspect_marker(self.client, lock_name(self.pool.name))
        return entry_of(marker, LOCK_LEASE) if marker is not None else None

    def remove_lock(self) -> Entry | None:
        """Remove the pool's lock whoever holds it (``pool sweep --lock``: the operator's
        answer to a forged or stuck one); the entry removed, or None when there was none."""
        current = self.lock_holder()
        if current is not None:
            self._remove(current.container_id)
        return current

    @contextlib.contextmanager
    def locked(self, holder: Holder, timeout: float = 300,
               on_wait: Callable[[str], None] | None = None,
               lease: float = LOCK_LEASE) -> Iterator[float]:
        """Hold the pool's lock; yields the engine time it was taken at. A lock whose lease
        ran out on the engine's clock is broken; a live one is waited for (``on_wait`` told
        once, with whom), up to ``timeout`` seconds, then :class:`PoolBusy`. No lock is
        believed for more than ``LOCK_LEASE``, whatever its label says."""
        name = lock_name(self.pool.name)
        deadline = time.monotonic() + timeout
        told = False
        while True:
            made = self._create(name, {KIND_LABEL: "lock", HOLDER_LABEL: holder.label(),
                                       LEASE_LABEL: f"{min(lease, LOCK_LEASE):g}",
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
            who += f" (lock marker {current.container_id[:12]})"
            if time.monotonic() > deadline:
                raise PoolBusy(f"pool {self.pool.name} stayed locked by {who} for "
                               f"{timeout:g}s; nothing was created; if no such `up` runs, "
                               f"`sessionctl pool sweep {self.pool.name} --lock` removes it")
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

    # --- reaping (sessionctl pool reap) -----------------------------------------------------

    def claim_reap(self, stack_id: str, session: str, holder: Holder) -> str | None:
        """Claim ending ``stack_id``'s session (``pool reap``): a marker named after the pool
        and the stack, which the engine makes for one client only (409 for the next); its id,
        or None when another reaper holds it. A claim whose lease (``REAP_LEASE``, on the
        engine's clock) ran out is a dead reaper's: removed and taken."""
        name = f"{PROJECT}-reap-{_pool_key(self.pool.name)}-{_pool_key(stack_id)}"
        labels = {KIND_LABEL: "reap", ENTRY_SESSION_LABEL: session, ENTRY_STACK_LABEL: stack_id,
                  HOLDER_LABEL: holder.label(), LEASE_LABEL: f"{REAP_LEASE:g}"}
        for _ in range(2):
            made = self._create(name, labels)
            if made is not None:
                return made
            current = engine.inspect_marker(self.client, name)
            if current is None:
                continue  # released meanwhile
            if not entry_of(current, REAP_LEASE).expired(self.now()):
                return None
            self._remove(current.container_id)
        return None

    def release_reap(self, marker_id: str) -> None:
        self._remove(marker_id)

    # --- reservations and the queue -------------------------------------------------------

    def drop_superseded(self, kind: str, stack_id: str, keep: str) -> None:
        """Remove this stack's other entries of ``kind``: one ``up`` of a stack runs at a time
        (the stack's own lock, driver/stack_lock.py), so any other is a killed ``up``'s, which
        would otherwise hold its capacity, and show in ``ls`` and ``pool usage``, until its
        lease ran out. Entries without a stack id (older markers) are nobody's to drop."""
        if not stack_id:
            return
        for entry in self.entries(kind):
            if entry.stack_id == stack_id and entry.container_id != keep:
                self._remove(entry.container_id)

    def renewed(self, kind: str, session: str, stack_id: str, holder: Holder, lease: float,
                holds: Mapping[str, Any] | None = None,
                arrival: float | None = None, project: str | None = None,
                containers: int | None = None, priority: int | None = None,
                asks: tuple[int, int, int] | None = None) -> Renewed:
        """A reservation or queue entry of ``session`` (of ``project``: None, the default
        policy's; a reservation of ``containers``; a queue entry asking ``asks``: millicpu,
        mem, GPUs in all), kept alive until closed."""
        return Renewed(self, kind, session, stack_id, holder, lease, holds or {}, arrival,
                       project, containers, priority, asks)


class Renewed:
    """A ledger entry its holder keeps alive: a thread makes a fresh marker every lease/3
    (then removes the old one), so readers always see one unexpired entry; ``close`` removes
    it. A holder that dies stops renewing, and the entry runs out."""

    def __init__(self, ledger: Ledger, kind: str, session: str, stack_id: str, holder: Holder,
                 lease: float, holds: Mapping[str, Any], arrival: float | None,
                 project: str | None = None, containers: int | None = None,
                 priority: int | None = None, asks: tuple[int, int, int] | None = None):
        self.ledger = ledger
        self.kind = kind
        self.labels = {KIND_LABEL: kind, ENTRY_SESSION_LABEL: session,
                       ENTRY_STACK_LABEL: stack_id, HOLDER_LABEL: holder.label(),
                       LEASE_LABEL: f"{lease:g}",
                       HOLDS_LABEL: json.dumps(dict(holds), sort_keys=True,
                                               separators=(",", ":"))}
        if project is not None:
            self.labels[LEDGER_PROJECT_LABEL] = project
        if containers is not None:
            self.labels[LEDGER_CONTAINERS_LABEL] = str(containers)
        if priority is not None:
            self.labels[LEDGER_PRIORITY_LABEL] = str(priority)
        if asks is not None:
            self.labels[LEDGER_ASKS_LABEL] = ",".join(str(int(n)) for n in asks)
        self.lease = lease
        self.current = self._make(arrival)
        ledger.drop_superseded(kind, stack_id, keep=self.current)
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
