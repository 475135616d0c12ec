"""A small stand-in for the Pulumi engine, for running the real ``__main__.py`` under mocks.

Used by the tests and the benchmarks (not by the product): the emulation of what ``pulumi up``
and the docker provider do, kept in one place (``docker_builder.py`` builds what is declared on
a real engine; :mod:`cluster_sessions.core.provider_facts` is what the provider reads back).

``pulumi.runtime.set_mocks`` replaces the engine with a mock monitor. This one also

- records every registration as the engine would receive it: the serialized inputs (camelCase,
  numbers as floats, secrets still marked where they are), parent, provider, dependencies,
  ``additionalSecretOutputs`` and ``deleteBeforeReplace``;
- keeps a *state* across runs and drives dynamic providers the way the engine does (unpickle
  ``__provider``, ``check``, then ``create`` the first time and ``diff``/``update`` later), so
  that two runs in a row behave like two ``pulumi up``s;
- hands every custom resource to an optional ``on_create`` hook, which the end-to-end test uses
  to build the declared networks and containers on a real Docker Engine.

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
from . import provider

PROJECT = Path(__file__).resolve().parents[3]  # the checkout: modules/cluster_sessions/emulation
MAIN = PROJECT / "__main__.py"
STACKS = PROJECT / "stacks"
SECRET_SIG = rpc._special_sig_key
SECRET_VALUE = rpc._special_secret_sig
DYNAMIC_PREFIX = "pulumi-python:dynamic"


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

    @property
    def provider_urn(self) -> str:
        return self.provider.rsplit("::", 1)[0] if self.provider else ""

    @property
    def plain_inputs(self) -> dict:
        return plain(self.inputs)


CreateHook = Callable[[Registration, dict], dict | None]


@dataclass
class Engine:
    """The state of one stack across runs, and the registrations of the last run."""

    on_create: CreateHook | None = None
    state: dict[str, tuple[str, dict]] = field(default_factory=dict)
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
        else:
            old = self.state.get(reg.urn)
            id_ = old[0] if old else f"{reg.name}-id"
            news = plain(inputs)
            if old is None:
                self.actions[reg.urn] = (provider.CREATE, ())
            else:
                self.actions[reg.urn] = provider.diff(reg.type, plain(old[1]), news,
                                                      reg.ignore_changes)
            outs = provider.read_back(reg.type, inputs, news)
            if self.on_create and reg.custom:
                outs.update(self.on_create(reg, news) or {})
        self.state[reg.urn] = (id_, outs)
        return id_, outs


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
