"""The session's SSH key material as a Pulumi resource: generated once, kept on every later ``up``.

A Pulumi dynamic resource, so the keys live in the stack's state (the private halves as
secrets) instead of being made again on each run, which would rewrite every container's files
and replace every container. ``create`` makes the user keypair and one host key per container;
``diff``/``update`` keep every key that exists and only add (or drop) host keys when the set of
hosts changes, so a session that grows keeps its user key and the host keys of its old members.
The session CA and the host certificates it signed are kept the same way; a stack made before
the CA existed gets one (and a certificate per host) on its next ``up``, keeping every key.

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
SECRET_OUTPUTS = ("user_private", "host_private", "ca_private")
#: Never change once created: a new host set only adds or drops host keys.
STABLE_OUTPUTS = ("user_private", "user_public")


def _hosts(props: Mapping[str, Any]) -> list[str]:
    return list(props.get("hosts") or [])


def _principals(props: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each host's certificate principals (input ``principals``; default: the host name)."""
    return keys.principals_of(_hosts(props), props.get("principals"))


def _outs(hosts: Sequence[str], principals: Mapping[str, Sequence[str]],
          material: keys.SessionKeys) -> dict[str, Any]:
    return {"hosts": list(hosts), "principals": {h: list(principals[h]) for h in hosts},
            **keys.to_dict(material)}


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
        principals = news.get("principals")
        if principals is not None and not (
                isinstance(principals, dict) and all(
                    isinstance(v, list) and v and all(isinstance(p, str) and p for p in v)
                    for v in principals.values())):
            failures.append(CheckFailure("principals", "must map host names to non-empty "
                                         "lists of names"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        hosts, principals = _hosts(props), _principals(props)
        return CreateResult(uuid.uuid4().hex, _outs(
            hosts, principals, keys.generate_session_keys(hosts, principals)))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Only the host list and the principals are inputs. The serialized provider
        # (``__provider``) is left out on purpose: a new pulumi or dill version re-pickles it
        # differently, and that must never look like a change to the keys. Key material from
        # before the session CA existed is a change: the update adds the CA and certificates.
        changed = (_hosts(olds) != _hosts(news) or _principals(olds) != _principals(news)
                   or not olds.get("ca_private") or not olds.get("host_cert"))
        return DiffResult(changes=changed, replaces=[], stables=list(STABLE_OUTPUTS),
                          delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        hosts, principals = _hosts(news), _principals(news)
        material = keys.with_hosts(keys.from_dict(olds), hosts, principals)
        return UpdateResult(_outs(hosts, principals, material))

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
    ca_public: pulumi.Output[str]
    ca_private: pulumi.Output[str]
    host_cert: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, hosts: Sequence[str],
                 opts: pulumi.ResourceOptions | None = None,
                 principals: Mapping[str, Sequence[str]] | None = None) -> None:
        secret = pulumi.ResourceOptions(additional_secret_outputs=list(SECRET_OUTPUTS))
        props = {
            "hosts": list(hosts),
            "principals": keys.principals_of(hosts, principals),
            # Declared as None so that the outputs become attributes of this resource.
            "user_public": None,
            "user_private": None,
            "host_public": None,
            "host_private": None,
            "ca_public": None,
            "ca_private": None,
            "host_cert": None,
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
            ca_private=self.ca_private,
            ca_public=self.ca_public,
            host_cert=self.host_cert,
        )
        return pulumi.Output.secret(both.apply(from_state))


def from_state(state: Mapping[str, Any]) -> keys.SessionKeys:
    """The keys as stored, with the host keys in host order.

    Maps come back from the state in no particular order; files rendered from them (such as
    ``known_hosts``) must come out the same on every run, or every container would be replaced.
    """
    material = keys.from_dict(state)
    order = list(state.get("hosts") or material.hosts)
    return keys.SessionKeys(material.user, {h: material.hosts[h] for h in order}, material.ca,
                            {h: material.host_certs[h] for h in order
                             if h in material.host_certs})
