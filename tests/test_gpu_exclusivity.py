"""GPUs are exclusive and no agent is over-committed, over any sequence of operations by
several clients against one pool (issue 31, item 6), as a property.

Each client decides the way ``up`` does: one decision at a time (the pool's lock: the model
runs one rule at a time), on :func:`live_free` of what the engines show, then a reservation
written, then containers created one per step (an ``up`` renews its lease before each and
gives up once it has lapsed), then the reservation removed. Each session of a ``count`` is a
stack of its own; a resize removes every old container of the definition before it creates
a new one. Clients die while holding a reservation, and leases run out. After every step no
agent holds more CPU, memory or GPU ids than it declares and no GPU id is held twice, judged
both by :func:`over_commitments` and by counting the containers directly. The broken variants
at the end (reservations ignored; an ``up`` going on after its lease ran out; a resize
replacing its containers one at a time, as Pulumi's per-container delete-before-replace
would) must make the property fail: that is what shows it can.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from cluster_sessions.core.plan import build_plans, pool_capacity, request_of, session_copies
from cluster_sessions.core.scheduling import (
    ContainerHold,
    Reservation,
    holds_of,
    live_free,
    over_commitments,
)
from cluster_sessions.core.selectors import SELECTORS
from cluster_sessions.core.spec import Pool, Session

from . import factories

LEASE = 30.0
CLIENTS = 3


def pool(selector: str) -> Pool:
    return Pool.model_validate(factories.pool(
        "shared",
        factories.agent("a1", cpu=4, mem="8g", gpus=(0, 1, 2, 3)),
        factories.agent("a2", cpu=4, mem="8g", gpus=(5, 6)),
        factories.agent("a3", cpu=2, mem="4g"),
        swarm={"manager": "a1"}, scheduler={"selector": selector}))


shapes = st.fixed_dictionaries({
    "mode": st.sampled_from(["single-node", "multi-node"]),
    "size": st.integers(1, 4),
    "cpu": st.sampled_from([0.5, 1, 2]),
    "mem": st.sampled_from(["512m", "1g", "2g"]),
    "gpu": st.integers(0, 2),
    "count": st.integers(1, 2),
})


def definition(name: str, shape: dict) -> Session:
    doc = factories.session(name, "shared", "img", size=shape["size"], mode=shape["mode"],
                            cpu=shape["cpu"], mem=shape["mem"], shmem="64m")
    doc["resources"]["gpu"] = shape["gpu"]
    return Session.model_validate({**doc, "count": shape["count"]})


@dataclass
class Up:
    """An ``up`` (or resize) under way: old containers to remove, new ones to create."""

    reservations: list[Reservation]
    old: list[ContainerHold]
    todo: list[ContainerHold]
    removed: bool = False  # IN_PLACE: one removed since the last creation


@dataclass
class Client:
    up: Up | None = None
    definitions: set[str] = field(default_factory=set)


class SharedPool(RuleBasedStateMachine):
    IGNORE_RESERVATIONS = False  # broken variant: decide on containers alone
    IGNORE_LEASE = False  # broken variant: an up goes on after its lease ran out
    IN_PLACE = False  # broken variant: a resize replaces its containers one at a time

    @initialize(selector=st.sampled_from(SELECTORS))
    def start(self, selector):
        self.pool = pool(selector)
        self.declared = pool_capacity(self.pool)
        self.containers: list[ContainerHold] = []
        self.reservations: list[Reservation] = []
        self.now = 1_000.0
        self.after: str | None = None
        self.clients = [Client() for _ in range(CLIENTS)]
        self.definitions: dict[str, tuple[str, int]] = {}  # id -> (name, count)

    # what a client does

    def decide(self, client: int, definition_id: str, session: Session):
        """The decision under the pool's lock: pending (nothing written) or a reservation per
        session of the definition (each of a ``count`` is a stack of its own)."""
        stacks = {f"{definition_id}:{copy.name}" for copy in session_copies(session)}
        seen = [] if self.IGNORE_RESERVATIONS else self.reservations
        free = live_free(self.declared, self.containers, seen, stacks, self.now)
        plans = build_plans(session, self.pool, free, after=self.after)
        if plans[0].pending:
            return  # exit 3, nothing created
        self.after = plans[-1].containers[0].agent
        # the new reservation replaces one a killed up of this definition left
        self.reservations = [r for r in self.reservations
                             if not set(r.stack_ids) & stacks]
        reservations = [Reservation(session.name, tuple(sorted(stacks)), f"client{client}",
                                    self.now, self.now + LEASE,
                                    holds_of((p.placement, request_of(p.resources))
                                             for p in plans))]
        todo = [ContainerHold(p.name, f"{definition_id}:{p.name}", c.agent,
                              p.resources.millicpu, p.resources.mem, c.gpus)
                for p in plans for c in p.containers]
        old = [h for h in self.containers if h.stack_id in stacks]
        self.reservations += reservations
        self.clients[client].up = Up(reservations, old, todo)
        self.clients[client].definitions.add(definition_id)

    def idle(self, client: int) -> Client | None:
        c = self.clients[client]
        return c if c.up is None else None

    @rule(client=st.integers(0, CLIENTS - 1), shape=shapes)
    def up(self, client, shape):
        if self.idle(client):
            key = f"def{len(self.definitions) + 1}"
            self.definitions[key] = (f"sess{len(self.definitions) + 1:03d}", shape["count"])
            self.decide(client, key, definition(self.definitions[key][0], shape))

    @rule(client=st.integers(0, CLIENTS - 1), pick=st.integers(0, 9), shape=shapes)
    def resize(self, client, pick, shape):
        """A new shape for a definition's sessions (another ``count`` would be other stacks:
        a new definition, as far as the pool can tell)."""
        c = self.idle(client)
        if c and c.definitions:
            key = sorted(c.definitions)[pick % len(c.definitions)]
            name, count = self.definitions[key]
            self.decide(client, key, definition(name, {**shape, "count": count}))

    @rule(client=st.integers(0, CLIENTS - 1), times=st.integers(1, 4))
    def steps(self, client, times):
        """A few steps of one client's up, the invariant checked after each."""
        for _ in range(times):
            self.step(client)
            self.nothing_over_committed()

    def step(self, client):
        c = self.clients[client]
        if c.up is None:
            return
        up = c.up
        if up.old and not (self.IN_PLACE and up.removed and up.todo):
            self.containers.remove(up.old.pop())  # every old container before any new one
            up.removed = True
        elif up.todo:
            up.removed = False
            if not self.IGNORE_LEASE and any(not r.live(self.now) for r in up.reservations):
                self.release(up)  # the lease ran out under us: this up fails
                c.up = None
                return
            self.renew(up)
            self.containers.append(up.todo.pop(0))
        else:
            self.release(up)
            c.up = None

    def renew(self, up: Up) -> None:
        renewed = [Reservation(r.session, r.stack_ids, r.holder, r.since, self.now + LEASE,
                               r.holds) for r in up.reservations]
        for r, new in zip(up.reservations, renewed, strict=True):
            self.reservations[self.reservations.index(r)] = new
        up.reservations = renewed

    def release(self, up: Up) -> None:
        for r in up.reservations:
            self.reservations.remove(r)

    @rule(client=st.integers(0, CLIENTS - 1), pick=st.integers(0, 9))
    def destroy(self, client, pick):
        c = self.idle(client)
        if c and c.definitions:
            key = sorted(c.definitions)[pick % len(c.definitions)]
            self.containers = [h for h in self.containers
                               if not h.stack_id.startswith(f"{key}:")]
            c.definitions.discard(key)

    @rule(client=st.integers(0, CLIENTS - 1))
    def die(self, client):
        """Killed: what it made stays, its reservation until the lease runs out; a new process
        of the same user takes its place (and may destroy or resize what it left)."""
        self.clients[client].up = None

    @rule(seconds=st.sampled_from([0.5, 5.0, LEASE - 1, LEASE, 2 * LEASE]))
    def tick(self, seconds):
        self.now += seconds

    # the invariant

    @invariant()
    def nothing_over_committed(self):
        if not hasattr(self, "pool"):
            return
        found = over_commitments(self.declared, self.containers, self.reservations, self.now)
        assert not found, found
        for d in self.declared:
            on = [h for h in self.containers if h.agent == d.name]
            assert sum(h.millicpu for h in on) <= d.millicpu
            assert sum(h.mem for h in on) <= d.mem
            gpus = Counter(g for h in on for g in h.gpus)
            assert all(n == 1 for n in gpus.values()), f"a GPU of {d.name} held twice"
            assert set(gpus) <= set(d.gpus)


SETTINGS = settings(max_examples=200, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def test_no_gpu_is_held_twice_and_no_agent_over_its_capacity_over_any_sequence():
    run_state_machine_as_test(SharedPool, settings=SETTINGS)


BROKEN = settings(max_examples=300, stateful_step_count=40, deadline=None, database=None,
                  derandomize=True, report_multiple_bugs=False,
                  phases=(Phase.explicit, Phase.generate),
                  suppress_health_check=[HealthCheck.too_slow])


class IgnoringReservations(SharedPool):
    IGNORE_RESERVATIONS = True


class IgnoringTheLease(SharedPool):
    IGNORE_LEASE = True


class ReplacingInPlace(SharedPool):
    IN_PLACE = True


@pytest.mark.parametrize("broken", [IgnoringReservations, IgnoringTheLease],
                         ids=["reservations-ignored", "lease-ignored"])
def test_the_property_fails_on_a_deliberately_broken_decision(broken):
    with pytest.raises(AssertionError):
        run_state_machine_as_test(broken, settings=BROKEN)


def resize_in_place(machine: SharedPool) -> None:
    """A session of 2 containers with a GPU each, up, then placed again with the same shape:
    the new main1 is given the GPU the old main1 holds until it is removed."""
    machine.start(selector="concentrated")
    shape = {"mode": "single-node", "size": 2, "cpu": 1, "mem": "1g", "gpu": 1, "count": 1}
    machine.up(client=0, shape=shape)
    machine.steps(client=0, times=3)
    machine.resize(client=0, pick=0, shape=shape)
    machine.steps(client=0, times=4)


def test_a_resize_must_remove_every_old_container_before_it_creates_a_new_one():
    """Pulumi's delete-before-replace is per container: replacing them one at a time leaves
    an old container holding a GPU a new one is given (the random search rarely reaches this
    sequence, so it is written out)."""
    resize_in_place(SharedPool())
    with pytest.raises(AssertionError, match="GPU 5 held 2 times"):
        resize_in_place(ReplacingInPlace())
