"""Engine verbs: ``sessionctl preview|up|destroy|refresh FILE`` through ``pulumi.automation``.

The driver runs the same Pulumi program a user runs with ``pulumi up -s <stack>``: the project
directory (the one holding ``Pulumi.yaml``) is the Automation API's ``work_dir``, the stack is
named after the session, and the stack's config names the definition
(``cluster-sessions:definition``, relative to ``stacks/`` when the file is inside it) and, with
``--pool``, the pool (``cluster-sessions:pool``). Nothing here builds resources.

Order of a run, so that each failure has one exit code and nothing reaches the engine early:

1. load and validate the definition and its pool, plan it      -> 2 invalid
2. ``preview``/``up`` of a pending plan                        -> 3, before any engine call
3. ``up``/``destroy`` without ``--yes`` and without a terminal -> 2 (nobody to confirm)
4. prerequisites: the ``pulumi`` CLI, and a Docker Engine on each ``unix://`` agent the plan
   uses; all missing ones are reported together                -> 4
5. the engine: create or select the stack, set its config, run the verb -> 0, or 1 on failure

Decisions (README "Engine verbs" repeats them for users):

- Backend: ``PULUMI_BACKEND_URL`` if set, else ``file://<project>/.pulumi-state`` (created on
  first use, git-ignored). Machines that apply from CI need a backend that outlives the
  checkout (a shared directory, S3, Pulumi Cloud) - see examples/ci/README.md.
- Passphrase (DIY backends): ``PULUMI_CONFIG_PASSPHRASE`` or ``PULUMI_CONFIG_PASSPHRASE_FILE``
  if set, else :data:`DEFAULT_PASSPHRASE`, announced once on stderr as insecure: it is public,
  so it protects nothing. It keeps the stack's secrets (the session's SSH key) readable by the
  next run on the same machine; a stack created with it keeps needing it until changed with
  ``pulumi stack change-secrets-provider passphrase``.
- Only ``unix://`` agents are checked for a Docker Engine before the engine runs (a socket on
  this machine: cheap, and its absence is a missing prerequisite, exit 4). ``ssh://`` and
  ``tcp://`` agents are remote: the docker provider reports them, exit 1.
- ``destroy`` and ``refresh`` do not refuse a pending plan: they do not run the program's
  placement, and a definition that grew beyond its pool must still be destroyable.
- ``up`` and ``destroy`` confirm on a terminal (after a preview); without a terminal they need
  ``--yes``. ``--json`` never prompts, so it needs ``--yes`` for them too. Declining exits 1
  (nothing was applied), as ``terraform apply`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shlex
import shutil
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ..agents.capacity import preflight
from ..agents.cleanup import sweep
from ..agents.early_limits import early_pids_limits
from ..agents.folders import bind_refusals, folder_refusals, volume_refusals
from ..agents.pool_ledger import Ledger, PoolBusy
from ..agents.reach import LOCAL, SSH, reach_of
from ..core.decisions import (
    KEPT_OUTPUT,
    StackIdentity,
    carried,
    decide_expiry,
    kept_placement,
    labelled,
    recover_kept,
)
from ..core.errors import ClusterSessionsError
from ..core.governance import lifetime_of
from ..core.loader import Loaded
from ..core.names import (
    CONFIG_NAMESPACE,
    DEFAULT_DOCKER_HOSTS,
    DEFINITION_KEY,
    DOCKER_CLIENT_ENV,
    EXPIRES_KEY,
    IMAGE_KEY,
    PLACEMENT_KEY,
    SERVICE_PORTS_KEY,
    STACK_ID_KEY,
    STACK_ID_LABEL,
    STACKS_DIR,
    config_key,
)
from ..core.plan import ClusterPlan, with_expiry, with_image
from ..core.spec import DEFAULT_PROJECT, Agent, Pool, clean_target
from ..core.terminal import printable
from . import ending, service_ports, stack_identity
from .errors import CommandError, Exit
from .placing import Preemption, parse_duration, placed, recorded_placements
from .session_args import EPILOG, add_session_args, needs_pulumi, selected
from .stack_lock import StackBusy, stack_lock
from .stack_settings import (
    CONFIRM,
    PASSPHRASE_WARNING,
    PROJECT_NAME,
    STATE_DIR,
    VERBS,
    EngineSettings,
    EventLog,
    call_kwargs,
    change_counts,
    command_error_text,
    config_path,
    confirmation,
    engine_error_message,
    engine_settings,
    find_project,
    install_instructions,
    masked_outputs,
    owner_conflict,
    parallel_for,
    project_starts,
    split_command_error,
    stack_config,
    stack_name_for,
    step_lines,
    summary_document,
)

# --- effects: the machine ----------------------------------------------------------------------


def package_version(name: str, fallback: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return fallback


def how_to_install() -> str:
    from .verbs import pulumi_verbs  # the verbs' own modules import this one

    return install_instructions(package_version("pulumi", "3.272.0"),
                                package_version("pulumi-docker", "5.2.0"), pulumi_verbs())


def find_pulumi(environ: Mapping[str, str]) -> Path | None:
    """The CLI on PATH, else where the official installer puts it."""
    found = shutil.which("pulumi", path=environ.get("PATH", os.defpath))
    if found:
        return Path(found)
    home = Path(environ.get("PULUMI_HOME") or Path(environ.get("HOME", "~")) / ".pulumi")
    installed = home.expanduser() / "bin" / "pulumi"
    return installed if installed.is_file() and os.access(installed, os.X_OK) else None


def project_engine(starts: Sequence[Path], missing: str) -> tuple[Path, EngineSettings, Path]:
    """The project found from ``starts``, its engine settings and the ``pulumi`` CLI, for a
    verb that reads the backend; CommandError 4 without the project (``missing`` says what it
    is for) or the CLI (how to install it)."""
    project = find_project(starts)
    if project is None:
        raise CommandError(missing, Exit.MISSING)
    settings = engine_settings(os.environ, project)
    pulumi = find_pulumi(os.environ)
    if pulumi is None:
        raise CommandError(how_to_install(), Exit.MISSING)
    return project, settings, pulumi


def docker_answers(agent: Agent, timeout: float = 5) -> str | None:
    """``None`` when the agent's Docker Engine answers (asked through its connector), else why
    not."""
    from ..agents.connectors import connector_for

    reach = reach_of(agent)
    if reach.kind == LOCAL and reach.socket and not Path(reach.socket).exists():
        return f"{reach.socket} does not exist"
    connector = connector_for(agent, timeout=timeout)
    try:
        client = connector.docker_client()
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # any failure to reach it means "no engine here"
        return f"{type(exc).__name__}: {exc}"
    finally:
        connector.close()
    return None


def start_hint(docker_host: str) -> str:
    if docker_host in DEFAULT_DOCKER_HOSTS:
        return "start it (as root: scripts/ensure-docker.sh, or `systemctl start docker`)"
    return ("start the engine serving that socket (the lab pool's agents: `sessionctl lab up`)")


def unreachable_local_agents(plan: ClusterPlan, loaded: Loaded,
                             ping: Callable[[Agent], str | None] = docker_answers) -> list[str]:
    """One message per ``unix://`` agent of the plan whose engine does not answer."""
    missing = []
    for name in plan.agents:
        agent = loaded.pool.agent(name)
        if reach_of(agent).kind == LOCAL:  # on this machine
            why = ping(agent)
            if why:
                missing.append(f"agent {name}: no Docker Engine answers on "
                               f"{agent.docker_host} ({why}); {start_hint(agent.docker_host)}")
    return missing


def cli_command(pulumi: Path | None) -> Any:
    """The CLI the workspace runs (:mod:`.pulumi_cli`: Ctrl-C passed on, the CLI waited for):
    ``pulumi`` from ``PATH``, or the installed one that is not on it (``~/.pulumi/bin``). One
    per CLI and process: making one runs ``pulumi version`` (a process), and a verb opens a
    workspace or stack several times."""
    found = shutil.which("pulumi")
    root = str(pulumi.parent.parent) if pulumi is not None and found != str(pulumi) else None
    return _command_for(root, found)


@functools.lru_cache(maxsize=8)
def _command_for(root: str | None, found: str | None) -> Any:
    from . import pulumi_cli

    return pulumi_cli.InterruptibleCommand(root=root)  # None: `pulumi` from PATH (``found``)


def open_stack(stack: str, project: Path, settings: EngineSettings, pulumi: Path | None,
               create: bool = True) -> Any:
    """Create or select the stack of the local program in ``project``.

    The Automation API finds the CLI when the workspace is made; a missing CLI surfaces here as
    ``FileNotFoundError`` and becomes exit 4, whatever the pre-check said.
    """
    from pulumi import automation as auto

    try:
        opts = auto.LocalWorkspaceOptions(env_vars=settings.env,
                                          pulumi_command=cli_command(pulumi))
        if create:
            return auto.create_or_select_stack(stack, work_dir=str(project), opts=opts)
        return auto.select_stack(stack, work_dir=str(project), opts=opts)
    except FileNotFoundError as exc:
        if "pulumi" in str(exc) or exc.filename and "pulumi" in str(exc.filename):
            raise CommandError(how_to_install(), Exit.MISSING) from None
        raise
    except auto.InvalidVersionError as exc:
        raise CommandError(f"the pulumi CLI is not usable by the SDK: {exc}\n"
                           + how_to_install(), Exit.MISSING) from None


def open_workspace(project: Path, settings: EngineSettings, pulumi: Path | None) -> Any:
    """The project's workspace (``list_stacks``, ``stack_outputs``) on the configured backend."""
    from pulumi import automation as auto

    try:
        return auto.LocalWorkspace(work_dir=str(project), env_vars=settings.env,
                                   pulumi_command=cli_command(pulumi))
    except FileNotFoundError:
        raise CommandError(how_to_install(), Exit.MISSING) from None
    except auto.InvalidVersionError as exc:
        raise CommandError(f"the pulumi CLI is not usable by the SDK: {exc}\n"
                           + how_to_install(), Exit.MISSING) from None


def apply_config(stack: Any, config: Mapping[str, str | None]) -> None:
    """The stack's config as ``config`` says (``None``: not set), in one CLI call for what is
    set and one for what is removed: each call is a ``pulumi`` process (0.1-0.3 s), and an
    ``up`` keeps about ten keys (docs/benchmarks.md). ``config rm-all`` of a key not set
    leaves it so (the CLI's ``config.Map.Remove``)."""
    from pulumi import automation as auto

    values = {key: auto.ConfigValue(value=value) for key, value in config.items()
              if value is not None}
    if values:
        stack.set_all_config(values)
    removed = [key for key, value in config.items() if value is None]
    if removed:
        stack.remove_all_config(removed)


class Terminal:
    """Where engine output goes: streamed live (stdout/stderr) or only collected (``--json``)."""

    def __init__(self, quiet: bool, out: Any = None):
        self.quiet = quiet
        self.out_stream = out  # None: stdout; ``run --json`` streams to stderr (one document)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._lock = threading.Lock()

    def out(self, line: str) -> None:
        with self._lock:
            self.stdout.append(line)
            if not self.quiet:
                print(line, file=self.out_stream or sys.stdout, flush=True)

    def err(self, line: str) -> None:
        with self._lock:
            self.stderr.append(line)
            if not self.quiet:
                print(line, file=sys.stderr, flush=True)


_warned_passphrase = False


def warn_passphrase_once(settings: EngineSettings) -> None:
    global _warned_passphrase
    if settings.default_passphrase and not _warned_passphrase:
        _warned_passphrase = True
        print(f"sessionctl: {PASSPHRASE_WARNING}", file=sys.stderr)


def ask(question: str) -> bool:
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def emit(doc: Mapping[str, Any]) -> None:
    json.dump(doc, sys.stdout, indent=2, ensure_ascii=False, default=str)
    print()


# --- the verb ----------------------------------------------------------------------------------


class StackFailed(CommandError):
    """One stack's run failed; ``doc`` is its ``--json`` summary."""

    def __init__(self, message: str, code: Exit, doc: dict[str, Any]):
        super().__init__(message, code)
        self.doc = doc


@dataclass(frozen=True)
class Prepared:
    """What every run needs once its checks passed: the project, the CLI and its settings."""

    project: Path
    settings: EngineSettings
    pulumi: Path | None
    ask_first: bool


def prepare(verb: str, args: argparse.Namespace, starts: Sequence[Path], about: str,
            report: Callable[..., None], more_missing: Callable[[], list[str]] = list
            ) -> Prepared:
    """The checks every engine verb makes, in order, before anything reaches the engine
    (after dropping the caller's Docker client settings): the project (4), the ``pulumi`` CLI
    and ``more_missing`` (4, all together), a confirmation that can be asked for (2).
    ``report(result, backend=..., error=...)`` writes the ``--json`` document of a failure."""
    drop_docker_client_env(os.environ)
    project = find_project(starts)
    if project is None:
        raise CommandError(f"no Pulumi project {PROJECT_NAME!r} (Pulumi.yaml) found above "
                           f"{about}, the current directory or the installed package",
                           Exit.MISSING)
    settings = engine_settings(os.environ, project)
    pulumi = find_pulumi(os.environ)
    missing = ([] if pulumi is not None else [how_to_install()]) + more_missing()
    if missing:
        report("missing-prerequisite", backend=settings.backend_url, error="\n".join(missing))
        raise CommandError("\n".join(missing), Exit.MISSING)
    # after the prerequisites: a missing CLI is exit 4 whether or not --yes was given
    try:
        ask_first = confirmation(verb, args.yes, args.json, sys.stdin.isatty())
    except CommandError as exc:  # --json promises one document, whatever the outcome
        report("needs-confirmation", backend=settings.backend_url, error=str(exc))
        raise
    return Prepared(project, settings, pulumi, ask_first)


def started(prepared: Prepared) -> None:
    """Just before the first engine call: the default backend's directory, the warning."""
    if prepared.settings.state_dir is not None:
        prepared.settings.state_dir.mkdir(parents=True, exist_ok=True)
    warn_passphrase_once(prepared.settings)


def drop_docker_client_env(environ: MutableMapping[str, str]) -> list[str]:
    """Remove what would steer a Docker client elsewhere than the pool says (``DOCKER_HOST``,
    ``DOCKER_CONTEXT``, ``DOCKER_CERT_PATH``, ``DOCKER_TLS_VERIFY``, ...) from the environment
    the ``pulumi`` CLI, its providers and our own clients inherit (the Automation API passes
    the whole process environment on), and say so once. Returns the names removed."""
    dropped = [k for k in DOCKER_CLIENT_ENV if k in environ]
    for key in dropped:
        del environ[key]
    if dropped:
        print(f"sessionctl: ignoring {', '.join(dropped)} from the environment: a session goes "
              "where its pool says, whatever the shell points Docker at", file=sys.stderr)
    return dropped


@dataclass(frozen=True)
class Target:
    """One stack a verb runs on: a session's, or a pool's (``sessionctl pool up``)."""

    stack: str
    label: str  # what the summary and messages name: the session, or "pool NAME"
    config: Mapping[str, str | None]
    message: str  # the update's message in the stack's history
    up_hint: str  # what to run when the stack does not exist
    # after a destroy: what state forgot (raises StackFailed), and what to say when the
    # destroy could not finish (returns the message)
    after_destroy: Callable[[Callable[..., dict[str, Any]]], None] | None = None
    partly_destroyed: Callable[[str], str] | None = None
    before_up: Callable[..., None] | None = None  # given the stack and verb, before up/destroy
    # given the plan as placed and pinned, the context ``up`` itself runs in (a session's:
    # its pids limits as soon as its containers exist, agents/early_limits.py)
    while_up: Callable[[ClusterPlan], contextlib.AbstractContextManager] | None = None
    parallel: int | None = None  # the engine's, for every verb (stack_settings.parallel_for)


def cmd_stack(args: argparse.Namespace) -> int:
    verb = args.verb
    definition = Path(args.file)
    sel = selected(args)  # DefinitionError -> exit 2 in cli.main
    if args.stack is not None:
        sel.one("--stack names one stack")
    stacks = {plan.name: stack_name_for(plan.name, args.stack) for _, plan in sel.chosen}
    docs: list[dict[str, Any]] = []

    def report_all(result: str, **extra: Any) -> None:
        docs[:] = [summary_document(verb, stacks[p.name], p.name, extra.get("backend"), result,
                                    **{k: v for k, v in extra.items() if k != "backend"})
                   for _, p in sel.chosen]
        emit_docs()

    def emit_docs() -> None:
        if args.json:
            emit(docs[0] if len(docs) == 1 else
                 {"verb": verb, "count": len(sel.plans), "sessions": docs})

    pending = sel.pending
    if pending is not None:
        if verb in ("preview", "up"):
            report_all("pending", reason=pending.reason)
            raise CommandError(f"{definition}: pending: {pending.reason}; nothing was sent to "
                               "the engine", Exit.PENDING)
        print(f"sessionctl {verb}: note: {definition} is pending now ({pending.reason}); "
              f"{verb} works on the stack's recorded state", file=sys.stderr)

    def local_engines() -> list[str]:
        missing: list[str] = []
        if verb != "destroy":  # destroy goes on past an agent that does not answer
            for _, plan in sel.chosen:
                missing += [m for m in unreachable_local_agents(plan, sel.loaded)
                            if m not in missing]
        return missing

    prepared = prepare(verb, args, project_starts(definition), str(definition), report_all,
                       local_engines)
    with contextlib.ExitStack() as held:
        if verb != "preview":  # one change at a time per stack, from before the preflight
            try:
                for stack in stacks.values():
                    held.enter_context(stack_lock(prepared.settings.backend_url, stack, verb))
            except StackBusy as exc:
                report_all("busy", backend=prepared.settings.backend_url, error=str(exc))
                raise
        return run_stacks(args, verb, sel, stacks, prepared, docs, emit_docs, report_all)


def run_stacks(args: argparse.Namespace, verb: str, sel: Any, stacks: dict[str, str],
               prepared: Prepared, docs: list[dict[str, Any]],
               emit_docs: Callable[[], None], report_all: Callable[..., None]) -> int:
    """The preflight, no stack taken from another definition, each stack's identity (kept in
    its config) and no chosen session name held by another stack, then the verb on each chosen
    stack in turn."""
    definition = Path(args.file)
    # --pool takes what pool: takes (a name or a path): the stack keeps the file it resolved to
    pool_file = sel.loaded.pool_file if args.pool else None
    stacks_dir = prepared.project / STACKS_DIR
    configs = {plan.name: stack_config(definition, pool_file, prepared.project,
                                       index if sel.counted else None,
                                       sel.loaded.session.project or DEFAULT_PROJECT)
               for index, plan in sel.chosen}
    for config in configs.values():  # a preempted session's record (driver/ending.py):
        if verb == "destroy" and getattr(args, "preempted", None):  # written by its destroy
            config[config_key(ending.PREEMPTED_KEY)] = args.preempted
        elif verb in ("up", "destroy"):  # gone once it is up again, or destroyed by hand
            config[config_key(ending.PREEMPTED_KEY)] = None
    pending = sel.pending
    placing = verb in ("preview", "up") and pending is None
    with contextlib.ExitStack() as held:
        # the pool's ledger agent answers (exit 4, nothing made) before any stack is read
        ledger = held.enter_context(Ledger.open(sel.loaded.pool)) if placing else None
        try:
            # who each stack is (its kept id, read with the config that says whose file it is)
            recorded = refuse_taken_stacks(
                [Target(stacks[p.name], p.name, configs[p.name], "", "")
                 for _, p in sel.chosen], prepared)
            who = stack_identity.identities(stacks, recorded, stack_identity.made_by_here())
        except CommandError as exc:
            report_all("invalid" if exc.code == Exit.INVALID else "failed",
                       backend=prepared.settings.backend_url, error=str(exc))
            raise
        targets = [(plan, session_target(args, sel.loaded.pool, plan, stacks[plan.name],
                                         {**configs[plan.name],
                                          **stack_identity.identity_config(who[plan.name])},
                                         f"sessionctl {verb} "
                                         f"{config_path(definition, stacks_dir)}",
                                         who[plan.name]))
                   for _, plan in sel.chosen]
        if ledger is not None:
            def refuse_held() -> None:
                """Under the pool's lock, before anything is swept or created: no other
                stack holds a chosen session name on the pool (exit 2, reported by
                :func:`with_live_placement`)."""
                stack_identity.refuse_held_names(definition, sel.loaded.pool,
                                                 [(p, who[p.name]) for _, p in sel.chosen])

            sel, targets = with_live_placement(
                args, verb, sel, targets, recorded, held, report_all,
                prepared.settings.backend_url, ledger,
                {name: w.stack_id for name, w in who.items()}, refuse_held,
                preemption_for(verb, sel.loaded.pool, prepared))
            # Every agent the plans use answers, and is what each plan assumes (swarm
            # membership, encryption support) before anything is created: no half-made session.
            mine = [p.name for p in sel.plans]
            for agents in dict.fromkeys(p.agents for _, p in sel.chosen):
                preflight(sel.loaded.pool, agents, exclude_session=mine)
            refuse_unusable_folders(definition, sel)
            refuse_unusable_scratch(sel)
            sel, targets = with_pinned_image(args, verb, sel, targets, recorded, report_all,
                                             prepared.settings.backend_url)
        return run_targets(args, verb, sel, targets, prepared, docs, emit_docs)


def with_live_placement(args: argparse.Namespace, verb: str, sel: Any, targets: list,
                        recorded: Mapping[str, Mapping[str, str]], held: contextlib.ExitStack,
                        report_all: Callable[..., None], backend: str,
                        ledger: Ledger, stack_ids: Mapping[str, str],
                        under_lock: Callable[[], None],
                        preempt: Preemption | None = None) -> tuple[Any, list]:
    """``sel`` and ``targets`` placed on the pool's live free capacity (driver.placing): each
    session keeps the placement its stack recorded while its shape is unchanged, else is
    placed anew; for ``up`` under the pool's lock, with reservations ``held`` until the
    caller's ``up``s are done. The placement goes into each stack's config, where the
    program reads it."""
    pool = sel.loaded.pool
    stack_of = {plan.name: target.stack for plan, target in targets}
    kept = recorded_placements({p.name: recorded.get(stack_of[p.name]) or {}
                                for _, p in sel.chosen})
    try:
        result = held.enter_context(placed(
            ledger, [p.session for _, p in sel.chosen], kept, stack_ids, reserve=verb == "up",
            wait=getattr(args, "wait", None), under_lock=under_lock, preempt=preempt))
    except CommandError as exc:
        if exc.code == Exit.PENDING:
            report_all("pending", backend=backend, reason=str(exc).removeprefix("pending: "))
            raise CommandError(f"{args.file}: {exc}", exc.code) from None
        report_all("invalid" if exc.code == Exit.INVALID else "failed", backend=backend,
                   error=str(exc))
        raise
    except PoolBusy as exc:
        report_all("busy", backend=backend, error=str(exc))
        raise
    decided = result.decided
    by_name = {p.name: p for p in decided.plans}
    if not args.json:
        for plan in decided.plans:
            note = decided.notes.get(plan.name, "")
            where = ", ".join(f"{c.host}@{c.agent}" + (f" gpu {','.join(map(str, c.gpus))}"
                                                        if c.gpus else "")
                              for c in plan.containers[:8])
            more = f", +{len(plan.containers) - 8}" if len(plan.containers) > 8 else ""
            what = ("keeps its placement" if note == "kept"
                    else f"placed on live capacity ({note})")
            print(f"sessionctl {verb}: {plan.name} {what}: {where}{more}", file=sys.stderr)
    # the lifetime: decided at the first up (kept), again after it ended (core.decisions)
    lifetime = lifetime_of(sel.loaded.session, pool.policies.of(sel.loaded.session.project))
    now = time.time()
    expiry = {p.name: decide_expiry((recorded.get(stack_of[p.name]) or {}).get(
        config_key(EXPIRES_KEY)), lifetime, now) for p in decided.plans}
    by_name = {name: with_expiry(p, expiry[name]) for name, p in by_name.items()}
    sel = dataclasses.replace(sel, plans=tuple(by_name.get(p.name, p) for p in sel.plans))
    targets = [(by_name[plan.name], dataclasses.replace(target, config={
        **target.config, **kept_config(by_name[plan.name], pool, result.ports.get(plan.name)),
        config_key(EXPIRES_KEY): (str(expiry[plan.name]) if expiry[plan.name] is not None
                                  else None)}))
        if plan.name in by_name else (plan, target) for plan, target in targets]
    return sel, targets


def preemption_for(verb: str, pool: Pool, prepared: Prepared) -> Preemption | None:
    """For an ``up`` on a pool with ``policies.preemption``: the pool's session stacks of this
    backend (read when a preemption is considered, kept 30 s: each is checked against the
    engines again), and the end of one through ``sessionctl destroy`` of its stack, which
    writes the record of its preemption (driver/ending.py) as ``pool reap`` ends one."""
    if verb != "up" or not pool.policies.preemption:
        return None
    read: list[tuple[float, list[ending.Candidate]]] = []

    def candidates() -> list[ending.Candidate]:
        if not read or time.monotonic() - read[0][0] > 30:
            workspace = open_workspace(prepared.project, prepared.settings, prepared.pulumi)
            found = ending.candidates(pool, workspace, prepared.project, lambda line: print(
                printable(f"sessionctl up: {line}"), file=sys.stderr))
            read[:] = [(time.monotonic(), found)]
        return read[0][1]

    def end(candidate: ending.Candidate, record: Mapping[str, object]) -> None:
        code = cmd_stack(ending.destroy_args(candidate, record))
        if code != Exit.OK:
            raise CommandError(f"destroy exited {code}", Exit(code))

    return Preemption(candidates, end)


def with_pinned_image(args: argparse.Namespace, verb: str, sel: Any, targets: list,
                      recorded: Mapping[str, Mapping[str, str] | None],
                      report_all: Callable[..., None], backend: str) -> tuple[Any, list]:
    """Each session's image resolved once (or kept) and, for ``up``, pulled onto every agent
    of its plan that lacks it, before anything is created (driver.image_step); the pinned
    image goes into each stack's config (core.decisions ``image``), where the program reads
    it. A pull that fails stops here: exit 4 for credentials, 1 for an engine failure."""
    from . import image_step

    chosen = [plan for plan, _ in targets]
    stack_of = {plan.name: target.stack for plan, target in targets}
    try:
        images = image_step.decide_images(
            verb, sel.loaded.pool, sel.loaded.pool_file, chosen,
            {p.name: recorded.get(stack_of[p.name]) for p in chosen},
            getattr(args, "refresh_image", False), args.json)
        if verb == "up":
            image_step.pull_for(verb, sel.loaded.pool, sel.loaded.pool_file, chosen, images,
                                args.json)
    except ClusterSessionsError as exc:
        error = image_step.as_command_error(exc)
        report_all("invalid" if error.code == Exit.INVALID else "failed", backend=backend,
                   error=str(error))
        raise error from None
    by_name = {p.name: with_image(p, images[p.name][0].pinned) for p in chosen}
    sel = dataclasses.replace(sel, plans=tuple(by_name.get(p.name, p) for p in sel.plans))
    targets = [(by_name[plan.name], dataclasses.replace(target, config={
        **target.config, config_key(IMAGE_KEY): images[plan.name][0].to_config()}))
        for plan, target in targets]
    return sel, targets


def kept_config(plan: ClusterPlan, pool: Pool, ports: Mapping[str, int] | None
                ) -> dict[str, str]:
    """The decisions of this ``up`` that the stack keeps (core.decisions): the placement, and
    the host ports of main1's services (driver.service_ports, chosen under the pool's lock)."""
    config = {config_key(PLACEMENT_KEY): kept_placement(plan.session, pool,
                                                        plan.placement).to_config()}
    if ports is not None:
        config[config_key(SERVICE_PORTS_KEY)] = service_ports.config_value(ports)
    return config


def run_targets(args: argparse.Namespace, verb: str, sel: Any, targets: list,
                prepared: Prepared, docs: list[dict[str, Any]],
                emit_docs: Callable[[], None]) -> int:
    """The verb on each chosen stack in turn; the first failure stops an ``up``."""
    started(prepared)
    failures: list[StackFailed] = []
    done: list[str] = []
    for plan, target in targets:
        try:
            docs.append(run_stack(args, verb, target, prepared, plan))
            done.append(plan.name)
        except StackFailed as exc:
            docs.append(exc.doc)
            failures.append(exc)
            if verb != "destroy":  # stop at the first failure: say what was and was not run
                break
        except KeyboardInterrupt:
            if verb == "up":
                docs.append(summary_document(verb, target.stack, plan.name,
                                             prepared.settings.backend_url, "interrupted",
                                             error=interrupted_up(args, sel, plan)))
                emit_docs()
            raise
    emit_docs()
    if failures:
        message = "\n".join(str(f) for f in failures)
        tried = [d["session"] for d in docs]
        left = [p.name for _, p in sel.chosen if p.name not in tried]
        if len(sel.chosen) > 1:
            message += (f"\n{verb} done for: {', '.join(done) or 'none'}"
                        + (f"; not attempted: {', '.join(left)}" if left else ""))
        raise CommandError(message, failures[0].code)
    return Exit.OK


def interrupted_up(args: argparse.Namespace, sel: Any, plan: ClusterPlan) -> str:
    """Ctrl-C during ``up``: the engine stops where it was, and the stack may not hold what was
    being created. Say what the agents hold of the session now (by label, from the engines, as
    ``pool sweep --dry-run`` sees it) and what to run next; returns the same text."""
    from ..agents.cleanup import find_leftovers

    left, errors = find_leftovers(sel.loaded.pool, plan.name)
    head = ("its agents hold:" if left else
            "its agents could not all be asked:" if errors else "its agents hold nothing of it")
    lines = [f"session {plan.name}: interrupted; {head}"]
    lines += [f"  {item}" for item in left] + [f"  {error}" for error in errors]
    if left or errors:
        again = shlex.join([args.file, *(["--pool", args.pool] if args.pool else []),
                            *(["--index", str(args.index)] if args.index else [])])
        lines.append(f"Run `sessionctl up {again}` again: it removes what the stack does "
                     f"not hold and makes the rest; or `sessionctl destroy {again}` to "
                     "remove it all.")
    text = "\n".join(lines)
    for line in lines:
        print(f"sessionctl up: {line}", file=sys.stderr)
    return text


def refuse_unusable_scratch(sel: Any) -> None:
    """Before anything is created: every agent that delivers bundles into its scratch root
    (core/bundles.py) has it, as a delivery needs it (the SSH user's, 0700, no link on its
    way, some room on its disk); else an engine failure (exit 1) naming each agent and the
    path, and nothing is made (agents/bundles.py check_root)."""
    from concurrent.futures import ThreadPoolExecutor

    from ..agents.bundles import check_root
    from ..agents.connectors import AgentError, connector_for
    from ..core.bundles import SCRATCH

    pool = sel.loaded.pool
    agents = list(dict.fromkeys(a for _, plan in sel.chosen for a in plan.agents
                                if plan.delivery(a) == SCRATCH))

    def check(name: str) -> str | None:
        try:
            with connector_for(pool.agent(name)) as conn:
                check_root(conn, clean_target(pool.scratch))
        except AgentError as exc:
            return str(exc)
        return None

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(agents)))) as workers:
        found = [p for p in workers.map(check, agents) if p]
    if found:
        raise CommandError("\n".join(printable(p) for p in found) + "\nnothing was created",
                           Exit.ENGINE)


def refuse_unusable_folders(definition: Path, sel: Any) -> None:
    """Before anything is created: a data folder that some agent's storage holds as a link,
    a file or another user's directory, a host path whose way on some agent holds a link or a
    directory anyone but root can write, and a named volume the pool does not list that is
    another's, are invalid input (exit 2), named by file and field; nothing is made
    (agents.folders.folder_refusals, bind_refusals, volume_refusals)."""
    found: list[str] = []
    for _, plan in sel.chosen:
        found += [f"{definition}: {path}: {message}"
                  for refusals in (bind_refusals, volume_refusals, folder_refusals)
                  for path, message in refusals(sel.loaded.pool, plan)]
    if found:
        raise CommandError("\n".join(dict.fromkeys(found)) + "\nnothing was created",
                           Exit.INVALID)


def refuse_taken_stacks(targets: Sequence[Target], prepared: Prepared
                        ) -> dict[str, dict[str, str] | None]:
    """Before any stack is created or changed: refuse (exit 2) when a stack of ``targets``
    already exists and was made from another file (:func:`owner_conflict`). One
    ``list_stacks``, and one config read per stack that exists. Returns each stack's config
    as read (None: the backend does not have it), for the decisions it keeps."""
    from pulumi import automation as auto

    workspace = open_workspace(prepared.project, prepared.settings, prepared.pulumi)
    try:
        existing = {s.name for s in workspace.list_stacks()}
        problems = []
        read: dict[str, dict[str, str] | None] = {}
        for target in targets:
            read[target.stack] = None
            if target.stack.rsplit("/", 1)[-1] not in existing:
                continue
            checkout = {k: v.value for k, v in workspace.get_all_config(target.stack).items()}
            recorded = recovered(workspace, target.stack, checkout)
            read[target.stack] = recorded
            problem = owner_conflict(target.stack, checkout if recorded is None else recorded,
                                     target.config)
            if problem:
                problems.append(problem)
    except auto.errors.CommandError as exc:
        raise CommandError(f"could not read the stacks' config: {command_error_text(exc)}",
                           Exit.ENGINE) from None
    if problems:
        raise CommandError("\n".join(problems), Exit.INVALID)
    return read


def recovered(workspace: Any, stack: str, checkout: Mapping[str, str]) -> dict[str, str] | None:
    """The config a stack runs with: the checkout's, with every kept decision the stack's
    backend recorded at its last update (its ``kept`` output) in place of the checkout's
    (core.decisions.recover_kept): a fresh clone, or a checkout that ran against another
    backend, makes the same session as the one that made it. Each contradiction is said.

    None (the stack is taken as new: a new identity, every decision made again) when the
    backend recorded no decisions and holds nothing, or objects labelled with another stack
    id than the checkout's:
    the checkout's stack file is then another backend's word (one checkout, two backends, a
    stack of the same name), and its id would make this stack's ``destroy`` sweep the other
    backend's session (the stand-in kept each backend's config apart; the real CLI keeps it
    in the checkout). An ``up`` interrupted before the backend recorded anything is taken as
    new too: what it left is then held by "another stack", said with the sweep that removes
    it."""
    found = workspace.stack_outputs(stack).get(KEPT_OUTPUT)
    record = found.value if found is not None else None
    prefix = f"{CONFIG_NAMESPACE}:"
    short = {k.removeprefix(prefix): v for k, v in checkout.items() if k.startswith(prefix)}
    claimed = short.get(STACK_ID_KEY)
    held = ((workspace.export_stack(stack).deployment or {}).get("resources", [])
            if record is None and claimed else [])
    # believed: some resource carries it, or the stack holds only what carries no stack id
    # at all (its providers: an up interrupted before its first labelled object)
    if record is None and claimed and not carried(held, claimed) and (
            not held or labelled(held, STACK_ID_LABEL)):
        why = ("another backend's stack file?" if held else
               "the stack holds nothing: destroyed, or its first up did not finish")
        print(f"sessionctl: stack {stack}: the checkout's config names stack id "
              f"{printable(claimed[:60])}, which nothing this backend's stack holds carries "
              f"({why}): the stack is taken as new", file=sys.stderr)
        return None
    merged, notes = recover_kept(short, record)
    for note in notes:
        print(f"sessionctl: stack {stack}: {printable(note)}", file=sys.stderr)
    config = {**checkout, **{config_key(k): v for k, v in merged.items() if v is not None}}
    if isinstance(record, Mapping) and isinstance(record.get(DEFINITION_KEY), str):
        # whose file the stack is made from: the backend knows it when the checkout does not
        config.setdefault(config_key(DEFINITION_KEY), record[DEFINITION_KEY])
    return config


def session_target(args: argparse.Namespace, pool: Pool, plan: ClusterPlan, stack: str,
                   config: Mapping[str, str | None], message: str,
                   identity: StackIdentity) -> Target:
    """A session's stack; after ``destroy``, what state forgot is swept by label: only what
    carries the stack's own id (``identity``), never another stack's of the same name."""
    mine = identity.owns
    sweep_hint = (f"`sessionctl pool sweep {pool.name} --session {plan.name} --stack-id "
                  f"{identity.stack_id}`")

    def after_destroy(summary: Callable[..., dict[str, Any]]) -> None:
        swept = sweep(pool, plan.name, mine=mine)  # what state forgot must not outlive it
        if swept.remaining:
            raise StackFailed(swept.summary(), Exit.ENGINE,
                              summary("failed", error=swept.summary()))
        for error in swept.errors:  # the stack is gone; leftovers there cannot be looked for
            print(f"sessionctl destroy: warning: {plan.name}: could not look for leftovers: "
                  f"{error}; {sweep_hint} once it answers", file=sys.stderr)

    def partly_destroyed(text: str) -> str:
        """``destroy`` went on past what it could not delete (an agent that does not answer):
        remove by label what is left where agents answer, and name the rest. The stack keeps
        what it could not delete, so a later ``destroy`` (or ``pool sweep``) finishes."""
        swept = sweep(pool, plan.name, mine=mine)
        return "\n".join([
            f"destroy of stack {stack} did not finish; it removed what it could.",
            "The engine could not delete:", *(f"  {line}" for line in text.splitlines()),
            swept.summary(),
            f"What is left stays in the stack: run `sessionctl destroy {args.file}` again once "
            f"the agents answer ({sweep_hint} removes leftovers by label)."])

    def before_up(stack_: Any, verb: str = "up") -> None:
        """An ``up`` killed while creating leaves that object on the engine but not in the
        stack (the CLI drops an interrupted create): it would clash by name with the one this
        ``up`` makes, or be a second network. Remove what is labelled with the session and
        not held by the stack, and say so."""
        deployment = stack_.export_stack().deployment or {}
        held = {r.get("id") for r in deployment.get("resources", []) if r.get("id")}
        swept = sweep(pool, plan.name, keep=held, mine=mine)
        for item in swept.removed:
            print(f"sessionctl {verb}: {plan.name}: removed {item.kind} {item.name} on agent "
                  f"{item.agent}, which the stack does not hold (left by an interrupted run)",
                  file=sys.stderr)
        if swept.remaining and verb == "up":  # destroy goes on: after_destroy says the rest
            raise StackFailed(swept.summary(), Exit.ENGINE, summary_document(
                "up", stack, plan.name, None, "failed", error=swept.summary()))

    def while_up(final: ClusterPlan) -> contextlib.AbstractContextManager:
        return early_pids_limits([pool.agent(a) for a in final.agents], identity.stack_id,
                                 final.limits.pids_limit)

    over_ssh = sum(reach_of(agent).kind == SSH for agent in pool.agents)
    return Target(stack, plan.name, config, message, f"sessionctl up {args.file}",
                  after_destroy, partly_destroyed, before_up, while_up,
                  parallel_for(over_ssh))


def run_stack(args: argparse.Namespace, verb: str, target: Target,
              prepared: Prepared, plan: ClusterPlan | None = None) -> dict[str, Any]:
    """One verb on one stack; returns its ``--json`` summary or raises :class:`StackFailed`
    with it. The same for session and pool stacks (``plan``: a session's, as placed)."""
    term = Terminal(quiet=args.json,
                    out=sys.stderr if getattr(args, "output_to_stderr", False) else None)
    events = EventLog()
    color = sys.stdout.isatty()
    backend = prepared.settings.backend_url
    name = target.stack
    shown_verb = verb if not target.label.startswith("pool ") else f"pool {verb}"

    def summary(result: str, **extra: Any) -> dict[str, Any]:
        extra.setdefault("steps", events.steps)
        return summary_document(verb, name, target.label, backend, result, **extra)

    def kwargs(call: str) -> dict[str, Any]:
        return call_kwargs(call, json_mode=args.json, color=color, on_output=term.out,
                           on_error=term.err, on_event=events, message=target.message,
                           diff=getattr(args, "diff", False), parallel=target.parallel)

    from pulumi import automation as auto

    try:
        try:
            stack = open_stack(name, prepared.project, prepared.settings, prepared.pulumi,
                               create=verb in ("preview", "up"))
        except auto.errors.StackNotFoundError:
            if verb == "destroy":
                print(f"sessionctl {shown_verb}: no stack {name!r} in {backend}; nothing to "
                      "destroy", file=sys.stderr)
                return summary("succeeded")
            raise StackFailed(f"no stack {name!r} in {backend}; run `{target.up_hint}` first",
                              Exit.ENGINE, summary("failed")) from None
        apply_config(stack, target.config)
        if verb in ("up", "destroy") and target.before_up is not None:
            # what an interrupted run left and the stack does not hold goes first: for up it
            # would clash by name; for destroy it keeps the network in use ("has active
            # endpoints") and the destroy from finishing
            target.before_up(stack, verb)
        outputs: Mapping[str, Any] = {}
        if prepared.ask_first:
            preview = (stack.preview(**kwargs("preview")) if verb == "up"
                       else stack.preview_destroy(**kwargs("preview_destroy")))
            counts = change_counts(preview.change_summary)
            shown = ", ".join(f"{n} {op}" for op, n in counts.items()) or "no changes"
            for line in step_lines(events.steps):
                print(line, file=sys.stderr)
            question = "Apply these changes" if verb == "up" else "Destroy these resources"
            if not ask(f"{question} to stack {name} ({shown})?"):
                raise StackFailed(f"{shown_verb} declined: nothing was changed", Exit.ENGINE,
                                  summary("declined"))
            events.steps.clear()
        if verb == "preview":
            result = stack.preview(**kwargs("preview"))
            changes = change_counts(result.change_summary)
        else:
            during = (target.while_up(plan) if verb == "up" and target.while_up is not None
                      and plan is not None else contextlib.nullcontext())
            with during:
                result = getattr(stack, verb)(**kwargs(verb))
            changes = change_counts(result.summary.resource_changes)
            if verb == "up":
                outputs = result.outputs
            elif verb == "refresh":
                outputs = stack.outputs()
    except auto.errors.CommandError as exc:
        out, err = split_command_error(str(exc))
        text = engine_error_message(events.errors, term.stdout or out, term.stderr or err)
        if verb == "destroy" and target.partly_destroyed is not None:
            message = target.partly_destroyed(text)
            raise StackFailed(message, Exit.ENGINE, summary("partial", error=message)) from None
        raise StackFailed(f"the engine failed on stack {name}:\n{text}", Exit.ENGINE,
                          summary("failed", error=text)) from None
    if verb == "destroy" and target.after_destroy is not None:
        target.after_destroy(summary)
    if verb == "destroy" and getattr(args, "remove", False):
        remove_stack(prepared, name, summary)
    if not args.json:
        shown = ", ".join(f"{n} {op}" for op, n in changes.items()) or "no changes"
        if verb == "preview":  # each step and why, as `pulumi preview --diff` names them
            for line in step_lines(events.steps):
                print(line, file=sys.stderr)
        print(f"sessionctl {shown_verb}: stack {name}: {shown}", file=sys.stderr)
    return summary("succeeded", changes=changes, outputs=masked_outputs(outputs))


def remove_stack(prepared: Prepared, name: str, summary: Callable[..., dict[str, Any]]) -> None:
    """``destroy --remove``: the emptied stack leaves the backend (``pulumi stack rm``), as a
    user who is done with a session expects; a stack that still holds resources is kept."""
    from pulumi import automation as auto

    workspace = open_workspace(prepared.project, prepared.settings, prepared.pulumi)
    try:
        workspace.remove_stack(name)
    except auto.errors.CommandError as exc:
        text = command_error_text(exc)
        raise StackFailed(f"stack {name} was destroyed but not removed:\n{text}", Exit.ENGINE,
                          summary("failed", error=text)) from None
    print(f"sessionctl destroy: removed stack {name} from {prepared.settings.backend_url}",
          file=sys.stderr)


HELP = {
    "preview": "show what `pulumi up` would change for a session (no changes made)",
    "up": "create or update a session's containers and network",
    "destroy": "delete a session's containers and network (the stack stays, empty)",
    "refresh": "read the real state of a session's resources into the stack",
}


def register(subparsers) -> None:
    for verb in VERBS:
        description = textwrap.fill(
            f"{HELP[verb][0].upper()}{HELP[verb][1:]}, through the Pulumi Automation API (needs "
            "the pulumi CLI). The stack is named after the session; its config names the "
            "definition. Backend: PULUMI_BACKEND_URL, else a file backend in the project's "
            f"{STATE_DIR}/. Secrets passphrase: PULUMI_CONFIG_PASSPHRASE, else a documented, "
            "insecure local default.", 79)
        p = needs_pulumi(subparsers.add_parser(
            verb, help=HELP[verb], epilog=EPILOG, description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter))
        add_session_args(p)
        p.add_argument("--json", action="store_true",
                       help="no live output; print one JSON summary (verb, stack, result, "
                       "changes, outputs with secrets masked)")
        p.add_argument("--stack", metavar="NAME",
                       help="stack name (default: the session's name)")
        if verb in CONFIRM:
            p.add_argument("--yes", "-y", action="store_true",
                           help="do not ask for confirmation (required without a terminal)")
        else:  # every engine verb takes it, so a script passes it to each alike
            p.add_argument("--yes", "-y", action="store_true",
                           help=f"accepted for uniformity: {verb} never asks (it changes no "
                           "resource" + (", only the stack's record of them)" if verb ==
                                         "refresh" else ")"))
        if verb == "up":
            p.add_argument("--wait", nargs="?", type=parse_duration, const=float("inf"),
                           metavar="DURATION",
                           help="when the pool cannot hold the session now, queue for it "
                           "(first come, first served; progress on stderr; Ctrl-C leaves the "
                           "queue) instead of exiting 3; DURATION (90s, 10m, 2h) bounds the "
                           "wait, then exit 3 with the reason")
        if verb == "destroy":
            p.add_argument("--remove", action="store_true",
                           help="after the destroy, remove the stack itself from the backend "
                           "(`pulumi stack rm`): its history and kept decisions go, and `ls` "
                           "no longer lists it; a destroy that did not finish keeps it")
        if verb in ("preview", "up"):
            p.add_argument("--refresh-image", action="store_true",
                           help="resolve the definition's image to its registry's current "
                           "digest again instead of keeping the one the stack recorded (the "
                           "containers are replaced when it changed)")
            p.add_argument("--diff", action="store_true",
                           help="show a detailed property diff in the live output")
        p.set_defaults(func=cmd_stack)
