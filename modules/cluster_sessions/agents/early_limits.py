"""The pool's pids limit on a session's containers between their create and their start, while
``sessionctl up`` runs, so that no set-up waits for it.

Until a container's pids limit holds, nothing of the user's runs in it: its set-up waits for
the limit before its first step as the user (templates/setup.sh.j2). The docker provider has no
argument for the limit, so ``ContainerLimits`` (pulumi_layer/limits.py) sets it once every
container of an agent exists, and every container of the agent waited for the last one's
create: the largest single cost of a session's time to ready (issue 35: 0.2-0.26 s of 1 s at
N = 2 on the local engine; on the lab at N = 128, an agent's limits came 19.5 s after its last
container ran). The provider creates a container, uploads its files and then starts it
(rcf.go ``resourceDockerContainerCreate``), and the engine announces each create on its event
stream: while ``up`` runs, the driver follows each agent's stream for this stack's containers
and sets the limit on each as soon as it exists, mostly before its start. Those made before
the stream opened (over SSH to a loaded agent that takes seconds) and still without the limit,
whether created or already started and waiting for it, are found and set as it opens.

``ContainerLimits`` stays the guarantee, and this only a head start: a plain ``pulumi up`` has
no watcher, an agent whose stream does not open or breaks is left to it, and a failed update is
not an error here (the resource reports it). Only containers labelled with this stack's id are
touched (:func:`cluster_sessions.agents.engine.created_container`), and only with the pool's
limit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.spec import Agent
from .connectors import connector_for
from .engine import created_container, follow_creations, set_pids_limit

# update calls at once per agent (a created container's set-up waits for one); with the
# stream, within sshd's MaxSessions (10) of one SSH connection: each call is a channel
PARALLEL = 4
STOP_WAIT = 10.0  # s a stopping watcher gives the updates it started


class AgentWatch:
    """Follows one agent's creations of stack ``stack_id``'s containers and sets ``limit`` on
    each, in a thread of its own, until :meth:`stop`."""

    def __init__(self, agent: Agent, stack_id: str, limit: int) -> None:
        self.agent, self.stack_id, self.limit = agent, stack_id, limit
        self.limited: list[str] = []  # container ids whose limit this watch set
        self.refused: list[str] = []  # why an update failed (ContainerLimits then says it)
        self.error: BaseException | None = None  # why it gave up early, if it did
        self.following = threading.Event()  # set once its stream is open (or it gave up)
        self._stream: Any = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"pids-limits-{agent.name}")

    def start(self) -> AgentWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the stream (its thread then finishes the updates it started) and waits."""
        self._stopping.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        # still connecting: not held up by it (once connected, it sees the stop and leaves)
        self._thread.join(STOP_WAIT if stream is not None else 1.0)

    def _set(self, client: Any, cid: str) -> None:
        try:
            set_pids_limit(client, cid, self.limit)
        except Exception as exc:  # noqa: BLE001 - removed meanwhile, an engine that refused: ContainerLimits says
            with self._lock:
                self.refused.append(f"{cid[:12]}: {exc}")
            return
        with self._lock:
            self.limited.append(cid)

    def _run(self) -> None:
        try:
            with connector_for(self.agent) as conn:
                client = conn.docker_client()
                try:
                    self._follow(client)
                finally:
                    client.close()
        except Exception as exc:  # noqa: BLE001 - a head start only: ContainerLimits is the guarantee
            if not self._stopping.is_set():
                self.error = exc
        finally:
            self.following.set()

    def _follow(self, client: Any) -> None:
        stream, waiting = follow_creations(client, self.stack_id, self.limit)
        with self._lock:
            self._stream = stream
        self.following.set()
        if self._stopping.is_set():  # stopped while the stream was opening
            stream.close()
            return
        with ThreadPoolExecutor(max_workers=PARALLEL,
                                thread_name_prefix=f"pids-limit-{self.agent.name}") as pool:
            taken: set[str] = set()  # one made as the stream opened is in both

            def take(cid: str | None) -> None:
                if cid is not None and cid not in taken:
                    taken.add(cid)
                    pool.submit(self._set, client, cid)

            for cid in waiting:
                take(cid)
            try:
                for event in stream:
                    take(created_container(event, self.stack_id))
            except Exception:
                if not self._stopping.is_set():  # closed by stop(): the expected end
                    raise


def wait_following(watches: Iterable[AgentWatch], timeout: float) -> None:
    """Until every watch follows its agent (or gave up), at most ``timeout`` s in all: for a
    benchmark, whose builder starts at once where ``pulumi up`` takes seconds to begin."""
    deadline = time.monotonic() + timeout
    for watch in watches:
        watch.following.wait(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def early_pids_limits(agents: Iterable[Agent], stack_id: str,
                      limit: int) -> Iterator[list[AgentWatch]]:
    """While the block runs (``up``), each agent's new containers of ``stack_id`` get ``limit``
    as soon as the agent reports them created."""
    watches = [AgentWatch(agent, stack_id, limit).start() for agent in agents]
    try:
        yield watches
    finally:
        for watch in watches:
            watch.stop()
