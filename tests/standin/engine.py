"""A small stand-in for the Pulumi engine, for running the real ``__main__.py`` under mocks.

Used by the tests and the benchmarks (not by the product): the emulation of what ``pulumi up``
and the docker provider do, kept in one place (``docker_builder.py`` builds what is declared on
a real engine; :mod:`.provider` is what the provider refuses, reads back and diffs, from its
own source).

``pulumi.runtime.set_mocks`` replaces the engine with a mock monitor. This one also

- records every registration as the engine would receive it: the serialized inputs (camelCase,
  numbers as floats, secrets still marked where they are), parent, provider, dependencies,
  ``additionalSecretOutputs`` and ``deleteBeforeReplace``;
- keeps a *state* across runs and drives dynamic providers the way the engine and pulumi's
  dynamic provider host do (:meth:`Engine._dynamic`: ``check`` against the old inputs, then
  ``create``, or ``diff`` against the old outputs and ``update`` in place or replace, deleting
  first or last as the diff and the options say; :meth:`Engine.delete_resources` for what a run or a
  ``destroy`` removes), so that two runs in a row behave like two ``pulumi up``s;
- decides each custom resource's step as pulumi's step generator does (``ignore_changes`` keeps
  the old inputs, a changed provider reference, delete-before-replace cascades) and hands it to
  optional hooks (``on_create``, ``on_update``, ``on_delete``), which the end-to-end tests use
  to build the declared networks and containers on real Docker Engines;
- records in ``failed`` every create the provider or its engine would refuse.

Tests read stack outputs with ``await output.future()`` (via :func:`resolve`), never through an
``apply`` that might not run.
"""

from __future__ import annotations

import base64
import gc
import runpy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dill
import pulumi
import yaml
from google.protobuf import struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor, _resolve_callbacks
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.settings import get_root_resource, reset_options
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from cluster_sessions.core.decisions import KEPT_OUTPUT
from cluster_sessions.core.names import PROJECT as PROJECT_NAME
from cluster_sessions.core.names import STACKS_DIR

from . import provider

PROJECT = Path(__file__).resolve().parents[2]  # the checkout: tests/standin/engine.py
MAIN = PROJECT / "__main__.py"
STACKS = PROJECT / STACKS_DIR
SECRET_SIG = rpc._special_sig_key
SECRET_VALUE = rpc._special_secret_sig
DYNAMIC_PREFIX = "pulumi-python:dynamic"
PROVIDER_PREFIX = "pulumi:providers:"
PROVIDER_KEY = "__provider"  # pulumi/dynamic/__main__.py: the pickled provider, in every state


def ignore_changes(inputs: dict, old_inputs: dict, ignored: list[str]) -> dict:
    """The engine's ``processIgnoreChanges`` for top-level properties: each ignored one takes
    its old input value (or stays unset when it had none)."""
    kept = dict(inputs)
    for key in ignored:
        if key in old_inputs:
            kept[key] = old_inputs[key]
        else:
            kept.pop(key, None)
    return kept


def is_secret(value: Any) -> bool:
    """A serialized value the engine would store encrypted."""
    return isinstance(value, dict) and value.get(SECRET_SIG) == SECRET_VALUE


def plain(value: Any) -> Any:
    """Serialized or deserialized properties with every secret marker removed."""
    if is_secret(value):
        return plain(value["value"])
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@dataclass
class Registration:
    type: str
    name: str
    urn: str
    parent: str
    provider: str  # "<provider urn>::<provider id>", or "" for the default provider
    inputs: dict  # as serialized for the engine: camelCase, floats, secret markers in place
    dependencies: list[str]
    additional_secret_outputs: list[str]
    delete_before_replace: bool
    custom: bool
    # the SDK sends ``deleteBeforeReplaceDefined``: an unset option leaves it to the provider
    delete_before_replace_defined: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    # input property -> the URNs its value came from (what a replacement cascades along)
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)

    @property
    def provider_urn(self) -> str:
        return self.provider.rsplit("::", 1)[0] if self.provider else ""

    @property
    def plain_inputs(self) -> dict:
        return plain(self.inputs)


CreateHook = Callable[[Registration, dict], dict | None]
DeleteHook = Callable[[str], None]
UpdateHook = Callable[[Registration, dict, tuple[str, ...]], None]


@dataclass
class Engine:
    """The state of one stack across runs, and the registrations of the last run."""

    on_create: CreateHook | None = None
    on_delete: DeleteHook | None = None
    on_update: UpdateHook | None = None
    state: dict[str, tuple[str, dict]] = field(default_factory=dict)
    # urn -> the inputs the engine kept for it (after ignore_changes), its provider reference
    # and its property dependencies: what the next run's step generator compares against
    old_inputs: dict[str, dict] = field(default_factory=dict)
    old_provider: dict[str, str] = field(default_factory=dict)
    old_dependencies: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # urn -> why the provider (or its engine) refused the create: ``up`` would fail there
    failed: dict[str, str] = field(default_factory=dict)
    # urn -> (old provider urn, new provider urn) for a resource moved to another provider
    # without being replaced: the real engine leaves it where it was
    moved: dict[str, tuple[str, str]] = field(default_factory=dict)
    cascaded: dict[str, str] = field(default_factory=dict)  # urn -> the replaced urn
    registrations: list[Registration] = field(default_factory=list)
    dynamic_calls: list[str] = field(default_factory=list)
    # (step, name, inputs) of dynamic providers that act on docker objects, not run under
    # mocks (:meth:`Engine._mocked`)
    mocked_effects: list[tuple[str, str, dict]] = field(default_factory=list)
    # urn -> (create | same | update | replace, the arguments that differ): what the provider
    # would do with the last run's registration, against the state the run before left
    actions: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # (urn, id, outputs) of what a create-before-delete replacement superseded: the engine
    # deletes it after every create and update of the run (step_generator.go l. 2164, 2390-2423)
    pending_deletes: list[tuple[str, str, dict]] = field(default_factory=list)
    # urn -> its last registration (type, parent, provider, dependencies): what a delete of a
    # resource the program no longer registers is scheduled by
    known: dict[str, Registration] = field(default_factory=dict)
    # a preview: providers are asked to check and diff, never to create, update or delete
    dry_run: bool = False
    # called before each dynamic provider's create, update or delete (a checkpoint)
    before_step: Callable[[], None] | None = None
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    # --- queries ----------------------------------------------------------------------------

    def of_type(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def named(self, type_: str, name: str) -> Registration:
        found = [r for r in self.of_type(type_) if r.name == name]
        assert len(found) == 1, f"expected one {type_} named {name}, got {len(found)}"
        return found[0]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.registrations if r.urn == urn)

    # --- engine behaviour -------------------------------------------------------------------

    def _step(self) -> None:
        if self.before_step is not None:
            self.before_step()

    def _check(self, reg: Registration, olds: dict, news: dict) -> dict:
        """The provider's ``check``; the host puts ``__provider`` back into what it returns
        (dynamic/__main__.py ``Check``)."""
        provider = _provider_of(news)
        checked = provider.check(olds, {k: v for k, v in news.items()})
        if checked.failures:
            reasons = "; ".join(f"{f.property}: {f.reason}" for f in checked.failures)
            raise ValueError(f"{reg.urn}: check failed: {reasons}")
        return {**checked.inputs, PROVIDER_KEY: news[PROVIDER_KEY]}

    def _create(self, reg: Registration, news: dict) -> tuple[str, dict]:
        """``Create``: the state's outputs are what the provider returned, plus
        ``__provider`` (dynamic/__main__.py ``Create``); nothing of the inputs is merged in."""
        self.dynamic_calls.append(f"create {reg.name}")
        if self.dry_run:  # a preview shows the inputs; the outputs are not known yet
            return "", {k: (rpc.UNKNOWN if v is None else v) for k, v in news.items()}
        if self._mocked(reg, "create", news):
            return f"{reg.name}-id", dict(news)
        self._step()
        result = _provider_of(news).create(dict(news))
        return result.id, {**(result.outs or {}), PROVIDER_KEY: news[PROVIDER_KEY]}

    def _mocked(self, reg: Registration, step: str, news: dict) -> bool:
        """Without a builder no docker object is made (the mocks' ``<name>-id`` stand in for
        the engine's IDs), so a dynamic provider that acts on what the docker provider made
        (``ACTS_ON_DOCKER_OBJECTS``: pulumi_layer/limits.py) has nothing to act on: its step
        is recorded in ``mocked_effects`` instead of run. Every other provider runs."""
        if self.on_create is not None or not getattr(
                _provider_of(news), "ACTS_ON_DOCKER_OBJECTS", False):
            return False
        self.mocked_effects.append(
            (step, reg.name, {k: v for k, v in news.items() if k != PROVIDER_KEY}))
        return True

    def _dynamic(self, reg: Registration, inputs: dict) -> tuple[str, dict]:
        """pulumi's step generator for a dynamic resource (``step_generator.go``):
        ``check`` with the old *inputs* (l. 1325-1342); ``diff`` with the old *outputs*
        (``diffResource`` l. 2982-2995, dynamic/__main__.py ``Diff``), an unknown answer
        (``changes=None``) decided by comparing the inputs (l. 2996-3000); changes with
        ``replaces`` replace (l. 1953), the inputs checked again without the old ones
        (l. 2003-2023), delete-before-replace when the diff or the resource option says so
        (the option wins, l. 2043-2047: old deleted first, l. 2147, after the dependents it
        replaces, :meth:`_cascade`), else the new one is
        created and the old one deleted after the run (l. 2159-2164); changes without them
        update in place (l. 2168-2177) and the outputs become what ``update`` returned; no
        changes keep the old outputs (a same step)."""
        news = {k: plain(v) for k, v in inputs.items()}
        old = self.state.get(reg.urn)
        # deleted with what it depends on: made again, checked without old inputs (l. 1325)
        recreating = old is not None and reg.urn in self.cascaded
        olds_in = self.old_inputs.get(reg.urn, {}) if old is not None and not recreating else {}
        news = self._check(reg, olds_in, news)
        replaces: list[str] = []
        if recreating:
            replaces = [f"<replaced with {self.cascaded.pop(reg.urn)}>"]
            action = provider.REPLACE
            id_, outs = self._create(reg, news)
        elif old is None:
            action = provider.CREATE
            id_, outs = self._create(reg, news)
        else:
            id_, olds = old
            if news[PROVIDER_KEY] == rpc.UNKNOWN:
                diff = _provider_of(olds).diff(id_, dict(olds), dict(news))
            else:
                diff = _provider_of(news).diff(id_, dict(olds), dict(news))
            changes = diff.changes
            if changes is None:
                changes = olds_in != news
            self.dynamic_calls.append(f"diff {reg.name} changes={diff.changes}")
            replaces = list(diff.replaces or []) if changes else []
            if replaces:
                action = provider.REPLACE
                news = self._check(reg, {}, news)
                first = (reg.delete_before_replace if reg.delete_before_replace_defined
                         else bool(diff.delete_before_replace))
                if first:
                    self._cascade(reg.urn)
                    self._delete_dynamic(reg.name, id_, olds)
                else:
                    self.pending_deletes.append((reg.urn, id_, olds))
                id_, outs = self._create(reg, news)
            elif changes:
                action = provider.UPDATE
                self.dynamic_calls.append(f"update {reg.name}")
                if self.dry_run:
                    # a preview's update by a provider without provider previews (dynamic
                    # providers declare none) hands back the new inputs as the state
                    # (sdk/go/common/resource/plugin/provider_plugin.go, Update: "If the
                    # provider does not support previews, return the inputs as the state"):
                    # every output the inputs do not give is unknown, as after a preview's
                    # create (the stand-in kept the old outputs: kinder than Pulumi)
                    outs = {k: (rpc.UNKNOWN if v is None else v) for k, v in news.items()}
                elif self._mocked(reg, "update", news):
                    outs = dict(news)
                else:
                    self._step()
                    result = _provider_of(news).update(id_, dict(olds), dict(news))
                    outs = {**(result.outs or {}), PROVIDER_KEY: news[PROVIDER_KEY]}
            else:
                action, outs = provider.SAME, olds
        self.actions[reg.urn] = (action, tuple(replaces))
        self._remember(reg, news)
        return id_, outs

    def _delete_dynamic(self, name: str, id_: str, outs: dict) -> None:
        """``Delete`` with the *old* outputs, through the provider pickled in them
        (dynamic/__main__.py ``Delete``)."""
        self.dynamic_calls.append(f"delete {name}")
        if self.dry_run:
            return
        self._step()
        _provider_of(outs).delete(id_, dict(outs))

    def depends_on(self, urn: str) -> set[str]:
        """What ``urn`` depends on in the dependency graph the engine schedules deletes by
        (``graph.DependencyGraph``: dependencies, parent, provider, property dependencies)."""
        reg = self.known.get(urn)
        if reg is None:
            return set()
        found = {*reg.dependencies, reg.parent, reg.provider_urn,
                 *(u for urns in reg.property_dependencies.values() for u in urns)}
        return {u for u in found if u and u != urn}

    def schedule_deletes(self, condemned: dict[str, str]) -> list[list[str]]:
        """``ScheduleDeletes`` (step_generator.go l. 2747-2796): antichains of what depends
        on nothing else condemned, in reverse: dependents are deleted first. ``condemned``:
        step key -> the URN it deletes."""
        by_urn: dict[str, set[str]] = {}
        for key, urn in condemned.items():
            by_urn.setdefault(urn, set()).add(key)
        left = set(condemned)
        chains: list[list[str]] = []
        while left:
            chain = sorted(k for k in left if not any(
                by_urn.get(d, set()) & left for d in self.depends_on(condemned[k])))
            chain = chain or sorted(left)  # a snapshot has no cycles; never loop forever
            left -= set(chain)
            chains.append(chain)
        chains.reverse()
        return chains

    def delete_resources(self, urns: list[str], go_on: bool = False) -> dict[str, str]:
        """The delete steps of ``urns`` (of the state) and of what create-before-delete
        replacements superseded (``pending_deletes``), scheduled together as the engine
        does. A dynamic resource is deleted through the provider pickled in its old outputs,
        a docker one through ``on_delete``; components and providers only leave the state.
        A failed delete keeps the resource; without ``go_on`` nothing more is deleted, with
        it everything else is except what a failed resource depends on (transitively).
        Returns URN -> why, for each failed delete."""
        with self.lock:
            condemned = {urn: urn for urn in urns}
            pending = {f"{urn}#replaced-{i}": (urn, id_, outs)
                       for i, (urn, id_, outs) in enumerate(self.pending_deletes)}
            condemned.update({key: urn for key, (urn, _, _) in pending.items()})
            failed: dict[str, str] = {}
            kept: set[str] = set()
            for chain in self.schedule_deletes(condemned):
                for key in chain:
                    urn = condemned[key]
                    if (failed and not go_on) or urn in kept:
                        continue
                    try:
                        if key in pending:
                            _, id_, outs = pending[key]
                            self._delete_dynamic(urn.rsplit("::", 1)[-1], id_, outs)
                            self.pending_deletes.remove(pending[key])
                        else:
                            self._delete_one(urn)
                    except Exception as exc:  # what the provider says; the CLI reports it
                        failed[urn] = f"{type(exc).__name__}: {exc}"
                        kept |= self._needs(urn)
            return failed

    def _needs(self, urn: str) -> set[str]:
        seen: set[str] = set()
        todo = [urn]
        while todo:
            for dep in self.depends_on(todo.pop()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    def _delete_one(self, urn: str) -> None:
        reg = self.known.get(urn)
        type_ = reg.type if reg else urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1]
        id_, outs = self.state[urn]
        if type_.startswith(DYNAMIC_PREFIX):
            self._delete_dynamic(urn.rsplit("::", 1)[-1], id_, outs)
        elif (reg is None or reg.custom) and not type_.startswith(PROVIDER_PREFIX) \
                and self.on_delete and not self.dry_run:
            self.on_delete(urn)
        self.forget(urn)

    def forget(self, urn: str) -> None:
        for table in (self.state, self.old_inputs, self.old_provider, self.old_dependencies,
                      self.known):
            table.pop(urn, None)

    def unregistered(self) -> list[str]:
        """What the state holds and the last run did not register: the engine deletes it at
        the end of the run (``GenerateDeletes``, l. 2424-2432)."""
        seen = {r.urn for r in self.registrations}
        return [urn for urn in self.state if urn not in seen]

    def new_resource(self, reg: Registration, inputs: dict) -> tuple[str, dict]:
        with self.lock:
            return self._new_resource(reg, inputs)

    def _new_resource(self, reg: Registration, inputs: dict) -> tuple[str, dict]:
        if reg.type.startswith(DYNAMIC_PREFIX):
            id_, outs = self._dynamic(reg, inputs)
        elif reg.type.startswith(PROVIDER_PREFIX):
            id_, outs = self._provider(reg, inputs)
        else:
            id_, outs = self._custom(reg, inputs)
            if reg.urn in self.failed:  # a failed create leaves nothing in the state
                return id_, outs
        self.state[reg.urn] = (id_, outs)
        self.known[reg.urn] = reg
        return id_, outs

    def _provider(self, reg: Registration, inputs: dict) -> tuple[str, dict]:
        """A provider is configured on every run; the docker provider never asks to be
        replaced (pulumi-docker declares no ``ForcesProviderReplace`` config, so the bridge's
        ``DiffConfig`` answers no replacement: pulumi-terraform-bridge
        ``pkg/tfbridge/provider.go`` ``configDiffer``)."""
        old = self.state.get(reg.urn)
        self.actions[reg.urn] = (provider.SAME if old else provider.CREATE, ())
        self.old_inputs[reg.urn] = inputs
        if self.on_create:
            self.on_create(reg, plain(inputs))
        return (old[0] if old else f"{reg.name}-id"), inputs

    def _custom(self, reg: Registration, inputs: dict) -> tuple[str, dict]:
        """pulumi ``pkg/resource/deploy/step_generator.go`` (1b594989): ``processIgnoreChanges``
        puts the old *inputs* back for each ignored property before the diff, and the
        replacement is created from those (l. 1264-1269, 3074-3095); a changed provider
        reference replaces only if the new provider's ``DiffConfig`` says so (``providerChanged``
        l. 2800-2878, since pulumi 3.152, #18509); a delete-before-replace replacement replaces
        the dependents whose inputs came from it when their provider's diff of those inputs,
        made unknown, says replace (``calculateDependentReplacements`` l. 3268-3360)."""
        old = self.state.get(reg.urn)
        if old is not None and reg.ignore_changes:
            inputs = ignore_changes(inputs, self.old_inputs.get(reg.urn, {}), reg.ignore_changes)
        news = plain(inputs)
        deleted = False  # by the delete-before-replace of what it depends on
        if old is None:
            action: tuple[str, tuple[str, ...]] = (provider.CREATE, ())
        elif reg.urn in self.cascaded:
            action = (provider.REPLACE, (f"<replaced with {self.cascaded.pop(reg.urn)}>",))
            deleted = True
        else:
            action = provider.diff(reg.type, plain(old[1]), news, reg.ignore_changes)
            before = self.old_provider.get(reg.urn, "")
            if before.rsplit("::", 1)[0] != reg.provider_urn and action[0] != provider.REPLACE:
                self.moved[reg.urn] = (before.rsplit("::", 1)[0], reg.provider_urn)
        self.actions[reg.urn] = action
        if action[0] == provider.REPLACE and reg.delete_before_replace:
            self._cascade(reg.urn)
        try:
            outs = provider.create(reg.type, inputs, news)
        except provider.ProviderRefused as exc:
            self.failed[reg.urn] = str(exc)
            return (old[0] if old else f"{reg.name}-id"), provider.create(
                reg.type, inputs, news, strict=False)
        if reg.urn in self.moved or action[0] == provider.SAME:  # nothing is read again
            outs = dict(old[1])
        elif action[0] == provider.UPDATE:
            outs = provider.after_update(reg.type, old[1], news, action[1])
        self._remember(reg, inputs)
        made: dict = {}
        if self.on_create and reg.custom:
            if action[0] == provider.CREATE:
                made = dict(self.on_create(reg, news) or {})
            elif action[0] == provider.REPLACE:
                if self.on_delete and not deleted:
                    self.on_delete(reg.urn)
                made = dict(self.on_create(reg, news) or {})
            elif action[0] == provider.UPDATE and self.on_update:
                self.on_update(reg, news, action[1])
        # The resource's ID is the engine object's, as the provider sets it (rcf.go
        # ``d.SetId(retContainer.ID)``, rnf.go ``d.SetId(retNetwork.ID)``): what the program
        # gets as ``.id`` and passes on. Without a builder (mocks) a name stands in.
        made_id = made.pop("id", None)
        outs.update(made)
        return (made_id or (old[0] if old else f"{reg.name}-id")), outs

    def _remember(self, reg: Registration, inputs: dict) -> None:
        self.old_inputs[reg.urn] = inputs
        self.old_provider[reg.urn] = reg.provider
        self.old_dependencies[reg.urn] = reg.property_dependencies

    def _cascade(self, root: str) -> None:
        """Mark and delete first, dependents first, what a delete-before-replace of ``root``
        replaces with it (``calculateDependentReplacements`` l. 3268-3417): a resource whose
        provider is replaced, or whose inputs taken from a replaced resource, made unknown,
        make its provider's diff say replace (the docker provider's schema; a dynamic
        provider's own ``diff``)."""
        replacing = {root}
        changed = True
        while changed:
            changed = False
            for urn, deps in self.old_dependencies.items():
                if urn in replacing or urn in self.cascaded or urn not in self.state:
                    continue
                through = [k for k, froms in deps.items() if replacing & set(froms)]
                if self.old_provider.get(urn, "").rsplit("::", 1)[0] in replacing or (
                        through and self._replaced_through(urn, through)):
                    self.cascaded[urn] = root
                    replacing.add(urn)
                    changed = True
        for urn in reversed([u for u, r in self.cascaded.items() if r == root]):
            if self._type(urn).startswith(DYNAMIC_PREFIX):
                self._delete_dynamic(urn.rsplit("::", 1)[-1], *self.state[urn])
            elif self.on_delete:
                self.on_delete(urn)

    def _type(self, urn: str) -> str:
        reg = self.known.get(urn)
        return reg.type if reg else urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1]

    def _replaced_through(self, urn: str, keys: list[str]) -> bool:
        type_ = self._type(urn)
        if not type_.startswith(DYNAMIC_PREFIX):
            return any(provider.force_new(type_, k) for k in keys)
        id_, outs = self.state[urn]
        news = {**self.old_inputs[urn], **dict.fromkeys(keys, rpc.UNKNOWN)}
        return bool(_provider_of(news).diff(id_, dict(outs), news).replaces)


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, monitor: _Monitor) -> None:
        self.monitor = monitor

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        return self.monitor.engine.new_resource(self.monitor.local.current, args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        raise NotImplementedError(f"the program calls {args.token}; it should not")


class _Monitor(MockMonitor):
    """The SDK's mock monitor, recording each registration for the :class:`Engine`.

    ``RegisterResource`` answers as ``MockMonitor.RegisterResource`` does, byte for byte, with
    less work where the properties are plain JSON values (as all of this project's are): the
    request's properties are read once (:func:`struct_to_dict`), what the mocks get is derived
    from that (:func:`deserialized`, pulumi's ``rpc.deserialize_properties``) and the state is
    written straight into the response (:func:`state_struct`, pulumi's
    ``rpc.serialize_properties``), without an event loop per value. Anything else (an
    unknown, a resource reference, an asset) takes the SDK's own path.
    (``tests/test_emulation.py`` checks the two paths give the same answers and state.)
    """

    # False: every registration through ``MockMonitor.RegisterResource`` (the tests compare)
    fast = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The SDK registers resources from a thread pool; each call stays on its thread.
        self.local = threading.local()
        super().__init__(_Mocks(self))

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        inputs = struct_to_dict(request.object)
        reg = Registration(
            type=request.type,
            name=request.name,
            urn=self.make_urn(request.parent, request.type, request.name),
            parent=request.parent,
            provider=request.provider,
            inputs=inputs,
            dependencies=list(request.dependencies),
            additional_secret_outputs=list(request.additionalSecretOutputs),
            delete_before_replace=request.deleteBeforeReplace,
            custom=request.custom,
            delete_before_replace_defined=request.deleteBeforeReplaceDefined,
            ignore_changes=list(request.ignoreChanges),
            property_dependencies={k: list(v.urns)
                                   for k, v in request.propertyDependencies.items()},
        )
        with self.engine.lock:
            self.engine.registrations.append(reg)
        self.local.current = reg
        if not self.fast:
            return super().RegisterResource(request)
        return self._register(request, reg.urn, inputs)

    def _register(self, request, urn: str, inputs: dict):
        """``MockMonitor.RegisterResource`` (pulumi/runtime/mocks.py), on ``inputs`` read once."""
        if request.type == "pulumi:pulumi:Stack":
            return resource_pb2.RegisterResourceResponse(urn=urn)
        # an event loop on this thread, as the SDK's: deserializing resource references needs it
        _ensure_event_loop()
        args = deserialized(inputs)
        if args is None:
            args = rpc.deserialize_properties(request.object)
        id_, state = self.mocks.new_resource(pulumi.runtime.MockResourceArgs(
            typ=request.type,
            name=request.name,
            inputs=args,
            provider=request.provider,
            resource_id=request.importId,
            custom=request.custom or False,
            transforms=_resolve_callbacks(request.transforms),
        ))
        obj_proto = state_struct(state, request.object, inputs, args)
        if obj_proto is None:
            obj_proto = _sync_await(rpc.serialize_properties(state, {}))
        self.resources[urn] = MockMonitor.ResourceRegistration(urn, id_, state)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=obj_proto)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "struct_value":
        return {k: _value(v) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_value(v) for v in value.list_value.values]
    if kind == "number_value":
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "null_value":
        return None
    raise ValueError("Value not set")  # json_format's answer to a Value of no kind


def struct_to_dict(struct: Any) -> dict:
    """``json_format.MessageToDict`` of a ``Struct`` (numbers as floats), in one pass."""
    return {k: _value(v) for k, v in struct.fields.items()}


class _Fallback(Exception):
    """A value :func:`deserialized` leaves to the SDK."""


def _deserialize(value: Any) -> Any:
    """pulumi's ``rpc.deserialize_property`` of a plain value (from :func:`struct_to_dict`):
    a secret stays wrapped, and a list or a map holding one becomes a secret of its plain
    values; a null in a map is left out."""
    if isinstance(value, str):
        if value == rpc.UNKNOWN:
            raise _Fallback  # None, or Unknown() in a preview: the SDK decides
        return value
    if isinstance(value, list):
        items = [_deserialize(v) for v in value]
        if any(is_secret(v) for v in items):
            return {SECRET_SIG: SECRET_VALUE, "value": [rpc.unwrap_rpc_secret(v) for v in items]}
        return items
    if isinstance(value, dict):
        if SECRET_SIG in value:
            if value[SECRET_SIG] != SECRET_VALUE:
                raise _Fallback  # an asset, archive, resource reference or output value
            return rpc.wrap_rpc_secret(_deserialize(value.get("value")))
        props = {}
        for k, v in value.items():
            v = _deserialize(v)
            if v is not None:
                props[k] = v
        if any(is_secret(v) for v in props.values()):
            return {SECRET_SIG: SECRET_VALUE,
                    "value": {k: rpc.unwrap_rpc_secret(v) for k, v in props.items()}}
        return props
    return value


def deserialized(inputs: dict) -> dict | None:
    """``rpc.deserialize_properties`` of the struct ``inputs`` was read from, or None where
    the SDK has to decide (an unknown, a special value other than a secret)."""
    if SECRET_SIG in inputs:
        return None
    try:
        out = {}
        for k, v in inputs.items():
            v = _deserialize(v)
            if v is not None:
                out[k] = v
        return out
    except _Fallback:
        return None


def _json(value: Any) -> bool:
    """A value ``rpc.serialize_property`` hands on as it is: JSON types only (a tuple is
    written as the list it would become)."""
    if value is None or isinstance(value, str | bool | int | float):
        return True
    if type(value) is dict:
        return all(isinstance(k, str) and _json(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(_json(v) for v in value)
    return False


def state_struct(state: dict, request: Any = None, inputs: dict | None = None,
                 args: dict | None = None) -> Any:
    """``rpc.serialize_properties(state, {})`` as the mock monitor answers it, for a state of
    plain JSON values (None otherwise: the SDK's path): each property that is not None,
    written into the struct as the SDK writes what it serialized.

    A property the state took unchanged from what the mocks got (``args``, read from
    ``request``'s struct as ``inputs``), where reading it changed nothing (no secret moved up,
    no null left out), is copied from the request's struct: the same value, written the same.
    """
    if type(state) is not dict:
        return None
    struct = struct_pb2.Struct()
    for k, v in state.items():
        if v is None:
            continue
        if (args is not None and inputs is not None and k in args and v is args[k]
                and k in inputs and v == inputs[k]):
            struct.fields[k].CopyFrom(request.fields[k])
        elif _json(v):
            struct[k] = v
        else:
            return None
    return struct


def _provider_of(props: dict) -> Any:
    """The provider pickled in a dynamic resource's inputs or outputs (``get_provider``)."""
    return dill.loads(base64.b64decode(props[PROVIDER_KEY]))


def stack_config(stack: str) -> dict[str, str]:
    """The ``config:`` of ``stacks/Pulumi.<stack>.yaml``, as the CLI would pass it; {} when
    the checkout has none (a fresh clone: the program finds ``sessions/<stack>.yaml``)."""
    path = STACKS / f"Pulumi.{stack}.yaml"
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    return {k: str(v) for k, v in (data.get("config") or {}).items()}


def example_stacks() -> list[str]:
    """The stack of every shipped session (``stacks/sessions/*.yaml``; a ``count``'s each)."""
    from cluster_sessions.core.loader import load_session
    from cluster_sessions.core.plan import build_plans

    names = []
    for path in sorted((STACKS / "sessions").glob("*.yaml")):
        loaded = load_session(path)
        names += [plan.name for plan in build_plans(loaded.session, loaded.pool)]
    return sorted(names)


def run_program(engine: Engine, stack: str, config: dict[str, str],
                program: Callable[[], Any] | None = None,
                previous: dict[str, tuple[Any, bool]] | None = None) -> dict[str, Any]:
    """Run the real ``__main__.py`` once (a preview when ``engine.dry_run``: what is not
    known yet stays unknown); return its outputs, resolved.

    Each output is ``(value, is_secret)``, read with ``await output.future()`` after every
    registration has finished. Exceptions raised by the program propagate. ``program``, when
    given, runs instead of ``__main__.py`` (e.g. ``pool_program.run``).
    """
    engine.registrations = []
    engine.actions = {}
    engine.moved = {}
    engine.failed = {}
    reset_options(project=PROJECT_NAME, stack=stack, preview=engine.dry_run)
    monitor = _Monitor(engine)
    pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT_NAME, stack=stack,
                             preview=engine.dry_run, monitor=monitor)
    pulumi.runtime.set_all_config(config)

    @pulumi.runtime.test
    def main() -> None:
        if program is not None:
            program()
        else:
            runpy.run_path(str(MAIN), run_name="__main__")

    # what the program sets for its process (pulumi_layer/program.py ``collect_less``) holds
    # for this run only: the next run, the program's or another's, starts from the same
    # collector
    thresholds = gc.get_threshold()
    # what the program would read of its last update with the CLI (``pulumi stack output``,
    # program.read_previous_kept): the stand-in backend's outputs of this stack
    from cluster_sessions.pulumi_layer import program as session_program

    kept = (previous or {}).get(KEPT_OUTPUT, (None, False))[0]
    reader = session_program.previous_kept
    session_program.previous_kept = lambda _project, _stack: kept
    try:
        main()
        root = get_root_resource()
        assert root is not None
        outputs: dict[str, Any] = {}
        for name, value in root.outputs.items():
            out = pulumi.Output.from_input(value)
            outputs[name] = (_sync_await(out.future()), _sync_await(out.is_secret()))
        return outputs
    finally:
        session_program.previous_kept = reader
        gc.set_threshold(*thresholds)
