"""Which host port each service of main1 gets, where it is bound, and its URL: decided here,
once, as pure functions of what the driver read on the engine.

Backend.AI's agent hands out host ports from its ``port-range`` (30000-31000 by default) and
its apps are reached through AppProxy, never directly. Here the pool's ``service_ports`` range
is each agent's port pool; a service gets its ``preferred_port`` when the range holds it and
the agent does not publish it already, else the first free port of the range. ``taken`` is
what the agent's engine publishes now for *other* containers (the driver reads it, under a
pool-wide lock, at ``up``); ``current`` is what this session's main1 holds already, so a later
``up`` keeps a service where it is instead of moving (and replacing) main1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .spec import PortRange, Service

LOOPBACK = "127.0.0.1"
ALL_ADDRESSES = "0.0.0.0"


@dataclass(frozen=True)
class Allocation:
    """Host ports by service name, or why none could be given (``reason``)."""

    ports: Mapping[str, int]
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


def choose_port(span: PortRange, preferred: int | None, taken: Iterable[int],
                current: int | None = None) -> int | None:
    """The port one service gets: ``current`` if still in the range and free, else
    ``preferred`` if in the range and free, else the lowest free port of the range; None when
    the range is full."""
    used = set(taken)
    for wish in (current, preferred):
        if wish is not None and wish in span and wish not in used:
            return wish
    return next((p for p in range(span.first, span.last + 1) if p not in used), None)


def allocate(services: Sequence[Service], span: PortRange, taken: Iterable[int],
             current: Mapping[str, int] | None = None, agent: str = "") -> Allocation:
    """Host ports for all of one session's services on one agent, in declaration order; each
    port chosen is taken for the next. Services that keep their ``current`` port go first, so
    a newly declared one cannot take a port an existing one holds."""
    current = current or {}
    used = set(taken)
    ports: dict[str, int] = {}
    order = sorted(services, key=lambda s: s.name not in current)
    for svc in order:
        port = choose_port(span, svc.preferred_port, used, current.get(svc.name))
        if port is None:
            where = f" of agent {agent}" if agent else ""
            return Allocation({}, f"the service port range {span.first}-{span.last}{where} has "
                              f"no free port left for service {svc.name!r} (main1's agent "
                              "publishes all of them): widen the pool's service_ports, or "
                              "destroy a session that holds some")
        ports[svc.name] = port
        used.add(port)
    return Allocation({s.name: ports[s.name] for s in services})


def bind_address(service: Service, agent_address: str | None) -> str:
    """Where the agent's engine binds a service: its loopback, so only the agent's SSH reaches
    it (``sessionctl open``), unless ``public``: then the agent's address, or every address
    when the agent has none (a local engine: this machine's own addresses)."""
    if not service.public:
        return LOOPBACK
    return agent_address or ALL_ADDRESSES


def service_url(protocol: str, address: str, port: int) -> str:
    """``http://ADDR:PORT/`` (https too), ``tcp://ADDR:PORT`` for plain TCP; IPv6 bracketed."""
    host = f"[{address}]" if ":" in address else address
    return f"{protocol}://{host}:{port}" + ("/" if protocol in ("http", "https") else "")
