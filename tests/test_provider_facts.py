"""The provider's read-back, as provider_facts models it from the provider's source
(docs/provider-fidelity.md), and what the Session does so that nothing shows as a change on
the next up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster_sessions.core.provider_facts import (
    CONTAINER_FORCE_NEW,
    NETWORK_FORCE_NEW,
    cpus_argument,
    cpus_read_back,
    parse_cpus,
    stable_cpus_near,
)

from .test_session import Run


# helpers.go nanoInt64ToDecimalString, worked by hand: FloatString(9); exactly nine zeros in
# that text -> FloatString(1); else the trailing zeros trimmed.
@pytest.mark.parametrize(("nano", "text"), [
    (0, "0"), (10**9, "1.0"), (2 * 10**9, "2.0"), (16 * 10**9, "16.0"), (10 * 10**9, "10."),
    (100 * 10**9, "100."), (5 * 10**8, "0.5"), (15 * 10**8, "1.5"), (25 * 10**7, "0.25"),
    (10**8, "0.1"), (10**6, "0.0"), (10**7, "0.0"), (5 * 10**7, "0.1"), (101 * 10**7, "1.01"),
])
def test_cpus_read_back_follows_the_providers_formatting(nano, text):
    assert cpus_read_back(nano) == text


@given(st.integers(100, 4_096_000).map(lambda m: m / 1000))
def test_a_cpu_value_is_passed_as_read_back_or_has_a_stable_neighbour(cpu):
    argument = cpus_argument(cpu)
    if argument is None:  # its nine-decimal text holds exactly nine zeros (707.001 -> "707.0")
        assert cpus_read_back(round(cpu * 10**9)).count(".") == 1
        near = stable_cpus_near(cpu)
        assert abs(round(near * 1000) - round(cpu * 1000)) <= 10 and cpus_argument(near) is not None
        return
    assert parse_cpus(argument) == round(cpu * 10**9)  # the provider creates what was asked
    assert cpus_read_back(parse_cpus(argument)) == argument  # and reads the same text back


def test_a_value_whose_nine_decimals_hold_nine_zeros_reads_back_rounded():
    assert cpus_read_back(707_001_000_000) == "707.0"  # helpers.go: strings.Count(str, "0") == 9
    assert cpus_argument(707.001) is None
    assert cpus_argument(707.002) is None and cpus_argument(707.011) == "707.011"


@pytest.mark.parametrize("cpu", [0.001, 0.01, 0.05])
def test_values_the_provider_reads_back_differently_have_no_spelling(cpu):
    assert cpus_argument(cpu) is None


@pytest.mark.parametrize(("cpu", "near"), [
    (0.001, 0.011), (0.005, 0.011), (0.01, 0.011),  # never 0, never below: the next one up
    (0.08, 0.081), (707.001, 707.0), (707.002, 707.0), (10.001, 10.0), (707.009, 707.011),
])
def test_the_hint_for_a_value_without_a_spelling_is_the_nearest_one_with(cpu, near):
    assert stable_cpus_near(cpu) == near and cpus_argument(near) is not None


@pytest.mark.parametrize(("text", "nano"), [("2", 2 * 10**9), ("10", 10 * 10**9),
                                            ("10.", 10 * 10**9), ("1.5", 15 * 10**8),
                                            ("0.001", 10**6), (".5", 5 * 10**8)])
def test_parse_cpus_reads_the_texts_the_provider_writes(text, nano):
    assert parse_cpus(text) == nano


def test_the_table_covers_every_argument_the_session_passes():
    run = Run("train-demo")
    for c in run.plan.containers:
        passed = {k for k, v in run.container(c.host).plain_inputs.items()
                  if v not in (None, [], {}) and not k.startswith("__")}
        known = {_camel(k) for k in CONTAINER_FORCE_NEW}
        assert passed <= known, passed - known
    # the network is our own resource (pulumi_layer/network.py); "agent" is how it reaches
    # the engine (a provider's place), the rest are the network's arguments
    passed = {k for k, v in run.network.plain_inputs.items()
              if v not in (None, [], {}) and not k.startswith("__")} - {"agent"}
    assert passed <= {_camel(k) for k in NETWORK_FORCE_NEW}, passed


def test_the_network_ignores_dockers_own_options_and_labels_carry_what_the_session_set():
    """Our network resource compares what the program gives, never what the engine reads
    back: Docker's own overlay options (below) change nothing."""
    from cluster_sessions.pulumi_layer.network import SessionNetworkProvider

    run = Run("multi-demo")
    net = run.network
    inputs = {k: v for k, v in net.plain_inputs.items() if not k.startswith("__")}
    assert not SessionNetworkProvider().diff("id", dict(inputs), dict(inputs)).changes
    assert SessionNetworkProvider().diff("id", inputs, {**inputs, "name": "x"}).replaces == [
        "name"]
    labels = net.plain_inputs["labels"]
    assert labels["cluster-sessions.mtu"] == str(run.plan.network.mtu or "")
    assert labels["cluster-sessions.encrypted"] == str(run.plan.network.encrypted).lower()



def test_the_network_replaces_on_what_the_review_says_forces_a_new_network():
    """One fact, decided in provider_facts: each argument the review calls ForceNew replaces
    the network, and how the agent is reached alone only updates it."""
    from cluster_sessions.pulumi_layer.network import SessionNetworkProvider

    inputs = {k: v for k, v in Run("train-demo").network.plain_inputs.items()
              if not k.startswith("__")}
    provider = SessionNetworkProvider()
    for key, forces in NETWORK_FORCE_NEW.items():
        changed = {**inputs, key: "other" if isinstance(inputs.get(key), str) else {"o": "1"}}
        assert provider.diff("id", inputs, changed).replaces == ([key] if forces else []), key
    moved = provider.diff("id", inputs, {**inputs, "agent": {**inputs["agent"], "x": 1}})
    assert moved.changes and moved.replaces == []

def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def test_review_takes_replace_or_update_from_the_providers_schema(monkeypatch):
    from cluster_sessions.core import provider_facts, review
    from cluster_sessions.core.plan import build_plan

    from .test_plan import pool, session

    def actions(old, new):
        return {(a.action, a.why) for a in review.diff_plans(old, new).containers}

    base = build_plan(session(), pool((64, 0)))
    restarting = build_plan(session(restart="always"), pool((64, 0)))
    assert actions(base, restarting) == {(review.UPDATE, ("restart policy",))}
    more_memory = build_plan(session(resources={"cpu": 2, "mem": "8g", "shmem": "1g",
                                                "gpu": 0}), pool((64, 0)))
    # memory is updated in place by the provider, but the mem label forces a new container
    assert actions(base, more_memory) == {(review.REPLACE, ("resources",))}

    # were the schema different, the review would follow it
    monkeypatch.setitem(provider_facts.CONTAINER_FORCE_NEW, "restart", True)
    assert actions(base, restarting) == {(review.REPLACE, ("restart policy",))}
    for argument in ("labels", "cpus", "shm_size"):  # all a resources change can touch
        monkeypatch.setitem(provider_facts.CONTAINER_FORCE_NEW, argument, False)
    assert actions(base, more_memory) == {(review.UPDATE, ("resources",))}


SWARM_NETWORKS = ("docker_gwbridge", "ingress")


def restore_networks(client, names: set[str]) -> None:
    """Remove the networks joining a swarm made that were not there before (leaving it keeps
    docker_gwbridge). Only those: other networks may be another test run's."""
    import contextlib
    import time

    for _ in range(20):
        extra = [n for n in client.networks.list(names=list(SWARM_NETWORKS))
                 if n.name in SWARM_NETWORKS and n.name not in names]
        if not extra:
            return
        for network in extra:
            with contextlib.suppress(Exception):  # in use while the swarm winds down: again
                network.remove()
        time.sleep(0.5)
    raise AssertionError(f"networks left on the engine: {[n.name for n in extra]}")


@pytest.mark.docker
def test_docker_adds_its_own_option_to_an_overlay_which_the_provider_would_read_back(
        docker_client):
    """The evidence for NETWORK_IGNORED: the provider writes every one of Docker's ``Options``
    into the state (rnf.go 185-194), and an overlay's include one nobody asked for; our own
    network resource (pulumi_layer/network.py), made here on the overlay, keeps what it was
    given as its outputs, so the next diff compares like with like.

    An overlay needs a swarm: one made here is left again, and the networks joining it made
    (``docker_gwbridge``, ``ingress``) are removed, so the engine is as it was (conftest)."""
    import uuid

    from cluster_sessions.agents.connectors import agent_props
    from cluster_sessions.core.spec import Agent
    from cluster_sessions.pulumi_layer.network import SessionNetworkProvider

    joined = docker_client.info()["Swarm"]["LocalNodeState"] == "active"
    networks_before = {n.name for n in docker_client.networks.list()}
    if not joined:
        docker_client.swarm.init(advertise_addr="127.0.0.1")
    try:
        inputs = {"agent": agent_props(Agent(name="local", capacity={"cpu": 1, "mem": "1g"})),
                  "name": f"cspf-{uuid.uuid4().hex[:8]}", "driver": "overlay",
                  "attachable": True, "options": {"com.docker.network.driver.mtu": "1450"},
                  "labels": {"cluster-sessions.test": "provider-facts"}}
        made = SessionNetworkProvider().create(dict(inputs))
        try:
            options = docker_client.api.inspect_network(made.id)["Options"]
            assert docker_client.api.inspect_network(made.id)["Attachable"] is True
        finally:
            SessionNetworkProvider().delete(made.id, made.outs)
        assert made.outs == inputs  # not what the engine holds
        assert not SessionNetworkProvider().diff(made.id, made.outs, dict(inputs)).changes
        assert not docker_client.networks.list(names=[inputs["name"]])
    finally:
        if not joined:
            docker_client.swarm.leave(force=True)
            restore_networks(docker_client, networks_before)
    assert options["com.docker.network.driver.mtu"] == "1450"
    assert set(options) - {"com.docker.network.driver.mtu"}, options  # e.g. vxlanid_list


def test_capabilities_are_passed_as_the_providers_docker_client_sends_them():
    """docker/docker v28.5.2 ``client/container_create.go`` ``normalizeCapabilities``: the
    engine stores ``CAP_CHOWN`` for ``chown``, so a bare name is a ForceNew diff against the
    refreshed state on every up (seen through the real provider, issue 42)."""
    from cluster_sessions.core.provider_facts import capabilities_argument
    from tests.standin.provider import normalize_capabilities

    names = ("SETUID", "chown", "CAP_KILL", "SETUID")
    assert capabilities_argument(names) == ("CAP_CHOWN", "CAP_KILL", "CAP_SETUID")
    assert capabilities_argument(("ALL",)) == ("ALL",)
    assert normalize_capabilities(list(names)) == list(capabilities_argument(names))
    for asked in (("CHOWN",), ("ALL",), ("CAP_SYS_CHROOT", "CAP_CHOWN")):  # a fixed point
        spelled = capabilities_argument(asked)
        assert tuple(normalize_capabilities(list(spelled))) == spelled
