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
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pulumi import automation as auto
from pulumi.automation import events
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import create_command_error

from .docker_builder import DockerBuilder
from .engine import Engine, Registration, run_program

ORDER = ("docker:index/container:Container", "docker:index/network:Network")


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

    def __init__(self) -> None:
        self.stacks: dict[str, StackState] = {}
        self.calls: list[str] = []

    # --- what driver/stacks.py's open_stack and open_workspace return -------------------------

    def open_stack(self, stack: str, project: Path, settings: Any, pulumi: Path | None,
                   create: bool = True) -> EmulatedStack:
        if stack not in self.stacks:
            if not create:
                raise auto.errors.StackNotFoundError(CommandResult(
                    "", f"error: no stack named '{stack}' found", 255))
            builder = DockerBuilder()
            engine = Engine(on_create=builder, on_update=builder.update, on_delete=builder.remove)
            self.stacks[stack] = StackState(stack, builder, engine)
        return EmulatedStack(self, self.stacks[stack])

    def open_workspace(self, project: Path, settings: Any, pulumi: Path | None) -> Backend:
        return self

    # --- auto.LocalWorkspace --------------------------------------------------------------------

    def list_stacks(self, *args: Any, **kwargs: Any) -> list[auto.StackSummary]:
        _bound(auto.LocalWorkspace, "list_stacks", *args, **kwargs)
        self.calls.append("list_stacks")
        return [auto.StackSummary(s.name, False, False, s.last_update,
                                  len(s.engine.state) + 1 if s.engine.state else 0)
                for s in self.stacks.values()]

    def stack_outputs(self, *args: Any, **kwargs: Any) -> dict[str, auto.OutputValue]:
        _bound(auto.LocalWorkspace, "stack_outputs", *args, **kwargs)
        name = inspect.signature(auto.LocalWorkspace.stack_outputs).bind(
            None, *args, **kwargs).arguments["stack_name"]
        self.calls.append(f"stack_outputs {name}")
        return {k: auto.OutputValue(v, secret)
                for k, (v, secret) in self.stacks[name].outputs.items()}

    def get_all_config(self, *args: Any, **kwargs: Any) -> dict[str, auto.ConfigValue]:
        _bound(auto.LocalWorkspace, "get_all_config", *args, **kwargs)
        name = inspect.signature(auto.LocalWorkspace.get_all_config).bind(
            None, *args, **kwargs).arguments["stack_name"]
        self.calls.append(f"get_all_config {name}")
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

    def up(self, *args: Any, **kwargs: Any) -> auto.UpResult:
        self._call("up", *args, **kwargs)
        engine = self.state.engine
        try:
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
        return auto.RefreshResult("", "", self._summary(
            "refresh", {"same": len(self.state.engine.state)}))

    def destroy(self, *args: Any, **kwargs: Any) -> auto.DestroyResult:
        self._call("destroy", *args, **kwargs)
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
