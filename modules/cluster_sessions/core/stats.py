"""What a session's containers use, from what the engines and ``nvidia-smi`` print: plain
functions of plain data (issue 43; ``sessionctl top``, ``ls --sample``, ``pool usage``).

Reading those documents is the agents' (:mod:`cluster_sessions.agents.sampling`); here is only
the arithmetic, tested on captured output (``tests/test_stats.py``):

- :func:`reading` turns one Docker stats document (``GET /containers/ID/stats?stream=false``,
  cgroup v1 or v2) into a :class:`Reading`; :func:`cpu_percent` is docker/cli's "delta over a
  delta" (``stats_helpers.go``, ``calculateCPUPercentUnix``) but as a share of the cores the
  container was *allocated*: 100 means every allocated core busy, whatever the host has;
- memory used leaves the page cache's inactive files out, as docker/cli does (the kernel
  drops them before it would refuse the container memory);
- :func:`nvidia_smi_gpus` reads ``nvidia-smi --query-gpu=index,uuid,utilization.gpu,
  memory.used,memory.total --format=csv,noheader,nounits`` (:data:`NVIDIA_SMI_QUERY`), and
  :func:`gpus_of` maps it to a container's allocated GPU ids; an agent without the tool says
  nothing, which is "unknown" (None), never 0 %;
- :func:`last_ssh_login` and :func:`open_connections`: main1's sshd log lines and its
  ``/proc/net/tcp`` (design notes, "What a session uses");
- :func:`window_average`: the mean of samples over a window (``top --watch``'s column).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import EngineFailure

IDLE_BELOW = 5.0  # % of the allocation: below this, cpu and every GPU, a session is idle now
SSHD_PORT = 2200

# NVIDIA's documented CSV query (nvidia-smi(1), "--query-gpu" and --help-query-gpu): one line
# per GPU, the fields in the order asked, ", " between them; "noheader" drops the header line,
# "nounits" the units ("93 %" -> "93", "6120 MiB" -> "6120"; memory is in MiB); a field the
# board does not report is "[N/A]" or "[Not Supported]".
NVIDIA_SMI_QUERY = ("nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total "
                    "--format=csv,noheader,nounits")
MIB = 2**20


# --- Docker stats ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One stats document, reduced to what we compute with (bytes, nanoseconds, epoch s)."""

    read_at: float | None  # the engine's time of the reading, epoch seconds
    cpu_ns: int  # the container's CPU time so far (all its cores), ns
    system_ns: int  # the host's CPU time so far (all cores), ns; 0 when not given
    online_cpus: int  # the host's CPUs the engine counts
    mem_used: int  # usage without inactive page cache
    mem_limit: int  # the cgroup's limit (the host's memory when unlimited)
    pids: int
    net_rx: int  # bytes received so far, every interface
    net_tx: int


def parse_time(stamp: Any) -> float | None:
    """An engine's RFC 3339 time (nanoseconds, ``Z``) as epoch seconds; None for its zero
    time (``0001-01-01T00:00:00Z``) or anything else that is not a time."""
    text = str(stamp)
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if not m or text.startswith("0001-"):
        return None
    base = datetime.fromisoformat(m[1] + m[3])  # Python 3.11 reads "Z" as UTC
    return base.timestamp() + (
        int(m[2]) / 10 ** len(m[2]) if m[2] else 0.0)


def _int(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def reading(doc: Mapping[str, Any]) -> Reading:
    """A stats document as the engine answers ``stream=false`` (``one-shot`` or not)."""
    cpu = doc.get("cpu_stats") or {}
    usage = cpu.get("cpu_usage") or {}
    mem = doc.get("memory_stats") or {}
    mstats = mem.get("stats") or {}
    # cgroup v1 names the hierarchy's total "total_inactive_file", v2 "inactive_file"
    inactive = _int(mstats.get("total_inactive_file", mstats.get("inactive_file")))
    used = _int(mem.get("usage"))
    nets = (doc.get("networks") or {}).values()
    return Reading(
        read_at=parse_time(doc.get("read")),
        cpu_ns=_int(usage.get("total_usage")),
        system_ns=_int(cpu.get("system_cpu_usage")),
        online_cpus=_int(cpu.get("online_cpus")) or len(usage.get("percpu_usage") or ()) or 1,
        mem_used=used - inactive if inactive < used else used,
        mem_limit=_int(mem.get("limit")),
        pids=_int((doc.get("pids_stats") or {}).get("current")),
        net_rx=sum(_int(n.get("rx_bytes")) for n in nets),
        net_tx=sum(_int(n.get("tx_bytes")) for n in nets),
    )


def elapsed_s(first: Reading, second: Reading) -> float | None:
    """Wall time between two readings: the engine's own reading times (nanoseconds), else the
    host's CPU time over its CPUs (10 ms steps); None when neither moved."""
    if first.read_at is not None and second.read_at is not None \
            and second.read_at > first.read_at:
        return second.read_at - first.read_at
    if second.system_ns > first.system_ns:
        return (second.system_ns - first.system_ns) / 1e9 / (second.online_cpus or 1)
    return None


def cpu_percent(first: Reading, second: Reading, allocated_cores: float) -> float | None:
    """The container's CPU time between two readings as a share of its allocated cores over
    the same wall time, 0-100. ``allocated_cores`` 0 (no limit) counts the host's CPUs.
    None when the two readings cannot give a rate (same time, or a restart in between: the
    container's counter went back)."""
    wall = elapsed_s(first, second)
    if wall is None or second.cpu_ns < first.cpu_ns:
        return None
    cores = allocated_cores if allocated_cores > 0 else float(second.online_cpus or 1)
    percent = (second.cpu_ns - first.cpu_ns) / 1e9 / wall / cores * 100
    return round(min(100.0, max(0.0, percent)), 1)  # a quota allows short bursts above it


def rate(first: int, second: int, wall: float | None) -> float | None:
    """Bytes per second between two counters; None across a reset or without a wall time."""
    if wall is None or wall <= 0 or second < first:
        return None
    return round((second - first) / wall, 1)


# --- cgroup files (an agent reached over SSH: agents/sampling.py's one command) -------------

CGROUP_FORMAT = "cs-cgroup-read 1"  # the first line the agent's command prints


class CgroupOutputError(EngineFailure, ValueError):
    """The agent's cgroup read printed something that is not its format."""


_NET_FIELDS = 16  # /proc/net/dev: 8 receive counters, 8 transmit (bytes first of each)


def _count(text: str, what: str) -> int:
    if not re.fullmatch(r"\d{1,20}", text):
        raise CgroupOutputError(f"{what}: not a count: {text[:40]!r}")
    return int(text)


def _net_dev_line(line: str) -> tuple[str, int, int]:
    """``  eth0: 200 2 0 ...`` (a counter may touch the colon: ``eth0:4268009586``)."""
    iface, sep, rest = line.partition(":")
    fields = rest.split()
    if not sep or not iface.strip() or len(fields) != _NET_FIELDS:
        raise CgroupOutputError(f"not a /proc/net/dev line: {line[:80]!r}")
    return iface.strip(), _count(fields[0], "rx bytes"), _count(fields[8], "tx bytes")


def cgroup_readings(output: str) -> dict[str, list[Reading]]:
    """The readings an agent's cgroup read printed (``sampling.cgroup_command``), by container
    id, in the order taken (two each when it could read that container's files both times).

    The format, one record per line, fields split by one space::

        cs-cgroup-read 1
        H <online cpus> <MemTotal kB>
        R <id> <epoch ns>             a container's reading begins
        cpu_ns <n> | cpu_us <n>       cgroup v1 cpuacct.usage | v2 cpu.stat usage_usec
        mem <bytes>                   v1 memory.usage_in_bytes | v2 memory.current
        limit <bytes>|max             v1 memory.limit_in_bytes | v2 memory.max
        inactive <bytes>              v1 total_inactive_file | v2 inactive_file (memory.stat)
        pids <n>                      pids.current
        N <a line of /proc/PID/net/dev>
        E <id>                        its reading is whole
        X <id> <why>                  its files could not be read (the caller asks the API)

    A reading without ``E`` (the command was cut short), or lacking cpu, mem, limit or pids,
    is left out. Raises :class:`CgroupOutputError` on any other line: the kernel's files have
    one format, so anything else is not them."""
    lines = output.splitlines()
    if not lines or lines[0] != CGROUP_FORMAT:
        raise CgroupOutputError(f"not the cgroup read's output: {output[:80]!r}")
    cpus, host_mem = 1, 0
    found: dict[str, list[Reading]] = {}
    cur: dict[str, Any] | None = None
    for line in lines[1:]:
        kind, _, rest = line.partition(" ")
        if kind == "H":
            parts = rest.split(" ")
            if len(parts) != 2:
                raise CgroupOutputError(f"not a host line: {line[:80]!r}")
            cpus = max(1, _count(parts[0], "online cpus"))
            host_mem = _count(parts[1], "MemTotal") * 1024
        elif kind == "R":
            parts = rest.split(" ")
            if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]):
                raise CgroupOutputError(f"not a reading's start: {line[:80]!r}")
            cur = {"id": parts[0], "at": _count(parts[1], "time") / 1e9, "net": {}}
        elif kind == "N":
            if cur is None:
                raise CgroupOutputError(f"a network line outside a reading: {line[:80]!r}")
            iface, rx, tx = _net_dev_line(rest)
            cur["net"][iface] = (rx, tx)
        elif kind in ("cpu_ns", "cpu_us", "mem", "inactive", "pids", "limit"):
            if cur is None:
                raise CgroupOutputError(f"a figure outside a reading: {line[:80]!r}")
            cur[kind] = None if kind == "limit" and rest == "max" else _count(rest, kind)
        elif kind == "E":
            if cur is None or rest != cur["id"]:
                raise CgroupOutputError(f"an end without its reading: {line[:80]!r}")
            done, cur = cur, None
            if {"mem", "limit", "pids"} - done.keys() or not (
                    "cpu_ns" in done or "cpu_us" in done):
                continue  # a file missing: not a reading (the caller asks the API)
            cpu_ns = done["cpu_ns"] if "cpu_ns" in done else done["cpu_us"] * 1000
            used, inactive = done["mem"], done.get("inactive", 0)
            limit = done["limit"]
            if host_mem:  # unlimited (v2 "max", v1 a huge page-rounded number): the host's
                limit = host_mem if limit is None else min(limit, host_mem)
            nets = [v for k, v in done["net"].items() if k != "lo"]  # as the engine's stats
            found.setdefault(done["id"], []).append(Reading(
                read_at=done["at"], cpu_ns=cpu_ns, system_ns=0, online_cpus=cpus,
                mem_used=used - inactive if inactive < used else used,
                mem_limit=limit or 0, pids=done["pids"],
                net_rx=sum(rx for rx, _ in nets), net_tx=sum(tx for _, tx in nets)))
        elif kind == "X":
            if not re.fullmatch(r"[0-9a-f]{64}( .*)?", rest):
                raise CgroupOutputError(f"not a refusal line: {line[:80]!r}")
            cur = None
        elif line.strip():
            raise CgroupOutputError(f"the cgroup read printed {line[:80]!r}")
    return found


# --- GPUs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str
    util_percent: int | None  # None: the board does not say
    mem_used: int | None  # bytes
    mem_total: int | None


class GpuOutputError(EngineFailure, ValueError):
    """``nvidia-smi`` printed something that is not its documented CSV."""


def _field(text: str) -> int | None:
    text = text.strip()
    if text.startswith("[") or text in ("", "N/A"):  # [N/A], [Not Supported], [Unknown Error]
        return None
    if not re.fullmatch(r"\d+(\.\d+)?", text):
        raise GpuOutputError(f"not a number: {text[:40]!r}")
    return round(float(text))


def nvidia_smi_gpus(output: str) -> dict[int, GpuReading]:
    """Every GPU :data:`NVIDIA_SMI_QUERY` lists, by index. Raises :class:`GpuOutputError` on
    a line that is not five fields of it (a driver message, another tool under the name)."""
    found: dict[int, GpuReading] = {}
    for line in output.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            raise GpuOutputError(f"nvidia-smi printed {line.strip()[:100]!r}")
        util, used, total = (_field(p) for p in parts[2:])
        found[int(parts[0])] = GpuReading(
            int(parts[0]), parts[1], util, None if used is None else used * MIB,
            None if total is None else total * MIB)
    return found


def gpus_of(allocated: Sequence[int], readings: Mapping[int, GpuReading] | None
            ) -> list[dict[str, Any]] | None:
    """A container's allocated GPUs (by id, as its label says), each with what the agent's
    ``nvidia-smi`` says of it; None when the agent cannot tell (no tool, it failed): unknown,
    never 0 %. An allocated id the tool does not list has null figures."""
    if readings is None:
        return None
    out = []
    for gpu in allocated:
        r = readings.get(gpu)
        out.append({"id": gpu, "util_percent": r.util_percent if r else None,
                    "mem_used": r.mem_used if r else None,
                    "mem_total": r.mem_total if r else None})
    return out


# --- logins -----------------------------------------------------------------------------------

_ACCEPTED = re.compile(r"^(\S+) Accepted \S+ for \S+ from \S+ port \d+")


def last_ssh_login(log_lines: Iterable[str]) -> float | None:
    """The time of the last login sshd accepted, from its log as the engine keeps it with
    timestamps (``2026-12-01T19:58:53.543623098Z Accepted publickey for work from 10.0.3.2
    port 40112 ssh2: ...``); None when there is none."""
    times = (parse_time(m[1]) for m in map(_ACCEPTED.match, log_lines) if m)
    return max((t for t in times if t is not None), default=None)


_TCP_ADDRESS = re.compile(r"[0-9A-Fa-f]+:([0-9A-Fa-f]{4})")  # HEX:PORT, the port 4 digits


def open_connections(proc_net_tcp: str, ports: Iterable[int]) -> dict[int, int]:
    """Established TCP connections *to* each of ``ports`` (the local end's port) in a network
    namespace's ``/proc/net/tcp`` and ``/proc/net/tcp6`` text (``sl local_address
    rem_address st ...``, addresses ``HEX:PORT``, state ``01`` established)."""
    wanted = {int(p): 0 for p in ports}
    for line in proc_net_tcp.splitlines():
        parts = line.split()
        local = _TCP_ADDRESS.fullmatch(parts[1]) if len(parts) >= 4 else None
        if local is None or parts[3] != "01":
            continue
        port = int(local[1], 16)
        if port in wanted:
            wanted[port] += 1
    return wanted


def last_login(logged: float | None, connected_now: int, sampled_at: float) -> float | None:
    """main1's last login: now while a connection to its sshd is open, else its log's last."""
    return sampled_at if connected_now else logged


# --- a session's figures --------------------------------------------------------------------


@dataclass
class ContainerUse:
    """One container's figures at a sample (contract 9's container object), or why not."""

    host: str
    agent: str
    cpus: float  # allocated cores
    mem_limit: int | None
    cpu_percent: float | None = None
    mem_used: int | None = None
    pids: int | None = None
    net_rx: int | None = None
    net_tx: int | None = None
    net_rx_rate: float | None = None  # bytes/s between the two readings
    net_tx_rate: float | None = None
    gpu_ids: tuple[int, ...] = ()
    gpus: list[dict[str, Any]] | None = None
    last_login: float | None = None
    connections: dict[int, int] = field(default_factory=dict)  # port -> established
    state: str = "running"  # running | gone | not running
    error: str = ""
    source: str | None = None  # where the figures came from: "cgroup" files | the stats "api"
    session: str = ""  # whose (pool usage samples every session's containers)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "agent": self.agent, "cpus": self.cpus,
                "cpu_percent": self.cpu_percent, "mem_limit": self.mem_limit,
                "mem_used": self.mem_used, "pids": self.pids, "net_rx": self.net_rx,
                "net_tx": self.net_tx, "gpus": self.gpus, "last_login": self.last_login,
                "gpu_ids": list(self.gpu_ids), "net_rx_rate": self.net_rx_rate,
                "net_tx_rate": self.net_tx_rate,
                "connections": {str(p): n for p, n in sorted(self.connections.items())},
                "state": self.state, "error": self.error or None, "source": self.source}


def measured(host: str, agent: str, cpus: float, gpu_ids: Sequence[int],
             first: Reading, second: Reading,
             gpu_readings: Mapping[int, GpuReading] | None) -> ContainerUse:
    """A container's figures from its two readings and its agent's GPUs."""
    wall = elapsed_s(first, second)
    return ContainerUse(
        host=host, agent=agent, cpus=cpus, mem_limit=second.mem_limit or None,
        cpu_percent=cpu_percent(first, second, cpus), mem_used=second.mem_used,
        pids=second.pids, net_rx=second.net_rx, net_tx=second.net_tx,
        net_rx_rate=rate(first.net_rx, second.net_rx, wall),
        net_tx_rate=rate(first.net_tx, second.net_tx, wall),
        gpu_ids=tuple(gpu_ids), gpus=gpus_of(gpu_ids, gpu_readings) if gpu_ids else [],
    )


def mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 1) if known else None


def session_used(containers: Sequence[ContainerUse]) -> dict[str, float | None]:
    """``ls``'s USED: the mean cpu % of the containers measured, and the mean utilisation of
    their allocated GPUs (None: no GPUs, or unknown)."""
    running = [c for c in containers if c.state == "running"]
    gpus = [g["util_percent"] for c in running for g in (c.gpus or ())]
    return {"cpu_percent": mean(c.cpu_percent for c in running),
            "gpu_percent": mean(gpus)}


def idle_since(containers: Sequence[ContainerUse], started: float | None,
               below: float = IDLE_BELOW) -> float | None:
    """When an idle session was last known to be used: the later of main1's start and its
    last login, if every measured container's cpu and every GPU is below ``below`` % now;
    None when it is busy now or nothing could be measured. (One sample says "idle now", not
    for how long the CPUs were: this is the time since which nobody came in.)"""
    running = [c for c in containers if c.state == "running" and c.cpu_percent is not None]
    if not running:
        return None
    busy = any(c.cpu_percent >= below for c in running) or any(
        (g["util_percent"] or 0) >= below for c in running for g in (c.gpus or ()))
    if busy:
        return None
    known = [t for t in (started, *(c.last_login for c in running)) if t is not None]
    return max(known) if known else None


def window_average(samples: Sequence[tuple[float, float | None]], now: float,
                   window: float) -> float | None:
    """The mean of the values sampled in the last ``window`` seconds (``(time, value)``)."""
    return mean(v for t, v in samples if now - window <= t <= now)


def usage_document(session: str, sampled_at: float,
                   containers: Sequence[ContainerUse]) -> dict[str, Any]:
    """Contract 9: ``top --once --json``'s document."""
    return {"session": session, "sampled_at": round(sampled_at, 3),
            "containers": [c.to_dict() for c in containers]}


# --- text -----------------------------------------------------------------------------------


def bar(fraction: float | None, width: int = 10) -> str:
    """``[#####.....]`` for 0.5; ``[?         ]`` when not known; capped at full."""
    if fraction is None:
        return "[" + "?".ljust(width) + "]"
    filled = int(min(1.0, max(0.0, fraction)) * width + 0.5)  # half up, not to even
    return "[" + "#" * filled + "." * (width - filled) + "]"


def percent_text(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f} %"


def human_size(size: int | None) -> str:
    """``6.1 GiB``, ``512 MiB``, ``646 B``; ``?`` when not known."""
    if size is None:
        return "?"
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"


def clock(epoch: float | None) -> str:
    """``20:01:05Z`` (UTC) today, ``2026-11-30 20:01Z`` before; ``-`` when not known."""
    if epoch is None:
        return "-"
    at = datetime.fromtimestamp(epoch, UTC)
    if at.date() == datetime.now(UTC).date():
        return at.strftime("%H:%M:%SZ")
    return at.strftime("%Y-%m-%d %H:%MZ")


# --- used against allocated (pool usage) ------------------------------------------------------


@dataclass(frozen=True)
class Used:
    """What measured containers use in all: cores busy, memory, their GPUs' mean use."""

    cores: float  # sum of cpu % x allocated cores
    mem: int
    gpu_percent: float | None  # mean over their allocated GPUs; None: unknown or none
    measured: int  # containers with figures
    gpus_unknown: bool = False  # some container's GPUs could not be told

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": round(self.cores, 3), "mem": self.mem, "gpu_percent": self.gpu_percent,
                "gpus_unknown": self.gpus_unknown, "measured_containers": self.measured}


def used_of(containers: Iterable[ContainerUse]) -> Used:
    running = [c for c in containers if c.state == "running" and c.cpu_percent is not None]
    gpus = [g["util_percent"] for c in running for g in (c.gpus or ())]
    return Used(cores=sum((c.cpu_percent or 0) / 100 * c.cpus for c in running),
                mem=sum(c.mem_used or 0 for c in running),
                gpu_percent=mean(gpus), measured=len(running),
                gpus_unknown=any(c.gpu_ids and c.gpus is None for c in running))


def fraction(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def bar_lines(name: str, alloc_cpu: float, declared_cpu: float, alloc_mem: int,
              declared_mem: int, alloc_gpus: int, declared_gpus: int, used: Used | None
              ) -> list[str]:
    """Three lines of text bars for an agent (or the pool): allocated of allocatable, and
    used of allocated, for cpu, memory and GPUs (``used`` None: not sampled)."""
    def right(fr: float | None, text: str) -> str:
        return f"used {bar(fr)} {text}"

    def cores(n: float) -> str:
        return f"{n:.1f}" if n % 1 else f"{n:g}"

    cpu_used = mem_used = gpu_used = "used -"
    if used is not None:
        cpu_used = right(fraction(used.cores, alloc_cpu),
                         f"{cores(used.cores)}/{cores(alloc_cpu)} cores")
        mem_used = right(fraction(used.mem, alloc_mem),
                         f"{human_size(used.mem)}/{human_size(alloc_mem)}")
        if alloc_gpus:
            gpu_used = ("used unknown (no nvidia-smi)" if used.gpu_percent is None
                        else right(used.gpu_percent / 100, f"{used.gpu_percent:.0f} %"
                                   + (" (some unknown)" if used.gpus_unknown else "")))
    pad = " " * len(name)
    return [
        f"{name}  cpu  alloc {bar(fraction(alloc_cpu, declared_cpu))} "
        f"{cores(alloc_cpu)}/{cores(declared_cpu)}  {cpu_used}",
        f"{pad}  mem  alloc {bar(fraction(alloc_mem, declared_mem))} "
        f"{human_size(alloc_mem)}/{human_size(declared_mem)}  {mem_used}",
        (f"{pad}  gpu  alloc {bar(fraction(alloc_gpus, declared_gpus))} "
         f"{alloc_gpus}/{declared_gpus}  {gpu_used}" if alloc_gpus or declared_gpus
         else f"{pad}  gpu  none declared"),
    ]
