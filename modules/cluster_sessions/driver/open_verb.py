"""``sessionctl open FILE SERVICE``: a local port forwarded to a service of main1 (issue 23).

Our stand-in for Backend.AI's AppProxy (reference 004: "User → Container (direct access) MUST
BE BLOCKED"): the service is published on its agent's loopback, and the way to it goes over
the agent's SSH, as the pool reaches it (its user, key and known_hosts; a ``direct-tcpip``
channel, what ``ssh -L`` opens), or straight to the port on a local agent. Which host port
the service has is read on the engine (what main1 publishes), not from the stack: no
``pulumi`` CLI is needed. Ctrl-C (SIGINT) or SIGTERM closes the listening port and every
forwarded connection, and ``open`` exits 0: that is how it is meant to end.
"""

from __future__ import annotations

import argparse
import contextlib
import selectors
import signal
import socket
import sys
import threading
from typing import Any

from ..agents import facts
from ..agents.connectors import AgentError, Connector, connector_for, pipe
from ..agents.gathering import gather
from ..core.plan import ClusterPlan, ServicePlan
from ..core.problems import did_you_mean
from ..core.services import ALL_ADDRESSES, LOOPBACK, service_url
from ..core.spec import Pool
from .access import one_plan
from .errors import CommandError, Exit
from .session_args import add_session_args, verb_parser


def find_service(plan: ClusterPlan, name: str, file: str) -> ServicePlan:
    found = next((s for s in plan.services if s.name == name), None)
    if found is None:
        names = [s.name for s in plan.services]
        hint = ((did_you_mean(name, names) or f"; it declares {', '.join(names)}") if names
                else "; it declares none (services: in the definition)")
        raise CommandError(f"{file}: services: no service {name!r}{hint}", Exit.INVALID)
    return found


def agent_port(plan: ClusterPlan, service: ServicePlan,
               published: tuple[facts.PublishedPort, ...]) -> tuple[str, int]:
    """(address, port) the service is at on its agent, as the engine publishes it."""
    main = plan.containers[0]
    for p in published:
        if p.container == main.container_name and p.session == plan.name \
                and p.internal == service.port:
            return (LOOPBACK if p.host_ip in (ALL_ADDRESSES, "::") else p.host_ip), p.host_port
    raise CommandError(f"main1 of session {plan.name} publishes no port for service "
                       f"{service.name!r} ({service.port}) on agent {main.agent}: is the session "
                       "up? (`sessionctl up`, `sessionctl status`)", Exit.ENGINE)


class Forwarder:
    """A listening socket on this machine; each connection is piped to the service through
    ``connector`` (:meth:`.Connector.open_tcp`)."""

    def __init__(self, connector: Connector, target: tuple[str, int], local_port: int = 0,
                 bind: str = LOOPBACK):
        self.connector = connector
        self.target = target
        self.server = socket.create_server((bind, local_port), reuse_port=False)
        self.port = self.server.getsockname()[1]
        self._stop = threading.Event()

    def serve(self) -> None:
        """Accept until :meth:`stop`; each connection in a thread of its own."""
        watch = selectors.DefaultSelector()
        watch.register(self.server, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                if not watch.select(0.2):
                    continue
                conn, _ = self.server.accept()
                threading.Thread(target=self._forward, args=(conn,), daemon=True).start()
        finally:
            watch.close()

    def _forward(self, conn: Any) -> None:
        try:
            chan = self.connector.open_tcp(*self.target)
        except AgentError as exc:
            print(f"sessionctl open: {exc}", file=sys.stderr)
            conn.close()
            return
        pipe(conn, chan)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self.server.close()


def cmd_open(args: argparse.Namespace) -> int:
    plan, pool = one_plan(args)
    service = find_service(plan, args.service, args.file)
    return forward(plan, pool, service, args.local_port)


def forward(plan: ClusterPlan, pool: Pool, service: ServicePlan, local_port: int) -> int:
    agent = pool.agent(plan.containers[0].agent or "")
    conn = connector_for(agent)
    try:
        try:
            target = agent_port(plan, service, gather(conn, facts.PublishedPorts()))
        except (AgentError, facts.FactError) as exc:
            raise CommandError(f"agent {agent.name}: {exc}", Exit.ENGINE) from None
        try:
            forwarder = Forwarder(conn, target, local_port)
        except OSError as exc:
            raise CommandError(f"cannot listen on {LOOPBACK}:{local_port}: {exc.strerror or exc}",
                               Exit.ENGINE) from None
        url = service_url(service.protocol, LOOPBACK, forwarder.port)
        print(url, flush=True)
        print(f"sessionctl open: {service.name} of {plan.name} (agent {agent.name}, "
              f"{target[0]}:{target[1]}, via {conn.description}) at {url}; Ctrl-C closes it",
              file=sys.stderr, flush=True)
        previous = signal.signal(signal.SIGTERM, lambda *_: forwarder.stop())
        try:
            forwarder.serve()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            forwarder.close()
        print(f"sessionctl open: closed {url}", file=sys.stderr)
        return Exit.OK
    finally:
        conn.close()


def local_port(value: str) -> int:
    """An argparse type: 0 (any free port) to 65535."""
    if not value.isdigit() or int(value) > 65535:
        raise argparse.ArgumentTypeError("must be a port, 1-65535 (0: any free one)")
    return int(value)


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "open", "forward a local port to a service of main1 and print its URL",
        "Forward a port of this machine (127.0.0.1) to SERVICE, one of the definition's "
        "`services`, and print its local URL (http://127.0.0.1:PORT/). The way goes over the "
        "pool's SSH to main1's agent (its user, key and known_hosts; skipped for a local "
        "engine), to the port the service is published at on the agent's loopback (read on "
        "the engine): our AppProxy, so no service is reachable from outside unless it is "
        "`public`. Declaring a service only publishes and names it: main1's command or "
        "image starts it. Ctrl-C closes the port and every forwarded connection (exit 0).",
        epilog="exit codes: 0 closed by Ctrl-C or SIGTERM, 1 the agent did not answer or main1 "
        "publishes no such port, 2 invalid input (no such service), 3 pending")
    add_session_args(p)
    p.add_argument("service", metavar="SERVICE", help="a service name from the definition")
    p.add_argument("--local-port", type=local_port, default=0, metavar="PORT",
                   help="the local port to listen on (default: any free one)")
    p.set_defaults(func=cmd_open)
