"""The docker provider's create, read-back and diff, emulated from the provider's own source.

pulumi-docker 5.2.0 bridges kreuzwerker/terraform-provider-docker v4.5.0 (5074970c). Paths
are in that commit: ``rc.go`` = ``internal/provider/resource_docker_container.go`` (schema),
``rcf.go`` = ``resource_docker_container_funcs.go`` (create, read, update), ``helpers.go``.
docker/cli is v28.5.2 (the provider's ``go.mod`` l. 14). Only the container: the session's
network is our own resource (pulumi_layer/network.py).

Independent on purpose of :mod:`cluster_sessions.core.provider_facts` (what the program
believes): a wrong belief there shows up here as a refusal or a diff.

What :class:`.engine.Engine` stores as a resource's state is what the provider's Read writes
after create (:func:`read_back`), read-back-only keys included (``memory_swap``). Each later
registration gets the action the bridge's SDKv2 diff takes against that state (:func:`diff`):
an argument the program does not pass keeps its state value when the schema marks it Computed,
is compared with its schema Default when it has one, and with the zero value otherwise (a
removal, ``schemaMap.diffString``), so a read-back the program does not pass is a diff on every
run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

CONTAINER = "docker:index/container:Container"
CREATE, SAME, UPDATE, REPLACE = "create", "same", "update", "replace"


class ProviderRefused(ValueError):
    """What the real provider (or the engine behind it) would fail the create with."""


@dataclass(frozen=True)
class Arg:
    """One schema argument: ForceNew, Computed, Default, and where the source says so."""

    force_new: bool
    computed: bool = False
    default: Any = None
    source: str = ""


# docker.Container arguments (camelCase, as registered): the ones the Session passes, and the
# ones Read writes into the state although the Session does not pass them.
CONTAINER_ARGS: dict[str, Arg] = {
    "name": Arg(True, source="rc.go 50-55"),
    "image": Arg(True, source="rc.go 141-146"),
    "hostname": Arg(True, True, source="rc.go 148-154"),
    "command": Arg(True, True, source="rc.go 163-170"),
    "entrypoints": Arg(True, True, source="rc.go 172-179 (entrypoint)"),
    "restart": Arg(False, default="no", source="rc.go 230-236; update rcf.go 1016-1017"),
    "mustRun": Arg(False, default=True, source="rc.go 122-127; update rcf.go 997-1013"),
    "wait": Arg(False, default=False, source="rc.go 79-84"),
    "mounts": Arg(True, source="rc.go 328-433"),
    "ports": Arg(True, source="rc.go 487-535"),
    # not ForceNew, and not among the attributes the update applies (rcf.go 1016-1017): a
    # changed tmpfs alone changes the state, not the container; read back whole, rcf.go 883
    "tmpfs": Arg(False, source="rc.go 482-486; create rcf.go 266-268"),
    "envs": Arg(True, True, source="rc.go 590-598 (env)"),
    "deviceRequests": Arg(True, source="rc.go 774-825"),
    "destroyGraceSeconds": Arg(False, source="rc.go 827-831 (not ForceNew; not read back, "
                                             "rcf.go 931)"),
    "labels": Arg(True, True, source="rc.go 833-840"),
    "memory": Arg(False, source="rc.go 842-847; update rcf.go 1016-1017"),
    "memorySwap": Arg(False, source="rc.go 856-861; update rcf.go 1017, 1060-1067"),
    "shmSize": Arg(True, True, source="rc.go 863-870"),
    "networksAdvanced": Arg(True, source="rc.go 909-972"),
    "uploads": Arg(True, source="rc.go 987-1043 (upload)"),
    "init": Arg(False, True, source="rc.go 1126-1131"),
    "gpus": Arg(True, source="rc.go 1152-1157"),
    "cpus": Arg(True, source="rc.go 1158-1163"),
    # ForceNew; read back as the engine stores them: as the provider's Docker client sent
    # them, normalized (normalize_capabilities)
    "capabilities": Arg(True, source="rc.go 262-290 (add, drop); create rcf.go 286-293; "
                                     "read rcf.go 870-878"),
    "securityOpts": Arg(True, True, source="rc.go 291-299; create rcf.go 327-332; read "
                                           "rcf.go 854"),
    "logDriver": Arg(True, True, source="rc.go 886-892; create rcf.go 261-262; read rcf.go 951"),
    "logOpts": Arg(True, source="rc.go 894-899; create rcf.go 387-389; read rcf.go 952, 980-986"),
}
ARGS = {CONTAINER: CONTAINER_ARGS}


def force_new(type_: str, key: str) -> bool:
    """Whether a change to ``key`` replaces the resource (unknown arguments: the cautious yes)."""
    arg = ARGS.get(type_, {}).get(key)
    return True if arg is None else arg.force_new


# --- cpus: docker/cli opts.ParseCPUs and helpers.go nanoInt64ToDecimalString -----------------

NANO = 10**9


def parse_cpus(text: str) -> int:
    """NanoCPUs of a ``cpus`` string (docker/cli ``opts.ParseCPUs``: exact, or refused)."""
    try:
        value = Fraction(text) * NANO
    except (ValueError, ZeroDivisionError):
        raise ProviderRefused(f"Error setting cpus: failed to parse {text} as a rational "
                              "number") from None
    if value.denominator != 1:
        raise ProviderRefused("Error setting cpus: value is too precise")
    return int(value)


def _float_string(value: Fraction, decimals: int) -> str:
    """Go's ``big.Rat.FloatString``: rounded half away from zero."""
    scaled = abs(value) * 10**decimals
    digits = int(scaled + Fraction(1, 2))
    sign = "-" if value < 0 else ""
    whole, frac = divmod(digits, 10**decimals)
    return f"{sign}{whole}.{frac:0{decimals}d}" if decimals else f"{sign}{whole}"


def cpus_read_back(nano_cpus: int) -> str:
    """helpers.go l. 133-149, as rcf.go l. 946-948 writes it into the state."""
    if nano_cpus == 0:
        return "0"
    rat = Fraction(nano_cpus, NANO)
    text = _float_string(rat, 9)
    if text.count("0") == 9:
        return _float_string(rat, 1)
    return text.rstrip("0")


# --- gpus: rcf.go normalizeGPUOptionString + docker/cli opts.GpuOpts.Set ---------------------

def _csv_record(value: str) -> list[str]:
    """The first record of Go's ``encoding/csv`` Reader (comma ``,``, strict quotes)."""
    line = value.split("\n", 1)[0].rstrip("\r") if '"' not in value else value
    if not line:
        raise ProviderRefused("EOF")
    fields: list[str] = []
    i, n = 0, len(line)
    while True:
        if i < n and line[i] == '"':
            i += 1
            buf = []
            while True:
                j = line.find('"', i)
                if j < 0:
                    raise ProviderRefused('parse error: extraneous or missing " in quoted-field')
                buf.append(line[i:j])
                i = j + 1
                if i < n and line[i] == '"':
                    buf.append('"')
                    i += 1
                    continue
                if i == n or line[i] in ",\n":
                    break
                raise ProviderRefused('parse error: extraneous or missing " in quoted-field')
            fields.append("".join(buf))
        else:
            end = n
            for stop in (",", "\n"):
                k = line.find(stop, i)
                if k >= 0:
                    end = min(end, k)
            field_ = line[i:end]
            if '"' in field_:
                raise ProviderRefused('parse error: bare " in non-quoted-field')
            fields.append(field_)
            i = end
        if i >= n or line[i] == "\n":
            return fields
        i += 1  # the comma
        if i == n:
            fields.append("")
            return fields


def _count(text: str) -> int:
    if text == "all":
        return -1
    try:
        return int(text, 10)
    except ValueError:
        raise ProviderRefused(f'invalid count ({text}): value must be either "all" or an '
                              "integer: invalid syntax") from None


@dataclass
class DeviceRequest:
    driver: str = ""
    count: int = 0
    device_ids: list[str] | None = None
    capabilities: list[list[str]] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)


def parse_gpus(value: str) -> DeviceRequest:
    """docker/cli v28.5.2 ``opts/gpus.go`` ``GpuOpts.Set`` (l. 36-99): a CSV record of
    ``all``/a number (a count), ``driver=``, ``count=``, ``device=``, ``capabilities=``,
    ``options=``; each key once."""
    req = DeviceRequest()
    seen: set[str] = set()
    for item in _csv_record(value):
        key, eq, val = item.partition("=")
        if key in seen:
            raise ProviderRefused(f"gpu request key '{key}' can be specified only once")
        seen.add(key)
        if not eq:
            seen.add("count")
            req.count = _count(key)
            continue
        if key == "driver":
            req.driver = val
        elif key == "count":
            req.count = _count(val)
        elif key == "device":
            req.device_ids = val.split(",")
        elif key == "capabilities":
            req.capabilities = [[*val.split(","), "gpu"]]
        elif key == "options":
            req.options = dict(kv.partition("=")[::2] for kv in _csv_record(val))
        else:
            raise ProviderRefused(f"unexpected key '{key}' in '{item}'")
    if "count" not in seen and req.device_ids is None:
        req.count = 1
    if not req.capabilities:
        req.capabilities = [["gpu"]]
    return req


def normalize_gpus(value: str) -> str:
    """rcf.go l. 705-718: surrounding quotes, any number of layers, are stripped first."""
    text = value.strip()
    while len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def gpus_request(value: str) -> DeviceRequest:
    """What the provider sends for ``gpus`` (rcf.go l. 417-428), and what the engine refuses
    when it starts the container (moby ``daemon/nvidia_linux.go``,
    ``errConflictCountDeviceIDs``)."""
    try:
        req = parse_gpus(normalize_gpus(value))
    except ProviderRefused as exc:
        raise ProviderRefused(f"Error setting gpus: {exc}") from None
    if req.count != 0 and req.device_ids:
        raise ProviderRefused(f"gpus={value!r} is sent as count={req.count} and device_ids="
                              f"{req.device_ids}: cannot set both Count and DeviceIDs on "
                              "device request")
    return req


def gpus_read_back(req: DeviceRequest) -> str | None:
    """rcf.go l. 720-748 (``flattenGPUsFromDeviceRequests``); None: not representable, the
    configured value is kept (l. 921-925)."""
    if req.device_ids:
        return "device=" + ",".join(req.device_ids)
    if req.count != -1:
        return None
    return "all" if any(c.lower() == "gpu" for caps in req.capabilities for c in caps) else None


# --- create/read and diff ---------------------------------------------------------------------

MIB = 1024 * 1024


def create(type_: str, inputs: dict[str, Any], plain: dict[str, Any],
           strict: bool = True) -> dict[str, Any]:
    """The state after create: ``inputs`` as serialized (secrets stay marked) with what the
    provider's Read writes in place of what was passed; raises :class:`ProviderRefused` where
    the provider or the engine would fail the create (``strict=False``: the outputs a mock
    still has to hand the program, with what was refused left as passed)."""
    if not strict:
        try:
            return create(type_, inputs, plain)
        except ProviderRefused:
            unparsed = ("cpus", "gpus")
            return create(type_, {k: v for k, v in inputs.items() if k not in unparsed},
                          {k: v for k, v in plain.items() if k not in unparsed}) | {
                k: inputs[k] for k in unparsed if k in inputs}
    outs = dict(inputs)
    if type_ == CONTAINER:
        for key, arg in CONTAINER_ARGS.items():
            if arg.default is not None:
                outs.setdefault(key, arg.default)
        if plain.get("cpus"):  # rcf.go l. 354-360 parse; l. 946-948 read back
            outs["cpus"] = cpus_read_back(parse_cpus(plain["cpus"]))
        if plain.get("gpus"):
            shown = gpus_read_back(gpus_request(plain["gpus"]))
            outs["gpus"] = shown if shown is not None else plain["gpus"]
        if plain.get("memory"):
            outs["memorySwap"] = memory_swap_read_back(plain)
        if plain.get("capabilities"):  # rcf.go l. 870-878, as the client sent them
            outs["capabilities"] = {k: normalize_capabilities(v or [])
                                    for k, v in plain["capabilities"].items()}
        outs["init"] = bool(plain.get("init"))  # rcf.go l. 447-448, 864-868
        outs["ports"] = [{**p, "external": p.get("external") or 32768 + i}
                         for i, p in enumerate(plain.get("ports") or [])]
    return outs


def normalize_capabilities(names: list[str]) -> list[str]:
    """What the provider's Docker client sends as ``CapAdd``/``CapDrop`` and so what the engine
    stores and the provider reads back (docker/docker v28.5.2 ``client/container_create.go``
    ``normalizeCapabilities``, ``normalizeCap``): each name upper-cased and prefixed ``CAP_``
    unless it is ``ALL`` or has the prefix, duplicates dropped, sorted. Seen through the real
    provider on this host's Docker 20.10 (issue 42): ``CHOWN`` is stored ``CAP_CHOWN``."""
    spelled = []
    for name in names:
        name = name.upper()
        if name != "ALL" and not name.startswith("CAP_"):
            name = "CAP_" + name
        if name not in spelled:
            spelled.append(name)
    return sorted(spelled)


def memory_swap_read_back(plain: dict[str, Any]) -> int:
    """rcf.go l. 940-944 reads ``HostConfig.MemorySwap`` back in MiB. When only ``memory`` is
    set the engine makes it twice the memory (moby ``daemon/daemon_unix.go``
    ``adaptContainerSettings``; seen on this host's Docker 20.10: ``-m 64m`` reads
    ``MemorySwap 134217728``)."""
    swap = int(plain.get("memorySwap") or 0)
    return swap if swap else 2 * int(plain["memory"])


def _zero(value: Any) -> Any:
    return type(value)() if isinstance(value, (bool, int, float, str, list, dict)) else None


def diff(type_: str, state: dict[str, Any], inputs: dict[str, Any],
         ignore_changes: list[str]) -> tuple[str, tuple[str, ...]]:
    """(action, the arguments that differ) for ``inputs`` (plain) against ``state`` (plain).

    An argument in ``ignore_changes`` is not compared (the bridge drops it from the diff); an
    argument missing from the schema table counts as force-new (the cautious reading)."""
    table = ARGS.get(type_, {})
    if type_ == CONTAINER and inputs.get("ports"):  # an unset external port is computed
        inputs = {**inputs, "ports": [
            {**p, "external": p.get("external") or _state_port(state, i).get("external")}
            for i, p in enumerate(inputs["ports"])]}
    changed = []
    for key in sorted(set(inputs) | (set(state) & set(table))):
        if key.startswith("__") or key in ignore_changes:
            continue
        new, old = inputs.get(key), state.get(key)
        if new in (None, [], {}):
            arg = table.get(key)
            if arg is None or arg.computed or old is None:
                continue
            new = arg.default if arg.default is not None else _zero(old)
        if old != new:
            changed.append(key)
    if not changed:
        return SAME, ()
    return (REPLACE if any(force_new(type_, k) for k in changed) else UPDATE), tuple(changed)


def after_update(type_: str, state: dict[str, Any], inputs: dict[str, Any],
                 changed: tuple[str, ...]) -> dict[str, Any]:
    """The state after an in-place update: the planned values, not read again (the container
    update returns without a Read, rcf.go l. 1076), so a removed read-back key is its zero
    until a refresh reads it back."""
    outs = dict(state)
    table = ARGS.get(type_, {})
    for key in changed:
        new = inputs.get(key)
        if new in (None, [], {}):
            arg = table.get(key)
            new = arg.default if arg and arg.default is not None else _zero(state.get(key))
        outs[key] = new
    return outs


def _state_port(state: dict[str, Any], index: int) -> dict[str, Any]:
    ports = state.get("ports") or []
    return ports[index] if index < len(ports) else {}
