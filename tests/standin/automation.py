"""A stand-in for the Automation API's stacks and workspace, so that ``sessionctl``'s engine
verbs run for real where the ``pulumi`` CLI is missing (tests, benchmarks; not the product).

What stays real: ``driver/stacks.py`` from the arguments to the summary, the program
(``__main__.py``, run under the engine-backed mocks of :mod:`.engine`) and the containers and
networks it declares (built by :class:`.docker_builder.DockerBuilder` on real engines). What is
stood in for: the CLI process. Every call is bound to the installed SDK's own signature
(``auto.Stack.up``, ``auto.LocalWorkspace.list_stacks`` ...), so a keyword the SDK does not
take fails here as it would there, and results are the SDK's own classes.

``destroy`` does what the CLI does: every resource through its provider's delete (a dynamic
one's ``delete``, a docker object on the engine it was created on), dependents before what
they depend on (the engine's ``ScheduleDeletes``); with ``continue_on_error`` it goes on past
a failure, never deletes what a failed resource depends on, keeps the failed ones in the stack
and ends with an error naming them (``error`` diagnostics on the event stream, as the CLI's).
``up`` deletes, after its creates and updates, what the program no longer declares and what a
create-before-delete replacement superseded (:meth:`.engine.Engine.delete_resources`).

With a ``directory`` (the file backend's), stacks are files, as the DIY backend's are: a
version-3 checkpoint per stack at ``.pulumi/stacks/<project>/<stack>.json`` and the config in
``Pulumi.<stack>.yaml``; every read (``list_stacks``, ``stack_outputs``, ``get_all_config``,
each verb of a stack) goes to them, so a second process sees what the first finished, and a
stack the backend does not hold is the SDK's ``StackNotFoundError``. Each stack is saved
before every resource step and at the end of a run, so a run killed half-way leaves what it
finished (an object created but not yet recorded is on the engine only, as a pending create
is dropped by the CLI's next run). Secrets are kept as plaintext (the CLI encrypts them).
Updates take the DIY backend's lock file
(``.pulumi/locks/organization/<project>/<stack>/<uuid>.json``, always on since pulumi 3.20,
#8565): another update of the stack meanwhile is refused with the CLI's own message (the SDK
makes it ``ConcurrentUpdateError``), and a killed run leaves its lock behind, as the CLI does.
``up(refresh=True)`` reads every container back first, as the provider's Read does: one that is
gone leaves the state, one that is not running reads back ``must_run=false``.
"""

from __future__ import annotations

import contextlib
import copy
import getpass
import inspect
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pulumi import automation as auto
from pulumi.automation import events
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import create_command_error
from pulumi.runtime import rpc

from cluster_sessions.core.names import PROJECT as PROJECT_NAME

from . import connhelper
from .docker_builder import DockerBuilder, remove_bundle_dir
from .engine import Engine, Registration, run_program
from .provider import force_new as _force_new

LOCKED = ("error: the stack is currently locked by {n} lock(s). Either wait for the other "
          "process(es) to end or delete the lock file with `pulumi cancel`.")
# what `pulumi stack select|output|config` say of a stack the backend does not hold; the SDK
# makes it StackNotFoundError (automation/errors.py ``not_found_regex``)
NOT_FOUND = "error: no stack named '{stack}' found"
STACK_TYPE = "pulumi:pulumi:Stack"
# where the stand-in keeps the stacks' config instead of the project's stacks/ (tests)
CONFIG_DIR_ENV = "CLUSTER_SESSIONS_EMULATION_CONFIG_DIR"
# how the engine marks a secret; "plaintext" is its decrypted form (the CLI's checkpoint holds
# "ciphertext": the stand-in does not encrypt)
SECRET_SIG, SECRET_VALUE = rpc._special_sig_key, rpc._special_secret_sig


def _bound(cls: type, name: str, *args: Any, **kwargs: Any) -> None:
    """Fail as the SDK would on a call it does not take (TypeError names the argument)."""
    inspect.signature(getattr(cls, name)).bind(None, *args, **kwargs)


def _argument(cls: type, name: str, arg: str, *args: Any, **kwargs: Any) -> Any:
    return inspect.signature(getattr(cls, name)).bind(None, *args, **kwargs).arguments[arg]


def _failure(stderr: str, code: int = 255) -> auto.errors.CommandError:
    return create_command_error(CommandResult("", stderr, code))


def _not_found(stack: str) -> auto.errors.CommandError:
    return _failure(NOT_FOUND.format(stack=stack))


@dataclass
class StackState:
    name: str
    builder: DockerBuilder
    engine: Engine
    config: dict[str, str] = field(default_factory=dict)  # without a directory only
    outputs: dict[str, tuple[Any, bool]] = field(default_factory=dict)
    last_update: datetime | None = None
    # the last preview's step per resource: (action, the arguments that differ), as the CLI's
    # `preview --diff` would list them
    previewed: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)


# --- the checkpoint: the DIY backend's stack file ----------------------------------------------


def _secret(value: Any) -> dict[str, str]:
    return {SECRET_SIG: SECRET_VALUE, "plaintext": json.dumps(value)}


def _output(value: Any) -> tuple[Any, bool]:
    if isinstance(value, dict) and value.get(SECRET_SIG) == SECRET_VALUE and "plaintext" in value:
        return json.loads(value["plaintext"]), True
    return value, False


def stack_urn(stack: str) -> str:
    return f"urn:pulumi:{stack}::{PROJECT_NAME}::{STACK_TYPE}::{PROJECT_NAME}-{stack}"


def encode(state: StackState) -> dict[str, Any]:
    """``apitype.VersionedCheckpoint`` (version 3): ``checkpoint.stack`` and ``latest`` with
    its ``manifest`` (whose ``time`` is the stack's last update) and ``resources`` in the
    engine's fields, the stack's outputs on the ``pulumi:pulumi:Stack`` resource, and what a
    create-before-delete replacement left to delete marked ``delete``. The docker objects the
    stand-in built (``emulation``) are extra: the CLI's readers ignore unknown fields."""
    engine, builder = state.engine, state.builder
    resources: list[dict[str, Any]] = []
    if engine.state or state.outputs:
        resources.append({"urn": stack_urn(state.name), "custom": False, "type": STACK_TYPE,
                          "outputs": {k: _secret(v) if secret else v
                                      for k, (v, secret) in state.outputs.items()}})
    for urn, (id_, outs) in engine.state.items():
        reg = engine.known.get(urn)
        doc: dict[str, Any] = {"urn": urn, "custom": reg.custom if reg else True, "id": id_,
                               "type": reg.type if reg else "", "outputs": outs}
        if reg is not None:
            doc.update({
                "inputs": engine.old_inputs.get(urn, reg.inputs), "parent": reg.parent,
                "provider": reg.provider, "dependencies": reg.dependencies,
                "propertyDependencies": reg.property_dependencies,
                "deleteBeforeReplace": reg.delete_before_replace,
                "additionalSecretOutputs": reg.additional_secret_outputs,
                "ignoreChanges": reg.ignore_changes})
        resources.append(doc)
    for urn, id_, outs in engine.pending_deletes:
        reg = engine.known.get(urn)
        resources.append({"urn": urn, "custom": True, "id": id_, "delete": True,
                          "type": reg.type if reg else "", "outputs": outs})
    latest = None
    if state.last_update is not None or resources:
        latest = {"manifest": {"time": (state.last_update or datetime.now(UTC)).isoformat(),
                               "magic": "", "version": "cluster-sessions emulation"},
                  "resources": resources,
                  "emulation": {"made": builder.made,
                                "providerConfigs": builder.provider_configs}}
    return {"version": 3, "checkpoint": {"stack": f"organization/{PROJECT_NAME}/{state.name}",
                                         "latest": latest}}


def decode(doc: dict[str, Any], state: StackState) -> StackState:
    """``state`` filled from a checkpoint written by :func:`encode`."""
    latest = doc["checkpoint"].get("latest") or {}
    engine, builder = state.engine, state.builder
    manifest = latest.get("manifest") or {}
    if manifest.get("time"):
        state.last_update = datetime.fromisoformat(manifest["time"])
    for res in latest.get("resources") or []:
        urn = res["urn"]
        if res.get("type") == STACK_TYPE:
            state.outputs = {k: _output(v) for k, v in (res.get("outputs") or {}).items()}
            continue
        if res.get("delete"):
            engine.pending_deletes.append((urn, res["id"], res["outputs"]))
            continue
        engine.state[urn] = (res["id"], res["outputs"])
        if "inputs" not in res:
            continue
        reg = Registration(
            type=res["type"], name=urn.rsplit("::", 1)[-1], urn=urn, parent=res["parent"],
            provider=res["provider"], inputs=res["inputs"], dependencies=res["dependencies"],
            additional_secret_outputs=res["additionalSecretOutputs"],
            delete_before_replace=res["deleteBeforeReplace"], custom=res["custom"],
            ignore_changes=res["ignoreChanges"],
            property_dependencies=res["propertyDependencies"])
        engine.known[urn] = reg
        engine.old_inputs[urn] = res["inputs"]
        engine.old_provider[urn] = res["provider"]
        engine.old_dependencies[urn] = res["propertyDependencies"]
    extra = latest.get("emulation") or {}
    builder.made = {urn: tuple(made) for urn, made in (extra.get("made") or {}).items()}
    builder.provider_configs = extra.get("providerConfigs") or {}
    return state


class Backend:
    """The state backend: stacks by name, each with the containers its ``up`` built.

    With a ``directory`` it is the DIY backend's: every read goes to the files (a checkpoint
    per stack, ``.pulumi/stacks/<project>/<stack>.json``, as pulumi ``pkg/backend/diy/
    store.go`` ``StackBasePath`` l. 138-142 names it; ``list_stacks`` lists them as
    ``ListReferences`` l. 239-301 does), and each stack's config is the project's
    ``Pulumi.<stack>.yaml`` in its ``stackConfigDir``, or in ``config_dir`` when given (tests:
    the checkout's ``stacks/`` holds the committed example stacks). Without one, everything
    lives in this process."""

    def __init__(self, directory: Path | None = None, config_dir: Path | None = None) -> None:
        self.stacks: dict[str, StackState] = {}
        self.calls: list[str] = []
        self.directory = directory
        # every stand-in of one run keeps the stacks' config in one place: the one given, else
        # $CLUSTER_SESSIONS_EMULATION_CONFIG_DIR (tests), else the project's, as the CLI does
        env = os.environ.get(CONFIG_DIR_ENV)
        self.config_dir = config_dir or (Path(env) if env else None)
        self.project: Path | None = None

    # --- the file backend: checkpoints, config files and locks ------------------------------

    def _stacks_dir(self) -> Path:
        assert self.directory is not None
        return self.directory / ".pulumi" / "stacks" / PROJECT_NAME

    def _checkpoint(self, stack: str) -> Path | None:
        if self.directory is None:
            return None
        return self._stacks_dir() / f"{stack}.json"

    def lock_dir(self, stack: str) -> Path:
        assert self.directory is not None
        return self.directory / ".pulumi" / "locks" / "organization" / PROJECT_NAME / stack

    def config_file(self, stack: str) -> Path:
        """``Pulumi.<stack>.yaml`` where the CLI keeps the stack's config."""
        if self.config_dir is not None:
            return self.config_dir / f"Pulumi.{stack}.yaml"
        assert self.project is not None, "no project: open_stack or open_workspace first"
        project = yaml.safe_load((self.project / "Pulumi.yaml").read_text()) or {}
        return self.project / project.get("stackConfigDir", ".") / f"Pulumi.{stack}.yaml"

    def read_config(self, stack: str) -> dict[str, str]:
        if self.directory is None:
            return dict(self.stacks[stack].config)
        path = self.config_file(stack)
        if not path.exists():
            return {}
        doc = yaml.safe_load(path.read_text()) or {}
        return {k: v if isinstance(v, str) else json.dumps(v)
                for k, v in (doc.get("config") or {}).items()}

    def write_config(self, stack: str, config: dict[str, str]) -> None:
        if self.directory is None:
            self.stacks[stack].config = dict(config)
            return
        path = self.config_file(stack)
        doc = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
        doc["config"] = dict(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def save(self, state: StackState) -> None:
        path = self._checkpoint(state.name)
        if path is None:
            return
        meta = self.directory / ".pulumi" / "meta.yaml"  # type: ignore[operator]
        if not meta.exists():  # the project layout (diy/meta.go): version 1
            meta.parent.mkdir(parents=True, exist_ok=True)
            meta.write_text("version: 1\n")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(encode(state), indent=4))
        tmp.replace(path)  # a kill never leaves half a checkpoint

    def exists(self, stack: str) -> bool:
        path = self._checkpoint(stack)
        return path.exists() if path is not None else stack in self.stacks

    def load(self, stack: str) -> StackState:
        """The stack as the backend holds it now (read from its file, with a directory);
        StackNotFoundError when it holds no such stack."""
        path = self._checkpoint(stack)
        if path is None:
            if stack not in self.stacks:
                raise _not_found(stack)
            return self.stacks[stack]
        if not path.exists():
            raise _not_found(stack)
        state = decode(json.loads(path.read_text()), self._new_state(stack))
        old = self.stacks.get(stack)
        if old is not None:
            old.builder.close()
        self.stacks[stack] = state
        return state

    def _new_state(self, stack: str) -> StackState:
        builder = DockerBuilder()
        state = StackState(stack, builder, Engine())

        def saved(hook: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any) -> Any:
                self.save(state)  # what finished so far, before the next step
                return hook(*args)
            return run

        state.engine.on_create = saved(builder)
        state.engine.on_update = saved(builder.update)
        state.engine.on_delete = saved(builder.remove)
        state.engine.before_step = saved(lambda: None)
        return state

    @contextlib.contextmanager
    def locked(self, stack: str):
        """The DIY backend's update lock: refused while another lock file exists."""
        if self.directory is None:
            yield
            return
        locks = self.lock_dir(stack)
        locks.mkdir(parents=True, exist_ok=True)
        held = sorted(locks.glob("*.json"))
        if held:
            info = []
            for path in held:
                with contextlib.suppress(OSError, ValueError):
                    doc = json.loads(path.read_text())
                    info.append(f"\n  {path}: created by {doc['username']}@{doc['hostname']} "
                                f"(pid {doc['pid']}) at {doc['timestamp']}")
            raise _failure(LOCKED.format(n=len(held)) + "".join(info))
        mine = locks / f"{uuid.uuid4()}.json"
        mine.write_text(json.dumps({"pid": os.getpid(), "username": getpass.getuser(),
                                    "hostname": socket.gethostname(),
                                    "timestamp": datetime.now(UTC).isoformat()}))
        try:
            yield
        finally:
            mine.unlink(missing_ok=True)

    # --- what driver/stacks.py's open_stack and open_workspace return -------------------------

    def open_stack(self, stack: str, project: Path, settings: Any, pulumi: Path | None,
                   create: bool = True) -> EmulatedStack:
        self.project = project
        if not self.exists(stack):
            if not create:
                raise auto.errors.StackNotFoundError(CommandResult(
                    "", NOT_FOUND.format(stack=stack), 255))
            self.stacks[stack] = self._new_state(stack)
            self.save(self.stacks[stack])  # `pulumi stack init`: a checkpoint, no deployment
        return EmulatedStack(self, stack)

    def open_workspace(self, project: Path, settings: Any, pulumi: Path | None) -> Backend:
        self.project = project
        return self

    # --- auto.LocalWorkspace --------------------------------------------------------------------

    def _names(self) -> list[str]:
        if self.directory is None:
            return list(self.stacks)
        found = self._stacks_dir().glob("*.json") if self._stacks_dir().is_dir() else []
        return sorted(p.name.removesuffix(".json") for p in found)

    def list_stacks(self, *args: Any, **kwargs: Any) -> list[auto.StackSummary]:
        """``pulumi stack ls --json`` of this project: every checkpoint the backend holds, its
        last update the manifest's time and its resource count that of ``latest.resources``
        (pkg/backend/diy/stack.go ``diyStackSummary`` l. 141-157)."""
        _bound(auto.LocalWorkspace, "list_stacks", *args, **kwargs)
        self.calls.append("list_stacks")
        found = []
        for name in self._names():
            doc = encode(self.load(name))
            latest = doc["checkpoint"]["latest"]
            found.append(auto.StackSummary(
                name, False, False, self.stacks[name].last_update,
                len(latest["resources"]) if latest is not None else None))
        return found

    def remove_stack(self, *args: Any, **kwargs: Any) -> None:
        """``pulumi stack rm --yes``: refused while the stack holds resources (the CLI's
        "still has resources; removal rejected"), else its checkpoint and config go."""
        _bound(auto.LocalWorkspace, "remove_stack", *args, **kwargs)
        name = _argument(auto.LocalWorkspace, "remove_stack", "stack_name", *args, **kwargs)
        self.calls.append(f"remove_stack {name}")
        state = self.load(name)
        if state.engine.state:
            raise _failure(f"error: '{name}' still has resources; removal rejected. Possible "
                           f"actions:\n- Make sure that '{name}' is the stack that you want to "
                           "destroy\n- Run `pulumi destroy` to delete the resources, then run "
                           "`pulumi stack rm`")
        state.builder.close()
        self.stacks.pop(name, None)
        path = self._checkpoint(name)
        if path is not None:
            path.unlink(missing_ok=True)
            with contextlib.suppress(AssertionError, OSError):
                self.config_file(name).unlink(missing_ok=True)

    def export_stack(self, *args: Any, **kwargs: Any) -> auto.Deployment:
        _bound(auto.LocalWorkspace, "export_stack", *args, **kwargs)
        name = _argument(auto.LocalWorkspace, "export_stack", "stack_name", *args, **kwargs)
        return EmulatedStack(self, name).export_stack()

    def stack_outputs(self, *args: Any, **kwargs: Any) -> dict[str, auto.OutputValue]:
        _bound(auto.LocalWorkspace, "stack_outputs", *args, **kwargs)
        name = _argument(auto.LocalWorkspace, "stack_outputs", "stack_name", *args, **kwargs)
        self.calls.append(f"stack_outputs {name}")
        return {k: auto.OutputValue(v, secret)
                for k, (v, secret) in self.load(name).outputs.items()}

    def get_all_config(self, *args: Any, **kwargs: Any) -> dict[str, auto.ConfigValue]:
        _bound(auto.LocalWorkspace, "get_all_config", *args, **kwargs)
        name = _argument(auto.LocalWorkspace, "get_all_config", "stack_name", *args, **kwargs)
        self.calls.append(f"get_all_config {name}")
        if not self.exists(name):
            raise _not_found(name)
        return {k: auto.ConfigValue(v) for k, v in self.read_config(name).items()}

    def remove_all(self) -> list[str]:
        """Delete every stack's docker objects (test teardown), whatever state they are in;
        the names of what could not be deleted."""
        states = [self.load(name) for name in self._names()] if self.directory is not None \
            else list(self.stacks.values())
        for state in states:
            # containers first: a network cannot go while one is attached
            made = state.builder.made
            for urn in sorted(made, key=lambda urn: made[urn][0] != "container"):
                with contextlib.suppress(Exception):  # an engine a test stopped
                    state.builder.remove(urn)
            # the bundles' deliveries and the network the state holds (an interrupted up made
            # them before its containers), deleted as a destroy would (pulumi_layer/bundles.py,
            # network.py)
            for urn in [u for u in state.engine.state
                        if ":BundleDelivery::" in u or ":SessionNetwork::" in u]:
                with contextlib.suppress(Exception):
                    state.engine.delete_resources([urn])
            for path in dict.fromkeys(getattr(state.builder, "bundle_dirs", [])):
                remove_bundle_dir(path)
            state.builder.close()
            self.save(state)
        return [urn.rsplit("::", 1)[-1] for state in states for urn in state.builder.made]


class EmulatedStack:
    """What ``driver/stacks.py`` calls on an ``auto.Stack``. Each call reads the stack as the
    backend holds it at that moment, as each ``pulumi`` command does."""

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend = backend
        self.name = name

    @property
    def state(self) -> StackState:
        return self.backend.load(self.name)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        _bound(auto.Stack, name, *args, **kwargs)
        self.backend.calls.append(f"{name} {self.name}")

    def set_config(self, *args: Any, **kwargs: Any) -> None:
        self._call("set_config", *args, **kwargs)
        key = _argument(auto.Stack, "set_config", "key", *args, **kwargs)
        value = _argument(auto.Stack, "set_config", "value", *args, **kwargs)
        config = self.backend.read_config(self.name)
        self.backend.write_config(self.name, {**config, key: value.value})

    def remove_config(self, *args: Any, **kwargs: Any) -> None:
        self._call("remove_config", *args, **kwargs)
        key = _argument(auto.Stack, "remove_config", "key", *args, **kwargs)
        config = self.backend.read_config(self.name)
        if config.pop(key, None) is None:
            raise _failure(f"configuration key '{key}' not found")
        self.backend.write_config(self.name, config)

    def set_all_config(self, *args: Any, **kwargs: Any) -> None:
        self._call("set_all_config", *args, **kwargs)
        values = _argument(auto.Stack, "set_all_config", "config", *args, **kwargs)
        config = self.backend.read_config(self.name)
        self.backend.write_config(self.name, {**config, **{k: v.value
                                                         for k, v in values.items()}})

    def remove_all_config(self, *args: Any, **kwargs: Any) -> None:
        """Keys not set are left so, as the CLI's ``config rm-all`` does."""
        self._call("remove_all_config", *args, **kwargs)
        keys = _argument(auto.Stack, "remove_all_config", "keys", *args, **kwargs)
        config = self.backend.read_config(self.name)
        for key in keys:
            config.pop(key, None)
        self.backend.write_config(self.name, config)

    def outputs(self) -> dict[str, auto.OutputValue]:
        self._call("outputs")
        return {k: auto.OutputValue(v, s) for k, (v, s) in self.state.outputs.items()}

    def _summary(self, kind: str, changes: dict[str, int]) -> auto.UpdateSummary:
        now = datetime.now(UTC)
        return auto.UpdateSummary(kind, now, "", {}, {}, "succeeded", now,
                                  resource_changes=changes)

    def _config(self) -> dict[str, str]:
        return {k: v for k, v in self.backend.read_config(self.name).items() if v != ""}

    def export_stack(self, *args: Any, **kwargs: Any) -> auto.Deployment:
        """The checkpoint's resources with the IDs the provider returned, their inputs (as
        registered) and outputs, as the CLI's ``stack export`` has them."""
        self._call("export_stack", *args, **kwargs)
        state = self.state
        made, known = state.builder.made, state.engine.known
        resources = [{"urn": urn, "type": known[urn].type if urn in known else "",
                      "id": made[urn][2] if urn in made else id_,
                      "inputs": known[urn].inputs if urn in known else {},
                      "outputs": outs if isinstance(outs, dict) else {}}
                     for urn, (id_, outs) in state.engine.state.items()]
        return auto.Deployment(version=3, deployment={"resources": resources})

    @contextlib.contextmanager
    def _update(self):
        """An update of the stack: under its lock, on the state the backend holds now,
        checkpointed at the end whatever happens, the connections closed."""
        with self.backend.locked(self.name):
            state = self.state
            try:
                yield state
            finally:
                self.backend.save(state)
                state.builder.close()

    def up(self, *args: Any, **kwargs: Any) -> auto.UpResult:
        self._call("up", *args, **kwargs)
        with self._update() as state:
            return self._up(state, kwargs)

    @staticmethod
    def _read_back(state: StackState) -> None:
        """The provider's Read of every container (``up --refresh``): gone leaves the state;
        not running reads back ``must_run=false``."""
        import docker.errors

        engine, made = state.engine, state.builder.made
        for urn, (kind, config, object_id) in list(made.items()):
            if kind != "container" or urn not in engine.state:
                continue
            conn = connhelper.connect(config, timeout=15)
            try:
                running = conn.client.api.inspect_container(object_id)["State"]["Running"]
            except docker.errors.NotFound:
                del made[urn]
                engine.forget(urn)
                continue
            finally:
                conn.close()
            if not running:
                id_, outs = engine.state[urn]
                engine.state[urn] = (id_, {**outs, "mustRun": False})

    def _up(self, state: StackState, kwargs: dict[str, Any]) -> auto.UpResult:
        engine = state.engine
        try:
            if kwargs.get("refresh"):
                self._read_back(state)
            outputs = run_program(engine, self.name, self._config(), previous=state.outputs)
        except Exception as exc:  # the program failed: the CLI exits non-zero with its error
            raise _failure(f"error: {exc}") from None
        if engine.failed:  # what the provider refused: the CLI reports each and exits non-zero
            raise _failure("\n".join(f"error: {urn.rsplit('::', 1)[-1]}: creating failed: {why}"
                                      for urn, why in engine.failed.items()))
        changes: dict[str, int] = {}
        for action, _ in engine.actions.values():
            changes[action] = changes.get(action, 0) + 1
        # after every create and update: what the program no longer declares, and what a
        # create-before-delete replacement superseded (step_generator.go GenerateDeletes)
        gone = engine.unregistered()
        self._steps(kwargs.get("on_event"), engine, list(gone))
        failed = engine.delete_resources(gone)
        deleted = len([urn for urn in gone if urn not in engine.state])
        if deleted:
            changes["delete"] = deleted
        if failed:
            raise _failure("\n".join(f"error: {urn.rsplit('::', 1)[-1]}: deleting failed: {why}"
                                      for urn, why in failed.items()))
        state.outputs = outputs
        state.last_update = datetime.now(UTC)
        return auto.UpResult("", "", self._summary("update", changes),
                             {k: auto.OutputValue(v, s) for k, (v, s) in outputs.items()})

    def preview(self, *args: Any, **kwargs: Any) -> auto.PreviewResult:
        self._call("preview", *args, **kwargs)
        live = self.state.engine
        scratch = Engine(state=copy.deepcopy(live.state),
                         old_inputs=copy.deepcopy(live.old_inputs),
                         old_provider=dict(live.old_provider),
                         old_dependencies=copy.deepcopy(live.old_dependencies),
                         known=dict(live.known), dry_run=True)
        run_program(scratch, self.name, self._config(), previous=self.state.outputs)
        self._steps(kwargs.get("on_event"), scratch, scratch.unregistered())
        self.state.previewed = dict(scratch.actions)
        changes: dict[str, int] = {}
        for action, _ in scratch.actions.values():
            changes[action] = changes.get(action, 0) + 1
        if scratch.unregistered():
            changes["delete"] = len(scratch.unregistered())
        return auto.PreviewResult("", "", changes)

    def preview_destroy(self, *args: Any, **kwargs: Any) -> auto.PreviewResult:
        self._call("preview_destroy", *args, **kwargs)
        return auto.PreviewResult("", "", {"delete": len(self.state.engine.state)})

    def refresh(self, *args: Any, **kwargs: Any) -> auto.RefreshResult:
        self._call("refresh", *args, **kwargs)
        with self._update() as state:
            self._read_back(state)
            count = len(state.engine.state)
        return auto.RefreshResult("", "", self._summary("refresh", {"same": count}))

    def destroy(self, *args: Any, **kwargs: Any) -> auto.DestroyResult:
        self._call("destroy", *args, **kwargs)
        with self._update() as state:
            return self._destroy(state, kwargs)

    def _destroy(self, state: StackState, kwargs: dict[str, Any]) -> auto.DestroyResult:
        """Every resource through its provider's delete, dependents first (the engine's
        ``ScheduleDeletes``); with ``continue_on_error`` on past a failure, keeping the failed
        ones and what they depend on, and failing at the end with an error naming each."""
        on_event: Callable[[Any], None] | None = kwargs.get("on_event")
        engine = state.engine
        before = len(engine.state)
        failed = engine.delete_resources(list(engine.state),
                                         go_on=bool(kwargs.get("continue_on_error")))
        for urn, why in failed.items():
            self._emit(on_event, urn, why)
        if failed:
            lines = [f"error: {urn.rsplit('::', 1)[-1]}: deleting failed: {why}"
                     for urn, why in failed.items()]
            raise _failure("\n".join(lines))
        state.outputs = {}
        state.last_update = datetime.now(UTC)
        return auto.DestroyResult("", "", self._summary(
            "destroy", {"delete": before - len(engine.state)}))

    @staticmethod
    def _steps(on_event: Callable[[Any], None] | None, engine: Engine,
               deleted: list[str]) -> None:
        """The engine's step events (``ResourcePreEvent``), as ``pulumi preview``/``up --json``
        stream them: one per resource that is not the same; a create-before-delete replace is
        the engine's three steps (``create-replacement``, ``replace``, ``delete-replaced``,
        pkg/engine/events.go), each with the keys that force it and the keys that differ."""
        if on_event is None:
            return
        for urn, (action, changed) in engine.actions.items():
            if action == "same":
                continue
            reg = engine.known.get(urn)
            kind = reg.type if reg is not None else ""
            forced = [k for k in changed if action == "replace" and _force_new(kind, k)]
            ops = (["create-replacement", "replace", "delete-replaced"] if action == "replace"
                   else [action])
            for op in ops:
                meta = events.StepEventMetadata(
                    op=events.OpType(op), urn=urn, type=kind, provider="",
                    keys=forced or None, diffs=list(changed) or None)
                on_event(events.EngineEvent(
                    sequence=0, timestamp=int(time.time()),
                    resource_pre_event=events.ResourcePreEvent(metadata=meta)))
        for urn in deleted:
            reg = engine.known.get(urn)
            meta = events.StepEventMetadata(op=events.OpType("delete"), urn=urn,
                                            type=reg.type if reg is not None else "",
                                            provider="")
            on_event(events.EngineEvent(sequence=0, timestamp=int(time.time()),
                                        resource_pre_event=events.ResourcePreEvent(meta)))

    @staticmethod
    def _emit(on_event: Callable[[Any], None] | None, urn: str, why: str) -> None:
        if on_event is None:
            return
        diag = events.DiagnosticEvent(message=f"deleting {urn.rsplit('::', 1)[-1]}: {why}",
                                      color="never", severity="error", urn=urn)
        on_event(events.EngineEvent(sequence=0, timestamp=int(time.time()),
                                    diagnostic_event=diag))
