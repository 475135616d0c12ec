"""The session's SSH key material as a Pulumi resource: generated once, kept on every later ``up``.

A Pulumi dynamic resource, so the keys live in the stack's state (the private halves as
secrets) instead of being made again on each run, which would rewrite every container's files
and replace every container. ``create`` makes the user keypair and one host key per container;
``diff``/``update`` keep every key that exists and only add (or drop) host keys when the set of
hosts changes, so a session that grows keeps its user key and the host keys of its old members.

The provider is pickled with dill into the state and unpickled by Pulumi's dynamic provider
host in another process. The class is pickled *by reference*, so ``cluster_sessions`` must be
importable there: install the project (``pip install -e .``) into the Python environment that
runs ``pulumi``. Nothing here opens a file or a connection at import time.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

from ..core import keys

#: Outputs that hold private keys; the engine stores them encrypted.
SECRET_OUTPUTS = ("user_private", "host_private")
#: Never change once created: a new host set only adds or drops host keys.
STABLE_OUTPUTS = ("user_private", "user_public")


def _hosts(props: Mapping[str, Any]) -> list[str]:
    return list(props.get("hosts") or [])


def _outs(hosts: Sequence[str], material: keys.SessionKeys) -> dict[str, Any]:
    return {"hosts": list(hosts), **keys.to_dict(material)}


class SessionKeysProvider(ResourceProvider):
    """CRUD for a session's keys. Stateless: safe to pickle, no clients, no open files."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        hosts = news.get("hosts")
        if not isinstance(hosts, list) or not hosts:
            failures.append(CheckFailure("hosts", "must be a non-empty list of host names"))
        elif not all(isinstance(h, str) and h for h in hosts):
            failures.append(CheckFailure("hosts", "every host must be a non-empty string"))
        elif len(set(hosts)) != len(hosts):
            failures.append(CheckFailure("hosts", "host names must be unique"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        hosts = _hosts(props)
        return CreateResult(uuid.uuid4().hex, _outs(hosts, keys.generate_session_keys(hosts)))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Only the host list is an input. The serialized provider (``__provider``) is left out
        # on purpose: a new pulumi or dill version re-pickles it differently, and that must
        # never look like a change to the keys.
        changed = _hosts(olds) != _hosts(news)
        return DiffResult(changes=changed, replaces=[], stables=list(STABLE_OUTPUTS),
                          delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        hosts = _hosts(news)
        return UpdateResult(_outs(hosts, keys.with_hosts(keys.from_dict(olds), hosts)))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # The keys exist only in the state; a refresh has nothing to compare them with.
        return ReadResult(id_, props)


class SessionKeyStore(pulumi.dynamic.Resource, module="cluster-sessions", name="SessionKeys"):
    """The user keypair and per-host keys of one session (``keys.SessionKeys`` in the state).

    Type token ``pulumi-python:dynamic/cluster-sessions:SessionKeys``. The private outputs are
    secrets; read them with :meth:`material`, which keeps them secret.
    """

    hosts: pulumi.Output[list[str]]
    user_public: pulumi.Output[str]
    user_private: pulumi.Output[str]
    host_public: pulumi.Output[dict[str, str]]
    host_private: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, hosts: Sequence[str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        secret = pulumi.ResourceOptions(additional_secret_outputs=list(SECRET_OUTPUTS))
        props = {
            "hosts": list(hosts),
            # Declared as None so that the outputs become attributes of this resource.
            "user_public": None,
            "user_private": None,
            "host_public": None,
            "host_private": None,
        }
        super().__init__(SessionKeysProvider(), name, props,
                         pulumi.ResourceOptions.merge(opts, secret))

    def material(self) -> pulumi.Output[keys.SessionKeys]:
        """All of it as one ``keys.SessionKeys``; a secret Output, like the private keys."""
        both = pulumi.Output.all(
            hosts=self.hosts,
            user_private=self.user_private,
            user_public=self.user_public,
            host_private=self.host_private,
            host_public=self.host_public,
        )
        return pulumi.Output.secret(both.apply(from_state))


def from_state(state: Mapping[str, Any]) -> keys.SessionKeys:
    """The keys as stored, with the host keys in host order.

    Maps come back from the state in no particular order; files rendered from them (such as
    ``known_hosts``) must come out the same on every run, or every container would be replaced.
    """
    material = keys.from_dict(state)
    order = list(state.get("hosts") or material.hosts)
    return keys.SessionKeys(material.user, {h: material.hosts[h] for h in order})
