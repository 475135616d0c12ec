"""GPUs are exclusive and no agent is over-committed, over any sequence of operations by
several clients against one pool (issue 31, item 6), as a property.

Each client decides the way ``up`` does: one decision at a time (the pool's lock: the model
runs one rule at a time), on :func:`live_free` of what the engines show, then a reservation
written, then containers created one per step (an ``up`` renews its lease before each and
gives up once it has lapsed), then the reservation removed. A resize removes the old
containers before it creates the new. Clients die while holding a reservation, and leases run
out. After every step no agent holds more CPU, memory or GPU ids than it declares and no GPU
id is held twice, judged both by :func:`over_commitments` and by counting the containers
directly. The two broken variants at the end (reservations ignored; an ``up`` going on after
its lease ran out) must make the property fail: that is what shows it can.
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

from cluster_sessions.core.plan import build_plans, pool_capacity, request_of
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

    stack: str
    reservations: list[Reservation]
    old: list[ContainerHold]
    todo: list[ContainerHold]


@dataclass
class Client:
    up: Up | None = None
    stacks: set[str] = field(default_factory=set)


class SharedPool(RuleBasedStateMachine):
    IGNORE_RESERVATIONS = False  # broken variant: decide on containers alone
    IGNORE_LEASE = False  # broken variant: an up goes on after its lease ran out

    @initialize(selector=st.sampled_from(SELECTORS))
    def start(self, selector):
        self.pool = pool(selector)
        self.declared = pool_capacity(self.pool)
        self.containers: list[ContainerHold] = []
        self.reservations: list[Reservation] = []
        self.now = 1_000.0
        self.after: str | None = None
        self.clients = [Client() for _ in range(CLIENTS)]
        self.names: dict[str, str] = {}  # stack -> its definition's name

    # what a client does

    def decide(self, client: int, stack: str, session: Session, old: list[ContainerHold]):
        """The decision under the pool's lock: pending (nothing written) or a reservation."""
        seen = [] if self.IGNORE_RESERVATIONS else self.reservations
        free = live_free(self.declared, self.containers, seen, {stack}, self.now)
        plans = build_plans(session, self.pool, free, after=self.after)
        if plans[0].pending:
            return  # exit 3, nothing created
        self.after = plans[-1].containers[0].agent
        # a session's new reservation replaces one a killed up of it left
        self.reservations = [r for r in self.reservations if r.stack_id != stack]
        reservations = [Reservation(p.name, stack, f"client{client}", self.now,
                                    self.now + LEASE,
                                    holds_of(p.placement, request_of(p.resources)))
                        for p in plans]
        todo = [ContainerHold(p.name, stack, c.agent, p.resources.millicpu, p.resources.mem,
                              c.gpus) for p in plans for c in p.containers]
        self.reservations += reservations
        self.clients[client].up = Up(stack, reservations, old, todo)
        self.clients[client].stacks.add(stack)

    def idle(self, client: int) -> Client | None:
        c = self.clients[client]
        return c if c.up is None else None

    @rule(client=st.integers(0, CLIENTS - 1), shape=shapes)
    def up(self, client, shape):
        if self.idle(client):
            stack = f"stack{len(self.names) + 1}"
            self.names[stack] = f"sess{len(self.names) + 1:03d}"
            self.decide(client, stack, definition(self.names[stack], shape), [])

    @rule(client=st.integers(0, CLIENTS - 1), pick=st.integers(0, 9), shape=shapes)
    def resize(self, client, pick, shape):
        c = self.idle(client)
        if c and c.stacks:
            stack = sorted(c.stacks)[pick % len(c.stacks)]
            old = [h for h in self.containers if h.stack_id == stack]
            self.decide(client, stack, definition(self.names[stack], shape), old)

    @rule(client=st.integers(0, CLIENTS - 1))
    def step(self, client):
        c = self.clients[client]
        if c.up is None:
            return
        up = c.up
        if up.old:  # delete before replace
            self.containers.remove(up.old.pop())
        elif up.todo:
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
        renewed = [Reservation(r.session, r.stack_id, r.holder, r.since, self.now + LEASE,
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
        if c and c.stacks:
            stack = sorted(c.stacks)[pick % len(c.stacks)]
            self.containers = [h for h in self.containers if h.stack_id != stack]
            c.stacks.discard(stack)

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


@pytest.mark.parametrize("broken", [IgnoringReservations, IgnoringTheLease],
                         ids=["reservations-ignored", "lease-ignored"])
def test_the_property_fails_on_a_deliberately_broken_decision(broken):
    with pytest.raises(AssertionError):
        run_state_machine_as_test(broken, settings=BROKEN)
