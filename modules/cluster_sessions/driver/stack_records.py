"""What a stack's record in the backend says, for the verbs that only look (``status``,
``logs``, ``wait``, ``run``, ``ls``): the stack's identity (:func:`read_identity`) and whether
its last ``up`` finished (:func:`unfinished_up`).

Above the stack runner (:mod:`.stacks`: the project, the CLI, the workspace) that it reads the
backend through, and above :mod:`.stack_identity`, whose decision it applies; the runner
imports neither this module nor the verbs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.decisions import StackIdentity
from . import stacks as engine
from .errors import CommandError, Exit
from .stack_identity import identities
from .stack_settings import command_error_text


def read_identity(stack: str, starts: Sequence[Path]) -> StackIdentity | None:
    """The identity of ``stack`` in the configured backend, for a verb that only looks; None
    when the backend has no such stack (then no object on the pool is its). Raises
    CommandError 4 without the ``pulumi`` CLI or the project, 1 when the backend cannot be
    read, 2 for a kept value we did not write."""
    from pulumi import automation as auto

    project, settings, pulumi = engine.project_engine(
        starts, f"no Pulumi project {engine.PROJECT_NAME!r} (Pulumi.yaml) found: it says which "
        "stack's objects are this session's")
    workspace = engine.open_workspace(project, settings, pulumi)
    short = stack.rsplit("/", 1)[-1]
    try:
        if short not in {s.name for s in workspace.list_stacks()}:
            return None
        config = engine.recovered(workspace, stack, {
            k: v.value for k, v in workspace.get_all_config(stack).items()})
    except auto.errors.CommandError as exc:
        raise CommandError(f"could not read the config of stack {stack}: "
                           f"{command_error_text(exc)}", Exit.ENGINE) from None
    if config is None:  # its identity is unproven: nothing on the pool is known to be its
        return None
    return identities({stack: stack}, {stack: config}, "")[stack]


UNFINISHED = ("the last up did not finish (the stack holds {n} resource{s} and no outputs: it "
              "was interrupted)")


def looking_workspace(starts: Sequence[Path]) -> Any | None:
    """The project's workspace for a verb that only looks; None without the project or the
    CLI (such a look then says nothing). Raises what opening it raises."""
    project = engine.find_project(starts)
    pulumi = engine.find_pulumi(os.environ)
    if project is None or pulumi is None:
        return None
    return engine.open_workspace(project, engine.engine_settings(os.environ, project), pulumi)


def unfinished_up(stack: str, starts: Sequence[Path]) -> str | None:
    """Why the stack's record cannot be trusted as complete, the same words for ``status``
    and ``ls``: it holds resources but its last ``up`` recorded no outputs (Ctrl-C, a killed
    runner). None when it finished, holds nothing, or cannot be read (no CLI, no stack)."""
    try:
        workspace = looking_workspace(starts)
        if workspace is None:
            return None
        short = stack.rsplit("/", 1)[-1]
        summary = next((s for s in workspace.list_stacks() if s.name == short), None)
        if summary is None or not summary.resource_count:
            return None
        if "session" in workspace.stack_outputs(stack):
            return None
    except Exception:  # noqa: BLE001 # a look only: the other checks report the backend
        return None
    return unfinished_text(summary.resource_count)


def preempted_record(stack: str, starts: Sequence[Path]) -> dict | None:
    """The record a preemption wrote on the stack with its destroy (driver/ending.py), for
    ``status``; None when there is none or it cannot be read (no CLI, no stack)."""
    from ..core.names import config_key
    from .ending import PREEMPTED_KEY, read_preempted

    try:
        workspace = looking_workspace(starts)
        if workspace is None:
            return None
        short = stack.rsplit("/", 1)[-1]
        if short not in {s.name for s in workspace.list_stacks()}:
            return None
        value = workspace.get_all_config(stack).get(config_key(PREEMPTED_KEY))
    except Exception:  # noqa: BLE001 # a look only: the other checks report the backend
        return None
    return read_preempted(getattr(value, "value", value))


def unfinished_text(count: int) -> str:
    return UNFINISHED.format(n=count, s="" if count == 1 else "s")
