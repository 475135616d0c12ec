"""The session stacks of a pool in the state backend, and how one of them is ended through
its own ``destroy``: what ``pool reap`` (driver/reap_verb.py) and preemption at ``up``
(driver/placing.py ``placed``, driven by driver/stacks.py) share.

Below the stack runner (:mod:`.stacks`): the workspace is given, and the destroy is run by the
caller with :func:`destroy_args` (``sessionctl destroy FILE --yes`` as the stack's config
recorded it: file, pool, index, project), so a session is ended one way only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.names import EXPIRES_KEY, STACK_ID_KEY, STACKS_DIR, config_key
from ..core.problems import DefinitionError
from ..core.spec import Pool

#: a session ended by preemption: JSON {"at", "by", "by_priority", "priority", "reason"},
#: written on its stack with its destroy, removed by its next ``up`` (driver/listing.py)
PREEMPTED_KEY = "preempted"


@dataclass
class Candidate:
    """A session stack of the backend whose definition runs on the pool."""

    stack: str
    session: str
    file: str
    pool_file: str | None
    index: int | None
    project: str | None
    session_type: str
    idle: Any  # core.spec.IdlePolicy | None
    stack_id: str | None
    expires_at: float | None
    priority: int = 0
    preemptible: bool = False


def _value(v: Any) -> Any:
    return getattr(v, "value", v)


def _path(value: str, project: Path) -> Path:
    p = Path(value)
    return p if p.is_absolute() else project / STACKS_DIR / p


def candidates(pool: Pool, workspace: Any, project: Path, say) -> list[Candidate]:
    """The backend's session stacks on ``pool``, as their configs say; a stack whose
    definition cannot be read any more is said and left alone (its destroy could not run)."""
    from .session_args import load_definition, select
    from .stack_settings import CONFIG_DEFINITION, CONFIG_INDEX, CONFIG_POOL, CONFIG_PROJECT

    found = []
    for summary in sorted(workspace.list_stacks(), key=lambda s: s.name):
        config = {k: _value(v) for k, v in workspace.get_all_config(summary.name).items()}
        definition = config.get(CONFIG_DEFINITION)
        if not definition:
            continue  # a pool stack, or not ours
        pool_file = config.get(CONFIG_POOL) or None
        index = config.get(CONFIG_INDEX) or None
        try:
            file = _path(definition, project)
            pool_path = _path(pool_file, project) if pool_file else None
            loaded = load_definition(file, pool_path, project=config.get(CONFIG_PROJECT) or None)
            if loaded.pool.name != pool.name:
                continue
            sel = select(loaded, int(index) if index else None)
        except (DefinitionError, OSError, ValueError) as exc:
            say(f"stack {summary.name}: its definition {definition} cannot be loaded "
                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}): left alone")
            continue
        session = loaded.session
        plans = [p for _, p in sel.chosen]
        plan = plans[0] if len(plans) == 1 else next(
            (p for p in plans if p.name == summary.name), None)
        if plan is None:
            continue
        expires = config.get(config_key(EXPIRES_KEY))
        found.append(Candidate(
            stack=summary.name, session=plan.name, file=str(file),
            pool_file=str(pool_path) if pool_path else None,
            index=int(index) if index else None, project=session.project,
            session_type=session.type, idle=loaded.pool.policies.of(session.project).idle,
            stack_id=config.get(config_key(STACK_ID_KEY)) or None,
            expires_at=float(expires) if expires and expires.isdigit() else None,
            priority=session.priority, preemptible=session.preemptible))
    return found


def destroy_args(c: Candidate, preempted: Mapping[str, Any] | None = None
                 ) -> argparse.Namespace:
    """The arguments of ``sessionctl destroy FILE --yes`` of the candidate's stack (its engine
    output on stderr); with ``preempted``, the record the destroy writes on the stack."""
    return argparse.Namespace(verb="destroy", file=c.file, pool=c.pool_file, index=c.index,
                              stack=c.stack, json=False, yes=True, diff=False,
                              output_to_stderr=True, remove=False, project=c.project,
                              preempted=(json.dumps(dict(preempted), sort_keys=True)
                                         if preempted is not None else None))


LAST_TIME = 253402300799  # 9999-12-31T23:59:59Z, the last second datetime shows


def read_preempted(text: object) -> dict[str, Any] | None:
    """A stack's record of its preemption (:data:`PREEMPTED_KEY`), or None when there is none
    or it is not one we wrote (edited by hand: no record)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    kinds = {"at": int, "by": str, "by_priority": int, "priority": int, "session": str,
             "type": str, "project": str, "reason": str}
    if not isinstance(data, dict) or set(data) != set(kinds) or any(
            type(data[k]) is not kind for k, kind in kinds.items()):
        return None
    if not 0 <= data["at"] <= LAST_TIME:  # a time `ls` can show (a huge one raised there)
        return None
    return data


def preempted_text(record: Mapping[str, Any]) -> str:
    """What ``ls`` and ``status`` say of a preempted session."""
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(record["at"], UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return (f"at {when} {record['reason']}; its containers are gone: `up` starts it again, "
            "`destroy --remove` removes the stack")
