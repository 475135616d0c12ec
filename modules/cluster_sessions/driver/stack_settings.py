"""What the stack verbs decide without touching anything: stack names and config, where the
project and its state are, the CLI's settings (backend, passphrase), whether to ask, the
keyword arguments of each Automation API call, and how the engine's answer is summarised
(``--json``) or explained (failures). :mod:`.stacks` runs them.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from ..core.names import (
    DEFINITION_KEY,
    INDEX_KEY,
    POOL_DEFINITION_KEY,
    POOL_KEY,
    PROJECT,
    PROJECT_KEY,
    STACKS_DIR,
    config_key,
)
from .errors import CommandError, Exit

Print = Callable[[str], None]

VERBS = ("preview", "up", "destroy", "refresh")
PROJECT_NAME = PROJECT
CONFIG_DEFINITION = config_key(DEFINITION_KEY)
CONFIG_POOL = config_key(POOL_KEY)
CONFIG_INDEX = config_key(INDEX_KEY)
CONFIG_PROJECT = config_key(PROJECT_KEY)
CONFIG_POOL_DEFINITION = config_key(POOL_DEFINITION_KEY)
OWNER_KEYS = (CONFIG_DEFINITION, CONFIG_POOL_DEFINITION)
"""The config keys that say which file a stack is made from: a session's definition, or a
pool stack's pool file. One stack, one file."""
STATE_DIR = ".pulumi-state"
# Public on purpose: it lets a laptop or the lab run without setup, and protects nothing.
DEFAULT_PASSPHRASE = "cluster-sessions-local-insecure"
SECRET_MASK = "[secret]"
# Pulumi stack names: letters, digits, '-', '_', '.'; at most 100 characters. An organization
# and project may precede it (``org/project/stack``) for Pulumi Cloud backends.
STACK_PART = re.compile(r"[A-Za-z0-9_.-]{1,100}")
DIY_SCHEMES = ("file://", "s3://", "gs://", "azblob://", "postgres://")
CONFIRM = ("up", "destroy")

Print = Callable[[str], None]


# --- pure: names, paths, settings, arguments ---------------------------------------------------


def stack_name_for(session_name: str, override: str | None = None) -> str:
    """The stack for a session: its name (session names are valid stack names), or ``--stack``."""
    name = override if override is not None else session_name
    parts = name.split("/")
    if len(parts) not in (1, 3) or not all(STACK_PART.fullmatch(p) for p in parts):
        raise CommandError(
            f"--stack {name!r} is not a valid Pulumi stack name: use letters, digits, '-', '_' "
            "or '.', at most 100 characters, optionally as ORG/PROJECT/STACK",
            Exit.INVALID,
        )
    return name


def config_path(file: Path, stacks_dir: Path) -> str:
    """How the stack config names a file: relative to ``stacks/`` when inside it, else absolute.

    Relative paths keep the stack file portable across checkouts (CI, another operator).
    """
    resolved = file.expanduser().resolve()
    try:
        return resolved.relative_to(stacks_dir.resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def stack_config(definition: Path, pool: Path | None, project: Path,
                 index: int | None = None, governed: str | None = None
                 ) -> dict[str, str | None]:
    """The stack config a run sets; ``None`` means "remove the key" (no stale pool from before).
    ``index``: which of a ``count``'s sessions the stack runs; ``governed``: the project the
    run's session runs under (core.governance, checked with the operator's word): the program
    runs it as that project, as the operator's own (``default``: the default policy)."""
    stacks = project / STACKS_DIR
    config = {
        CONFIG_DEFINITION: config_path(definition, stacks),
        CONFIG_POOL: config_path(pool, stacks) if pool is not None else None,
        CONFIG_INDEX: str(index) if index is not None else None,
    }
    if governed is not None:
        config[CONFIG_PROJECT] = governed
    return config


def owner_conflict(stack: str, recorded: Mapping[str, str],
                   wanted: Mapping[str, str | None]) -> str | None:
    """Why a run that sets ``wanted`` must not take over ``stack``, whose config holds
    ``recorded``; None when the stack is new or made from the same file. A different
    definition that maps to the same stack (``name: sweep`` with ``count: 2`` and another
    file's ``name: sweep-2``) would otherwise replace the other session's containers.

    An empty value is no value: the real CLI's ``pulumi config --json`` (what
    ``get_all_config`` reads) lists every key ``Pulumi.yaml`` declares with its default, ``""``
    here, beside the stack's own."""
    mine = {k: wanted.get(k) or None for k in OWNER_KEYS}
    theirs = {k: recorded.get(k) or None for k in OWNER_KEYS}
    if not any(theirs.values()) or theirs == mine:
        return None
    other = theirs[CONFIG_DEFINITION] or f"pool file {theirs[CONFIG_POOL_DEFINITION]}"
    this = mine[CONFIG_DEFINITION] or f"pool file {mine[CONFIG_POOL_DEFINITION]}"
    return (f"stack {stack} was made from {other} (relative to stacks/ when inside it), not "
            f"{this}: one stack holds one definition's session. Destroy the other first "
            f"(sessionctl destroy {other}), or give this session another name (name:, or "
            "--stack NAME)")


def is_project_dir(path: Path) -> bool:
    settings = path / "Pulumi.yaml"
    if not settings.is_file():
        return False
    try:
        data = yaml.safe_load(settings.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get("name") == PROJECT_NAME


def find_project(starts: Iterable[Path]) -> Path | None:
    """The first directory holding this project's ``Pulumi.yaml``, walking up from each start."""
    for start in starts:
        start = start.expanduser().resolve()
        for candidate in (start, *start.parents):
            if is_project_dir(candidate):
                return candidate
    return None


def project_starts(definition: Path) -> list[Path]:
    """Where to look for the project: the definition's checkout, the cwd, this package's tree."""
    return [definition.expanduser().resolve().parent, Path.cwd(), Path(__file__).resolve().parent]


@dataclass(frozen=True)
class EngineSettings:
    """What the Pulumi CLI is run with. ``env`` may hold a passphrase: never print it."""

    backend_url: str
    default_backend: bool
    default_passphrase: bool
    env: dict[str, str] = field(repr=False)

    @property
    def state_dir(self) -> Path | None:
        """The local state directory to create, for the default backend only."""
        if self.default_backend:
            return Path(self.backend_url.removeprefix("file://"))
        return None


def engine_settings(environ: Mapping[str, str], project: Path,
                    python: str = sys.executable) -> EngineSettings:
    """Backend, passphrase and environment for the CLI, from the caller's environment."""
    url = environ.get("PULUMI_BACKEND_URL", "")
    default_backend = not url
    if default_backend:
        url = "file://" + (project.resolve() / STATE_DIR).as_posix()
    env = {
        "PULUMI_BACKEND_URL": url,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        # The program runs with this interpreter, so it sees the packages sessionctl sees.
        "PULUMI_PYTHON_CMD": environ.get("PULUMI_PYTHON_CMD", python),
        # The dynamic providers (session keys, swarm) run in a process of their own, which
        # must import cluster_sessions even where the package is not installed.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(project.resolve() / "modules"), environ.get("PYTHONPATH")) if p),
    }
    has_own = "PULUMI_CONFIG_PASSPHRASE" in environ or "PULUMI_CONFIG_PASSPHRASE_FILE" in environ
    default_passphrase = not has_own and url.startswith(DIY_SCHEMES)
    if default_passphrase:
        env["PULUMI_CONFIG_PASSPHRASE"] = DEFAULT_PASSPHRASE
    return EngineSettings(url, default_backend, default_passphrase, env)


PASSPHRASE_WARNING = (
    "warning: PULUMI_CONFIG_PASSPHRASE is not set, so this stack's secrets (the session's SSH "
    "private key) are encrypted with the documented built-in passphrase. It is public and "
    "protects nothing: fine for a laptop or the lab, not for state others can read. Set "
    "PULUMI_CONFIG_PASSPHRASE (the same value on every run) to use your own; a stack already "
    "created with the default keeps needing it until `pulumi stack change-secrets-provider "
    "passphrase`."
)


def confirmation(verb: str, yes: bool, json_mode: bool, interactive: bool) -> bool:
    """Whether to ask before applying; raises when nobody can be asked and ``--yes`` is absent."""
    if verb not in CONFIRM or yes:
        return False
    if json_mode:
        raise CommandError(f"{verb} --json does not prompt: add --yes to {verb} without a "
                           "confirmation", Exit.INVALID)
    if not interactive:
        raise CommandError(f"refusing to {verb} without a terminal to confirm on: add --yes to "
                           f"{verb} non-interactively (e.g. in CI)", Exit.INVALID)
    return True


# Pulumi's default parallelism is unbounded (the SDK's "2147483647"), and every concurrent
# Docker call of the provider to an agent reached over SSH is one more SSH connection to it
# (docker/cli's connection helper runs one `ssh` per HTTP connection); a stock sshd drops
# connections beyond MaxStartups (10) still in their handshake. On the lab, 11 creates at once
# on one agent failed with "kex_exchange_identification: Connection closed by remote host"
# (benchmarks/ready_lab.py). A stack with an agent over SSH runs 8 operations at a time; the
# engine's --parallel is one number for the whole stack, so 8 is also each agent's most.
SSH_PARALLEL = 8


def parallel_for(agents_over_ssh: int) -> int | None:
    """The engine's ``parallel`` for a stack with that many agents reached over SSH (None:
    Pulumi's default)."""
    return SSH_PARALLEL if agents_over_ssh else None


def call_kwargs(verb: str, *, json_mode: bool, color: bool, on_output: Print | None,
                on_error: Print | None, on_event: Callable[[Any], None] | None,
                message: str, diff: bool = False,
                parallel: int | None = None) -> dict[str, Any]:
    """Keyword arguments for ``Stack.<verb>`` (``preview``, ``up``, ``destroy``, ``refresh``,
    ``preview_destroy``)."""
    kwargs: dict[str, Any] = {
        "color": "always" if color and not json_mode else "never",
        "on_output": on_output,
        "on_error": on_error,
        "on_event": on_event,
    }
    kwargs["message"] = message
    if verb in ("up", "destroy", "refresh", "preview_destroy"):
        kwargs["show_secrets"] = False  # keep config secrets out of the returned summary
    if json_mode:
        kwargs["suppress_progress"] = True
    if diff:
        kwargs["diff"] = True
    if parallel is not None:
        kwargs["parallel"] = parallel
    if verb == "up":
        # read the containers back first: without it a container that died or was removed
        # stays "running" in the state and `up` changes nothing (pulumi up does not refresh)
        kwargs["refresh"] = True
    if verb == "destroy":
        # past what cannot be deleted now (an agent that does not answer): the rest goes, the
        # stack keeps the failed ones for the next destroy
        kwargs["continue_on_error"] = True
    return kwargs


def op_name(op: object) -> str:
    return str(op.value if isinstance(op, Enum) else op)


def change_counts(op_map: Mapping[object, int] | None) -> dict[str, int]:
    """``{"create": 3, "same": 1}`` from an OpMap whose keys may be ``OpType`` members."""
    return {op_name(k): int(v) for k, v in sorted((op_map or {}).items(), key=lambda i: str(i[0]))}


def masked_outputs(outputs: Mapping[str, Any] | None) -> dict[str, Any]:
    """Stack outputs for printing: secret ones replaced by ``[secret]``."""
    shown: dict[str, Any] = {}
    for key, out in sorted((outputs or {}).items()):
        secret = bool(getattr(out, "secret", False))
        shown[key] = SECRET_MASK if secret else getattr(out, "value", out)
    return shown


def install_instructions(sdk_version: str, docker_version: str, verbs: Sequence[str]) -> str:
    """Exactly how to get the CLI (exit 4), which ``verbs`` need it, and the one thing this
    machine cannot do."""
    archive = f"https://get.pulumi.com/releases/sdk/pulumi-v{sdk_version}-linux-x64.tar.gz"
    return "\n".join([
        "the pulumi CLI is missing: not on PATH and not in ~/.pulumi/bin.",
        f"These verbs need it (they read or change stacks through the Automation API): "
        f"{', '.join(verbs)}; every other verb works without it.",
        f"Install it, the version matching the pulumi SDK here ({sdk_version}):",
        f"  bash scripts/install-pulumi.sh {sdk_version}"
        "    # the release archive, SHA-256 checked, into ~/.pulumi/bin",
        f"  or: curl -fsSL https://get.pulumi.com | sh -s -- --version {sdk_version}"
        "    # Pulumi's installer",
        f"  or unpack {archive} and put its pulumi/ directory on PATH",
        "then check with `pulumi version`. The first engine run also fetches the docker provider "
        f"plugin (or: pulumi plugin install resource docker {docker_version}).",
        "Both come from get.pulumi.com and github.com; if they cannot be reached from here, copy "
        "the archive and ~/.pulumi/plugins over from a machine where they can.",
    ])


_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)+(?P<name>[A-Za-z_]\w*(?::|$))")


def without_tracebacks(lines: Sequence[str]) -> list[str]:
    """``lines`` with each Python traceback (what Pulumi's dynamic-provider host prints when
    one of our providers raises: pulumi/dynamic/__main__.py) folded to its last line, the
    exception, its module path left out (``agent agent1: ...`` says what failed; the frames
    are ours to read, not the user's)."""
    out: list[str] = []
    in_traceback = False
    for line in lines:
        if line.strip() == _TRACEBACK:
            in_traceback = True
            continue
        if in_traceback:
            if line[:1].isspace() or not line.strip():
                continue  # a frame, its source line, or a caret line
            in_traceback = False
            line = _EXCEPTION.sub(lambda m: m["name"], line, count=1)
        out.append(line)
    return out


def engine_error_message(errors: Sequence[str], stdout: Sequence[str], stderr: Sequence[str],
                         limit: int = 20) -> str:
    """The engine's own words for a failure: its error diagnostics, else its stderr, else the
    tail of its output; a provider's Python traceback folded to its exception."""
    chosen = list(dict.fromkeys(e.strip() for e in errors if e.strip()))
    if not chosen:
        chosen = [line for line in stderr if line.strip()]
    if not chosen:
        chosen = [line for line in stdout if line.strip()][-limit:]
    chosen = without_tracebacks([line for text in chosen for line in text.splitlines()])
    if len(chosen) > limit:
        chosen = chosen[:limit] + [f"... ({len(chosen) - limit} more lines)"]
    return "\n".join(chosen) or "the pulumi CLI failed without saying why"


def split_command_error(text: str) -> tuple[list[str], list[str]]:
    """stdout and stderr lines from the text of an Automation API ``CommandError``, whose
    message is ``"\\n code: N\\n stdout: ...\\n stderr: ..."`` (``CommandResult.__str__``)."""
    match = re.search(r"\n stdout: (?P<out>.*)\n stderr: (?P<err>.*)\Z", text, re.DOTALL)
    if not match:
        return [], [line for line in text.splitlines() if line.strip()]
    return match["out"].splitlines(), match["err"].splitlines()


def command_error_text(exc: BaseException) -> str:
    """What the CLI said of a failed Automation API call (its ``error:`` lines), without the
    SDK's ``code: N / stdout: / stderr:`` framing."""
    return engine_error_message([], *split_command_error(str(exc)))


def summary_document(verb: str, stack: str, session: str, backend: str | None, result: str, *,
                     changes: Mapping[str, int] | None = None,
                     outputs: Mapping[str, Any] | None = None,
                     steps: Sequence[Mapping[str, Any]] = (), error: str | None = None,
                     reason: str | None = None) -> dict[str, Any]:
    """The ``--json`` document: one per run, whatever the outcome."""
    doc: dict[str, Any] = {
        "verb": verb, "stack": stack, "session": session, "backend": backend, "result": result,
        "changes": dict(changes or {}), "outputs": dict(outputs or {}), "steps": list(steps),
    }
    if error is not None:
        doc["error"] = error
    if reason is not None:
        doc["reason"] = reason
    return doc


REPLACE_OPS = ("replace", "create-replacement", "delete-replaced", "discard-replaced")


def step_lines(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per resource the engine's steps touch, as ``pulumi preview --diff`` names
    them: the step (a replacement's three steps are one ``replace``), the kind and name, and
    what forces a replacement or what an update changes (pure)."""
    merged: dict[str, dict[str, Any]] = {}
    for step in steps:
        name = str(step.get("name", ""))
        row = merged.setdefault(name, {"op": step.get("op", ""), "type": step.get("type", ""),
                                       "keys": [], "diffs": []})
        if step.get("op") in REPLACE_OPS:
            row["op"] = "replace"
        for key in ("keys", "diffs"):
            source = "replace_keys" if key == "keys" else "diffs"
            row[key] += [k for k in step.get(source) or () if k not in row[key]]
    lines = []
    for name, row in merged.items():
        kind = str(row["type"]).rsplit(":", 1)[-1] or "resource"
        line = f"  {row['op']:<8} {kind} {name}"
        if row["op"] == "replace" and row["keys"]:
            line += f"  (replaced: {', '.join(row['keys'])} changed)"
        elif row["diffs"]:
            line += f"  ({', '.join(row['diffs'])} changed)"
        lines.append(line)
    return lines


class EventLog:
    """Collects what the engine reports as structured events: per-resource steps (for the
    ``--json`` summary and the PR comment) and error diagnostics (for the failure message)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        pre = getattr(event, "resource_pre_event", None)
        meta = getattr(pre, "metadata", None)
        if meta is not None:
            op = op_name(getattr(meta, "op", ""))
            urn = str(getattr(meta, "urn", ""))
            kind = str(getattr(meta, "type", ""))
            if op != "same" and kind != "pulumi:pulumi:Stack":
                step = {"op": op, "type": kind, "name": urn.rsplit("::", 1)[-1]}
                diffs = list(getattr(meta, "diffs", None) or [])
                if diffs:
                    step["diffs"] = diffs
                keys = list(getattr(meta, "keys", None) or [])
                if keys and op in REPLACE_OPS:
                    step["replace_keys"] = keys
                with self._lock:
                    self.steps.append(step)
        diag = getattr(event, "diagnostic_event", None)
        if diag is not None and getattr(diag, "severity", "") == "error":
            text = str(getattr(diag, "message", "")).strip()
            if text:
                with self._lock:
                    self.errors.append(text)
