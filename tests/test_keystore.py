"""The SSH key dynamic provider, called directly the way Pulumi's dynamic provider host calls it."""

from __future__ import annotations

import base64
import pickle
import subprocess
import sys

import dill
from pulumi.dynamic.dynamic import serialize_provider

from cluster_sessions.core import keys
from cluster_sessions.pulumi_layer import keystore
from cluster_sessions.pulumi_layer.keystore import SessionKeysProvider

HOSTS = ["main1", "sub1", "sub2"]


def created(hosts=HOSTS) -> tuple[str, dict]:
    result = SessionKeysProvider().create({"hosts": list(hosts)})
    return result.id, result.outs


def test_create_makes_a_user_key_and_one_host_key_per_host():
    id_, outs = created()
    assert id_
    assert outs["hosts"] == HOSTS
    assert list(outs["host_public"]) == HOSTS and list(outs["host_private"]) == HOSTS
    material = keys.from_dict(outs)
    assert material.user.public_openssh.startswith("ssh-ed25519 ")
    assert "OPENSSH PRIVATE KEY" in material.user.private_openssh
    publics = {material.user.public_openssh, *(k.public_openssh for k in material.hosts.values())}
    assert len(publics) == len(HOSTS) + 1, "every key must be its own"


def test_the_same_hosts_are_no_change_even_with_another_serialized_provider():
    id_, outs = created()
    news = {"hosts": list(HOSTS), "__provider": "a different pickle"}
    diff = SessionKeysProvider().diff(id_, outs, news)
    assert diff.changes is False
    assert diff.replaces == []


def test_new_hosts_update_in_place_and_keep_every_existing_key():
    id_, outs = created(["main1", "sub1"])
    news = {"hosts": ["main1", "sub1", "sub2", "sub3"]}
    provider = SessionKeysProvider()
    diff = provider.diff(id_, outs, news)
    assert diff.changes is True and diff.replaces == [], "keys must never be replaced"
    assert {"user_private", "user_public"} <= set(diff.stables)
    new = provider.update(id_, outs, news).outs
    assert new["hosts"] == news["hosts"]
    assert (new["user_private"] == outs["user_private"]) is True
    assert new["user_public"] == outs["user_public"]
    for host in ("main1", "sub1"):
        assert (new["host_private"][host] == outs["host_private"][host]) is True
        assert new["host_public"][host] == outs["host_public"][host]
    assert set(new["host_public"]) == {"main1", "sub1", "sub2", "sub3"}


def test_a_shrunk_session_drops_the_keys_of_removed_hosts_only():
    id_, outs = created(["main1", "sub1", "sub2"])
    new = SessionKeysProvider().update(id_, outs, {"hosts": ["main1", "sub1"]}).outs
    assert list(new["host_public"]) == ["main1", "sub1"]
    assert new["user_public"] == outs["user_public"]
    assert new["host_public"]["sub1"] == outs["host_public"]["sub1"]


def test_check_refuses_empty_duplicate_or_non_string_hosts():
    provider = SessionKeysProvider()
    assert provider.check({}, {"hosts": HOSTS}).failures == []
    for bad in ([], ["main1", "main1"], ["main1", ""], ["main1", 3], None):
        failures = provider.check({}, {"hosts": bad}).failures
        assert [f.property for f in failures] == ["hosts"], bad


def test_private_outputs_are_declared_secret():
    assert set(keystore.SECRET_OUTPUTS) == {"user_private", "host_private", "ca_private"}
    outs = created()[1]
    public_only = {k: v for k, v in outs.items() if k not in keystore.SECRET_OUTPUTS}
    text = repr(public_only)
    assert "PRIVATE KEY" not in text, "a private key sits in an output that is not secret"


def test_from_state_puts_host_keys_back_in_host_order():
    outs = created()[1]
    shuffled = {**outs, "host_public": dict(reversed(list(outs["host_public"].items())))}
    assert list(keystore.from_state(shuffled).hosts) == HOSTS


def test_the_provider_pickles_as_pulumi_does_and_loads_in_a_fresh_interpreter():
    serialized = serialize_provider(SessionKeysProvider())
    assert serialize_provider(SessionKeysProvider()) == serialized, "not deterministic"
    provider = dill.loads(base64.b64decode(serialized))
    assert isinstance(provider, SessionKeysProvider)
    # Pulumi's dynamic provider host is another process: it must load it, and nothing may be
    # opened or generated when the module is imported there.
    code = (
        "import base64, sys, dill\n"
        f"p = dill.loads(base64.b64decode({serialized!r}))\n"
        "r = p.create({'hosts': ['main1']})\n"
        "print(type(p).__module__, sorted(r.outs['host_public']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.split() == ["cluster_sessions.pulumi_layer.keystore", "['main1']"]


def test_the_provider_holds_no_state_worth_pickling():
    assert vars(SessionKeysProvider()) == {}
    assert pickle.loads(pickle.dumps(SessionKeysProvider())).__class__ is SessionKeysProvider
