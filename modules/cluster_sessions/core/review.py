"""An offline review of a definition change: what ``pulumi up`` will do, as Markdown for a PR.

Pure: two plans in (either may be ``None`` for a file added or deleted), a :class:`Review` out,
rendered by :func:`to_markdown`. It predicts the engine's actions from how the ``Session``
component maps a plan onto resources and from the docker provider's schema:

- Almost every ``docker.Container`` input forces a replacement: image, env (``envs``),
  ``cpus``, ``shm_size``, ``gpus``, mounts, command, ports, labels (which carry cpu, mem and
  GPU ids, so a memory change replaces too) and uploads (the rendered files, which carry the
  host list, the container user and the readiness timeout). Only the restart policy is
  updated in place. Which arguments force a replacement is the provider's schema, kept in
  :mod:`cluster_sessions.core.provider_facts` (docs/provider-fidelity.md).
- A size change rewrites every container's ``BACKENDAI_CLUSTER_SIZE``/``_HOSTS``/``_REPLICAS``,
  so every existing container is replaced, not only the added or removed ones.
- A container that moves to another agent changes provider: replaced. A network change
  (driver, mtu, encryption, the agent it is created on) replaces the network, and with it
  every container attached to it. Containers are delete-before-replace: a replaced container
  is down while its successor starts.
- A new session name is a new stack: the old session is not touched by ``up`` and keeps
  running until destroyed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .container_args import container_args
from .flowchart import Box, placement_chart
from .names import CLUSTER_ENV_PREFIX, ENDPOINT_LABEL
from .plan import ClusterPlan, ContainerPlan
from .provider_facts import CONTAINER_FORCE_NEW
from .services import public_warnings
from .terminal import printable
from .units import format_size

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
    pending: bool = False  # the new definition cannot be placed: ``up`` fails
    deleted: bool = False  # the definition is gone: only ``destroy`` removes its session

    def count(self, action: str) -> int:
        return sum(1 for c in self.containers if c.action == action)

    @property
    def changed(self) -> bool:
        return (any(c.action != SAME for c in self.containers)
                or (self.network is not None and self.network.action != SAME)
                or bool(self.definition or self.user_env or self.cluster_env or self.agents
                        or self.old_name != self.name))

    @property
    def summary(self) -> str:
        if not self.changed:
            return f"{self.name}: no changes"
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


def definition_fields(plan: ClusterPlan) -> dict[str, str]:
    """The session's fields that reach its resources, each as one comparable string."""
    s = plan.session
    ports = ", ".join(f"{p.host_ip}:{p.host or '*'}->{p.container}/{p.protocol}"
                      for p in s.ports)
    mounts = ", ".join(
        (f"folder {m.folder} ({m.source}, kept after destroy)" if m.folder else m.source)
        + f":{m.target}{':ro' if m.read_only else ''}" for m in plan.mounts)
    return {
        "image": s.image,
        "cluster.mode": s.cluster.mode,
        "cluster.size": str(s.cluster.size),
        **_fmt_res(plan),
        "mounts": mounts or "(none)",
        "command": " ".join(s.command),
        "ports": ports or "(none)",
        "services": ", ".join(
            f"{v.name}={v.port}/{v.protocol}"
            + (f" preferred {v.preferred_port}" if v.preferred_port else "")
            + (" PUBLIC" if v.public else "") for v in s.services) or "(none)",
        "user": f"{s.user.name} ({s.user.uid}:{s.user.gid})",
        "readiness.timeout": f"{s.readiness.timeout}s",
        "restart": s.restart,
        "distributed.master_port": str(s.distributed.master_port) if s.distributed else "(unset)",
        "plan status": plan.status,
    }


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


def _container_change(old: ClusterPlan, new: ClusterPlan, o: ContainerPlan, n: ContainerPlan,
                      old_hosts: Mapping[str, str], new_hosts: Mapping[str, str],
                      network_replaced: bool) -> tuple[list[str], bool]:
    """(why, replaced): the reasons ``o`` becomes ``n`` and whether the provider replaces it,
    from the two containers' provider arguments (core.container_args, as the Session passes
    them). The bundle (``uploads``) needs the keys, so its change is read from what it holds:
    the hosts, the user, the readiness timeout and the definition's env (which only the
    bundle carries, never the container's env)."""
    # an agent's endpoint, or its name where no pool said (two agents are two engines)
    before = container_args(old, o, old_hosts.get(o.agent or "", f"agent {o.agent}"))
    after = container_args(new, n, new_hosts.get(n.agent or "", f"agent {n.agent}"))
    changed = list(after.changed(before))
    so, sn = old.session, new.session
    bundle = so.user != sn.user or so.readiness != sn.readiness or old.hosts != new.hosts
    if bundle or so.env != sn.env:
        changed.append("uploads")
    if network_replaced:  # a replaced network replaces what is attached (why is deduplicated)
        changed.append("networks_advanced")
    why: list[str] = []
    if so.env != sn.env:
        why.append("user env")
    if _cluster_env(o) != _cluster_env(n):  # they are in the container's env (envs)
        why.append("cluster variables")
    why += [_ARG_REASONS[a] for a in changed
            if a in _ARG_REASONS and (a != "uploads" or bundle)]
    if "labels" in changed and dict(before.labels).get(ENDPOINT_LABEL) != dict(
            after.labels).get(ENDPOINT_LABEL):
        why.append(f"moves {o.agent} -> {n.agent}" if o.agent != n.agent
                   else f"{n.agent}'s docker_host")
    replaced = network_replaced or any(CONTAINER_FORCE_NEW.get(a, True) for a in changed)
    return list(dict.fromkeys(why)), replaced


def diff_plans(old: ClusterPlan | None, new: ClusterPlan | None,
               old_hosts: Mapping[str, str] | None = None,
               new_hosts: Mapping[str, str] | None = None) -> Review:
    """What applying ``new`` to a stack holding ``old`` does. ``*_hosts``: agent name to its
    ``docker_host`` (from the pools), to see an agent that points at another engine."""
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
        warnings += public_warnings(new.services)
    # A deployed state exists only for a scheduled old plan of the same stack.
    base = old if old is not None and not old.pending and (new is None
                                                           or old.name == new.name) else None
    if old is not None and old.pending and (new is None or old.name == new.name):
        warnings.append("the old definition was pending, so nothing of it can be running "
                        "(unless an earlier version was applied); every container is new.")

    definition = _dict_changes(definition_fields(old), definition_fields(new),
                               list(definition_fields(new))) if old and new else []
    user_env = _dict_changes(old.session.env, new.session.env) if old and new else []
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
            network = NetworkAction(new.network.name, REPLACE if changes else SAME,
                                    new.network.driver, new.network.agent, tuple(changes))
    elif new is None and base is not None:
        network = NetworkAction(base.network.name, REMOVE, base.network.driver,
                                base.network.agent)

    net_replaced = network is not None and network.action == REPLACE
    actions: list[ContainerAction] = []
    cluster_changes: dict[str, list[Change]] = {}
    if new is not None and not new.pending:
        old_by_host = {c.host: c for c in base.containers} if base else {}
        for n in new.containers:
            o = old_by_host.pop(n.host, None)
            if o is None or base is None:
                actions.append(ContainerAction(n.host, ADD, None, n.agent, ("new host",)))
                continue
            cluster_changes[n.host] = _dict_changes(_cluster_env(o), _cluster_env(n))
            why, replaced = _container_change(base, new, o, n, old_hosts, new_hosts,
                                              net_replaced)
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
                  pending=new is not None and new.pending, deleted=new is None)


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


def code(value: str | None, cell: bool = False) -> str:
    """A value as a code span (controls escaped, so it stays on its line); a value longer than
    MAX_VALUE is cut with "…" and followed by its length and digest, never cut silently."""
    if value is None:
        return "*(absent)*"
    text = printable(value)  # newlines, escapes and other controls as \n, \x1b, ...
    if len(text) <= MAX_VALUE:
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
        lines += ["| {} | {} | {} |".format(c.what, *changed(c.old, c.new, cell=True))
                  for c in review.definition]
        lines.append("")
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
    else:
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
        "warnings": list(review.warnings),
    }
