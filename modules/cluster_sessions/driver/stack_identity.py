"""Whose a session name is on a pool: each stack's identity for the verbs, and the refusal of a
session whose name another stack holds (issue 31, item 7).

A stack's identity is a kept decision (:mod:`cluster_sessions.core.decisions`: ``stack-id``,
``made-by``), on every label of what it makes. Here:

- :func:`identities`: the identity each stack of a run uses, from the config
  ``refuse_taken_stacks`` already read (kept; derived for an existing stack that kept none;
  new and random, with this ``user@host``, for a stack this backend does not have);
- :func:`refuse_held_names`: before anything is swept or created, an ``up``/``preview`` of a
  session whose name objects of another stack hold on the pool is invalid input (exit 2),
  naming the holder by its labels (stack id, stack name, who made it) and what it holds;
- for the verbs that only look, the identity read from the backend is
  :func:`cluster_sessions.driver.stack_records.read_identity` (above the stack runner it reads
  the backend through, as this module is below it).

Why a name and not only the objects: containers and the network are named after the session
(``NAME-main1``, the network), so two stacks of one name cannot both run on a pool; before
stack ids, the second ``up`` took the first's objects for its own leftovers and removed them.
"""

from __future__ import annotations

import getpass
import re
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..agents.cleanup import Leftover, find_leftovers
from ..core.decisions import StackIdentity, stack_identity
from ..core.names import CONFIG_NAMESPACE, config_key
from ..core.plan import ClusterPlan
from ..core.spec import Pool
from ..core.terminal import printable
from .errors import CommandError, Exit

Recorded = Mapping[str, Mapping[str, str | None] | None]  # stack -> its config, None: new


def made_by_here() -> str:
    """``user@host`` of this process, reduced to what a label value and a refusal may show."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, no LOGNAME: still a stack of someone
        user = "unknown"
    text = f"{user}@{socket.gethostname()}"
    return re.sub(r"[^A-Za-z0-9_.@+-]", "_", text)[:128]


def short_config(config: Mapping[str, str | None]) -> dict[str, str | None]:
    """A stack's config with the project's keys short (``stack-id``), others dropped."""
    prefix = f"{CONFIG_NAMESPACE}:"
    return {k.removeprefix(prefix): v for k, v in config.items() if k.startswith(prefix)}


def identities(stacks: Mapping[str, str], recorded: Recorded,
               made_by: str) -> dict[str, StackIdentity]:
    """Session name -> the identity its stack (``stacks[name]``) runs with. A kept value that
    is not one ``sessionctl`` writes is invalid input naming the stack and the key."""
    found: dict[str, StackIdentity] = {}
    problems = []
    for session, stack in stacks.items():
        config = recorded.get(stack)
        try:
            found[session] = stack_identity(
                stack, None if config is None else short_config(config), made_by)
        except ValueError as exc:
            problems.append(f"stack {stack}: config {CONFIG_NAMESPACE}:{printable(str(exc))}; "
                            f"it was not written by sessionctl: remove it (`pulumi config rm "
                            f"-s {stack} {config_key('stack-id')}`) only if no session of this "
                            "stack runs")
    if problems:
        raise CommandError("\n".join(problems), Exit.INVALID)
    return found


def identity_config(identity: StackIdentity) -> dict[str, str]:
    """What the stack's config gets (full keys), as ``with_service_ports`` adds its own."""
    return {config_key(k): v for k, v in identity.config().items()}


# --- the refusal ---------------------------------------------------------------------------------


def holders(found: Iterable[Leftover], identity: StackIdentity) -> list[Leftover]:
    """What of the session's objects on the pool another stack holds (pure)."""
    return [item for item in found if not identity.owns(item.owner.stack_id)]


def holder_refusal(definition: Path, session: str, pool: str, held: Sequence[Leftover]) -> str:
    """The message for ``held`` (non-empty): per holder, its id, stack name and maker, and what
    it holds where; what to do. Label values are another user's text: shown escaped."""
    by_owner: dict[Any, list[Leftover]] = {}
    for item in held:
        by_owner.setdefault(item.owner, []).append(item)
    lines = [f"{definition}: name: session {session} is held on pool {pool} by another stack; "
             "nothing was created or removed"]
    for owner, items in by_owner.items():
        who = (f"stack id {printable(owner.stack_id)}" if owner.stack_id
               else "a stack made before stack ids (no stack-id label)")
        if owner.stack:
            who += f", stack {printable(owner.stack)}"
        if owner.made_by:
            who += f", made by {printable(owner.made_by)}"
        things = ", ".join(f"{i.kind} {printable(i.name)} on {i.agent}" for i in items[:6])
        more = f" and {len(items) - 6} more" if len(items) > 6 else ""
        lines.append(f"  held by {who}: {things}{more}")
    first = held[0].owner.stack_id
    lines.append(f"Give this session another name, or destroy the other from its own stack and "
                 f"backend; an operator who knows it is abandoned removes it with `sessionctl "
                 f"pool sweep {pool} --session {session} --stack-id "
                 f"{printable(first) or 'none'}`.")
    return "\n".join(lines)


def refuse_held_names(definition: Path, pool: Pool,
                      chosen: Sequence[tuple[ClusterPlan, StackIdentity]],
                      find: Callable[..., tuple[list[Leftover], list[Any]]] = find_leftovers
                      ) -> None:
    """Before anything is swept or created: refuse (exit 2) when another stack's objects hold
    a chosen session's name on the pool (every agent asked, in parallel). An agent that does
    not answer is not a holder here: the preflight names those the plan needs."""
    problems = []
    for plan, identity in chosen:
        found, _unanswered = find(pool, plan.name)
        held = holders(found, identity)
        if held:
            problems.append(holder_refusal(definition, plan.name, pool.name, held))
    if problems:
        raise CommandError("\n".join(problems), Exit.INVALID)
