"""A small stand-in for the Pulumi engine, for running the real ``__main__.py`` under mocks.

Used by the tests and the benchmarks (not by the product): the emulation of what ``pulumi up``
and the docker provider do, kept in one place (``docker_builder.py`` builds what is declared on
a real engine; :mod:`.provider` is what the provider refuses, reads back and diffs, from its
own source).

``pulumi.runtime.set_mocks`` replaces the engine with a mock monitor. This one also

- records every registration as the engine would receive it: the serialized inputs (camelCase,
  numbers as floats, secrets still marked where they are), parent, provider, dependencies,
  ``additionalSecretOutputs`` and ``deleteBeforeReplace``;
- keeps a *state* across runs and drives dynamic providers the way the engine does (unpickle
  ``__provider``, ``check``, then ``create`` the first time and ``diff``/``update`` later), so
  that two runs in a row behave like two ``pulumi up``s;
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
import runpy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dill
import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import get_root_resource, reset_options
from pulumi.runtime.sync_await import _sync_await

from ..core.names import PROJECT as PROJECT_NAME
from ..core.names import STACKS_DIR
from . import provider

PROJECT = Path(__file__).resolve().parents[3]  # the checkout: modules/cluster_sessions/emulation
MAIN = PROJECT / "__main__.py"
STACKS = PROJECT / STACKS_DIR
SECRET_SIG = rpc._special_sig_key
SECRET_VALUE = rpc._special_secret_sig
DYNAMIC_PREFIX = "pulumi-python:dynamic"
PROVIDER_PREFIX = "pulumi:providers:"


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
    # urn -> (create | same | update | replace, the arguments that differ): what the provider
    # would do with the last run's registration, against the state the run before left
    actions: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
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

    def _dynamic(self, reg: Registration, inputs: dict) -> tuple[str, dict]:
        provider = dill.loads(base64.b64decode(plain(inputs["__provider"])))
        news = {k: plain(v) for k, v in inputs.items() if k != "__provider"}
        old = self.state.get(reg.urn)
        checked = provider.check(old[1] if old else {}, news)
        if checked.failures:
            reasons = "; ".join(f"{f.property}: {f.reason}" for f in checked.failures)
            raise ValueError(f"{reg.urn}: check failed: {reasons}")
        news = checked.inputs
        if old is None:
            self.dynamic_calls.append(f"create {reg.name}")
            result = provider.create(news)
            id_, outs = result.id, result.outs or {}
        else:
            id_, outs = old
            diff = provider.diff(id_, outs, news)
            self.dynamic_calls.append(f"diff {reg.name} changes={diff.changes}")
            if diff.changes:
                self.dynamic_calls.append(f"update {reg.name}")
                outs = provider.update(id_, outs, news).outs or {}
        return id_, {**news, **outs}

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
        if self.on_create and reg.custom:
            if action[0] == provider.CREATE:
                outs.update(self.on_create(reg, news) or {})
            elif action[0] == provider.REPLACE:
                if self.on_delete and not deleted:
                    self.on_delete(reg.urn)
                outs.update(self.on_create(reg, news) or {})
            elif action[0] == provider.UPDATE and self.on_update:
                self.on_update(reg, news, action[1])
        return (old[0] if old else f"{reg.name}-id"), outs

    def _remember(self, reg: Registration, inputs: dict) -> None:
        self.old_inputs[reg.urn] = inputs
        self.old_provider[reg.urn] = reg.provider
        self.old_dependencies[reg.urn] = reg.property_dependencies

    def _cascade(self, root: str) -> None:
        """Mark (and, with a builder, delete first) what a delete-before-replace of ``root``
        replaces with it."""
        replacing = {root}
        changed = True
        while changed:
            changed = False
            for urn, deps in self.old_dependencies.items():
                if urn in replacing or urn in self.cascaded or urn not in self.state:
                    continue
                type_ = urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1]
                through = [k for k, froms in deps.items() if replacing & set(froms)]
                if self.old_provider.get(urn, "").rsplit("::", 1)[0] in replacing or any(
                        provider.force_new(type_, k) for k in through):
                    self.cascaded[urn] = root
                    replacing.add(urn)
                    changed = True
        if self.on_delete:
            for urn in [u for u, r in self.cascaded.items() if r == root]:
                self.on_delete(urn)


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, monitor: _Monitor) -> None:
        self.monitor = monitor

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        return self.monitor.engine.new_resource(self.monitor.local.current, args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        raise NotImplementedError(f"the program calls {args.token}; it should not")


class _Monitor(MockMonitor):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The SDK registers resources from a thread pool; each call stays on its thread.
        self.local = threading.local()
        super().__init__(_Mocks(self))

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        reg = Registration(
            type=request.type,
            name=request.name,
            urn=self.make_urn(request.parent, request.type, request.name),
            parent=request.parent,
            provider=request.provider,
            inputs=json_format.MessageToDict(request.object),
            dependencies=list(request.dependencies),
            additional_secret_outputs=list(request.additionalSecretOutputs),
            delete_before_replace=request.deleteBeforeReplace,
            custom=request.custom,
            ignore_changes=list(request.ignoreChanges),
            property_dependencies={k: list(v.urns)
                                   for k, v in request.propertyDependencies.items()},
        )
        with self.engine.lock:
            self.engine.registrations.append(reg)
        self.local.current = reg
        return super().RegisterResource(request)


def stack_config(stack: str) -> dict[str, str]:
    """The ``config:`` of ``stacks/Pulumi.<stack>.yaml``, as the CLI would pass it."""
    data = yaml.safe_load((STACKS / f"Pulumi.{stack}.yaml").read_text())
    return {k: str(v) for k, v in (data.get("config") or {}).items()}


def example_stacks() -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in STACKS.glob("Pulumi.*.yaml"))


def run_program(engine: Engine, stack: str, config: dict[str, str],
                program: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Run the real ``__main__.py`` once (not a preview); return its outputs, resolved.

    Each output is ``(value, is_secret)``, read with ``await output.future()`` after every
    registration has finished. Exceptions raised by the program propagate. ``program``, when
    given, runs instead of ``__main__.py`` (e.g. ``pool_program.run``).
    """
    engine.registrations = []
    engine.actions = {}
    engine.moved = {}
    engine.failed = {}
    reset_options(project=PROJECT_NAME, stack=stack, preview=False)
    monitor = _Monitor(engine)
    pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT_NAME, stack=stack, preview=False,
                             monitor=monitor)
    pulumi.runtime.set_all_config(config)

    @pulumi.runtime.test
    def main() -> None:
        if program is not None:
            program()
        else:
            runpy.run_path(str(MAIN), run_name="__main__")

    main()
    root = get_root_resource()
    assert root is not None
    outputs: dict[str, Any] = {}
    for name, value in root.outputs.items():
        out = pulumi.Output.from_input(value)
        outputs[name] = (_sync_await(out.future()), _sync_await(out.is_secret()))
    return outputs
