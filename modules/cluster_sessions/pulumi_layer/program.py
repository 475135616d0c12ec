"""The Pulumi program behind ``__main__.py``: this stack's definition, planned, as a Session.

Stack configuration (``stacks/Pulumi.<stack>.yaml``):

``cluster-sessions:definition``
    The session definition, relative to ``stacks/`` (``sessions/train-demo.yaml``) or absolute;
    without it, the one of ``stacks/sessions/*.yaml`` whose session the stack is named after.
``cluster-sessions:pool`` (optional)
    A pool file that replaces the one the definition names; relative to ``stacks/`` or absolute.
``cluster-sessions:service-ports`` (with ``services``)
    The host port of each service, JSON ``{"jupyter": 30000}``: ``sessionctl up`` chooses them
    from what main1's agent publishes, under a pool-wide lock. Without it (a bare ``pulumi up``)
    each service takes its preferred port, else the first of the range, unchecked: the engine
    refuses a port that is taken, and the update fails naming it.
``cluster-sessions:stack-id``, ``cluster-sessions:made-by``
    The stack's identity on the pool (core/decisions.py), on every label of what it makes;
    ``sessionctl`` writes them for a stack it creates. Without them (a bare ``pulumi up`` of a
    stack ``sessionctl`` never made, or one made before stack ids) the id is derived from the
    stack's name, the same on every run, and no ``made-by`` label is set. A value that is not
    one ``sessionctl`` writes fails the update, nothing created.
``cluster-sessions:image``
    The definition's image resolved once by ``sessionctl up`` (core/decisions.py, issue 33):
    every container is created from ``repo@sha256:…`` (or the image ID of an image only the
    agents hold), the same content on every agent. Without it (a bare ``pulumi up``) the
    containers name the definition's reference and each agent runs what it holds under it,
    said as a warning; a kept one for another reference fails the update, nothing changed.
``cluster-sessions:index`` (with ``count: K``)
    Which of the K sessions ``<name>-1`` .. ``<name>-K`` this stack runs; without it, the one
    the stack is named after. All K are planned together, so each lands where the joint plan
    puts it.

Every kept decision the run used is exported as the output ``kept``: the backend's record,
which ``sessionctl`` (and a direct ``pulumi up`` whose config keeps none) recovers from any
clone (core/decisions.py ``recover_kept``).

Invalid definitions and pending sessions fail the update before any resource is registered,
with the same messages ``sessionctl validate`` and ``sessionctl plan`` print.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulumi

from ..core.decisions import (
    KEPT_KEYS,
    KEPT_OUTPUT,
    MalformedDecision,
    image_reason,
    read_kept,
    recover_kept,
    replace_reason,
    stack_identity,
)
from ..core.errors import InvalidInput
from ..core.governance import governed
from ..core.loader import POOLS_ENV, Loaded, load_session, operator_pool_dirs
from ..core.names import (
    CONFIG_NAMESPACE,
    DEFINITION_KEY,
    EXPIRES_KEY,
    IMAGE_KEY,
    INDEX_KEY,
    MADE_BY_KEY,
    PLACEMENT_KEY,
    POOL_KEY,
    PROJECT_KEY,
    PROVIDER_STEERING_ENV,
    SERVICE_PORTS_KEY,
    STACK_ID_KEY,
    STACKS_DIR,
)
from ..core.plan import (
    ClusterPlan,
    build_plans,
    check_usable,
    plan_placed,
    with_expiry,
    with_identity,
    with_image,
    with_service_ports,
)
from ..core.problems import DefinitionError
from ..core.services import allocate
from ..core.spec import DEFAULT_PROJECT
from .session import Session, SessionArgs, SessionPending


class InvalidDefinition(pulumi.RunError, InvalidInput):
    """The definition or its pool is invalid; one ``FILE: path: message`` line per problem."""


def resolve(value: str, stacks: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else stacks / path


def default_definition(stacks: Path, stack: str) -> str | None:
    """The definition of a stack whose config names none (a fresh clone: the checkout keeps
    no stack file): the one of ``stacks/sessions/*.yaml`` whose session is the stack's name
    (``name:``, else the file's; with ``count: K``, ``NAME-1`` .. ``NAME-K``); None when no
    file or more than one holds it (then the config must say which)."""
    import yaml

    short = stack.rsplit("/", 1)[-1]
    found = []
    for path in sorted((stacks / "sessions").glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not this stack's, or `sessionctl validate` says what is wrong
        if not isinstance(doc, dict):
            continue
        name = doc.get("name") or path.stem
        count = doc.get("count", 1)
        names = {name} if count == 1 or not isinstance(count, int) else {
            f"{name}-{k}" for k in range(1, min(count, 10_000) + 1)}
        if short in names:
            found.append(f"sessions/{path.name}")
    return found[0] if len(found) == 1 else None


def load(project_dir: Path, config: pulumi.Config | None = None) -> Loaded:
    """The session and pool this stack's configuration names."""
    config = config or pulumi.Config(CONFIG_NAMESPACE)
    stacks = project_dir / STACKS_DIR
    value = config.get(DEFINITION_KEY) or default_definition(stacks, pulumi.get_stack())
    if not value:
        raise InvalidDefinition(f"stack config {CONFIG_NAMESPACE}:definition is not set and "
                                f"no {STACKS_DIR}/sessions/<stack>.yaml is there: name the "
                                "session definition, e.g. `pulumi config set "
                                f"{CONFIG_NAMESPACE}:definition sessions/train-demo.yaml`")
    definition = resolve(value, stacks)
    pool = config.get(POOL_KEY)
    try:
        # the project sessionctl's run granted (the operator's word, checked there), else
        # the definition's own claim, checked here as there
        return governed(check_usable(load_session(
            definition, resolve(pool, stacks) if pool else None,
            pool_dirs=operator_pool_dirs(os.environ.get(POOLS_ENV)))),
            config.get(PROJECT_KEY) or None)
    except DefinitionError as exc:
        raise InvalidDefinition(f"invalid session definition:\n{exc}") from None


def as_config(path: Path, project_dir: Path) -> str:
    """A file as the stack config names it: relative to ``stacks/`` when inside it."""
    resolved = path.resolve()
    try:
        return resolved.relative_to((project_dir / STACKS_DIR).resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def shown(path: Path, project_dir: Path) -> str:
    """A path relative to the project when it is inside it, so outputs read the same anywhere."""
    try:
        return str(path.resolve().relative_to(project_dir.resolve()))
    except ValueError:
        return str(path)


def chosen(plans: tuple[ClusterPlan, ...], index: str | None, stack: str) -> ClusterPlan:
    """This stack's session among a definition's (``count``): by index, else by stack name."""
    if len(plans) == 1 and index in (None, "1"):
        return plans[0]
    if index is None:
        named = [p for p in plans if p.name == stack]
        if named:
            return named[0]
        raise InvalidDefinition(
            f"the definition makes {len(plans)} sessions (count) and stack {stack!r} is none "
            f"of them: set {CONFIG_NAMESPACE}:index to 1..{len(plans)}, or name the stack "
            f"{plans[0].name} .. {plans[-1].name}")
    if not index.isdigit() or not 1 <= int(index) <= len(plans):
        raise InvalidDefinition(f"stack config {CONFIG_NAMESPACE}:index is {index!r}: the "
                                f"definition makes {len(plans)} session(s), 1..{len(plans)}")
    return plans[int(index) - 1]


class SteeredEnvironment(pulumi.RunError, InvalidInput):
    """The environment holds what the docker provider would follow instead of the pool."""


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse to run when the shell sets what the docker provider reads in place of the
    arguments the Session leaves unset (``DOCKER_CONTEXT`` overrides even an explicit
    ``host``; ``DOCKER_CERT_PATH`` turns an ``ssh://`` agent into a TLS attempt): a session must
    go where its pool says, whoever runs ``pulumi up`` (``sessionctl`` drops them itself)."""
    steering = [k for k in PROVIDER_STEERING_ENV if environ.get(k)]
    if steering:
        raise SteeredEnvironment(
            f"the environment sets {', '.join(steering)}, which the docker provider would "
            "follow instead of the pool's agents; nothing was created: unset "
            f"{'it' if len(steering) == 1 else 'them'} (`sessionctl up` ignores them for you)")


def kept_decision(config: Mapping[str, str | None], key: str) -> Any:
    """The decision the stack keeps under ``key`` (core.decisions.read_kept); one it did not
    write fails the update before anything is made."""
    try:
        return read_kept(key, config.get(key))
    except MalformedDecision as exc:
        raise InvalidDefinition(f"stack config {CONFIG_NAMESPACE}:{exc}; nothing was created: "
                                f"{exc.remedy}") from None


def service_ports(plan: ClusterPlan, config: Mapping[str, str | None]) -> ClusterPlan:
    """``plan`` with its services' host ports: those ``sessionctl up`` recorded, else a choice
    made without looking at the engine (said as a warning)."""
    if not plan.services:
        return plan
    ports = kept_decision(config, SERVICE_PORTS_KEY)
    if ports is not None:
        missing = [s.name for s in plan.services if s.name not in ports]
        if not missing:
            return with_service_ports(plan, ports)
    span = plan.services[0].port_range
    chosen_ = allocate(plan.session.services, span, (), agent=plan.services[0].agent or "")
    pulumi.log.warn(f"session {plan.name}: service host ports chosen without looking at the "
                    f"engine ({', '.join(f'{k} {v}' for k, v in chosen_.ports.items())}); "
                    "`sessionctl up` checks what the agent publishes first")
    return with_service_ports(plan, chosen_.ports)


def kept_placement(plan: ClusterPlan, loaded: Loaded,
                   config: Mapping[str, str | None]) -> ClusterPlan:
    """``plan`` where ``sessionctl up`` placed it on the pool's live capacity (the stack's
    kept placement, core.decisions), so a direct ``pulumi up`` makes the same session. A
    placement decided for another shape is not used: the session must be placed again, on
    live capacity, by ``sessionctl up``. Without one (a stack ``sessionctl`` never placed),
    the declared-capacity plan, said as a warning."""
    placement = kept_decision(config, PLACEMENT_KEY)
    if placement is None:
        if not plan.pending:
            pulumi.log.warn(f"session {plan.name}: placed on the pool's declared capacity, "
                            "without looking at what the agents hold; `sessionctl up` places "
                            "it on live capacity and records it in the stack's config")
        return plan
    reason = replace_reason(placement, plan.session, loaded.pool)
    if reason is not None:
        raise InvalidDefinition(f"session {plan.name} must be placed again ({reason}); "
                                "nothing was changed: `sessionctl up` places it on the pool's "
                                "live capacity")
    return plan_placed(plan.session, loaded.pool, placement.placement)


def pinned_image(plan: ClusterPlan, config: Mapping[str, str | None]) -> ClusterPlan:
    """``plan`` with every container on the image ``sessionctl up`` resolved (the stack's kept
    ``image``); without one, the definition's reference as it is, said as a warning."""
    image = kept_decision(config, IMAGE_KEY)
    if image is None:
        pulumi.log.warn(f"session {plan.name}: image {plan.session.image} is not pinned to a "
                        "digest: each agent runs what it holds under that name; `sessionctl "
                        "up` resolves it once and pulls it onto every agent first")
        return plan
    reason = image_reason(image, plan.session.image)
    if reason is not None:
        raise InvalidDefinition(f"session {plan.name}: the image must be resolved again "
                                f"({reason}); nothing was changed: `sessionctl up` resolves "
                                "it and pulls it onto the agents")
    return with_image(plan, image.pinned)


def read_previous_kept(project_dir: Path, stack: str) -> Mapping[str, object] | None:
    """The kept decisions this stack's last update recorded in its backend (the ``kept``
    output), read with the CLI that runs this program (``pulumi stack output``; it takes no
    lock): for a direct ``pulumi up -s NAME`` from a checkout whose config lacks them (a fresh
    clone). None when there is none or it cannot be read (a stack never updated)."""
    try:
        from pulumi import automation as auto

        workspace = auto.LocalWorkspace(work_dir=str(project_dir))
        found = workspace.stack_outputs(stack).get(KEPT_OUTPUT)
    except Exception:  # noqa: BLE001 # no CLI, no such stack, no outputs: nothing recorded
        return None
    return found.value if found is not None and isinstance(found.value, Mapping) else None


# What reads the backend's record: replaced by a stand-in engine that holds it in process.
previous_kept = read_previous_kept


def recovered_config(project_dir: Path, stack: str, config: pulumi.Config
                     ) -> dict[str, str | None]:
    """The kept decisions this run uses (short keys): the stack config's, and where it keeps
    no identity (a checkout that never ran ``sessionctl`` against this backend), the
    backend's record of the last update, so a direct ``pulumi up`` keeps the session."""
    kept: dict[str, str | None] = {key: config.get(key) for key in KEPT_KEYS}
    if kept[STACK_ID_KEY]:
        return kept
    merged, _notes = recover_kept(kept, previous_kept(project_dir, stack))
    if merged.get(STACK_ID_KEY):
        pulumi.log.info(f"stack {stack}: its kept decisions come from its backend (the "
                        "stack's config here keeps none)")
    return merged


def identity(plan: ClusterPlan, stack: str, config: Mapping[str, str | None]) -> ClusterPlan:
    """``plan`` labelled with this stack's identity: the kept one, else derived from the
    stack's name (core.decisions.stack_identity)."""
    for key in (MADE_BY_KEY, STACK_ID_KEY):
        kept_decision(config, key)  # one we did not write: refused, naming the key
    recorded = {STACK_ID_KEY: config.get(STACK_ID_KEY), MADE_BY_KEY: config.get(MADE_BY_KEY)}
    who = stack_identity(stack, recorded)
    return with_identity(plan, who.stack_id, stack, who.made_by)


# The collector's first threshold while the program runs (CPython's default: 700).
# Registering a session is thousands of resources, each a few hundred short-lived objects in
# reference cycles (the SDK's Outputs, futures and tasks, freed only by the collector): at the
# default the collector runs thousands of times and walks the whole heap, which holds every
# resource made so far, about fifteen times over a 1,024-container session, half of the
# program's CPU time. At this threshold it walks it a few times; the peak memory stays the
# same (docs/benchmarks.md, issue 35).
GC_THRESHOLD = 50_000


def collect_less() -> None:
    """Raise the collector's first threshold to :data:`GC_THRESHOLD` for this process (the
    language host runs one program; the tests' ``standin.engine.run_program`` puts it back after
    each run)."""
    first, *rest = gc.get_threshold()
    if 0 < first < GC_THRESHOLD:
        gc.set_threshold(GC_THRESHOLD, *rest)


def run(project_dir: Path) -> Session:
    """Build this stack's Session and export its outputs."""
    collect_less()
    check_environment(os.environ)
    loaded = load(project_dir)
    stack = pulumi.get_stack()
    plans = build_plans(loaded.session, loaded.pool)
    config = pulumi.Config(CONFIG_NAMESPACE)
    decided = recovered_config(project_dir, stack, config)
    plan = chosen(plans, config.get(INDEX_KEY) or None, stack)
    plan = kept_placement(plan, loaded, decided)
    if plan.pending:  # before any resource, so nothing is created (Session checks it too)
        raise SessionPending(f"session {plan.name!r} is pending, nothing was created: "
                             f"{plan.reason}")
    plan = service_ports(plan, decided)
    plan = identity(plan, stack, decided)
    plan = pinned_image(plan, decided)
    plan = with_expiry(plan, kept_decision(decided, EXPIRES_KEY))
    if stack != plan.name:
        pulumi.log.warn(f"stack {stack!r} runs session {plan.name!r}; sessionctl names the "
                        "stack after the session, so it will not find this one")
    session = Session(plan.name, SessionArgs(plan=plan, pool=loaded.pool))
    pulumi.export("session", {
        "name": plan.name,
        "id": plan.session_id,
        "mode": plan.mode,
        "type": plan.session.type,
        "definition": shown(loaded.session_file, project_dir),
        "pool": shown(loaded.pool_file, project_dir),
        "stack_id": plan.stack_id,
        "image": plan.image,
        "project": plan.session.project or DEFAULT_PROJECT,
        "priority": plan.session.priority,
        "expires_at": plan.expires_at,
    })
    # what this run decided and kept, in the backend: every checkout's truth (issue 41)
    pulumi.export(KEPT_OUTPUT, {k: v for k, v in {
        **decided, STACK_ID_KEY: plan.stack_id, MADE_BY_KEY: plan.made_by or None,
        DEFINITION_KEY: as_config(loaded.session_file, project_dir)}.items() if v})
    pulumi.export("hosts", session.hosts)
    pulumi.export("agents", session.agents)
    pulumi.export("network", session.network)
    pulumi.export("main1", session.main1)
    pulumi.export("services", session.services)
    pulumi.export("ssh_public_key", session.ssh_public_key)
    # For ssh into main1 from outside; shown only with ``--show-secrets``.
    pulumi.export("ssh_private_key", pulumi.Output.secret(session.keys.user_private))
    # The session CA (issue 22): known_hosts trusts its public half; `sessionctl ssh` signs the
    # user's own key with the private half, which never leaves the stack (a secret).
    pulumi.export("ssh_ca_public_key", session.ssh_ca_public_key)
    pulumi.export("ssh_ca_private_key", pulumi.Output.secret(session.keys.ca_private))
    return session
