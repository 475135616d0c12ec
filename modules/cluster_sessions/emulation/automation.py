"""A stand-in for the Automation API's stacks and workspace, so that ``sessionctl``'s engine
verbs run for real where the ``pulumi`` CLI is missing (tests, benchmarks; not the product).

What stays real: ``driver/stacks.py`` from the arguments to the summary, the program
(``__main__.py``, run under the engine-backed mocks of :mod:`.engine`) and the containers and
networks it declares (built by :class:`.docker_builder.DockerBuilder` on real engines). What is
stood in for: the CLI process. Every call is bound to the installed SDK's own signature
(``auto.Stack.up``, ``auto.LocalWorkspace.list_stacks`` ...), so a keyword the SDK does not
take fails here as it would there, and results are the SDK's own classes.

``destroy`` does what the CLI does: dependents before what they depend on, each through the
engine it was created on; with ``continue_on_error`` it goes on past a failure, never deletes
what a failed resource depends on, keeps the failed ones in the stack and ends with an error
naming them (``error`` diagnostics on the event stream, as the CLI's).

With a ``directory`` (the file backend's), stacks outlive the process, as the DIY backend's
checkpoints do: each stack is saved before every resource step and at the end of a run, so a
run killed half-way leaves what it finished (an object created but not yet recorded is on the
engine only, as a pending create is dropped by the CLI's next run), and a second process sees
it. Updates take the DIY backend's lock file
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
import pickle
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pulumi import automation as auto
from pulumi.automation import events
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import create_command_error

from ..core.names import PROJECT as PROJECT_NAME
from . import connhelper
from .docker_builder import DockerBuilder
from .engine import Engine, Registration, run_program

ORDER = ("docker:index/container:Container", "docker:index/network:Network")
LOCKED = ("error: the stack is currently locked by {n} lock(s). Either wait for the other "
          "process(es) to end or delete the lock file with `pulumi cancel`.")


def _bound(cls: type, name: str, *args: Any, **kwargs: Any) -> None:
    """Fail as the SDK would on a call it does not take (TypeError names the argument)."""
    inspect.signature(getattr(cls, name)).bind(None, *args, **kwargs)


def _failure(stderr: str, code: int = 255) -> auto.errors.CommandError:
    return create_command_error(CommandResult("", stderr, code))


@dataclass
class StackState:
    name: str
    builder: DockerBuilder
    engine: Engine
    config: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, tuple[Any, bool]] = field(default_factory=dict)
    registrations: dict[str, Registration] = field(default_factory=dict)
    last_update: datetime | None = None


class Backend:
    """The state backend: stacks by name, each with the containers its ``up`` built."""

    def __init__(self, directory: Path | None = None) -> None:
        self.stacks: dict[str, StackState] = {}
        self.calls: list[str] = []
        self.directory = directory

    # --- the file backend: checkpoints and locks --------------------------------------------

    def _checkpoint(self, stack: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / ".pulumi" / "stacks" / PROJECT_NAME / f"{stack}.emulated"

    def lock_dir(self, stack: str) -> Path:
        assert self.directory is not None
        return self.directory / ".pulumi" / "locks" / "organization" / PROJECT_NAME / stack

    def save(self, state: StackState) -> None:
        path = self._checkpoint(state.name)
        if path is None:
            return
        engine, builder = state.engine, state.builder
        # each resource is checkpointed with its registration (type, dependencies), as the
        # CLI's snapshot records it with the resource: a destroy after a killed run needs them
        state.registrations.update({r.urn: r for r in list(engine.registrations)
                                    if r.urn in engine.state})
        doc = {"config": state.config, "outputs": state.outputs,
               "registrations": state.registrations, "last_update": state.last_update,
               "state": engine.state, "old_inputs": engine.old_inputs,
               "old_provider": engine.old_provider, "old_dependencies": engine.old_dependencies,
               "made": builder.made, "provider_configs": builder.provider_configs}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(doc))
        tmp.replace(path)  # a kill never leaves half a checkpoint

    def _load(self, stack: str) -> StackState | None:
        path = self._checkpoint(stack)
        if path is None or not path.exists():
            return None
        doc = pickle.loads(path.read_bytes())
        state = self._new_state(stack)
        state.config, state.outputs = doc["config"], doc["outputs"]
        state.registrations, state.last_update = doc["registrations"], doc["last_update"]
        engine = state.engine
        engine.state, engine.old_inputs = doc["state"], doc["old_inputs"]
        engine.old_provider, engine.old_dependencies = doc["old_provider"], doc["old_dependencies"]
        state.builder.made = doc["made"]
        state.builder.provider_configs = doc["provider_configs"]
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
        if stack not in self.stacks:
            loaded = self._load(stack)
            if loaded is None and not create:
                raise auto.errors.StackNotFoundError(CommandResult(
                    "", f"error: no stack named '{stack}' found", 255))
            self.stacks[stack] = loaded or self._new_state(stack)
            self.save(self.stacks[stack])
        return EmulatedStack(self, self.stacks[stack])

    def open_workspace(self, project: Path, settings: Any, pulumi: Path | None) -> Backend:
        return self

    # --- auto.LocalWorkspace --------------------------------------------------------------------

    def _load_all(self) -> None:
        """Every stack the file backend holds, as the CLI lists them: also those another
        process made (or a killed run left) since this one started."""
        if self.directory is None:
            return
        found = self.directory / ".pulumi" / "stacks" / PROJECT_NAME
        for path in sorted(found.glob("*.emulated")) if found.is_dir() else ():
            if path.stem not in self.stacks:
                loaded = self._load(path.stem)
                if loaded is not None:
                    self.stacks[path.stem] = loaded

    def list_stacks(self, *args: Any, **kwargs: Any) -> list[auto.StackSummary]:
        _bound(auto.LocalWorkspace, "list_stacks", *args, **kwargs)
        self.calls.append("list_stacks")
        self._load_all()
        return [auto.StackSummary(s.name, False, False, s.last_update,
                                  len(s.engine.state) + 1 if s.engine.state else 0)
                for s in self.stacks.values()]

    def stack_outputs(self, *args: Any, **kwargs: Any) -> dict[str, auto.OutputValue]:
        _bound(auto.LocalWorkspace, "stack_outputs", *args, **kwargs)
        name = inspect.signature(auto.LocalWorkspace.stack_outputs).bind(
            None, *args, **kwargs).arguments["stack_name"]
        self.calls.append(f"stack_outputs {name}")
        self._load_all()
        return {k: auto.OutputValue(v, secret)
                for k, (v, secret) in self.stacks[name].outputs.items()}

    def get_all_config(self, *args: Any, **kwargs: Any) -> dict[str, auto.ConfigValue]:
        _bound(auto.LocalWorkspace, "get_all_config", *args, **kwargs)
        name = inspect.signature(auto.LocalWorkspace.get_all_config).bind(
            None, *args, **kwargs).arguments["stack_name"]
        self.calls.append(f"get_all_config {name}")
        self._load_all()
        return {k: auto.ConfigValue(v) for k, v in self.stacks[name].config.items()}

    def remove_all(self) -> list[str]:
        """Delete every stack's resources (test teardown), whatever state they are in; the
        names of what could not be deleted."""
        for state in self.stacks.values():
            # containers first: a network cannot go while one is attached
            made = state.builder.made
            for urn in sorted(made, key=lambda urn: made[urn][0] != "container"):
                with contextlib.suppress(Exception):  # an engine a test stopped
                    state.builder.remove(urn)
            state.builder.close()
        return [urn.rsplit("::", 1)[-1] for state in self.stacks.values()
                for urn in state.builder.made]


class EmulatedStack:
    """What ``driver/stacks.py`` calls on an ``auto.Stack``."""

    def __init__(self, backend: Backend, state: StackState) -> None:
        self.backend = backend
        self.state = state
        self.name = state.name

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        _bound(auto.Stack, name, *args, **kwargs)
        self.backend.calls.append(f"{name} {self.name}")

    def set_config(self, *args: Any, **kwargs: Any) -> None:
        self._call("set_config", *args, **kwargs)
        key, value = args[0], args[1]
        self.state.config[key] = value.value

    def remove_config(self, *args: Any, **kwargs: Any) -> None:
        self._call("remove_config", *args, **kwargs)
        if self.state.config.pop(args[0], None) is None:
            raise _failure(f"configuration key '{args[0]}' not found")

    def outputs(self) -> dict[str, auto.OutputValue]:
        self._call("outputs")
        return {k: auto.OutputValue(v, s) for k, (v, s) in self.state.outputs.items()}

    def _summary(self, kind: str, changes: dict[str, int]) -> auto.UpdateSummary:
        now = datetime.now(UTC)
        return auto.UpdateSummary(kind, now, "", {}, {}, "succeeded", now,
                                  resource_changes=changes)

    def _config(self) -> dict[str, str]:
        return {k: v for k, v in self.state.config.items() if v != ""}

    def export_stack(self, *args: Any, **kwargs: Any) -> auto.Deployment:
        """The checkpoint's resources with the IDs the provider returned."""
        self._call("export_stack", *args, **kwargs)
        made = self.state.builder.made
        resources = [{"urn": urn, "type": self.state.registrations[urn].type
                      if urn in self.state.registrations else "",
                      "id": made[urn][2] if urn in made else id_}
                     for urn, (id_, _outs) in self.state.engine.state.items()]
        return auto.Deployment(version=3, deployment={"resources": resources})

    def up(self, *args: Any, **kwargs: Any) -> auto.UpResult:
        self._call("up", *args, **kwargs)
        with self.backend.locked(self.name):
            try:
                return self._up(kwargs)
            finally:
                self.backend.save(self.state)

    def _read_back(self) -> None:
        """The provider's Read of every container (``up --refresh``): gone leaves the state;
        not running reads back ``must_run=false``."""
        import docker.errors

        engine, made = self.state.engine, self.state.builder.made
        for urn, (kind, config, object_id) in list(made.items()):
            if kind != "container" or urn not in engine.state:
                continue
            conn = connhelper.connect(config, timeout=15)
            try:
                running = conn.client.api.inspect_container(object_id)["State"]["Running"]
            except docker.errors.NotFound:
                del made[urn]
                engine.state.pop(urn)
                continue
            finally:
                conn.close()
            if not running:
                id_, outs = engine.state[urn]
                engine.state[urn] = (id_, {**outs, "mustRun": False})

    def _up(self, kwargs: dict[str, Any]) -> auto.UpResult:
        engine = self.state.engine
        try:
            if kwargs.get("refresh"):
                self._read_back()
            outputs = run_program(engine, self.name, self._config())
        except Exception as exc:  # the program failed: the CLI exits non-zero with its error
            raise _failure(f"error: {exc}") from None
        if engine.failed:  # what the provider refused: the CLI reports each and exits non-zero
            raise _failure("\n".join(f"error: {urn.rsplit('::', 1)[-1]}: creating failed: {why}"
                                      for urn, why in engine.failed.items()))
        self.state.outputs = outputs
        self.state.registrations = {r.urn: r for r in self.state.engine.registrations}
        self.state.last_update = datetime.now(UTC)
        changes: dict[str, int] = {}
        for action, _ in self.state.engine.actions.values():
            changes[action] = changes.get(action, 0) + 1
        return auto.UpResult("", "", self._summary("update", changes),
                             {k: auto.OutputValue(v, s) for k, (v, s) in outputs.items()})

    def preview(self, *args: Any, **kwargs: Any) -> auto.PreviewResult:
        self._call("preview", *args, **kwargs)
        live = self.state.engine
        scratch = Engine(state=copy.deepcopy(live.state),
                         old_inputs=copy.deepcopy(live.old_inputs),
                         old_provider=dict(live.old_provider),
                         old_dependencies=copy.deepcopy(live.old_dependencies))
        run_program(scratch, self.name, self._config())
        changes: dict[str, int] = {}
        for action, _ in scratch.actions.values():
            changes[action] = changes.get(action, 0) + 1
        return auto.PreviewResult("", "", changes)

    def preview_destroy(self, *args: Any, **kwargs: Any) -> auto.PreviewResult:
        self._call("preview_destroy", *args, **kwargs)
        return auto.PreviewResult("", "", {"delete": len(self.state.engine.state)})

    def refresh(self, *args: Any, **kwargs: Any) -> auto.RefreshResult:
        self._call("refresh", *args, **kwargs)
        with self.backend.locked(self.name):
            self._read_back()
            self.backend.save(self.state)
        return auto.RefreshResult("", "", self._summary(
            "refresh", {"same": len(self.state.engine.state)}))

    def destroy(self, *args: Any, **kwargs: Any) -> auto.DestroyResult:
        self._call("destroy", *args, **kwargs)
        with self.backend.locked(self.name):
            try:
                return self._destroy(kwargs)
            finally:
                self.backend.save(self.state)

    def _destroy(self, kwargs: dict[str, Any]) -> auto.DestroyResult:
        on_event: Callable[[Any], None] | None = kwargs.get("on_event")
        go_on = bool(kwargs.get("continue_on_error"))
        state, regs = self.state.engine.state, self.state.registrations
        failed: dict[str, str] = {}
        kept: set[str] = set()
        deleted = 0

        def rank(urn: str) -> int:
            kind = regs[urn].type if urn in regs else ""
            return ORDER.index(kind) if kind in ORDER else len(ORDER)

        for urn in sorted(state, key=rank):
            if failed and not go_on:
                break
            if urn in kept:
                continue
            try:
                self.state.builder.remove(urn)
            except Exception as exc:  # what the provider says when its engine does not answer
                failed[urn] = f"{type(exc).__name__}: {exc}"
                kept.update(self._needed_by(urn))
                self._emit(on_event, urn, failed[urn])
                continue
            del state[urn]
            deleted += 1
        if failed:
            lines = [f"error: {urn.rsplit('::', 1)[-1]}: deleting failed: {why}"
                     for urn, why in failed.items()]
            raise _failure("\n".join(lines))
        self.state.outputs = {}
        return auto.DestroyResult("", "", self._summary("destroy", {"delete": deleted}))

    def _needed_by(self, urn: str) -> set[str]:
        """What ``urn`` depends on, transitively (its network, its provider): kept with it."""
        regs = self.state.registrations
        seen: set[str] = set()
        todo = [urn]
        while todo:
            reg = regs.get(todo.pop())
            if reg is None:
                continue
            for dep in (*reg.dependencies, reg.provider_urn, reg.parent):
                if dep and dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    @staticmethod
    def _emit(on_event: Callable[[Any], None] | None, urn: str, why: str) -> None:
        if on_event is None:
            return
        diag = events.DiagnosticEvent(message=f"deleting {urn.rsplit('::', 1)[-1]}: {why}",
                                      color="never", severity="error", urn=urn)
        on_event(events.EngineEvent(sequence=0, timestamp=int(time.time()),
                                    diagnostic_event=diag))
