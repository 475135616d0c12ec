"""Decisions made once, at a session's first ``up``, and kept in its stack's config.

A shared pool changes under a session (others come and go), so what ``up`` decided from the
engines must not be decided again by the next ``up`` or by a direct ``pulumi up -s NAME``:
each such decision is one stack-config key, written by ``sessionctl`` (under the pool's lock,
where the decision depends on the pool) and read by the program. This module is that one
mechanism: the keys, their values' form, and when a kept value no longer holds.

- ``stack-id``: who the stack is on a pool (random, on every label of what it makes), so that
  a second stack with the same session name is refused instead of sweeping the first's objects;
  with it ``made-by`` (user@host), to name the holder. A stack that kept none (a bare ``pulumi
  up``, or made before ids) runs with one derived from its name (:func:`stack_identity`).
- ``placement``: each container's agent and GPU ids, with the shape they were decided for; the
  session is placed again only when that shape changes (size, resources, mode, pool) or an
  agent or GPU it holds left the pool: never because someone else came or left.
- ``service-ports``: main1's host ports (core.services chooses them).
- ``image``: the definition's image resolved once to what every container runs (issue 33): a
  registry's content digest (containers are created from ``repo@sha256:…``), or for an image
  only the agents hold, its image ID; kept while the definition names the same reference,
  resolved again by ``up --refresh-image``.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput
from .images import pinned_reference, valid_digest
from .names import (
    EXPIRES_KEY,
    IMAGE_KEY,
    MADE_BY_KEY,
    PLACEMENT_KEY,
    PROJECT,
    SERVICE_PORTS_KEY,
    STACK_ID_KEY,
)
from .placement import Free, Placement, Slot, holds, take
from .plan import ClusterPlan, place_sessions, request_of
from .spec import Pool, Session

KEPT_KEYS = (STACK_ID_KEY, MADE_BY_KEY, PLACEMENT_KEY, SERVICE_PORTS_KEY, IMAGE_KEY,
             EXPIRES_KEY)
KEPT_OUTPUT = "kept"
"""The stack output in which the program records the kept decisions it ran with (short keys,
config values as written): the backend's copy, the truth for every checkout (issue 41)."""


def recover_kept(checkout: Mapping[str, str | None],
                 backend: Mapping[str, object] | None) -> tuple[dict[str, str | None],
                                                                list[str]]:
    """What a stack decided, from the checkout's config (short keys) and its backend's last
    ``kept`` output: the backend's value wins for every kept key it holds (a fresh clone has
    none of them; a checkout that ran against another backend holds that one's), the
    checkout's is used only where the backend has none (an ``up`` interrupted before its
    first outputs). Returns the config to run with and a note per key taken from the backend
    against a different checkout value. A backend record that is not a mapping of strings is
    ignored (no record), never trusted in part."""
    merged = dict(checkout)
    if not isinstance(backend, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in backend.items()):
        return merged, []
    notes = []
    for key in KEPT_KEYS:
        value = backend.get(key)
        if not value:
            continue
        had = checkout.get(key)
        if had and had != value:
            notes.append(f"{key}: the checkout's config says {had[:60]!r}, the stack's backend "
                         f"{value[:60]!r}: using the backend's")
        merged[key] = value
    return merged, notes


def labelled(state: object, label: str) -> bool:
    """Whether something in ``state`` has the label ``label``: as the docker provider keeps
    labels (``{"label": K, "value": V}``: K a value, as :func:`carried` finds it) or as our own
    resources do (the SessionNetwork's ``{K: V}``: K a key). One walk. Pure."""
    if isinstance(state, str):
        return state == label
    if isinstance(state, Mapping):
        return label in state or any(labelled(v, label) for v in state.values())
    if isinstance(state, list | tuple):
        return any(labelled(v, label) for v in state)
    return False


def carried(state: object, value: str) -> bool:
    """Whether ``value`` is a string somewhere in ``state`` (a stack's exported resources, as
    plain JSON): a resource the stack's backend holds carries it (a label, an input), so it
    is this stack's own word, not only the checkout's. Pure."""
    if isinstance(state, str):
        return state == value
    if isinstance(state, Mapping):
        return any(carried(v, value) for v in state.values())
    if isinstance(state, list | tuple):
        return any(carried(v, value) for v in state)
    return False


_STACK_ID = re.compile(r"^[0-9a-f]{16}$")


def new_stack_id() -> str:
    """A stack's identity: 64 random bits, hex (labels and config hold it as is)."""
    return secrets.token_hex(8)


def valid_stack_id(value: object) -> bool:
    return isinstance(value, str) and bool(_STACK_ID.match(value))


def derived_stack_id(stack: str) -> str:
    """The id of a stack whose config keeps none: one ``sessionctl`` never ran (a bare ``pulumi
    up -s NAME``) or made before stack ids. Derived from the stack's name (without an
    organization/project prefix), so that the program and ``sessionctl`` agree on it without
    writing anything, and a second run keeps it. Two such stacks of one name on two backends
    share it: ``sessionctl`` gives every stack *it* creates a random one instead."""
    short = stack.rsplit("/", 1)[-1]
    return hashlib.sha256(f"{PROJECT} stack {short}".encode()).hexdigest()[:16]


_MADE_BY = re.compile(r"^[A-Za-z0-9_.@+-]{1,128}$")


def valid_made_by(value: object) -> bool:
    """``user@host`` as ``sessionctl`` writes it: a label value, printed in refusals."""
    return isinstance(value, str) and bool(_MADE_BY.match(value))


@dataclass(frozen=True)
class StackIdentity:
    """Who a stack is on a pool: its id (on every label of what it makes) and, for a stack that
    kept no id (``adopted``), also the objects carrying no id label at all (made before stack
    ids, by this stack as far as anyone can tell)."""

    stack_id: str
    made_by: str = ""
    adopted: bool = False
    new: bool = False  # made now, for a stack this backend does not have yet

    def owns(self, label: str) -> bool:
        """Whether an object whose stack-id label is ``label`` ("" when absent) is this stack's."""
        return label == self.stack_id or (self.adopted and label == "")

    def config(self) -> dict[str, str]:
        """What to write into the stack's config (short keys): the id, and who made a new one;
        nothing for an adopted stack (the program derives the same id, and its objects made
        before ids stay its own until they are replaced)."""
        if self.adopted:
            return {}
        kept = {STACK_ID_KEY: self.stack_id}
        if self.made_by:
            kept[MADE_BY_KEY] = self.made_by
        return kept


def stack_identity(stack: str, recorded: Mapping[str, str | None] | None,
                   made_by: str = "") -> StackIdentity:
    """The identity of ``stack`` from its recorded config (short keys; None: the stack does not
    exist yet). Kept when recorded; derived (:func:`derived_stack_id`) for an existing stack
    that kept none; new and random, with ``made_by``, for a new stack. ValueError for a
    recorded value that is not one we write (a hand-edited config)."""
    if recorded is None:
        return StackIdentity(new_stack_id(), made_by if valid_made_by(made_by) else "",
                             new=True)
    who = read_kept(MADE_BY_KEY, recorded.get(MADE_BY_KEY)) or ""
    kept = read_kept(STACK_ID_KEY, recorded.get(STACK_ID_KEY))
    if not kept:
        return StackIdentity(derived_stack_id(stack), who, adopted=True)
    return StackIdentity(kept, who)


@dataclass(frozen=True)
class Shape:
    """What a placement was decided for: a change of any of it places the session again."""

    pool: str
    mode: str
    size: int
    millicpu: int
    mem: int
    gpu: int

    @classmethod
    def of(cls, session: Session, pool: Pool) -> Shape:
        return cls.named(session, pool.name)

    @classmethod
    def named(cls, session: Session, pool: str) -> Shape:
        r = session.resources
        return cls(pool, session.cluster.mode, session.cluster.size, r.millicpu, r.mem, r.gpu)

    def changes(self, new: Shape) -> list[str]:
        """Each field that differs, as ``name old -> new``."""
        return [f"{name} {getattr(self, name)} -> {getattr(new, name)}"
                for name in self.__dataclass_fields__
                if getattr(self, name) != getattr(new, name)]


@dataclass(frozen=True)
class KeptPlacement:
    shape: Shape
    slots: tuple[Slot, ...]

    def to_config(self) -> str:
        return json.dumps({"shape": {k: getattr(self.shape, k)
                                     for k in self.shape.__dataclass_fields__},
                           "slots": [[s.agent, list(s.gpus)] for s in self.slots]},
                          separators=(",", ":"))

    @classmethod
    def from_config(cls, text: str) -> KeptPlacement:
        """Raises ValueError for anything but what :meth:`to_config` writes."""
        doc = json.loads(text)
        if not isinstance(doc, dict) or set(doc) != {"shape", "slots"}:
            raise ValueError("not a placement")
        shape_doc, slots_doc = doc["shape"], doc["slots"]
        fields = Shape.__dataclass_fields__
        if not isinstance(shape_doc, dict) or set(shape_doc) != set(fields):
            raise ValueError("not a placement shape")
        for name, f in fields.items():
            want = str if f.type == "str" else int
            value = shape_doc[name]
            if type(value) is not want:
                raise ValueError(f"shape.{name} is not a {want.__name__}")
        if not isinstance(slots_doc, list) or not slots_doc:
            raise ValueError("no slots")
        slots = []
        for item in slots_doc:
            if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                    or not isinstance(item[1], list)
                    or not all(type(g) is int and g >= 0 for g in item[1])):
                raise ValueError("not a slot")
            slots.append(Slot(item[0], tuple(item[1])))
        shape = Shape(**shape_doc)
        if len(slots) != shape.size:
            raise ValueError("slots and size differ")
        return cls(shape, tuple(slots))

    @property
    def placement(self) -> Placement:
        return Placement(self.slots)


def kept_placement(session: Session, pool: Pool, placement: Placement) -> KeptPlacement:
    return KeptPlacement(Shape.of(session, pool), placement.slots)


def replace_reason(kept: KeptPlacement | None, session: Session, pool: Pool) -> str | None:
    """Why ``session`` must be placed (again), or None when ``kept`` still holds."""
    if kept is None:
        return "it has not been placed yet"
    changes = kept.shape.changes(Shape.of(session, pool))
    if changes:
        return f"its shape changed ({', '.join(changes)})"
    agents = {a.name: a for a in pool.agents}
    for slot in kept.slots:
        agent = agents.get(slot.agent)
        if agent is None:
            return f"agent {slot.agent} it runs on is no longer in pool {pool.name}"
        gone = [g for g in slot.gpus if g not in agent.capacity.gpus]
        if gone:
            return (f"GPU {','.join(map(str, gone))} it holds is no longer declared on agent "
                    f"{slot.agent}")
    if len({s.agent for s in kept.slots}) > 1 and pool.swarm is None:
        return f"it spans several agents and pool {pool.name} has no swarm manager now"
    return None


@dataclass(frozen=True)
class KeptImage:
    """The definition's image reference ``ref`` resolved to ``digest``: a registry's manifest
    digest, or (``local``) the image ID of an image only the agents hold."""

    ref: str
    digest: str
    local: bool = False

    @property
    def pinned(self) -> str:
        """What the containers are created from: ``repo@sha256:…``, or the image ID."""
        return self.digest if self.local else pinned_reference(self.ref, self.digest)

    def to_config(self) -> str:
        return json.dumps({"ref": self.ref, "digest": self.digest, "local": self.local},
                          separators=(",", ":"))

    @classmethod
    def from_config(cls, text: str) -> KeptImage:
        """Raises ValueError for anything but what :meth:`to_config` writes."""
        doc = json.loads(text)
        if (not isinstance(doc, dict) or set(doc) != {"ref", "digest", "local"}
                or not isinstance(doc["ref"], str) or not doc["ref"]
                or any(c.isspace() for c in doc["ref"])
                or not valid_digest(doc["digest"]) or type(doc["local"]) is not bool):
            raise ValueError("not a kept image")
        return cls(doc["ref"], doc["digest"], doc["local"])


def image_reason(kept: KeptImage | None, image: str, refresh: bool = False) -> str | None:
    """Why the definition's ``image`` must be resolved (again), or None when ``kept`` holds."""
    if refresh:
        return "--refresh-image"
    if kept is None:
        return "it has not been resolved yet"
    if kept.ref != image:
        return f"the definition's image changed ({kept.ref} -> {image})"
    return None


def kept_values(config: Mapping[str, str | None]) -> dict[str, str]:
    """The kept decisions among a stack's config (short keys), those that are set."""
    return {k: v for k in KEPT_KEYS if (v := config.get(k))}


@dataclass(frozen=True)
class Decided:
    """The plans of the sessions an ``up`` places, and for each what became of its kept
    placement: ``kept``, or why it was placed (again)."""

    plans: tuple[ClusterPlan, ...]
    notes: Mapping[str, str]


def decide(copies: Sequence[Session], pool: Pool, free: Sequence[Free],
           kept: Mapping[str, KeptPlacement | None], after: str | None = None,
           own_gpus: Mapping[str, Mapping[str, Collection[int]]] | None = None,
           present: Collection[str] = ()) -> Decided:
    """Place ``copies`` on ``free`` (live free capacity, their own holdings left out): each
    keeps its kept placement where its shape is unchanged and what it names is still free
    (a running session always is: it holds it), else is placed anew beside the kept ones by
    the pool's selector (``after``: the agent the pool's last decision chose, for
    roundrobin).

    ``own_gpus`` (session -> agent -> GPU ids its containers hold now): a session placed
    anew gets none of the GPU ids its own old containers hold. Pulumi replaces containers one
    at a time, so an old container may still run when a new one starts: given the old one's
    GPU, two containers would share it (the invariant: no GPU id held twice, at any moment).
    Its cpu and memory are free to it: each old container goes before its replacement.

    ``present``: the sessions whose own containers are all there, where their kept placement
    says. Such a session keeps its placement while its shape is unchanged, whatever ``free``
    says: it holds what it holds, and what others reserve or forge never moves it (issue 47)."""
    keep: dict[str, Placement] = {}
    notes: dict[str, str] = {}
    left = list(free)
    for copy in copies:
        recorded = kept.get(copy.name)
        reason = replace_reason(recorded, copy, pool)
        if reason is None and recorded is not None:
            request = request_of(copy.resources)
            if copy.name in present or holds(left, recorded.placement, request):
                keep[copy.name] = recorded.placement
                left = take(left, recorded.placement, request)
                notes[copy.name] = "kept"
                continue
            reason = "what it held was taken by others while it was not running"
        notes[copy.name] = reason or "it has not been placed yet"
    busy: dict[str, set[int]] = {}
    for name, by_agent in (own_gpus or {}).items():
        if name not in keep:
            for agent, ids in by_agent.items():
                busy.setdefault(agent, set()).update(ids)
    if busy:
        free = [Free(f.name, f.millicpu, f.mem,
                     tuple(g for g in f.gpus if g not in busy.get(f.name, ()))) for f in free]
    return Decided(place_sessions(copies, pool, free, keep, after), notes)


def decide_expiry(recorded: str | None, lifetime: int | None, now: float) -> int | None:
    """When a session's lifetime ends: as its first ``up`` decided it (kept), else now plus
    its lifetime (None: no lifetime). An ``up`` after the expiry (the session ended by
    itself) starts it again with a lifetime of its own; a kept value that is not one we
    write is decided anew."""
    if lifetime is None:
        return None
    try:
        kept = read_kept(EXPIRES_KEY, recorded)
    except ValueError:
        kept = None
    if kept is not None and kept > now:
        return kept
    return int(now) + lifetime


# --- the one reader of what a stack keeps ------------------------------------------------------


class MalformedDecision(InvalidInput, ValueError):
    """A kept value that is not one ``sessionctl`` writes (a hand-edited config): its key, the
    value, what it should be, and what to do about it. Invalid input (exit 2), and a
    ValueError for the callers that take any unreadable value as none."""

    def __init__(self, key: str, value: str, expected: str, remedy: str):
        self.key, self.value, self.expected, self.remedy = key, value, expected, remedy
        super().__init__(f"{key} is {value[:80]!r}, not {expected}")


def _expiry(value: str) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise ValueError(value)
    return int(value)


def _service_ports(value: str) -> dict[str, int]:
    ports = json.loads(value)
    if not isinstance(ports, dict) or not all(
            isinstance(v, int) and 1 <= v <= 65535 for v in ports.values()):
        raise ValueError(value)
    return ports


def _matching(valid: Callable[[object], bool]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not valid(value):
            raise ValueError(value)
        return value
    return parse


DECIDED_AGAIN = "remove it and run `sessionctl up` (it decides it again)"
KEPT_BY_SESSIONCTL = "remove it (`sessionctl up` keeps the one it wrote)"

#: each kept key: how its value is read, what it must be, what to do with one that is not
KEPT_FORMS: dict[str, tuple[Callable[[str], Any], str, str]] = {
    STACK_ID_KEY: (_matching(valid_stack_id), "16 hex digits", KEPT_BY_SESSIONCTL),
    MADE_BY_KEY: (_matching(valid_made_by), "user@host", KEPT_BY_SESSIONCTL),
    PLACEMENT_KEY: (KeptPlacement.from_config, "a placement sessionctl wrote", DECIDED_AGAIN),
    SERVICE_PORTS_KEY: (_service_ports, "a JSON object of service name to port",
                        DECIDED_AGAIN),
    IMAGE_KEY: (KeptImage.from_config, "an image sessionctl wrote", DECIDED_AGAIN),
    EXPIRES_KEY: (_expiry, "seconds since the epoch", DECIDED_AGAIN),
}


def read_kept(key: str, value: str | None) -> Any:
    """The decision a stack keeps under ``key`` (one of :data:`KEPT_KEYS`), read from its
    config value: None when it keeps none; :class:`MalformedDecision` (a ValueError) for a
    value ``sessionctl`` does not write. The one reader, for the program and the driver."""
    if not value:
        return None
    parse, expected, remedy = KEPT_FORMS[key]
    try:
        return parse(value)
    except (ValueError, TypeError):
        raise MalformedDecision(key, value, expected, remedy) from None


def read_kept_or_again(key: str, value: str | None, warn: Callable[[str], None]) -> Any:
    """:func:`read_kept` where the decision can be made again: a malformed value is said
    (``warn`` gets why) and taken as none."""
    try:
        return read_kept(key, value)
    except MalformedDecision as exc:
        warn(str(exc))
        return None
