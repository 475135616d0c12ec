"""An offline review of a definition change: what ``pulumi up`` will do, as Markdown for a PR.

Pure: two plans in (either may be ``None`` for a file added or deleted), a :class:`Review` out,
rendered by :func:`to_markdown`. It predicts the engine's actions from how the ``Session``
component maps a plan onto resources and from the docker provider's schema:

- Almost every ``docker.Container`` input forces a replacement: image, env (``envs``),
  ``cpus``, ``shm_size``, ``gpus``, mounts, command, ports, labels (which carry cpu, mem and
  GPU ids, so a memory change replaces too) and uploads (the rendered bundle, compared by the
  digest of its public files, the label every container carries: rendered here for both
  sides with the same stand-in keys, so whatever the bundle holds is compared, never a list
  of the fields it is made from). Only the restart policy is updated in place. Which
  arguments force a replacement is the provider's schema, kept in
  :mod:`cluster_sessions.core.provider_facts` (docs/provider-fidelity.md).
- A size change rewrites every container's ``BACKENDAI_CLUSTER_SIZE``/``_HOSTS``/``_REPLICAS``,
  so every existing container is replaced, not only the added or removed ones.
- A container that moves to another agent changes provider: replaced. A network change
  (driver, mtu, encryption, the agent it is created on) replaces the network, and with it
  every container attached to it. Containers are delete-before-replace: a replaced container
  is down while its successor starts.
- A new session name is a new stack: the old session is not touched by ``up`` and keeps
  running until destroyed; so is a session a definition no longer makes (``count`` 1 -> 2,
  a count that shrinks: :func:`left_running`).
- A session that is new or gone shows everything it holds: every field, each list entry on a
  row of its own and shown whole, every env variable (credential values hidden).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import shlex
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

from pydantic import BaseModel

from .container_args import NetworkArgs, container_args, network_args
from .decisions import Shape
from .flowchart import Box, placement_chart
from .keys import KeyPair, SessionKeys
from .names import CLUSTER_ENV_PREFIX, ENDPOINT_LABEL
from .plan import ClusterPlan, ContainerPlan, public_warnings
from .provider_facts import CONTAINER_FORCE_NEW, NETWORK_FORCE_NEW, NETWORK_IGNORED
from .render import public_digest, render_container
from .spec import Session
from .terminal import printable
from .units import format_duration, format_size

CLUSTER_PREFIX = CLUSTER_ENV_PREFIX
# Values of variables whose names look like credentials are not repeated in the review.
SENSITIVE = re.compile(r"SECRET|TOKEN|PASSW|API_?KEY|PRIVATE|CREDENTIAL|AUTH", re.IGNORECASE)
MAX_VALUE = 80  # characters of a value shown; a longer one is cut, and says where and what

ADD, REMOVE, REPLACE, UPDATE, SAME = "add", "remove", "replace", "update", "same"


@dataclass(frozen=True)
class Change:
    what: str
    old: str | None  # None: absent before
    new: str | None  # None: absent after


@dataclass(frozen=True)
class ContainerAction:
    host: str
    action: str  # add | remove | replace | update | same
    old_agent: str | None
    new_agent: str | None
    why: tuple[str, ...] = ()


@dataclass(frozen=True)
class NetworkAction:
    name: str
    action: str  # add | remove | replace | same
    driver: str | None
    agent: str | None
    changes: tuple[Change, ...] = ()


@dataclass(frozen=True)
class Review:
    name: str
    old_name: str | None
    containers: tuple[ContainerAction, ...]
    network: NetworkAction | None
    definition: tuple[Change, ...]
    user_env: tuple[Change, ...]
    cluster_env: tuple[Change, ...]  # the same change in every container that stays
    host_env: Mapping[str, tuple[Change, ...]]  # changes particular to one container
    agents: tuple[Change, ...]  # docker_host of an agent the session uses
    warnings: tuple[str, ...] = field(default=())
    pool: tuple[Change, ...] = ()  # the pool, and what it decides for the session
    pending: bool = False  # the new definition cannot be placed: ``up`` fails
    deleted: bool = False  # the definition is gone: only ``destroy`` removes its session
    # the rendered files (the bundle up uploads) that change, by host
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the new definition no longer makes this session: ``up`` leaves it running
    left: bool = False

    def count(self, action: str) -> int:
        return sum(1 for c in self.containers if c.action == action)

    @property
    def changed(self) -> bool:
        return (any(c.action != SAME for c in self.containers)
                or (self.network is not None and self.network.action != SAME)
                or bool(self.definition or self.user_env or self.cluster_env or self.agents
                        or self.files or self.left or self.pool
                        or self.old_name != self.name))

    @property
    def summary(self) -> str:
        if not self.changed:
            return f"{self.name}: no changes"
        if self.left:
            if not self.containers:  # it was pending: nothing of it was made
                return f"{self.name}: no longer made by the new definition (it was pending)"
            return (f"{self.name}: no longer made by the new definition; `pulumi up` leaves "
                    f"its {len(self.containers)} container(s) running")
        if self.pending:
            return f"{self.name}: PENDING, `pulumi up` fails and changes nothing"
        counts = [(self.count(ADD), "to add"), (self.count(REPLACE), "to replace"),
                  (self.count(UPDATE), "to update in place"), (self.count(REMOVE), "to remove"),
                  (self.count(SAME), "unchanged")]
        shown = ", ".join(f"{n} {what}" for n, what in counts if n) or "none"
        text = f"{self.name}: containers {shown}"
        net = self.network
        if net is not None:
            text += "; network " + {ADD: "created", REMOVE: "removed", REPLACE: "replaced",
                                     SAME: "kept"}[net.action]
        return text


# --- building a review ---------------------------------------------------------------------------


def _fmt_res(plan: ClusterPlan) -> dict[str, str]:
    r = plan.resources
    return {"resources.cpu": f"{r.cpu:g}", "resources.mem": format_size(r.mem),
            "resources.shmem": format_size(r.shmem), "resources.gpu": str(r.gpu)}


def _mount_text(m) -> str:  # noqa: ANN001 (plan.MountPlan)
    return ((f"folder {m.folder} ({m.source}, kept after destroy)" if m.folder else m.source)
            + f":{m.target}{':ro' if m.read_only else ''}")


# Not rows of the definition table: the name is the stack (a rename is its own warning), the
# kind is fixed, the env has a section of its own (credential values hidden), the pool is
# shown with what it decides for the session (the pool's own rows, not its spelling here), and
# a review is of one session: ``count`` is the sessions the diff lists (each of the K is
# planned with count 1), added or left running.
NOT_ROWS = frozenset({"kind", "name", "env", "pool", "count"})
Value = str | tuple[str, ...]  # one value, or the entries of a list (each shown on its own)


def definition_fields(plan: ClusterPlan) -> dict[str, Value]:
    """The session's fields, each as one comparable string, or a list's entries each as one
    (so no entry hides behind another). The fields a reviewer compares most are spelled here;
    every other field of the definition follows from the model itself (:func:`_model_fields`),
    so a field added to ``spec.Session`` shows in the review without being listed twice."""
    s = plan.session
    spelled: dict[str, Value] = {
        "image": s.image,
        "cluster.mode": s.cluster.mode,
        "cluster.size": str(s.cluster.size),
        **_fmt_res(plan),
        "mounts": tuple(_mount_text(m) for m in plan.mounts),
        "command": shlex.join(s.command),
        "ports": tuple(f"{_address(p.host_ip)}:{p.host or '*'}->{p.container}/{p.protocol}"
                       + (" PUBLIC" if p.public else "") for p in s.ports),
        "services": tuple(
            f"{v.name}={v.port}/{v.protocol}"
            + (f" preferred {v.preferred_port}" if v.preferred_port else "")
            + (" PUBLIC" if v.public else "") for v in s.services),
        "user": f"{s.user.name} ({s.user.uid}:{s.user.gid})",
        "readiness.timeout": f"{s.readiness.timeout}s",
        "restart": s.restart,
        "distributed.master_port": str(s.distributed.master_port) if s.distributed else "(unset)",
        # governance (issue 44): the project it runs under (as granted), what it asks
        "project": s.project or "default",
        "lifetime": format_duration(s.lifetime) if s.lifetime else "(policy's)",
        "priority": str(s.priority),
        "preemptible": "true" if s.preemptible else "false",
    }
    rest = {path: value for path, value in _model_fields(Session, s)
            if path not in NOT_ROWS and path not in spelled
            and not any(path.startswith(k + ".") for k in spelled)}
    return {**spelled, **rest, "plan status": plan.status}


def _address(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip  # IPv6 bracketed before a port, as Docker shows it


def _submodel(annotation: object) -> type[BaseModel] | None:
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _model_fields(model: type[BaseModel], value: BaseModel | None,
                  prefix: str = "") -> Iterator[tuple[str, Value]]:
    """Every leaf of a definition as (dotted path, text), an unset optional block's leaves
    "(unset)"; a list as its entries."""
    for name, info in model.model_fields.items():
        path = prefix + name
        v = getattr(value, name) if value is not None else None
        sub = _submodel(info.annotation)
        if sub is not None and not isinstance(v, tuple | list):
            yield from _model_fields(sub, v, path + ".")
        elif isinstance(v, tuple | list):
            yield path, tuple(json.dumps(e.model_dump(mode="json") if isinstance(e, BaseModel)
                                         else e, sort_keys=True) for e in v)
        elif isinstance(v, dict):
            yield path, json.dumps(v, sort_keys=True)
        else:
            yield path, "(unset)" if v is None else str(v)


def _field_changes(old: Mapping[str, Value] | None,
                   new: Mapping[str, Value] | None) -> list[Change]:
    """Each changed field; for a list, each entry removed or added (a list reordered is one
    row, " | " between its entries). One side absent: every field the other holds."""
    old, new = old or {}, new or {}
    out: list[Change] = []
    for k in list(dict.fromkeys((*new, *old))):
        a, b = old.get(k), new.get(k)
        if a == b and (old and new):
            continue
        if isinstance(a, tuple) or isinstance(b, tuple):
            ea, eb = a or (), b or ()
            if not ea and not eb:  # an empty list on the only side there is
                out.append(Change(k, "(none)" if k in old else None,
                                  "(none)" if k in new else None))
                continue
            gone = [e for e in ea if e not in eb]
            came = [e for e in eb if e not in ea]
            out += [Change(k, e, None) for e in gone] + [Change(k, None, e) for e in came]
            if not gone and not came:
                out.append(Change(f"{k} (order)", " | ".join(ea), " | ".join(eb)))
        else:
            out.append(Change(k, a, b))
    return out


def _dict_changes(old: Mapping[str, str], new: Mapping[str, str],
                  keys: list[str] | None = None) -> list[Change]:
    order = keys or sorted(set(old) | set(new))
    return [Change(k, old.get(k), new.get(k)) for k in order if old.get(k) != new.get(k)]


def _cluster_env(c: ContainerPlan) -> dict[str, str]:
    return {k: v for k, v in c.env.items() if k.startswith(CLUSTER_PREFIX)}


def _network_fields(plan: ClusterPlan) -> dict[str, str]:
    n = plan.network
    return {"name": n.name, "driver": n.driver, "agent": n.agent or "(none)",
            "mtu": str(n.mtu) if n.mtu else "(engine default)",
            "encrypted": "yes" if n.encrypted else "no"}


def _network_args_changed(old: ClusterPlan, new: ClusterPlan, old_hosts: Mapping[str, str],
                          new_hosts: Mapping[str, str]) -> list[tuple[str, object, object]]:
    """The session network's arguments that differ and force a new network (all do;
    ``options`` follow the name: provider_facts.NETWORK_IGNORED)."""
    def args(plan: ClusterPlan, hosts: Mapping[str, str]) -> NetworkArgs:
        agent = plan.network.agent or ""
        return network_args(plan, hosts.get(agent, f"agent {agent}"))

    before, after = args(old, old_hosts), args(new, new_hosts)
    return [(f.name, before, after) for f in fields(NetworkArgs)
            if f.name not in NETWORK_IGNORED and NETWORK_FORCE_NEW.get(f.name, True)
            and getattr(before, f.name) != getattr(after, f.name)]


# Why a changed docker.Container argument changed, in a reviewer's words; whether it replaces
# the container is the provider's schema (provider_facts.CONTAINER_FORCE_NEW), not ours.
_ARG_REASONS: dict[str, str] = {
    "image": "image", "cpus": "resources", "memory": "resources", "memory_swap": "resources",
    "shm_size": "resources", "device_requests": "GPU ids", "mounts": "mounts",
    "command": "command", "entrypoints": "entrypoint", "ports": "published ports",
    "uploads": "rendered files", "restart": "restart policy", "must_run": "restart policy",
    "hostname": "hostname", "name": "name", "init": "init", "wait": "wait",
    "networks_advanced": "network replaced", "tmpfs": "tmpfs", "log_driver": "log limits",
    "log_opts": "log limits", "capabilities": "capabilities",
    "security_opts": "no-new-privileges",
}


# Key material of the right shapes and of no use: the bundle's public files hold public keys
# and certificates, which a stack keeps from one ``up`` to the next (keystore: a host keeps
# its key and certificate while it stays), so rendering both sides with the same stand-ins
# tells exactly which files a change of definition rewrites.
_STAND_IN = KeyPair("", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJldmlldyBzdGFuZC1pbg")
_STAND_IN_CERT = "ssh-ed25519-cert-v01@openssh.com AAAAIHNzaC1lZDI1NTE5LWNlcnQtdjAxQG9wZW5zc2guY29t"


@functools.lru_cache(maxsize=4)
def _stand_in_keys(hosts: tuple[str, ...]) -> SessionKeys:
    return SessionKeys(_STAND_IN, dict.fromkeys(hosts, _STAND_IN), _STAND_IN,
                       dict.fromkeys(hosts, _STAND_IN_CERT))


@dataclass(frozen=True)
class Bundle:
    """One container's public files as ``up`` sends them (path: mode and digest), and the
    digest of them all (the label)."""

    digest: str
    files: Mapping[str, str]


def bundles(plan: ClusterPlan, hosts: set[str]) -> dict[str, Bundle]:
    """The bundles of ``hosts`` of ``plan``, rendered one plan at a time (render keeps the
    session-wide files of the last plan it rendered: alternating two plans renders them anew
    for every container)."""
    keys = _stand_in_keys(plan.hosts)
    out = {}
    for c in plan.containers:
        if c.host in hosts:
            files = render_container(plan, c, keys)
            out[c.host] = Bundle(public_digest(files), {  # each file by its mode and digest
                f.path: f"{f.mode:o} {digest(f.content)}" for f in files if not f.secret})
    return out


# Files the definition's env is rendered into: their change is told as "user env".
USER_ENV_FILES = frozenset({"user-env.sh", "exec-env.sh"})


def _container_change(old: ClusterPlan, new: ClusterPlan, o: ContainerPlan, n: ContainerPlan,
                      old_hosts: Mapping[str, str], new_hosts: Mapping[str, str],
                      network_replaced: bool, ob: Bundle, nb: Bundle
                      ) -> tuple[list[str], bool, tuple[str, ...]]:
    """(why, replaced, files): the reasons ``o`` becomes ``n``, whether the provider replaces
    it, and the rendered files that change. Decided from what ``up`` sends: the two
    containers' provider arguments (core.container_args, as the Session passes them) and
    their bundles' digests (the label every container carries; rendered here with stand-in
    keys on both sides), never from a list of the definition's fields."""
    # an agent's endpoint, or its name where no pool said (two agents are two engines)
    before = container_args(old, o, old_hosts.get(o.agent or "", f"agent {o.agent}"))
    after = container_args(new, n, new_hosts.get(n.agent or "", f"agent {n.agent}"))
    changed = list(after.changed(before))
    files: tuple[str, ...] = ()
    if ob.digest != nb.digest:  # the upload and the digest label: both force a new container
        changed.append("uploads")
        files = tuple(p for p in dict.fromkeys((*nb.files, *ob.files))
                      if ob.files.get(p) != nb.files.get(p))
    if network_replaced:  # a replaced network replaces what is attached (why is deduplicated)
        changed.append("networks_advanced")
    why: list[str] = []
    env_changed = old.session.env != new.session.env
    if env_changed:
        why.append("user env")
    if _cluster_env(o) != _cluster_env(n):  # they are in the container's env (envs)
        why.append("cluster variables")
    told = USER_ENV_FILES if env_changed else frozenset()
    why += [_ARG_REASONS[a] for a in changed
            if a in _ARG_REASONS and (a != "uploads" or set(files) - told)]
    if "labels" in changed and dict(before.labels).get(ENDPOINT_LABEL) != dict(
            after.labels).get(ENDPOINT_LABEL):
        why.append(f"moves {o.agent} -> {n.agent}" if o.agent != n.agent
                   else f"{n.agent}'s docker_host")
    if old.limits.pids_limit != new.limits.pids_limit:  # set in place: pulumi_layer/limits.py
        why.append("pids limit")
    if changed and not why:  # an argument without a reviewer's word: say which
        why += changed
    replaced = network_replaced or any(CONTAINER_FORCE_NEW.get(a, True) for a in changed)
    return list(dict.fromkeys(why)), replaced, files


def diff_plans(old: ClusterPlan | None, new: ClusterPlan | None,
               old_hosts: Mapping[str, str] | None = None,
               new_hosts: Mapping[str, str] | None = None, *,
               old_pool: Mapping[str, str] | None = None,
               new_pool: Mapping[str, str] | None = None) -> Review:
    """What applying ``new`` to a stack holding ``old`` does. ``*_hosts``: agent name to its
    ``docker_host`` (from the pools), to see an agent that points at another engine.
    ``*_pool``: the pool a side is planned on and what it decides for the session (a row
    each, e.g. ``pool``, ``pool.agent1``, ``pool.mount_sources``), each change a row."""
    if old is None and new is None:
        raise ValueError("nothing to compare: both sides are empty")
    old_hosts, new_hosts = old_hosts or {}, new_hosts or {}
    warnings: list[str] = []
    name = (new or old).name  # type: ignore[union-attr]

    if new is not None and new.pending:
        warnings.append(f"the new definition is PENDING: {new.reason}. `pulumi up` fails "
                        "before changing anything.")
    if old is not None and new is not None and old.name != new.name:
        warnings.append(f"the session is renamed {old.name} -> {new.name}: that is another "
                        f"stack. `up` creates {new.name} from scratch and leaves {old.name} "
                        f"running until `sessionctl destroy` on the old definition.")
    if new is not None:
        warnings += public_warnings(new)
    # A deployed state exists only for a scheduled old plan of the same stack.
    base = old if old is not None and not old.pending and (new is None
                                                           or old.name == new.name) else None
    if old is not None and old.pending and (new is None or old.name == new.name):
        warnings.append("the old definition was pending, so nothing of it can be running "
                        "(unless an earlier version was applied); every container is new.")
    if base is not None and new is not None and not new.pending:
        # the pool is left out: a change of pool shows as its own rows
        moved_shape = Shape.named(base.session, "").changes(Shape.named(new.session, ""))
        if moved_shape:  # the placement kept in the stack no longer holds (core.decisions)
            warnings.append(f"the session's shape changes ({', '.join(moved_shape)}): `up` "
                            "places it again on what the pool's agents hold then, so its "
                            "containers may move to other agents than shown here.")

    # a session that is new or gone shows everything it holds (the other side absent)
    definition = _field_changes(definition_fields(old) if old else None,
                                definition_fields(new) if new else None)
    user_env = _dict_changes(old.session.env if old else {}, new.session.env if new else {})
    moved = [Change(a, old_hosts.get(a), new_hosts.get(a))
             for a in sorted(set(old_hosts) & set(new_hosts))
             if old_hosts[a] != new_hosts[a]
             and base is not None and new is not None
             and (a in base.agents or a in new.agents or a == base.network.agent)]
    moved_agents = {c.what for c in moved}
    for c in moved:
        warnings.append(f"agent {c.what} now points at {c.new} (was {c.old}): resources are "
                        "recreated through the new host, and if that is another engine the "
                        "old containers stay behind there; destroy with the old definition "
                        "first.")

    network: NetworkAction | None = None
    if new is not None and not new.pending:
        if base is None:
            network = NetworkAction(new.network.name, ADD, new.network.driver, new.network.agent)
        else:
            changes = _dict_changes(_network_fields(base), _network_fields(new),
                                    list(_network_fields(new)))
            if base.network.agent in moved_agents:
                changes.append(Change(f"{base.network.agent}'s docker_host",
                                      old_hosts.get(base.network.agent or ""),
                                      new_hosts.get(base.network.agent or "")))
            # decided from the network's provider arguments, as for containers
            replaced = bool(_network_args_changed(base, new, old_hosts, new_hosts))
            if replaced and not changes:  # an argument without a reviewer's word: show it
                changes = [Change(a, str(getattr(o, a)), str(getattr(n, a)))
                           for a, o, n in _network_args_changed(base, new, old_hosts,
                                                                new_hosts)]
            network = NetworkAction(new.network.name, REPLACE if replaced else SAME,
                                    new.network.driver, new.network.agent, tuple(changes))
    elif new is None and base is not None:
        network = NetworkAction(base.network.name, REMOVE, base.network.driver,
                                base.network.agent)

    net_replaced = network is not None and network.action == REPLACE
    actions: list[ContainerAction] = []
    cluster_changes: dict[str, list[Change]] = {}
    files: dict[str, tuple[str, ...]] = {}
    if new is not None and not new.pending:
        old_by_host = {c.host: c for c in base.containers} if base else {}
        staying = set(old_by_host) & {c.host for c in new.containers}
        old_b = bundles(base, staying) if base else {}
        new_b = bundles(new, staying) if base else {}
        for n in new.containers:
            o = old_by_host.pop(n.host, None)
            if o is None or base is None:
                actions.append(ContainerAction(n.host, ADD, None, n.agent, ("new host",)))
                continue
            cluster_changes[n.host] = _dict_changes(_cluster_env(o), _cluster_env(n))
            why, replaced, changed_files = _container_change(
                base, new, o, n, old_hosts, new_hosts, net_replaced, old_b[n.host],
                new_b[n.host])
            if changed_files:
                files[n.host] = changed_files
            if replaced:
                actions.append(ContainerAction(n.host, REPLACE, o.agent, n.agent, tuple(why)))
            elif why:  # every change is one the provider applies in place
                actions.append(ContainerAction(n.host, UPDATE, o.agent, n.agent, tuple(why)))
            else:
                actions.append(ContainerAction(n.host, SAME, o.agent, n.agent))
        actions += [ContainerAction(o.host, REMOVE, o.agent, None, ("host no longer in the "
                                                                    "session",))
                    for o in old_by_host.values()]
    elif new is None and base is not None:
        actions = [ContainerAction(o.host, REMOVE, o.agent, None, ("definition deleted",))
                   for o in base.containers]
        warnings.append("the definition is deleted: nothing destroys its stack by itself; run "
                        "`sessionctl destroy` on the old definition (the CI example does).")
    elif new is not None and base is not None:  # new is pending: nothing changes
        actions = [ContainerAction(o.host, SAME, o.agent, o.agent, ("update fails: pending",))
                   for o in base.containers]

    shared, per_host = _split_shared(cluster_changes)
    return Review(name=name, old_name=old.name if old else None,
                  containers=tuple(actions), network=network, definition=tuple(definition),
                  user_env=tuple(user_env), cluster_env=tuple(shared),
                  host_env={h: tuple(c) for h, c in per_host.items() if c},
                  agents=tuple(moved), warnings=tuple(warnings),
                  pending=new is not None and new.pending, deleted=new is None, files=files,
                  pool=tuple(_dict_changes(old_pool or {}, new_pool or {},
                                           list(dict.fromkeys([*(old_pool or {}),
                                                               *(new_pool or {})])))))


def left_running(old: ClusterPlan, hosts: Mapping[str, str] | None = None) -> Review:
    """A session the old definition made and the new one (still there) no longer does, as
    with ``count`` 1 -> 2 (``<name>`` -> ``<name>-1``, ``-2``) or a count that shrinks: ``up``
    applies only the sessions the definition makes, so this one keeps running, untouched,
    until ``sessionctl destroy`` removes it. It shows what it holds."""
    gone = diff_plans(old, None, hosts, {})
    warning = (f"the new definition no longer makes session {old.name}: `pulumi up` does not "
               "touch it and it keeps running until `sessionctl destroy` on the old definition "
               "removes it." if not old.pending else
               f"the new definition no longer makes session {old.name}, which was pending: "
               "nothing of it can be running (unless an earlier version was applied).")
    return replace(gone, deleted=False, left=True, warnings=(warning,),
                   containers=tuple(replace(c, action=SAME, new_agent=c.old_agent,
                                            why=("left running: not in the new definition",))
                                    for c in gone.containers),
                   network=None if gone.network is None else replace(gone.network,
                                                                     action=SAME))


def _split_shared(per_host: Mapping[str, list[Change]]) -> tuple[list[Change],
                                                                  dict[str, list[Change]]]:
    """Changes every staying container has in common, and the rest per container."""
    if not per_host:
        return [], {}
    sets = [set(changes) for changes in per_host.values()]
    common = set.intersection(*sets)
    first = next(iter(per_host.values()))
    shared = [c for c in first if c in common]
    return shared, {h: [c for c in changes if c not in common]
                    for h, changes in per_host.items()}


# --- Markdown ------------------------------------------------------------------------------------


def _span(text: str, cell: bool) -> str:
    """An inline code span that survives backticks and newlines in ``text``, and pipes when it
    sits in a table ``cell`` (GFM unescapes ``\\|`` there, and only there)."""
    if cell:
        text = text.replace("|", "\\|")
    if not text:
        return "*(empty)*"  # an empty code span does not render; a zero-width space is hidden
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _window(text: str, start: int) -> str:
    """At most MAX_VALUE characters of ``text`` from about ``start``, "…" where it is cut."""
    if len(text) <= MAX_VALUE:
        return text
    start = min(start, len(text) - MAX_VALUE + 2)
    if start <= 0:
        return text[:MAX_VALUE - 1] + "…"
    end = start + MAX_VALUE - 2
    return "…" + text[start:end] + ("…" if end < len(text) else "")


def digest(value: str) -> str:
    """A short digest that tells two values apart where their shown parts look alike."""
    return "sha256:" + hashlib.sha256(value.encode(errors="surrogatepass")).hexdigest()[:12]


def code(value: str | None, cell: bool = False, whole: bool = False) -> str:
    """A value as a code span (controls escaped, so it stays on its line); a value longer than
    MAX_VALUE is cut with "…" and followed by its length and digest, never cut silently
    (``whole``: never cut)."""
    if value is None:
        return "*(absent)*"
    text = printable(value)  # newlines, escapes and other controls as \n, \x1b, ...
    if len(text) <= MAX_VALUE or whole:
        return _span(text, cell)
    return f"{_span(_window(text, 0), cell)} ({len(value)} characters, {digest(value)})"


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def changed(old: str | None, new: str | None, cell: bool = False) -> tuple[str, str]:
    """Both sides of a change, shown so they never look equal: in full when both fit and their
    shown forms differ; else each cut around where they start to differ, marked "changed after
    character N", with its length and digest (also when escaping made two values look alike,
    such as a newline and a backslash followed by ``n``)."""
    if old is None or new is None:
        return code(old, cell), code(new, cell)
    shown = printable(old), printable(new)
    if shown[0] != shown[1] and max(map(len, shown)) <= MAX_VALUE:
        return _span(shown[0], cell), _span(shown[1], cell)
    at = _common_prefix(old, new)
    start = max(0, _common_prefix(*shown) - MAX_VALUE // 4)
    return tuple(  # type: ignore[return-value]
        f"{_span(_window(text, start), cell)} (changed after character {at}; "
        f"{len(value)} characters, {digest(value)})"
        for text, value in zip(shown, (old, new), strict=True))


HIDDEN = "*(hidden: the name looks like a credential)*"


def _env_pair(c: Change, key: bytes) -> tuple[str, str]:
    """A credential-looking variable's values are never shown, only a digest keyed for this
    review alone: old and new are told apart, and no digest can be matched to a guess."""
    if not SENSITIVE.search(c.what):
        return changed(c.old, c.new)

    def hidden(value: str | None) -> str:
        if value is None:  # as changed() spells it; _env_line shows the side that is there
            return code(None)
        mac = hmac.new(key, value.encode(errors="surrogatepass"), hashlib.sha256).hexdigest()
        return f"*(hidden: the name looks like a credential; digest {mac[:12]}, keyed for " \
               "this review only)*"

    return hidden(c.old), hidden(c.new)


def _env_line(c: Change, key: bytes) -> str:
    old, new = _env_pair(c, key)
    if c.old is None:
        return f"- added {code(c.what)} = {new}"
    if c.new is None:
        return f"- removed {code(c.what)} (was {old})"
    return f"- {code(c.what)}: {old} → {new}"


def _change_line(c: Change, label: str) -> str:
    old, new = changed(c.old, c.new)
    return f"- {label}: {old} → {new}"


def _field_cells(c: Change) -> tuple[str, str]:
    """A definition row: a value on one side only (a list's entry, a field of a session that
    is new or gone) is shown whole, so nothing it holds hides behind a cut; a changed value as
    :func:`changed` shows it."""
    if c.old is None or c.new is None:
        return code(c.old, cell=True, whole=True), code(c.new, cell=True, whole=True)
    return changed(c.old, c.new, cell=True)


def _files_lines(files: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Each set of rendered files that changes, with the hosts it changes in."""
    by_set: dict[tuple[str, ...], list[str]] = {}
    for host, names in files.items():
        by_set.setdefault(names, []).append(host)
    return [f"- {', '.join(code(n) for n in names)}: {', '.join(hosts)}"
            for names, hosts in by_set.items()]


ACTION_TEXT = {ADD: "add", REMOVE: "**remove**", REPLACE: "**replace**",
               UPDATE: "update in place", SAME: "unchanged"}


def to_markdown(review: Review, old_label: str = "old", new_label: str = "new") -> str:
    key = os.urandom(16)  # digests of hidden values compare within this review only
    lines = [f"### `sessionctl diff`: {review.name}", "", f"**{review.summary}**", "",
             f"{code(old_label)} → {code(new_label)}", ""]
    for w in review.warnings:
        lines.append(f"> ⚠️ {w}")
    if review.warnings:
        lines.append("")
    replaced = [c for c in review.containers if c.action == REPLACE]
    staying = [c for c in review.containers if c.action not in (ADD, REMOVE)]
    if replaced and len(replaced) == len(staying):
        if any("cluster variables" in c.why for c in replaced) and any(
                ch.what == "cluster.size" for ch in review.definition):
            lines += ["`pulumi up` replaces **every** existing container: the cluster size "
                      "changes, which rewrites each container's `BACKENDAI_CLUSTER_*` "
                      "variables.", ""]
        elif len(replaced) > 1:
            lines += ["`pulumi up` replaces **every** existing container.", ""]
    if replaced:
        lines += ["Containers are deleted before their replacements start: the session is "
                  "interrupted while `up` runs.", ""]
    if review.containers:
        verb = "`sessionctl destroy`" if review.deleted else "`pulumi up`"
        lines += [f"| host | agent | {verb} | why |", "|---|---|---|---|"]
        for c in review.containers:
            if c.action == ADD:
                agent = c.new_agent
            elif c.action == REMOVE or c.old_agent == c.new_agent:
                agent = c.old_agent
            else:
                agent = f"{c.old_agent} → {c.new_agent}"
            agent = agent or "-"
            lines.append(f"| {c.host} | {agent} | {ACTION_TEXT[c.action]} | "
                         f"{', '.join(c.why)} |")
        lines.append("")
    chart = review_chart(review)
    if chart:
        lines += ["#### Placement after the change" if not review.deleted
                  else "#### Placement now", "", *chart.splitlines(), ""]
    if review.definition:
        lines += ["#### Definition", "", "| field | old | new |",
                  "|---|---|---|"]
        lines += ["| {} | {} | {} |".format(c.what, *_field_cells(c))
                  for c in review.definition]
        lines.append("")
    if review.files:
        lines += ["#### Rendered files", "", "What `up` uploads changes (the bundle's digest "
                  "label with it):", "", *_files_lines(review.files), ""]
    if review.user_env or review.cluster_env or review.host_env:
        lines += ["#### Environment", ""]
        if review.user_env:
            lines += ["User env (every container):", ""]
            lines += [_env_line(c, key) for c in review.user_env]
            lines.append("")
        if review.cluster_env:
            lines += ["Cluster variables (every container that stays):", ""]
            lines += [_env_line(c, key) for c in review.cluster_env]
            lines.append("")
        for host, changes in review.host_env.items():
            lines += [f"Cluster variables of {host}:", ""]
            lines += [_env_line(c, key) for c in changes]
            lines.append("")
    net = review.network
    if net is not None:
        where = f"{net.driver} on {net.agent}" if net.agent else net.driver or "?"
        text = {ADD: "created", REMOVE: "**removed**", REPLACE: "**replaced**",
                SAME: "kept"}[net.action]
        lines += ["#### Network", "", f"{code(net.name)} ({where}): {text}"]
        lines += [_change_line(c, c.what) for c in net.changes]
        lines.append("")
    if review.pool:
        lines += ["#### Pool", "", "| field | old | new |", "|---|---|---|"]
        lines += ["| {} | {} | {} |".format(c.what, *changed(c.old, c.new, cell=True))
                  for c in review.pool]
        lines.append("")
    if review.agents:
        lines += ["#### Agents", ""]
        lines += [_change_line(c, f"{c.what} docker_host") for c in review.agents]
        lines.append("")
    return "\n".join(printable(line) for line in lines).rstrip() + "\n"


def review_chart(review: Review) -> str:
    """The placement ``up`` leaves (or, for a deleted definition, the one ``destroy``
    removes), each container noted with what happens to it; none for a pending session."""
    if review.pending:
        return ""
    boxes = []
    for c in review.containers:
        agent = c.old_agent if c.action == REMOVE else c.new_agent
        if agent is None:
            continue
        note = "" if c.action == SAME else c.action
        if c.action not in (ADD, REMOVE) and c.old_agent and c.old_agent != c.new_agent:
            note += f", from {c.old_agent}"
        boxes.append(Box(c.host, agent, note))
    net = review.network
    return placement_chart(boxes, net.name if net else None, (net.driver or "") if net else "")


def plan_chart(plan: ClusterPlan) -> str:
    """Where each container of a scheduled plan goes; none for a pending one."""
    if plan.pending:
        return ""
    return placement_chart([Box(c.host, c.agent) for c in plan.containers if c.agent],
                           plan.network.name, plan.network.driver)


def plan_markdown(plan: ClusterPlan, name_from_file: bool = False) -> str:
    """``sessionctl plan --markdown``: the plan for a pull request, with its picture."""
    res = plan.resources
    net = plan.network
    origin = " (name from the file name)" if name_from_file else ""
    lines = [f"### `sessionctl plan`: {code(plan.name)}{origin}", "",
             f"**{plan.status}**, {plan.mode}, {len(plan.containers)} container(s), image "
             f"{code(plan.session.image)}", ""]
    if plan.pending:
        lines += [f"> ⚠️ pending: {printable(plan.reason or '')}", ""]
    warnings = public_warnings(plan)
    if warnings:
        lines += [*(f"> ⚠️ {w}" for w in warnings), ""]
    if not plan.pending:
        lines += [f"Network {code(net.name)} ({net.driver} on {code(net.agent)})", ""]
    lines += ["| host | role | agent | cpu | mem | shmem | gpus |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {c.host} | {c.role} | {code(c.agent, cell=True) if c.agent else '-'} | "
              f"{res.cpu:g} | {format_size(res.mem)} | {format_size(res.shmem)} | "
              f"{','.join(map(str, c.gpus)) or '-'} |" for c in plan.containers]
    chart = plan_chart(plan)
    if chart:
        lines += ["", *chart.splitlines()]
    return "\n".join(printable(line) for line in lines) + "\n"


def review_to_dict(review: Review) -> dict:
    def ch(c: Change) -> dict:
        hide = SENSITIVE.search(c.what) is not None
        return {"what": c.what, "old": "[hidden]" if hide and c.old is not None else c.old,
                "new": "[hidden]" if hide and c.new is not None else c.new}

    return {
        "session": review.name,
        "old_session": review.old_name,
        "summary": review.summary,
        "changed": review.changed,
        "pending": review.pending,
        "deleted": review.deleted,
        "containers": [{"host": c.host, "action": c.action, "old_agent": c.old_agent,
                        "new_agent": c.new_agent, "why": list(c.why)}
                       for c in review.containers],
        "network": None if review.network is None else {
            "name": review.network.name, "action": review.network.action,
            "driver": review.network.driver, "agent": review.network.agent,
            "changes": [ch(c) for c in review.network.changes]},
        "definition": [ch(c) for c in review.definition],
        "user_env": [ch(c) for c in review.user_env],
        "cluster_env": [ch(c) for c in review.cluster_env],
        "host_env": {h: [ch(c) for c in cs] for h, cs in review.host_env.items()},
        "agents": [ch(c) for c in review.agents],
        "files": {h: list(names) for h, names in review.files.items()},
        "left": review.left,
        "pool": [ch(c) for c in review.pool],
        "warnings": list(review.warnings),
    }
