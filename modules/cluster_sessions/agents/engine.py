"""The engine room: the one place that talks to a Docker Engine about a session's objects.

Everyone who needs a session's containers or networks asks here (``status``, ``logs``,
``wait``, ``ls``, capacity probes, the clean-up, the emulated provider's sweep):

- reach: :func:`open_client` gives a Docker SDK client for an agent through its connector
  (:mod:`.connectors`, :mod:`.reach`: over SSH when the agent has an ``ssh`` block);
- list by label: :func:`session_containers` and :func:`session_network_attrs` through the
  SDK, :func:`labelled_inspect_command` over a shell (the label filter is
  :func:`cluster_sessions.core.names.session_label_filter`);
- whose: :class:`Owner` (the stack-id, stack and made-by labels) on every fact, and
  :func:`of_stack`, the one filter keeping a stack's own objects (``mine``:
  :meth:`cluster_sessions.core.decisions.StackIdentity.owns`);
- inspect to typed facts: :func:`container_facts` and :func:`network_facts` read ``docker
  inspect`` output (the same over a shell and through the API) into dataclasses, the only
  readers of our labels and the engine's ``State``;
- remove: :func:`remove` through the SDK, :func:`removal_command` over a shell;
- a named volume's labels (:func:`volume_labels`): whose it is;
- follow a stack's creations (:func:`follow_creations`, :func:`created_container`): the pids
  limit while ``up`` runs (:mod:`.early_limits`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..core import ledger as ledger_core
from ..core.errors import EngineFailure
from ..core.ledger import container_holds
from ..core.names import (
    CPU_LABEL,
    EXPIRES_LABEL,
    GPUS_LABEL,
    HOST_LABEL,
    MADE_BY_LABEL,
    MEM_LABEL,
    PROJECT_LABEL,
    ROLE_LABEL,
    SESSION_ID_LABEL,
    SESSION_LABEL,
    STACK_ID_LABEL,
    STACK_LABEL,
    session_label_filter,
)
from ..core.spec import DEFAULT_PROJECT
from .connectors import connector_for
from .docker_transport import retry_a_dropped_connection

Kind = Literal["container", "network"]
_FULL_ID = re.compile(r"[0-9a-f]{64}")


# --- inspect -> typed facts (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """Whose an object is, by its labels ("" for a label it does not carry: made before stack
    ids, or not by a stack of ours)."""

    stack_id: str = ""
    stack: str = ""
    made_by: str = ""
    # the project it counts to (core/governance.py): "default" without a label, "" when the
    # label is not a project name (core.ledger.project_label: another tenant's data)
    project: str = DEFAULT_PROJECT


def owner_of(labels: Mapping[str, Any]) -> Owner:
    try:
        project = ledger_core.project_label(labels.get(PROJECT_LABEL))
    except ValueError:
        project = ""
    return Owner(str(labels.get(STACK_ID_LABEL, "") or ""), str(labels.get(STACK_LABEL, "") or ""),
                 str(labels.get(MADE_BY_LABEL, "") or ""), project)


def of_stack(items: Sequence[Any], mine: Callable[[str], bool] | None) -> list[Any]:
    """The facts (anything with an ``owner``) whose stack-id label ``mine`` accepts; all of
    them when ``mine`` is None (the operator's sweep of a name, whoever holds it)."""
    return [i for i in items if mine is None or mine(i.owner.stack_id)]


@dataclass(frozen=True)
class ContainerFacts:
    """What ``docker inspect`` says of one container, and what our labels on it say."""

    container_id: str
    name: str
    session: str  # "" when the container has no session label
    session_id: str
    host: str | None  # the session's host name (main1, sub1, ...) from its label
    role: str | None
    state: str  # created | running | paused | restarting | removing | exited | dead
    health: str | None  # healthy | unhealthy | starting, when the container has a healthcheck
    started_at: str | None  # None when it never started
    finished_at: str | None  # only once it exited or died
    exit_code: int | None  # only once it exited or died
    image: str
    millicpu: int  # what it holds: our labels, else its HostConfig limits
    mem: int
    gpus: tuple[int, ...]
    owner: Owner = Owner()
    malformed: tuple[str, ...] = ()  # "LABEL: why" for each resource label not believed
    pid: int = 0  # its init process on the engine's host (``State.Pid``); 0 when not running
    expires_at: int | None = None  # when its session's lifetime ends (core.ledger)


def container_facts(attrs: Mapping[str, Any]) -> ContainerFacts:
    """A container from its ``docker inspect`` attributes (one object of the list)."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    labels = config.get("Labels") or {}
    host_cfg = attrs.get("HostConfig") or {}
    status = str(state.get("Status", "") or "")
    ended = status in ("exited", "dead")
    started = state.get("StartedAt") or None
    if started and str(started).startswith("0001-01-01"):  # never started
        started = None
    # labels are other tenants' data: one strict reading, and the rule for a malformed one
    # (what the engine enforces on it, else nothing), in core.ledger
    held = container_holds(labels, host_cfg, CPU_LABEL, MEM_LABEL, GPUS_LABEL)
    return ContainerFacts(
        container_id=str(attrs.get("Id", "")),
        name=str(attrs.get("Name", "")).lstrip("/"),
        session=str(labels.get(SESSION_LABEL, "")),
        session_id=str(labels.get(SESSION_ID_LABEL, "")),
        host=labels.get(HOST_LABEL),
        role=labels.get(ROLE_LABEL),
        state=status,
        health=(state.get("Health") or {}).get("Status"),
        started_at=started,
        finished_at=(state.get("FinishedAt") or None) if ended else None,
        exit_code=state.get("ExitCode") if ended else None,
        image=str(config.get("Image", "")),
        millicpu=held.millicpu,
        mem=held.mem,
        gpus=held.gpus,
        owner=owner_of(labels),
        malformed=held.malformed,
        pid=_pid(state.get("Pid")),
        expires_at=ledger_core.expiry_label(labels.get(EXPIRES_LABEL)),
    )


def _pid(value: Any) -> int:
    """``State.Pid`` as a pid: a positive int (JSON's number), else 0 (not a bool, a string)."""
    return value if isinstance(value, int) and not isinstance(value, bool) \
        and 0 < value < 2**31 else 0


@dataclass(frozen=True)
class NetworkFacts:
    """What ``docker network inspect`` (or ``ls``) says of one network."""

    network_id: str
    name: str
    driver: str
    scope: str  # local | swarm
    session: str
    session_id: str
    containers: int  # attached containers this engine sees (0 in a listing)
    owner: Owner = Owner()


def network_facts(attrs: Mapping[str, Any]) -> NetworkFacts:
    labels = attrs.get("Labels") or {}
    return NetworkFacts(
        network_id=str(attrs.get("Id", "")),
        name=str(attrs.get("Name", "")),
        driver=str(attrs.get("Driver", "")),
        scope=str(attrs.get("Scope", "")),
        session=str(labels.get(SESSION_LABEL, "")),
        session_id=str(labels.get(SESSION_ID_LABEL, "")),
        containers=len(attrs.get("Containers") or {}),
        owner=owner_of(labels),
    )


# --- list by label ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishedPort:
    """A host port an agent's engine publishes (or will again, for a stopped container)."""

    container: str  # its name
    session: str  # its session label, "" for a container not ours
    internal: int
    host_ip: str
    host_port: int


def published_ports(data: Mapping[str, Any]) -> list[PublishedPort]:
    """The host ports of one ``docker inspect`` document: what its HostConfig asks for (a
    stopped container takes it again when started) and what NetworkSettings says it holds (a
    port the engine picked)."""
    labels = (data.get("Config") or {}).get("Labels") or {}
    name = str(data.get("Name", "")).lstrip("/")
    session = str(labels.get(SESSION_LABEL, ""))
    found: dict[tuple[int, str, int], PublishedPort] = {}
    sources = ((data.get("HostConfig") or {}).get("PortBindings") or {},
               (data.get("NetworkSettings") or {}).get("Ports") or {})
    for bindings in sources:
        for key, binds in bindings.items():
            port, _, proto = str(key).partition("/")
            if proto not in ("tcp", "") or not port.isdigit():
                continue
            for bind in binds or ():
                text = str((bind or {}).get("HostPort") or "").strip()
                host_port = int(text) if text.isdigit() else 0
                if host_port:
                    ip = str((bind or {}).get("HostIp") or "0.0.0.0")
                    found[(int(port), ip, host_port)] = PublishedPort(name, session, int(port),
                                                                      ip, host_port)
    return list(found.values())


def published_by(client: Any) -> list[PublishedPort]:
    """Every host port ``client``'s engine publishes, for any container (ours or not, any
    state); a container gone between the listing and its inspection is left out."""
    import docker.errors

    out: list[PublishedPort] = []
    for c in client.api.containers(all=True):
        try:
            out += published_ports(client.api.inspect_container(c["Id"]))
        except docker.errors.NotFound:
            continue
    return out


LIFETIME_UNTIL = "/run/cluster-session/lifetime-until"
"""Where ``sessionctl extend`` writes a session's later end in each running container; its
lifetime timer (templates/lifetime.sh.j2) reads it each time it wakes."""


def lifetime_until(container: Any) -> int | None:
    """The later end ``extend`` wrote into a running container, or None (read as root: the file
    is root's; a value that is not digits is none)."""
    result = container.exec_run(["/bin/cat", LIFETIME_UNTIL], user="root")
    text = (result.output or b"").decode(errors="replace").strip()
    return int(text) if result.exit_code == 0 and text.isdigit() and len(text) <= 12 else None


def extend_lifetime(container: Any, until: int) -> None:
    """Write ``until`` (epoch seconds) as the running container's lifetime's new end."""
    result = container.exec_run(["/bin/sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh",
                                 str(int(until)), LIFETIME_UNTIL], user="root")
    if result.exit_code != 0:
        raise EngineFailure(f"could not extend the lifetime of {container.name}: "
                            f"{(result.output or b'').decode(errors='replace').strip()}")


IDLE_SAMPLES = "/run/cluster-session/idle-samples"
"""Where ``pool reap`` keeps its samples of a session between passes (core.idleness): in
main1's run tmpfs, root's (the session user cannot write it, and a restart empties it)."""


def idle_samples(client: Any, container_id: str) -> str:
    """The samples ``pool reap`` kept in main1 ("" when none, or it cannot be read)."""
    return read_in(client, container_id, ["/bin/cat", IDLE_SAMPLES], limit=1 << 16)


def keep_idle_samples(client: Any, container_id: str, text: str) -> bool:
    """Write ``text`` (core.idleness.format_samples) as main1's kept samples, as root, in one
    rename (a reader never sees half of it); False when the container refused it."""
    import docker.errors

    script = 'umask 077 && printf "%s" "$1" > "$2.new" && mv -f "$2.new" "$2"'
    try:
        exec_id = client.api.exec_create(container_id, ["/bin/sh", "-c", script, "sh", text,
                                                        IDLE_SAMPLES], user="0")["Id"]
        client.api.exec_start(exec_id)
        return client.api.exec_inspect(exec_id).get("ExitCode") == 0
    except docker.errors.APIError:
        return False


def session_containers(client: Any, session: str | None = None,
                       mine: Callable[[str], bool] | None = None) -> list[Any]:
    """The SDK's container objects (all states, inspected) carrying our session label, of one
    session or (no name) any, and of the stack ``mine`` accepts (:func:`of_stack`); one
    removed meanwhile is left out."""
    found = client.containers.list(all=True, ignore_removed=True,
                                   filters={"label": session_label_filter(session)})
    return [c for c in found
            if mine is None or mine(owner_of((c.attrs.get("Config") or {}).get("Labels")
                                             or {}).stack_id)]


def live_stacks(client: Any) -> set[str]:
    """The stack ids this engine's containers and networks of ours carry (``pool sweep
    --scratch``: a scratch directory of any other stack is of a stack that is gone)."""
    ids = {owner_of((c.attrs.get("Config") or {}).get("Labels") or {}).stack_id
           for c in session_containers(client)}
    ids |= {owner_of(n.get("Labels") or {}).stack_id for n in session_network_attrs(client)}
    return ids - {""}


def volume_labels(client: Any, name: str) -> Mapping[str, str] | None:
    """The labels of the named volume ``name`` on this engine ({} when it has none), or None
    when there is no such volume."""
    import docker

    try:
        return client.api.inspect_volume(name).get("Labels") or {}
    except docker.errors.NotFound:
        return None


def ensure_volume(client: Any, name: str, labels: Mapping[str, str], session: str,
                  label: str) -> str:
    """The named volume ``name`` made with ``labels`` if missing (``made``), or kept when it
    is this session's own (``kept``); another's raises ValueError saying whose
    (core.folders.volume_verdict). Made here rather than by a mount's ``volume_options``: the
    docker provider refuses those on an engine before API 1.45 (Docker 26) whatever they hold
    (kreuzwerker ``resource_docker_container_funcs.go``, "Setting VolumeOptions.Subpath
    requires docker version 1.45 or higher"; docs/provider-fidelity.md)."""
    import docker

    from ..core.folders import volume_verdict

    found = volume_labels(client, name)
    problem = volume_verdict(found, session, label)
    if problem:
        raise ValueError(f"volume {name} {problem}")
    if found is not None:
        return "kept"
    try:
        client.api.create_volume(name, labels=dict(labels))
    except docker.errors.APIError as exc:
        raise ValueError(f"volume {name}: the engine did not make it: {exc}") from None
    again = volume_labels(client, name)  # another made it meanwhile: whose is it?
    problem = volume_verdict(again, session, label)
    if problem:
        raise ValueError(f"volume {name} {problem}")
    return "made"


def create_network(client: Any, name: str, driver: str, attachable: bool,
                   options: Mapping[str, str], labels: Mapping[str, str]) -> str:
    """The session network made on the engine, its ID; ValueError naming it when the engine
    refuses (a network of that name exists: made by someone else, or left by an interrupted
    ``up``, which ``up`` sweeps first). One ``NetworkCreate`` and nothing more: the docker
    provider's ``docker.Network`` then waits 2 s before it reads the network back
    (kreuzwerker ``resource_docker_network_funcs.go`` l. 20, ``networkReadRefreshDelay``),
    on every create, read and delete (pulumi_layer/network.py)."""
    import docker

    try:
        made = client.api.create_network(name, driver=driver, options=dict(options) or None,
                                         labels=dict(labels), attachable=attachable or None,
                                         check_duplicate=True)
    except docker.errors.APIError as exc:
        raise ValueError(f"network {name}: the engine did not make it: "
                         f"{exc.explanation or exc}") from None
    return str(made["Id"])


def network_exists(client: Any, network_id: str) -> bool:
    import docker

    try:
        client.api.inspect_network(network_id)
    except docker.errors.NotFound:
        return False
    return True


def session_network_attrs(client: Any, session: str | None = None,
                          mine: Callable[[str], bool] | None = None) -> list[Mapping[str, Any]]:
    """The networks carrying our session label that this engine sees, as the API lists them,
    of the stack ``mine`` accepts."""
    found = client.api.networks(filters={"label": session_label_filter(session)})
    return [n for n in found
            if mine is None or mine(owner_of(n.get("Labels") or {}).stack_id)]


def labelled_inspect_command(kind: Kind, session: str | None = None) -> str:
    """A shell line that prints ``docker inspect`` of every container (or network) with our
    label (``[]`` for none; an object gone between the listing and the inspect is left out,
    not an error)."""
    ls, inspect = (("docker ps -a", "docker inspect") if kind == "container"
                   else ("docker network ls", "docker network inspect"))
    flt = _single_quoted(f"label={session_label_filter(session)}")
    return (f"ids=$({ls} -q --no-trunc --filter {flt}) || exit $?; "
            f"if [ -z \"$ids\" ]; then echo '[]'; else {inspect} $ids 2>/dev/null; fi; exit 0")


def _single_quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# --- remove -------------------------------------------------------------------------------------


def remove(client: Any, kind: Kind, object_id: str) -> bool:
    """Remove a container (with its anonymous volumes, running or not) or a network through
    the API; False when it was gone already. Other engine errors propagate."""
    import docker.errors

    try:
        if kind == "container":
            client.api.remove_container(object_id, force=True, v=True)
        else:
            client.api.remove_network(object_id)
    except docker.errors.NotFound:
        return False
    return True


def removal_command(kind: Kind, ids: Sequence[str]) -> str:
    """The shell line that removes the objects as :func:`remove` does."""
    quoted = " ".join(shlex.quote(i) for i in ids)
    return f"docker rm -f -v {quoted}" if kind == "container" else f"docker network rm {quoted}"


def gone_already(stderr: str) -> bool:
    """A removal over a shell that failed only because the object was gone."""
    return "No such" in stderr or "not found" in stderr


# --- limits the docker provider cannot set (pulumi_layer/limits.py) ------------------------------


def set_pids_limit(client: Any, container_id: str, limit: int, *,
                   unless_held: bool = False) -> int:
    """Bound a created container's tasks (``HostConfig.PidsLimit``, the pids cgroup) through the
    engine's ContainerUpdate, which the engine keeps across restarts; returns what the engine
    then reports. Refuses an engine that did not apply it (a kernel without the pids cgroup
    answers with a warning), rather than leave the container unbounded.

    ``unless_held``: look first and leave a container that holds the limit already (set by
    ``sessionctl up``'s watch before its start): the engine keeps ``HostConfig`` only for an
    update it applied (it restores the old one when runc's fails), and an update of a running
    container runs ``runc update``, CPU taken from the session's own start-ups."""

    if unless_held and _pids_limit(client, container_id) == limit:
        return limit
    url = client.api._url("/containers/{0}/update", container_id)
    answer = client.api._result(client.api._post_json(url, data={"PidsLimit": limit}), True)
    held = _pids_limit(client, container_id)
    if held != limit:
        warnings = "; ".join(str(w) for w in (answer or {}).get("Warnings") or ())
        raise EngineFailure(f"container {container_id[:12]} has pids limit {held!r}, not "
                            f"{limit}{': ' + warnings if warnings else ''}")
    return held


def _pids_limit(client: Any, container_id: str) -> Any:
    return (client.api.inspect_container(container_id).get("HostConfig") or {}).get("PidsLimit")


def created_container(event: Mapping[str, Any], stack_id: str) -> str | None:
    """The id of a container of stack ``stack_id`` that an engine event says was just created,
    or None for any other event. The engine's own filter (:func:`follow_creations`) asked for
    these already; this check does not rely on it."""
    actor = event.get("Actor") or {}
    attributes = actor.get("Attributes") or {}
    cid = actor.get("ID")
    if (event.get("Type") != "container" or event.get("Action") != "create" or not stack_id
            or attributes.get(STACK_ID_LABEL) != stack_id or not isinstance(cid, str)
            or not _FULL_ID.fullmatch(cid)):
        return None
    return cid


def follow_creations(client: Any, stack_id: str, limit: int) -> tuple[Any, list[str]]:
    """(the engine's stream of container creations labelled with ``stack_id``, the ids of that
    stack's containers made earlier that have not got pids limit ``limit``: created, or
    started and waiting for it). The stream is opened first, so a container is in one or the
    other (or both); ``close()`` on the stream ends it."""
    import docker.errors

    label = [f"{STACK_ID_LABEL}={stack_id}"]
    stream = client.api.events(decode=True, filters={
        "type": ["container"], "event": ["create"], "label": label})
    try:
        waiting = []
        for c in client.api.containers(all=True, filters={"label": label}):
            cid = str(c["Id"])
            if c.get("State") not in ("created", "running", "restarting") \
                    or not _FULL_ID.fullmatch(cid):
                continue
            try:
                held = (client.api.inspect_container(cid).get("HostConfig") or {})
            except docker.errors.NotFound:  # removed meanwhile
                continue
            if held.get("PidsLimit") != limit:
                waiting.append(cid)
    except Exception:
        stream.close()
        raise
    return stream, waiting


# --- what a container uses (agents/sampling.py; the arithmetic: core/stats.py) ---------------


class Gone(EngineFailure):
    """The container was removed between its listing and this call (the samplers say
    ``gone``; it never reaches the command line)."""


def container_stats(client: Any, container_id: str) -> Mapping[str, Any]:
    """One stats document of a container (``stream=false``): ``one-shot`` where the engine has
    it (API 1.41), so the engine answers at once instead of waiting a second for its own
    second reading; the rate comes from two of these (:func:`cluster_sessions.core.stats.
    cpu_percent`). :class:`Gone` when the container is no more."""
    import docker.errors

    try:
        try:
            return client.api.stats(container_id, stream=False, one_shot=True)
        except docker.errors.InvalidVersion:
            return client.api.stats(container_id, stream=False)
    except docker.errors.APIError:  # no such container, or one being removed: an answer
        raise Gone(container_id) from None  # about it, not about the agent
    except ValueError:  # an empty body (JSONDecodeError): the engine ended the stream without
        # a document, as for a container removed during the call (seen on the shared engine
        # while another developer's session went); a broken connection is a ConnectionError
        raise Gone(container_id) from None


def log_tail(client: Any, container_id: str, lines: int) -> list[str]:
    """The last ``lines`` lines the container wrote to stderr, each with the engine's
    timestamp (where main1's sshd logs: ``sshd -D -e``, templates/setup.sh.j2)."""
    import docker.errors

    try:
        raw = client.api.logs(container_id, stdout=False, stderr=True, timestamps=True,
                              tail=lines)
    except docker.errors.APIError:
        raise Gone(container_id) from None
    return raw.decode(errors="replace").splitlines()


def read_in(client: Any, container_id: str, argv: Sequence[str], limit: int = 1 << 20) -> str:
    """What ``argv`` prints when run in a running container as root, bounded (``cat`` of
    ``/proc/net/tcp``: the container's own network namespace); "" when it fails."""
    import docker.errors

    try:
        exec_id = client.api.exec_create(container_id, list(argv), stdout=True, stderr=False,
                                         user="0")["Id"]
        out = client.api.exec_start(exec_id, demux=False)
    except docker.errors.NotFound:
        raise Gone(container_id) from None
    except docker.errors.APIError:  # not running, or no such program in the image
        return ""
    return (out or b"")[:limit].decode(errors="replace")


# --- the pool's ledger: never-started marker containers (agents/pool_ledger.py) -------------


@dataclass(frozen=True)
class MarkerFacts:
    """One marker container of a pool's ledger, as ``docker inspect`` shows it."""

    container_id: str
    name: str
    created: str  # the engine's own timestamp (RFC 3339, nanoseconds)
    labels: Mapping[str, str]


def marker_facts(attrs: Mapping[str, Any]) -> MarkerFacts:
    return MarkerFacts(container_id=attrs.get("Id", ""),
                       name=(attrs.get("Name") or "").lstrip("/"),
                       created=attrs.get("Created") or "1970-01-01T00:00:00Z",
                       labels=dict((attrs.get("Config") or {}).get("Labels") or {}))


def inspect_marker(client: Any, name_or_id: str) -> MarkerFacts | None:
    """The marker named (or with id) ``name_or_id``; None when there is none."""
    import docker

    try:
        return marker_facts(client.api.inspect_container(name_or_id))
    except docker.errors.NotFound:
        return None


def ledger_markers(client: Any, labels: Sequence[str]) -> list[MarkerFacts]:
    """Every marker carrying all of ``labels`` (``key=value``), in any state; one removed
    while listed is left out."""
    listed = client.api.containers(all=True, filters={"label": list(labels)})
    found = [inspect_marker(client, item["Id"]) for item in listed]
    return [m for m in found if m is not None]


# --- reach --------------------------------------------------------------------------------------


def open_client(agent: Any, timeout: float) -> Any:
    """A Docker client for the agent, through its connector (over SSH with the pool's key and
    known_hosts when the agent has them, else its docker_host), answering a ping.
    :func:`close_client` closes the connection too."""
    connector = connector_for(agent, timeout=timeout)
    try:
        client = connector.docker_client()
        client.ping()
    except BaseException:
        connector.close()
        raise
    client.connector = connector
    retry_a_dropped_connection(client)
    return client


def close_client(client: Any) -> None:
    client.close()
    connector = getattr(client, "connector", None)
    if connector is not None:
        connector.close()
