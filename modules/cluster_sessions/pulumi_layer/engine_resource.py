"""The one shape of our dynamic resources that act on what an agent's engine holds: the pids
limit on containers (limits.py), data folders (folders.py), the named volumes a session makes
(volumes.py), an agent's bundles on its scratch root (bundles.py), the pool's swarm
(swarm.py). Each provider says only what is its own (its inputs, which of them replace, what
create, update and delete do on the agent); this base gives them the rest the same way:

- ``diff``: the inputs of :attr:`INPUTS` that changed, a value a preview does not know yet
  (:func:`unknown`) counted as changed; the changed ones of :attr:`REPLACES` replace. The
  pickled provider (``__provider``) is never an input: a new dill or pulumi pickles it
  differently, which must not look like a change.
- ``read``: read-back: :meth:`look` says what the engine holds now (the outputs), or None when
  it is gone (then the next ``up`` makes it again); by default the state's outputs as they are.
- ``delete``: :meth:`remove` with :func:`tolerating_gone` for the words of :attr:`GONE`: an
  object already gone is deleted.
- :class:`EnsuredProvider`, for an object that create and update both bring to what the
  inputs say (made if missing, kept or set again if there: a folder, a volume, a limit):
  :meth:`~EnsuredProvider.ensure` is the one act, :meth:`~EnsuredProvider.object_id` its name;
- the agent reached inside each call (:meth:`connect`, :meth:`client`), from the plain
  ``agent_props`` the program gave: nothing is opened at import or kept between calls.

The providers are pickled by dill into the state and unpickled by Pulumi's dynamic provider
host in another process, *by reference* (module path and class name: compat_pickle.py), with
no instance state. This base keeps it so: it adds class attributes and methods only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult
from pulumi.output import Unknown
from pulumi.runtime import rpc

from ..agents.connectors import AgentError, Connector, connector_from_props


def unknown(value: Any) -> bool:
    """A value a preview does not know yet: ``check`` and ``diff`` get ``Unknown()`` objects
    (pulumi/dynamic/__main__.py deserializes with keep_unknowns), the wire has the sentinel
    string (runtime/rpc.py ``UNKNOWN``)."""
    return isinstance(value, Unknown) or value == rpc.UNKNOWN


def changed_inputs(olds: Mapping[str, Any], news: Mapping[str, Any],
                   inputs: tuple[str, ...]) -> list[str]:
    """The ``inputs`` whose new value differs from the old one or is not known yet."""
    return [k for k in inputs if unknown(news.get(k)) or olds.get(k) != news.get(k)]


@contextlib.contextmanager
def tolerating_gone(*words: str) -> Iterator[None]:
    """An :class:`AgentError` whose detail has one of ``words`` (the engine's "not found")
    means what was to be removed is gone already: done, not a failure."""
    try:
        yield
    except AgentError as exc:
        if not any(w in exc.detail for w in words):
            raise


@contextlib.contextmanager
def engine_client(agent: Mapping[str, Any], timeout: float) -> Iterator[Any]:
    """A Docker SDK client of ``agent`` (its ``agent_props``), through its connector, closed
    with the connection when the block ends."""
    with connector_from_props(agent, timeout=timeout) as conn:
        client = conn.docker_client()
        try:
            yield client
        finally:
            client.close()


class EngineResourceProvider(ResourceProvider):
    """The diff, read-back and delete every engine-side dynamic provider shares."""

    #: the inputs a diff compares (outputs a create adds are not among them)
    INPUTS: tuple[str, ...] = ()
    #: the inputs whose change is another object: a replacement, not an update
    REPLACES: tuple[str, ...] = ()
    #: a replacement deletes the old object before it makes the new one (one per agent)
    DELETE_BEFORE_REPLACE = False
    #: words of an engine's answer to a removal that mean the object is gone already
    GONE: tuple[str, ...] = ()
    COMMAND_TIMEOUT = 120.0

    def connect(self, props: Mapping[str, Any], key: str = "agent") -> Connector:
        return connector_from_props(props[key], timeout=self.COMMAND_TIMEOUT)

    def client(self, props: Mapping[str, Any], key: str = "agent"
               ) -> contextlib.AbstractContextManager[Any]:
        """A Docker SDK client of the agent ``props[key]`` (:func:`engine_client`)."""
        return engine_client(props[key], self.COMMAND_TIMEOUT)

    def diffed(self) -> tuple[str, ...]:
        """The inputs a diff compares (by default all of :attr:`INPUTS`)."""
        return self.INPUTS

    def replaces(self, changed: list[str], olds: Mapping[str, Any],
                 news: Mapping[str, Any]) -> list[str]:
        return [k for k in changed if k in self.REPLACES]

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = changed_inputs(olds, news, self.diffed())
        return DiffResult(changes=bool(changed), replaces=self.replaces(changed, olds, news),
                          stables=[], delete_before_replace=self.DELETE_BEFORE_REPLACE)

    def look(self, id_: str, props: dict[str, Any]) -> dict[str, Any] | None:
        """The outputs as the engine holds them now; None when the object is gone. By default
        the state's: nothing on the engine says more."""
        return props

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        found = self.look(id_, props)
        return ReadResult(None, {}) if found is None else ReadResult(id_, found)

    def remove(self, id_: str, props: dict[str, Any]) -> None:
        """What delete undoes on the agent; by default nothing (it goes with what holds it)."""

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        with tolerating_gone(*self.GONE):
            self.remove(id_, props)


class EnsuredProvider(EngineResourceProvider):
    """An object create and update both bring to what the inputs say, in one idempotent act
    (made if missing, kept if there, set again): an update is that act on the new inputs."""

    def object_id(self, props: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def ensure(self, props: Mapping[str, Any]) -> dict[str, Any]:
        """Do it on the agent; the outputs."""
        raise NotImplementedError

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(self.object_id(props), self.ensure(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self.ensure(news))
