"""The arguments every session verb takes, and the one place that loads and plans them.

A definition makes one session, or K with ``count: K`` (``<name>-1`` .. ``<name>-K``, planned
together). Every verb acts on all of them, or on one with ``--index I``; :func:`selected`
returns the plans in either case, so that no verb loads or plans a definition itself.
"""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.governance import PROJECT_ENV, governed, operator_project
from ..core.loader import (
    POOLS_ENV,
    Loaded,
    load_file,
    load_session,
    operator_pool_dirs,
    with_pool,
)
from ..core.placement import Free
from ..core.plan import ClusterPlan, build_plans, check_usable, session_copies
from ..core.problems import DefinitionError, Problem
from ..core.spec import Session
from .errors import CommandError, Exit

EPILOG = """exit codes: 0 ok, 1 engine failure, 2 invalid input, 3 session pending,
4 missing prerequisite (e.g. the pulumi CLI), 5 batch job failed, 6 batch job lost
(timed out, or a container died first)"""


def nonempty(value: str) -> str:
    """An argparse type for names and paths: ``--pool ''`` is a mistake, not "the default"."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def verb_parser(subparsers, name: str, help: str, description: str,
                epilog: str = EPILOG) -> argparse.ArgumentParser:
    """A verb's parser as every verb has it: one-line help, the description wrapped, the exit
    codes below."""
    return subparsers.add_parser(name, help=help, description=textwrap.fill(description, 79),
                                 epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def needs_pulumi(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Mark a verb that reads or changes stacks through the pulumi CLI (exit 4 without it):
    the missing-CLI message names every verb marked so (:func:`.verbs.pulumi_verbs`)."""
    p.set_defaults(needs_pulumi=True)
    return p


def add_timeout(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--timeout", type=positive_seconds, default=None, metavar="S", help=help)


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 10**9:
        raise argparse.ArgumentTypeError("must be a number of seconds > 0")
    return seconds


def positive_index(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError("must be a session number 1, 2, ... (count)")
    return int(value)


def add_session_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", type=nonempty,
                   help="a ClusterSession definition (YAML)")
    p.add_argument("--pool", metavar="POOL", type=nonempty,
                   help="use this pool instead of the one the session names: an AgentPool "
                   "file (any: it is yours), or a pool name, looked up as the definition's "
                   "`pool` is: in $CLUSTER_SESSIONS_POOLS, then the project's stacks/pools")
    p.add_argument("--index", metavar="I", type=positive_index,
                   help="with `count: K`: only session I (<name>-I) of the K; default: all")
    add_project_arg(p)


def add_project_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--project", metavar="PROJECT", type=nonempty, default=None,
                   help="the operator's project for this run (CI: who asked): it wins over "
                   f"the definition's `project:`; default ${PROJECT_ENV}")


@dataclass(frozen=True)
class Selected:
    """A definition's sessions (all K, planned together) and the ones this run acts on."""

    loaded: Loaded
    plans: tuple[ClusterPlan, ...]
    indices: tuple[int, ...]  # 1-based

    @property
    def counted(self) -> bool:
        """The definition makes several sessions (``count`` > 1)."""
        return len(self.plans) > 1

    @property
    def chosen(self) -> list[tuple[int, ClusterPlan]]:
        return [(i, self.plans[i - 1]) for i in self.indices]

    @property
    def all_of_count(self) -> bool:
        """Several sessions, all acted on (no ``--index``): outputs name each one."""
        return self.counted and len(self.indices) == len(self.plans)

    def one(self, needs: str) -> ClusterPlan:
        """The one session a verb (or option) that acts on a single session means; several
        chosen is invalid input saying how to choose. ``needs``: who needs one, e.g.
        ``--stack names one stack``."""
        if len(self.indices) != 1:
            raise CommandError(f"{needs}, but {self.loaded.session_file} makes "
                               f"{len(self.plans)} sessions (count): choose one with --index I",
                               Exit.INVALID)
        return self.chosen[0][1]

    @property
    def pending(self) -> ClusterPlan | None:
        """A chosen plan that is pending (then all are: they are planned together)."""
        return next((p for _, p in self.chosen if p.pending), None)


def pool_dirs() -> tuple[Path, ...]:
    """The operator's pool directories: ``$CLUSTER_SESSIONS_POOLS``, then the project's."""
    return operator_pool_dirs(os.environ.get(POOLS_ENV))


def load_definition(file: Path, pool: Path | None = None,
                    dirs: Sequence[Path] | None = None, project: str | None = None) -> Loaded:
    """A session definition and its pool, valid and usable together, its project the one it
    may run under (core.governance), or DefinitionError. ``dirs``: the operator's pool
    directories, by default :func:`pool_dirs`; ``project``: the operator's ``--project``
    (else ``$CLUSTER_SESSIONS_PROJECT``)."""
    return governed(check_usable(load_session(file, pool,
                                              pool_dirs=pool_dirs() if dirs is None else dirs)),
                    operator_project(project))


def validate_files(paths: Sequence[Path], project: str | None = None) -> list[Problem]:
    """Every problem of every file (``sessionctl validate``); a session file is checked together
    with its pool, and its project claim with the operator's (``project``, else the
    environment's)."""
    problems: list[Problem] = []
    sessions: list[tuple[Path, Session]] = []
    for path in paths:
        try:
            obj = load_file(path)
            if isinstance(obj, Session):
                sessions.append((path, obj))
                governed(check_usable(with_pool(obj, path, pool_dirs=pool_dirs())),
                         operator_project(project))
        except DefinitionError as exc:
            problems.extend(exc.problems)
    return problems + same_sessions(sessions)


def same_sessions(definitions: Sequence[tuple[Path, Session]]) -> list[Problem]:
    """One problem per definition that makes a session (a stack) another one makes too, naming
    both files: ``name: sweep`` with ``count: 2`` makes sweep-1 and sweep-2, so another file's
    ``name: sweep-2`` would run on, and replace, the same stack. The same file given twice is
    one definition."""
    made: dict[str, tuple[Path, str]] = {}
    found: list[Problem] = []
    seen: set[Path] = set()
    for path, session in definitions:
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        for copy in session_copies(session):
            first = made.get(copy.name)
            if first is None:
                made[copy.name] = (path, session.name)
                continue
            how = (f" (name: {first[1]} with count)" if first[1] != copy.name else "")
            found.append(Problem(str(path), "name", f"makes session {copy.name}, which "
                                 f"{first[0]}{how} makes too: each session (and its stack) "
                                 "comes from one definition; rename one of them"))
            break
    return found


def selected(args: argparse.Namespace, free: Sequence[Free] | None = None) -> Selected:
    """Load ``args.file`` (with ``args.pool``), plan all its sessions, pick ``args.index``."""
    loaded = load_definition(Path(args.file), Path(args.pool) if args.pool else None,
                             project=getattr(args, "project", None))
    return select(loaded, getattr(args, "index", None), free)


def select(loaded: Loaded, index: int | None, free: Sequence[Free] | None = None) -> Selected:
    plans = build_plans(loaded.session, loaded.pool, free)
    if index is None:
        return Selected(loaded, plans, tuple(range(1, len(plans) + 1)))
    if not 1 <= index <= len(plans):
        made = (f"count: {len(plans)} makes sessions 1..{len(plans)}" if len(plans) > 1
                else "it makes one session (no count), --index 1 at most")
        raise DefinitionError([Problem(str(loaded.session_file), "count",
                                       f"--index {index} is out of range: {made}")])
    return Selected(loaded, plans, (index,))


def combined(codes: Iterable[int]) -> int:
    """One exit code for a run over several sessions: a failure to act (1-4) first, then a
    lost job (6), then a failed one (5), else 0."""
    codes = [int(c) for c in codes]
    for wanted in (Exit.INVALID, Exit.MISSING, Exit.PENDING, Exit.ENGINE,
                   Exit.JOB_LOST, Exit.JOB_FAILED):
        if wanted in codes:
            return wanted
    return next((c for c in codes if c), Exit.OK)
