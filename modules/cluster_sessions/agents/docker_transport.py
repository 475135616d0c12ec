"""How a Docker SDK client's connections to one engine behave: a dropped connection retried
once, one connection pool for the engine's socket. The connectors (:mod:`.connectors`, for the
client they make over SSH) and the engine room (:mod:`.engine`, for every client it opens) both
set them; below both, so neither imports the other for it.
"""

from __future__ import annotations

from typing import Any


def retry_a_dropped_connection(client: Any) -> None:
    """A call whose connection the agent dropped (``Connection reset by peer``: an idle pooled
    connection closed on the agent's side, seen on the lab when a client sat idle through an
    ``up``, e.g. the pool ledger's) is sent once more on a new connection. Only a dropped
    connection: a timeout is not retried (a frozen engine must still time out once)."""
    from urllib3.exceptions import ProtocolError
    from urllib3.util.retry import Retry

    class _OnceOnDrop(Retry):
        def _is_read_error(self, err: Exception) -> bool:
            return isinstance(err, ProtocolError)

    retry = _OnceOnDrop(total=1, connect=1, read=1, status=0, other=0, redirect=False,
                        allowed_methods=None, raise_on_status=False)
    for adapter in client.api.adapters.values():
        adapter.max_retries = retry


def one_pool_per_engine(client: Any) -> None:
    """Give the client one connection pool for its engine's socket. docker-py's
    ``UnixHTTPAdapter`` keys its pools by the whole request URL (up to 25 pools, each keeping
    its idle connection): every container's ``/containers/ID/stats`` got a connection of its
    own, and through an SSH agent's relay each connection is a channel, so one sample of 11
    containers opened 25 channels and outgrew sshd's ``MaxSessions`` (10): 3 SSH connections
    (seen on the lab, ``benchmarks/sample_cost.py``). With one pool, connections are reused
    from call to call (at most its ``maxsize`` kept)."""
    from docker.transport.unixconn import UnixHTTPAdapter

    for prefix, adapter in client.api.adapters.items():
        if isinstance(adapter, UnixHTTPAdapter):
            get = adapter.get_connection

            def pooled(url: str, proxies: Any = None, _get: Any = get,
                       _key: str = prefix + "localhost") -> Any:
                return _get(_key, proxies)

            adapter.get_connection = pooled
