"""The one shape of the dynamic resources that act on an agent's engine
(pulumi_layer/engine_resource.py): diff unknown-aware with replacement on a named subset,
read-back, a delete that takes "already gone" for done; every such provider uses it, and each
stays picklable by reference with no state (Pulumi's dynamic provider host unpickles it)."""

from __future__ import annotations

import dill
import pytest
from pulumi.output import Unknown
from pulumi.runtime import rpc

from cluster_sessions.agents.connectors import COMMAND_FAILED, AgentError
from cluster_sessions.pulumi_layer import (
    bundles,
    engine_resource,
    folders,
    keystore,
    limits,
    network,
    swarm,
    volumes,
)
from cluster_sessions.pulumi_layer.engine_resource import (
    EngineResourceProvider,
    EnsuredProvider,
    changed_inputs,
    tolerating_gone,
    unknown,
)

ENGINE_SIDE = [limits.ContainerLimitsProvider, folders.DataFolderProvider,
               bundles.BundleDeliveryProvider, swarm.SwarmManagerProvider,
               swarm.SwarmWorkerProvider, volumes.SessionVolumeProvider,
               network.SessionNetworkProvider]
# made if missing, kept or set again if there: create and update are one act
ENSURED = [limits.ContainerLimitsProvider, folders.DataFolderProvider,
           volumes.SessionVolumeProvider]


class Thing(EngineResourceProvider):
    INPUTS = ("agent", "path", "mode")
    REPLACES = ("agent", "path")
    GONE = ("No such thing",)

    def __init__(self, there: bool = True, fails: str | None = None):
        self.there, self.fails, self.removed = there, fails, []

    def look(self, id_, props):
        return {**props, "seen": True} if self.there else None

    def remove(self, id_, props):
        if self.fails:
            raise AgentError("a1", COMMAND_FAILED, self.fails)
        self.removed.append(id_)


OLD = {"agent": {"name": "a1"}, "path": "/x", "mode": 1, "outcome": "made", "__provider": "p"}


def test_a_diff_compares_the_inputs_only_and_replaces_on_the_named_ones():
    same = Thing().diff("t", OLD, {**OLD, "outcome": "kept", "__provider": "re-pickled"})
    assert (same.changes, same.replaces, same.delete_before_replace) == (False, [], False)
    updated = Thing().diff("t", OLD, {**OLD, "mode": 2})
    assert (updated.changes, updated.replaces) == (True, [])
    moved = Thing().diff("t", OLD, {**OLD, "path": "/y", "mode": 2})
    assert (moved.changes, moved.replaces) == (True, ["path"])


@pytest.mark.parametrize("not_known", [Unknown(), rpc.UNKNOWN], ids=["object", "wire"])
def test_a_value_a_preview_does_not_know_yet_is_a_change(not_known):
    assert unknown(not_known) and not unknown("x") and not unknown(None)
    assert changed_inputs(OLD, {**OLD, "agent": not_known}, Thing.INPUTS) == ["agent"]
    assert Thing().diff("t", OLD, {**OLD, "agent": not_known}).replaces == ["agent"]


def test_a_value_unknown_on_both_sides_is_still_a_change():
    """A preview knows neither: equal markers are no proof the value is the same."""
    assert changed_inputs({"agent": rpc.UNKNOWN}, {"agent": rpc.UNKNOWN}, ("agent",)) == ["agent"]
    assert changed_inputs({"agent": 1}, {"agent": 1}, ("agent",)) == []


class Seeing(Thing):
    """Records what each base method handed on."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def look(self, id_, props):
        self.seen.append(("look", id_, props))
        return props

    def remove(self, id_, props):
        self.seen.append(("remove", id_, props))

    def replaces(self, changed, olds, news):
        self.seen.append(("replaces", changed, olds, news))
        return []


def test_the_base_hands_each_call_its_id_and_properties():
    thing = Seeing()
    news = {**OLD, "mode": 2}
    diffed = thing.diff("t", OLD, news)
    assert (diffed.stables, diffed.changes) == ([], True)  # no output promised stable
    thing.read("t1", dict(OLD))
    thing.delete("t2", dict(OLD))
    assert thing.seen == [("replaces", ["mode"], OLD, news), ("look", "t1", OLD),
                          ("remove", "t2", OLD)]


def test_an_agent_is_reached_from_its_props_with_the_providers_timeout(monkeypatch):
    calls = []
    monkeypatch.setattr(engine_resource, "connector_from_props",
                        lambda agent, timeout: calls.append((agent, timeout)) or "conn")

    class Slow(Thing):
        COMMAND_TIMEOUT = 7.5
    assert Slow().connect({"agent": {"name": "a1"}, "manager": {"name": "m"}}) == "conn"
    assert Slow().connect({"manager": {"name": "m"}}, key="manager") == "conn"
    assert calls == [({"name": "a1"}, 7.5), ({"name": "m"}, 7.5)]


def test_read_is_what_the_engine_holds_or_gone():
    found = Thing().read("t", dict(OLD))
    assert (found.id, found.outs["seen"]) == ("t", True)
    gone = Thing(there=False).read("t", dict(OLD))
    assert (gone.id, gone.outs) == (None, {})
    kept = EngineResourceProvider().read("t", dict(OLD))  # by default: the state's outputs
    assert (kept.id, kept.outs) == ("t", OLD)


def test_delete_takes_already_gone_for_done_and_raises_anything_else():
    thing = Thing()
    thing.delete("t", OLD)
    assert thing.removed == ["t"]
    Thing(fails="Error: No such thing: t").delete("t", OLD)
    with pytest.raises(AgentError, match="permission denied"):
        Thing(fails="permission denied").delete("t", OLD)
    with pytest.raises(AgentError), tolerating_gone():  # no words: nothing is taken for gone
        raise AgentError("a1", COMMAND_FAILED, "not found")


@pytest.mark.parametrize("cls", ENGINE_SIDE, ids=lambda c: c.__name__)
def test_every_engine_side_provider_has_the_shape_and_pickles_by_reference(cls):
    assert issubclass(cls, EngineResourceProvider)
    assert cls.diff is EngineResourceProvider.diff and cls.delete is EngineResourceProvider.delete
    assert set(cls.REPLACES) <= set(cls.INPUTS)
    provider = cls()
    assert vars(provider) == {}  # plain: nothing but the class travels in the state
    raw = dill.dumps(provider, recurse=True)
    assert cls.__module__.encode() in raw and len(raw) < 200, "pickled by reference"
    assert type(dill.loads(raw)) is cls


class Made(EnsuredProvider):
    def __init__(self):
        self.done = []

    def object_id(self, props):
        return f"{props['agent']['name']}:{props['path']}"

    def ensure(self, props):
        self.done.append(props["mode"])
        return {**props, "outcome": "made" if len(self.done) == 1 else "kept"}


def test_an_ensured_object_is_made_by_create_and_brought_again_by_update():
    made = Made()
    created = made.create(dict(OLD))
    assert (created.id, created.outs["outcome"]) == ("a1:/x", "made")
    updated = made.update("a1:/x", dict(OLD), {**OLD, "mode": 2})
    assert updated.outs == {**OLD, "mode": 2, "outcome": "kept"} and made.done == [1, 2]


@pytest.mark.parametrize("cls", ENSURED, ids=lambda c: c.__name__)
def test_the_ensured_providers_keep_only_their_act_and_its_name(cls):
    assert issubclass(cls, EnsuredProvider)
    assert cls.create is EnsuredProvider.create and cls.update is EnsuredProvider.update
    assert cls.ensure is not EnsuredProvider.ensure
    assert cls.object_id is not EnsuredProvider.object_id


def test_the_key_store_is_no_engine_side_resource():
    """Its keys live only in the state: no engine to read back or delete from."""
    assert not issubclass(keystore.SessionKeysProvider, EngineResourceProvider)
    assert engine_resource.unknown is swarm.unknown
