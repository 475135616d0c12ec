"""Sampling what a session's containers use, on their agents (issue 43): the engine side of
``sessionctl top``, ``ls --sample`` and ``pool usage``. The arithmetic is
:mod:`cluster_sessions.core.stats`; the engine calls are the engine room's
(:mod:`.engine`: listing by label, stats, logs, a read inside main1).

Per agent, at once for every agent: one connection (:func:`.engine.open_client`: over SSH,
one connection whose channels carry the Docker API and shell commands), the session's
containers listed by label (with each one's init pid), then two readings of each container
``interval`` apart. Over SSH the readings are one command on one channel
(:func:`cgroup_command`): each container's cgroup files (cpu usage, memory current/limit and
inactive file cache, pids) and ``/proc/PID/net/dev``, read twice with ``sleep interval``
between, printed as plain text :func:`cluster_sessions.core.stats.cgroup_readings` parses
(Backend.AI's agent reads cgroups the same way, its "cgroup" stat mode). The engine's stats
API is kept for the local engine, an agent without a shell (``tcp://``), and any container
whose files the command could not read; each container says which (``source``: ``cgroup`` or
``api``). Through the API a one-shot call is answered at the engine's stats collector's next
tick (once a second) and holds an SSH channel until then, so those calls are one queue on at
most :data:`PER_AGENT` - 1 channels (sshd's ``MaxSessions``, 10, is never outgrown: no second
SSH connection); 11 containers take 3 ticks that way, against one interval for the files.
Beside them: ``nvidia-smi`` on the agent (only where a container holds GPUs) and main1's
logins (its sshd's log tail and ``/proc/net/tcp``), meanwhile over SSH.

An agent that cannot be reached is a row of its own (``unreachable``) and the others are
still sampled; a container removed between the listing and its reading is ``gone``.
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import stats
from ..core.spec import Agent
from . import engine
from .connectors import SSHConnector
from .facts import GpuUse

PER_AGENT = 9  # channels in use per agent: 8 stats calls and nvidia-smi, below sshd's
# MaxSessions (10) channels per connection (main1's logins are read after the readings)
LOG_TAIL = 2000  # lines of main1's stderr read for sshd's last "Accepted" line
MAIN = "main1"


@dataclass
class Sampled:
    """One sample of a session (or of every labelled container: ``session`` None)."""

    sampled_at: float
    containers: list[stats.ContainerUse] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)  # agent -> why
    started: dict[str, float] = field(default_factory=dict)  # session -> main1's start
    connections: dict[str, int] = field(default_factory=dict)  # agent -> SSH connections used

    @property
    def ok(self) -> bool:
        return not self.unreachable


Connect = Callable[[Agent], Any]


def _connect(agent: Agent) -> Any:
    return engine.open_client(agent, 15)


def _order(host: str | None) -> tuple[int, int, str]:
    host = host or ""
    role = host.rstrip("0123456789")
    idx = host[len(role):]
    return (0 if role == "main" else 1, int(idx) if idx else 0, host)


def _agent_sample(agent: Agent, session: str | None, mine: Callable[[str], bool] | None,
                  interval: float, logins: bool, connect: Connect, cause: Callable, out: Sampled,
                  lock: threading.Lock, kept: dict[str, Any] | None) -> None:
    client = kept.get(agent.name) if kept is not None else None
    try:
        if client is None:
            client = connect(agent)
    except Exception as exc:  # any failure to reach it: a row of its own
        with lock:
            out.unreachable[agent.name] = cause(agent, exc)
        return
    if kept is not None:
        with lock:
            kept[agent.name] = client
    failed = False
    try:
        listed = engine.session_containers(client, session, mine)
        facts = sorted((engine.container_facts(c.attrs) for c in listed),
                       key=lambda f: (f.session, _order(f.host)))
        services = {c.attrs.get("Id"): sorted({p.internal for p in engine.published_ports(c.attrs)})
                    for c in listed}
        rows: list[tuple[engine.ContainerFacts, stats.ContainerUse | None]] = []
        running = [f for f in facts if f.state == "running"]
        connector = getattr(client, "connector", None)
        gpus: dict[str, Any] = {}
        gpu_thread = None
        if connector is not None and any(f.gpus for f in running):
            def ask_gpus() -> None:
                try:
                    rc, o, e = connector.run(GpuUse.command, timeout=15)
                    gpus["readings"] = GpuUse().parse(rc, o, e)
                except Exception:  # no shell (tcp:// agents), a broken connection: unknown
                    gpus["readings"] = None
            gpu_thread = threading.Thread(target=ask_gpus, daemon=True)
            gpu_thread.start()

        # main1's logins, over SSH meanwhile (the cgroup read mostly waits out the interval)
        login_of: dict[str, Any] = {}
        login_failed: list[BaseException] = []

        def ask_logins() -> None:
            try:
                for f in running:
                    if logins and f.host == MAIN:
                        login_of[f.container_id] = _logins(client, f,
                                                           services.get(f.container_id, ()))
            except Exception as exc:  # raised below, as the agent's
                login_failed.append(exc)
        over_ssh = isinstance(connector, SSHConnector)
        login_thread = threading.Thread(target=ask_logins, daemon=True)
        if over_ssh:
            login_thread.start()
        pairs: dict[str, list[stats.Reading | None]] = {}
        source = {}
        if over_ssh:  # the files, on one channel (not the API's once-a-second tick)
            pairs.update(_cgroup_readings(connector, running, interval))
            source = dict.fromkeys(pairs, "cgroup")
            login_thread.join(30)  # done: the API's calls below get every channel
        rest = [f for f in running if f.container_id not in pairs]
        if rest:  # the local engine, an agent without a shell, files it could not read
            pairs.update(_readings(client, rest, interval,
                                   max(1, min(PER_AGENT - 1, len(rest)))))
        source.update((f.container_id, "api") for f in rest)
        if not over_ssh:
            ask_logins()
        if login_failed:
            raise login_failed[0]
        login_of = {cid: v for cid, v in login_of.items() if None not in pairs.get(cid, [None])}
        if gpu_thread is not None:
            gpu_thread.join(20)
        readings = gpus.get("readings")
        measured = {f.container_id: tuple(pairs[f.container_id]) for f in running}
        for f in facts:
            cpus, mem = f.millicpu / 1000, f.mem or None
            pair = measured.get(f.container_id)
            if pair is None:
                use = stats.ContainerUse(f.host or f.name, agent.name, cpus, mem,
                                         gpu_ids=f.gpus, state="not running")
            elif None in pair:
                use = stats.ContainerUse(f.host or f.name, agent.name, cpus, mem,
                                         gpu_ids=f.gpus, state="gone")
            else:
                use = stats.measured(f.host or f.name, agent.name, cpus, f.gpus, pair[0],
                                     pair[1], readings)
                use.source = source.get(f.container_id)
                if f.container_id in login_of:
                    logged, conns, now = login_of[f.container_id]
                    use.connections = conns
                    use.last_login = stats.last_login(logged, conns.get(stats.SSHD_PORT, 0),
                                                      now)
            rows.append((f, use))
        with lock:
            for f, use in rows:
                use.session = f.session
                out.containers.append(use)
                if f.host == MAIN and f.started_at:
                    at = stats.parse_time(f.started_at)
                    if at is not None:
                        out.started[f.session] = at
            if connector is not None:
                out.connections[agent.name] = 1 + len(getattr(connector, "_more", ()) or ())
    except Exception as exc:
        failed = True
        with lock:
            out.unreachable[agent.name] = cause(agent, exc)
    finally:
        if kept is None or failed:  # a kept connection that failed is opened anew next time
            if kept is not None:
                with lock:
                    kept.pop(agent.name, None)
            engine.close_client(client)


def _readings(client: Any, running: Sequence[engine.ContainerFacts], interval: float,
              workers: int) -> dict[str, list[stats.Reading | None]]:
    """Two readings of each container (``[first, second]``; None for one gone meanwhile),
    ``workers`` calls in flight. The engine answers a one-shot call at its stats collector's
    next tick (every second, for all containers at once), and each call holds an SSH channel
    until then: so the calls are one queue, a container's second reading queued behind the
    first readings still to take, not a first round then a second (11 containers on 7
    channels: 3 ticks instead of 4). The second is asked ``interval`` - 1 s after the first
    came (the tick adds the second); the rate uses the engine's own reading times."""
    import queue

    tasks: queue.Queue = queue.Queue()
    got: dict[str, list[stats.Reading | None]] = {f.container_id: [] for f in running}
    left = [2 * len(running)]
    errors: list[BaseException] = []
    cond = threading.Lock()
    for f in running:
        tasks.put((0.0, f))

    def work() -> None:
        while True:
            with cond:
                if left[0] <= 0 or errors:
                    return
            try:
                not_before, f = tasks.get(timeout=0.05)
            except queue.Empty:
                continue
            pause = not_before - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                r: stats.Reading | None = stats.reading(
                    engine.container_stats(client, f.container_id))
            except engine.Gone:
                r = None
            except BaseException as exc:  # the connection broke: the agent's row says so
                with cond:
                    errors.append(exc)
                return
            with cond:
                mine = got[f.container_id]
                mine.append(r)
                if r is None and len(mine) == 1:  # gone before its first: no second
                    mine.append(None)
                    left[0] -= 2
                else:
                    left[0] -= 1
                    if len(mine) == 1:
                        tasks.put((time.monotonic() + max(0.0, interval - 1.0), f))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got


# One command per agent (over SSH): each container's cgroup files and network counters, read
# twice ``interval`` apart on one channel, in the format core.stats.cgroup_readings parses. Only
# reads; run as the pool's SSH user (cgroup files, /proc/PID/cgroup and /proc/PID/net/dev are
# world-readable); ids and pids come from the engine and are checked before they are written in.
# The cgroup directory is the one /proc/PID/cgroup names under /sys/fs/cgroup (v1: the
# controller's hierarchy; v2: the unified one), leading components dropped until it exists (a
# host whose cgroup mounts are some cgroup's own), and it must name the container's id (a pid
# reused by another process is not read).
_CGROUP_SCRIPT = r"""
echo 'cs-cgroup-read 1'
n=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
mt=0
while read -r k v u; do [ "$k" = MemTotal: ] && mt=$v; done </proc/meminfo
echo "H $n $mt"
u2=/sys/fs/cgroup; [ -f $u2/cgroup.controllers ] || u2=/sys/fs/cgroup/unified
under() { d=; q=$2
  while :; do
    if [ -d "$1$q" ]; then d=$1$q; return 0; fi
    case $q in /*/*) q=/${q#/*/};; *) return 1;; esac
  done; }
one() { id=$1; pid=$2; c1=; m1=; p1=; v2=
  while IFS=: read -r num ctl p; do
    case ",$ctl," in
      ,,) v2=$p;; *,cpuacct,*) c1=$ctl:$p;; *,memory,*) m1=$ctl:$p;; *,pids,*) p1=$ctl:$p;;
    esac
  done 2>/dev/null </proc/$pid/cgroup || { echo "X $id no /proc/$pid/cgroup"; return; }
  echo "R $id $(date +%s%N)"
  if [ -n "$m1" ]; then
    under /sys/fs/cgroup/${c1%%:*} "${c1#*:}" && case $d in *$id*) c1=$d;; *) c1=;; esac || c1=
    under /sys/fs/cgroup/${m1%%:*} "${m1#*:}" && case $d in *$id*) m1=$d;; *) m1=;; esac || m1=
    under /sys/fs/cgroup/${p1%%:*} "${p1#*:}" && case $d in *$id*) p1=$d;; *) p1=;; esac || p1=
    [ -n "$c1" ] && [ -n "$m1" ] && [ -n "$p1" ] || { echo "X $id not its cgroup"; return; }
    read -r x <$c1/cpuacct.usage && echo "cpu_ns $x"
    read -r x <$m1/memory.usage_in_bytes && echo "mem $x"
    read -r x <$m1/memory.limit_in_bytes && echo "limit $x"
    while read -r k x; do [ "$k" = total_inactive_file ] && echo "inactive $x"
    done <$m1/memory.stat
    read -r x <$p1/pids.current && echo "pids $x"
  else
    under $u2 "$v2" && case $d in *$id*) ;; *) d=;; esac || d=
    [ -n "$d" ] || { echo "X $id not its cgroup"; return; }
    while read -r k x; do [ "$k" = usage_usec ] && echo "cpu_us $x"; done <$d/cpu.stat
    read -r x <$d/memory.current && echo "mem $x"
    read -r x <$d/memory.max && echo "limit $x"
    while read -r k x; do [ "$k" = inactive_file ] && echo "inactive $x"; done <$d/memory.stat
    read -r x <$d/pids.current && echo "pids $x"
  fi
  while IFS= read -r l; do case $l in *:*) echo "N $l";; esac; done </proc/$pid/net/dev
  echo "E $id"; }
round() { for t in $targets; do one ${t%:*} ${t#*:}; done; }
round; sleep $interval; round
"""
_ID = re.compile(r"[0-9a-f]{64}")


def cgroup_command(targets: Sequence[tuple[str, int]], interval: float) -> str:
    """The shell text that reads ``targets`` (container id, its init pid) twice, ``interval``
    seconds apart. Refuses an id or pid that is not one (they come from the engine)."""
    for cid, pid in targets:
        if not (isinstance(cid, str) and _ID.fullmatch(cid)):
            raise ValueError(f"not a container id: {cid!r}")
        if not (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31):
            raise ValueError(f"not a pid: {pid!r}")
    if not 0 <= interval <= 60:
        raise ValueError(f"interval out of range: {interval!r}")
    listed = " ".join(f"{cid}:{pid}" for cid, pid in targets)
    return (f"targets={shlex.quote(listed)}\ninterval={shlex.quote(f'{interval:.3f}')}\n"
            + _CGROUP_SCRIPT)


def _cgroup_readings(connector: Any, running: Sequence[engine.ContainerFacts], interval: float
                     ) -> dict[str, list[stats.Reading]]:
    """Both readings of each running container whose files the agent could read, by id; {}
    when the command cannot run or prints something else (the caller asks the API)."""
    targets = [(f.container_id, f.pid) for f in running
               if _ID.fullmatch(f.container_id) and f.pid > 0]
    if not targets:
        return {}
    try:
        rc, out, _err = connector.run(cgroup_command(targets, interval), timeout=interval + 20)
        found = stats.cgroup_readings(out)
    except (stats.CgroupOutputError, ValueError):
        return {}
    return {cid: pair for cid, pair in found.items() if len(pair) == 2}


def _logins(client: Any, f: engine.ContainerFacts, services: Sequence[int] = ()
            ) -> tuple[float | None, dict[int, int], float]:
    """main1's last accepted login in its sshd's log, and what is connected now to its sshd
    and to the ports it publishes (its services)."""
    try:
        logged = stats.last_ssh_login(engine.log_tail(client, f.container_id, LOG_TAIL))
        tcp = engine.read_in(client, f.container_id, ["cat", "/proc/net/tcp", "/proc/net/tcp6"])
    except engine.Gone:
        return None, {}, time.time()
    ports = [stats.SSHD_PORT, *services]
    return logged, stats.open_connections(tcp, ports), time.time()


def sample(agents: Iterable[Agent], session: str | None = None,
           mine: Callable[[str], bool] | None = None, *, interval: float = 1.0,
           logins: bool = True, connect: Connect = _connect,
           cause: Callable[[Agent, BaseException], str] | None = None,
           kept: dict[str, Any] | None = None) -> Sampled:
    """One sample of ``session``'s containers (every labelled container: None) on ``agents``,
    all agents at once; ``mine`` keeps one stack's (:func:`.engine.of_stack`). ``kept``: each
    agent's client, reused from one sample to the next (``top --watch``: the same SSH
    connection all along) and left open; :func:`close_kept` closes them."""
    from .connectors import short_error

    why = cause or (lambda agent, exc: short_error(exc))
    agents = list(agents)
    out = Sampled(sampled_at=time.time())
    lock = threading.Lock()
    threads = [threading.Thread(target=_agent_sample, daemon=True,
                                args=(a, session, mine, interval, logins, connect, why, out,
                                      lock, kept)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.sampled_at = time.time()
    order = {a.name: i for i, a in enumerate(agents)}
    out.containers.sort(key=lambda c: (c.session, _order(c.host), order.get(c.agent, 0)))
    return out


def close_kept(kept: dict[str, Any]) -> None:
    """Close the kept clients. Ctrl-C ends a watch in the middle of a sample: its agents'
    threads may still be adding their client meanwhile, so what is kept now is taken at
    once (a client added after is left to the process's end)."""
    clients = list(kept.copy().values())
    kept.clear()
    for client in clients:
        engine.close_client(client)


def of_session(sampled: Sampled, session: str) -> list[stats.ContainerUse]:
    return [c for c in sampled.containers if c.session == session]


def unreachable_rows(sampled: Sampled, agents: Sequence[str]) -> list[str]:
    return [f"{a}: {sampled.unreachable[a]}" for a in agents if a in sampled.unreachable]
