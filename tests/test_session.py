"""The Pulumi program and the Session component, run for real under Pulumi's mocks.

Every test runs the project's own ``__main__.py`` with the config of a stack file in ``stacks/``
(or of a fixture), through ``tests.standin.engine``: the mock monitor records what
the engine would receive (camelCase inputs, numbers as floats, secrets marked where they are),
and keeps
state between runs like two ``pulumi up``s. Assertions read recorded registrations and outputs
resolved with ``await output.future()``; none depends on an ``apply`` that might not run.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from cluster_sessions.core.bundles import SCRATCH, host_dir
from cluster_sessions.core.decisions import derived_stack_id
from cluster_sessions.core.names import (
    BUNDLE_DIGEST_LABEL,
    ENDPOINT_LABEL,
    MADE_BY_LABEL,
    STACK_ID_LABEL,
    STACK_LABEL,
)
from cluster_sessions.core.plan import (
    ClusterPlan,
    build_plans,
    container_command,
    container_labels,
    network_labels,
    runs_job,
    volume_labels,
    with_identity,
)
from cluster_sessions.core.provider_facts import cpus_read_back, parse_cpus
from cluster_sessions.core.render import BUNDLE_DIR, pack, pack_entrypoint_argv, render_container
from cluster_sessions.core.services import allocate
from cluster_sessions.pulumi_layer import keystore
from cluster_sessions.pulumi_layer.program import InvalidDefinition
from cluster_sessions.pulumi_layer.session import TYPE_TOKEN, SessionArgs, SessionPending
from tests.standin.engine import (
    STACKS,
    Engine,
    Registration,
    example_stacks,
    is_secret,
    run_program,
)
from tests.standin.engine import stack_config as stack_file_config

from .factories import load_session

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONTAINER = "docker:index/container:Container"
NETWORK = "pulumi-python:dynamic/cluster-sessions:SessionNetwork"
PROVIDER = "pulumi:providers:docker"
KEYS = "pulumi-python:dynamic/cluster-sessions:SessionKeys"
LIMITS = "pulumi-python:dynamic/cluster-sessions:ContainerLimits"
BUNDLES = "pulumi-python:dynamic/cluster-sessions:BundleDelivery"
VOLUMES = "pulumi-python:dynamic/cluster-sessions:SessionVolume"
STACK = "pulumi:pulumi:Stack"

EXAMPLES = example_stacks()
FIXTURE_STACKS = {
    # stack -> config, for shapes the examples do not cover
    "spread-demo": {"cluster-sessions:definition": str(FIXTURES / "sessions" / "spread.yaml")},
    "gpu-pair": {"cluster-sessions:definition": str(FIXTURES / "sessions" / "gpu-pair.yaml")},
    "spread-on-workers": {  # the swarm manager holds no container but makes the network
        "cluster-sessions:definition": str(FIXTURES / "sessions" / "spread.yaml"),
        "cluster-sessions:pool": str(FIXTURES / "pools" / "workers.yaml"),
    },
    "multi-demo-over-ssh": {
        "cluster-sessions:definition": "sessions/multi-demo.yaml",
        "cluster-sessions:pool": str(FIXTURES / "pools" / "ssh-pair.yaml"),
    },
    "remote-gpus": {"cluster-sessions:definition": str(FIXTURES / "sessions" / "remote-gpus.yaml")},
}


def config_of(stack: str) -> dict[str, str]:
    return FIXTURE_STACKS.get(stack) or stack_file_config(stack)


def definition_and_pool(config: dict[str, str], stack: str = "") -> tuple[Path, Path | None]:
    from cluster_sessions.pulumi_layer.program import default_definition

    definition = Path(config.get("cluster-sessions:definition")
                      or default_definition(STACKS, stack) or "")
    pool = config.get("cluster-sessions:pool")
    return (definition if definition.is_absolute() else STACKS / definition,
            Path(pool) if pool else None)


def expected_plan(config: dict[str, str], stack: str = "") -> ClusterPlan:
    """The plan the program should build, made here from the same files independently (with
    ``count``, the session ``cluster-sessions:index`` names, default the first)."""
    loaded = load_session(*definition_and_pool(config, stack))
    plans = build_plans(loaded.session, loaded.pool)
    named = [p for p in plans if p.name == stack]
    if "cluster-sessions:index" not in config and named:
        return named[0]
    return plans[int(config.get("cluster-sessions:index", "1")) - 1]


class Run:
    """One run of the program: its engine (registrations, state), outputs and expected plan."""

    def __init__(self, stack: str, engine: Engine | None = None) -> None:
        self.stack = stack
        self.config = config_of(stack)
        self.plan = expected_plan(self.config, self.stack)
        self.engine = engine or Engine()
        self.outputs = run_program(self.engine, stack, self.config)

    @property
    def component(self) -> Registration:
        return self.engine.named(TYPE_TOKEN, self.plan.name)

    def container(self, host: str) -> Registration:
        return self.engine.named(CONTAINER, f"{self.plan.name}-{host}")

    @property
    def network(self) -> Registration:
        return self.engine.named(NETWORK, self.plan.network.name)

    @property
    def keys(self) -> Registration:
        return self.engine.named(KEYS, f"{self.plan.name}-keys")

    def output(self, name: str):
        value, _secret = self.outputs[name]
        return value

    def scratch_agents(self) -> list[str]:
        """The agents that deliver into their scratch root (core/bundles.py)."""
        return [a for a in self.plan.agents if self.plan.delivery(a) == SCRATCH]

    def bundle_text(self, host: str) -> tuple[dict, str]:
        """(how ``host``'s bundle travels, its pack): the provider's upload, or the value of
        its agent's BundleDelivery (issue 45), as the engine received it."""
        c = next(c for c in self.plan.containers if c.host == host)
        if self.plan.delivery(c.agent) == SCRATCH:
            reg = self.engine.named(BUNDLES, f"{self.plan.name}-bundles-{c.agent}")
            bundles = reg.inputs["bundles"]
            assert is_secret(bundles), f"{reg.urn}: the bundles are not secret"
            return bundles, bundles["value"][host]
        (bundle,) = self.container(host).inputs["uploads"]
        return bundle["content"], bundle["content"]["value"]

    def provider(self, agent: str) -> Registration:
        """The provider of ``agent``: named ``<session>-<agent>-<8 hex digits>``."""
        found = [r for r in self.engine.of_type(PROVIDER)
                 if re.fullmatch(rf"{re.escape(self.plan.name)}-{re.escape(agent)}-[0-9a-f]{{8}}",
                                 r.name)]
        assert len(found) == 1, [r.name for r in self.engine.of_type(PROVIDER)]
        return found[0]


@pytest.fixture(scope="module", params=EXAMPLES + sorted(FIXTURE_STACKS))
def run(request) -> Run:
    return Run(request.param)


# --- the example stacks themselves ---------------------------------------------------------

def test_every_shipped_session_runs_from_a_fresh_clone_without_a_stack_file():
    """Issue 41, item 5: the checkout keeps no stack file (``sessionctl`` writes the config
    where the CLI keeps it, git-ignored; the backend keeps what ``up`` decided), and a direct
    ``pulumi up -s NAME`` finds its definition by the stack's name."""
    from cluster_sessions.pulumi_layer.program import default_definition

    assert EXAMPLES, "no example sessions in stacks/sessions"
    for path in sorted((STACKS / "sessions").glob("*.yaml")):
        loaded = load_session(path)
        for plan in build_plans(loaded.session, loaded.pool):
            assert (STACKS / default_definition(STACKS, plan.name)).resolve() == path.resolve()
    assert default_definition(STACKS, "no-such-session") is None
    assert default_definition(STACKS, "organization/cluster-sessions/train-demo") == \
        "sessions/train-demo.yaml"


def test_no_stack_file_is_tracked_and_every_one_is_ignored():
    tracked = subprocess.run(["git", "ls-files", "stacks/Pulumi.*.yaml"], cwd=STACKS.parent,
                             capture_output=True, text=True, check=True).stdout.split()
    assert tracked == []
    ignored = subprocess.run(["git", "check-ignore", "-q", "stacks/Pulumi.train-demo.yaml"],
                             cwd=STACKS.parent, check=False)
    assert ignored.returncode == 0, "stacks/Pulumi.<stack>.yaml must be git-ignored"


def test_the_project_declares_every_config_key_the_program_reads():
    project = yaml.safe_load((STACKS.parent / "Pulumi.yaml").read_text())
    declared = project["config"]
    assert project["stackConfigDir"] == "stacks"
    # Nothing is required project-wide: session stacks and pool stacks set different keys.
    assert all("default" in v for v in declared.values())
    for key in ("definition", "pool", "index", "stack-id", "made-by", "placement", "image",
                "service-ports"):
        assert f"cluster-sessions:{key}" in declared, key


# --- the resource graph --------------------------------------------------------------------

def test_one_component_holds_providers_network_keys_and_one_container_per_host(run: Run):
    plan, engine = run.plan, run.engine
    used_agents = set(plan.agents) | {plan.network.agent}
    assert [r.name for r in engine.of_type(TYPE_TOKEN)] == [plan.name]
    assert sorted(r.urn for r in engine.of_type(PROVIDER)) == sorted(
        run.provider(a).urn for a in used_agents)
    assert [r.name for r in engine.of_type(NETWORK)] == [plan.network.name]
    assert [r.name for r in engine.of_type(KEYS)] == [f"{plan.name}-keys"]
    # (registrations come from a thread pool, so their order is not the program's order)
    assert sorted(r.name for r in engine.of_type(CONTAINER)) == sorted(
        c.container_name for c in plan.containers)
    # the pids limit: one per agent that holds containers (pulumi_layer/limits.py)
    assert sorted(r.name for r in engine.of_type(LIMITS)) == sorted(
        f"{plan.name}-limits-{a}" for a in plan.agents)
    # the bundles: one delivery per agent with file access (pulumi_layer/bundles.py)
    assert sorted(r.name for r in engine.of_type(BUNDLES)) == sorted(
        f"{plan.name}-bundles-{a}" for a in run.scratch_agents())
    # the volumes it makes: one per volume and agent, labelled its own (pulumi_layer/volumes.py)
    made = sorted({m.source for m in plan.mounts if m.type == "volume" and not m.listed})
    volumes = engine.of_type(VOLUMES)
    assert sorted(r.name for r in volumes) == sorted(
        f"{plan.name}-volume-{a}/{v}" for a in plan.agents for v in made)
    assert all(r.inputs["labels"] == volume_labels(plan) for r in volumes)
    others = {r.type for r in engine.registrations} - {TYPE_TOKEN, PROVIDER, NETWORK, KEYS,
                                                         CONTAINER, STACK, LIMITS, BUNDLES,
                                                         VOLUMES}
    assert not others, f"unexpected resource types {others}"


def test_the_component_is_the_parent_of_every_resource_it_makes(run: Run):
    component = run.component
    stack = run.engine.of_type(STACK)[0]
    assert component.parent == stack.urn, f"{component.urn} is not a child of the stack"
    for reg in run.engine.registrations:
        if reg.type not in (STACK, TYPE_TOKEN):
            assert reg.parent == component.urn, f"{reg.urn} has parent {reg.parent}"


def test_each_agent_gets_a_provider_for_its_docker_host(run: Run):
    pool = load_session(*definition_and_pool(run.config, run.stack)).pool
    for agent in pool.agents:
        if agent.name not in set(run.plan.agents) | {run.plan.network.agent}:
            continue
        reg = run.provider(agent.name)
        inputs = reg.plain_inputs
        if agent.ssh is not None:  # remote: the socket named is the agent's, over its ssh
            socket = agent.docker_host.removeprefix("unix://")
            path = "" if socket == "/var/run/docker.sock" else socket
            assert inputs["host"] == (f"ssh://{agent.ssh.user}@{agent.ssh.host}:"
                                      f"{agent.ssh.port}{path}"), reg.urn
        else:
            assert inputs["host"] == agent.docker_host, reg.urn
        if inputs["host"].startswith("ssh://"):
            opts = json.loads(inputs["sshOpts"])  # provider config arrives JSON-encoded
            assert opts[:2] == ["-o", "StrictHostKeyChecking=yes"], reg.urn
            assert "BatchMode=yes" in opts and "ConnectTimeout=10" in opts, reg.urn
        else:
            assert "sshOpts" not in inputs, reg.urn
        if agent.docker_host.startswith("tcp://"):
            assert inputs["certPath"] == agent.tls.cert_path, reg.urn
        else:
            assert "certPath" not in inputs, reg.urn


def test_remote_gpu_agents_get_ssh_providers_and_device_requests_they_can_run():
    """The daily path of issue 20: two GPU hosts reached over SSH as a non-root user. Written
    out by hand, not derived from the code under test."""
    run = Run("remote-gpus")
    key = ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
           "-o", "UserKnownHostsFile=~/.ssh/known_hosts_pool",
           "-o", "IdentityFile=~/.ssh/id_pool", "-o", "IdentitiesOnly=yes"]
    a, b = run.provider("gpu-a").plain_inputs, run.provider("gpu-b").plain_inputs
    # the agent's default socket is the remote default: no path; another socket rides along
    assert a["host"] == "ssh://ops@10.0.0.11:2222"
    assert b["host"] == "ssh://ops@10.0.0.12:2222/run/user/1000/docker.sock"
    assert json.loads(a["sshOpts"]) == key and json.loads(b["sshOpts"]) == key
    assert "certPath" not in a and "context" not in a
    # two GPUs per container as one device request the engine accepts (not gpus=device=0,1)
    want = {"main1": ["0", "1"], "sub1": ["2", "3"], "sub2": ["0", "1"], "sub3": ["2", "3"]}
    for host, ids in want.items():
        inputs = run.container(host).plain_inputs
        assert "gpus" not in inputs, host
        assert inputs["deviceRequests"] == [
            {"driver": "nvidia", "deviceIds": ids, "capabilities": ["gpu"]}], host
        assert run.container(host).provider_urn == run.provider(
            "gpu-a" if host in ("main1", "sub1") else "gpu-b").urn
    assert run.network.plain_inputs["name"] == "remote-gpus-net-mtu1450"
    assert run.network.plain_inputs["agent"]["name"] == "gpu-a"  # made through gpu-a


def test_the_caller_s_docker_environment_moves_nothing(monkeypatch):
    """DOCKER_HOST cannot redirect a provider (every provider gets an explicit host); what the
    provider itself would follow over its arguments makes the program refuse to run."""
    before = Run("remote-gpus")
    monkeypatch.setenv("DOCKER_HOST", "tcp://203.0.113.9:2375")
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    after = Run("remote-gpus")
    assert ({r.name: r.plain_inputs for r in after.engine.of_type(PROVIDER)}
            == {r.name: r.plain_inputs for r in before.engine.of_type(PROVIDER)})
    for name in ("DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_SSH_OPTS", "DOCKER_CA_MATERIAL",
                 "DOCKER_CERT_MATERIAL", "DOCKER_KEY_MATERIAL"):
        with monkeypatch.context() as env:
            env.setenv(name, "elsewhere")
            engine = Engine()
            with pytest.raises(Exception, match=f"sets {name}, which the docker provider"):
                run_program(engine, "remote-gpus", config_of("remote-gpus"))
            assert not engine.of_type(PROVIDER) and not engine.of_type(CONTAINER)


def test_a_changed_endpoint_is_a_new_provider_and_new_containers(tmp_path):
    """Pulumi does not replace a resource whose provider reference changes (the docker
    provider marks no config key ForcesProviderReplace): the provider's name carries the
    endpoint's digest, and each container and network carries the endpoint in a label, which
    forces a new resource made through the new provider (the old one is deleted through the
    old)."""
    pool = yaml.safe_load((FIXTURES / "pools" / "remote-gpus.yaml").read_text())
    session = yaml.safe_load((FIXTURES / "sessions" / "remote-gpus.yaml").read_text())

    def run_with(agents_patch: dict) -> Run:
        doc = {**pool, "agents": [{**a, **agents_patch.get(a["name"], {})}
                                  for a in pool["agents"]]}
        (tmp_path / "pool.yaml").write_text(yaml.safe_dump(doc))
        definition = tmp_path / "s.yaml"
        definition.write_text(yaml.safe_dump({**session, "pool": str(tmp_path / "pool.yaml")}))
        FIXTURE_STACKS["remote-gpus-moved"] = {"cluster-sessions:definition": str(definition)}
        try:
            run = Run("remote-gpus-moved")
        finally:
            del FIXTURE_STACKS["remote-gpus-moved"]
        return run

    def endpoint(reg: Registration) -> str:
        return {x["label"]: x["value"] for x in reg.plain_inputs["labels"]}[
            "cluster-sessions.endpoint"]

    first = run_with({})
    ssh_b = {**pool["agents"][1]["ssh"], "host": "10.0.0.99"}
    moved = run_with({"gpu-b": {"ssh": ssh_b}})
    rekeyed = run_with({"gpu-b": {"ssh": {**pool["agents"][1]["ssh"], "key_file": "~/.ssh/k2"}}})
    assert moved.provider("gpu-a").name == first.provider("gpu-a").name
    assert moved.provider("gpu-b").name != first.provider("gpu-b").name
    assert rekeyed.provider("gpu-b").name == first.provider("gpu-b").name  # same endpoint
    assert endpoint(first.container("sub2")) == (
        "ssh://ops@10.0.0.12:2222 unix:///run/user/1000/docker.sock")
    assert endpoint(moved.container("sub2")) == (
        "ssh://ops@10.0.0.99:2222 unix:///run/user/1000/docker.sock")
    assert endpoint(moved.container("main1")) == endpoint(first.container("main1"))


def test_ssh_agents_pin_host_keys_with_the_files_of_their_ssh_block():
    run = Run("spread-demo")
    assert run.provider("node-a").plain_inputs["host"] == "ssh://ops@10.0.0.11:2222/run/docker-gpu.sock"
    assert json.loads(run.provider("node-a").plain_inputs["sshOpts"]) == [
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
        "-o", "UserKnownHostsFile=~/.ssh/known_hosts_agents",
        "-o", "IdentityFile=~/.ssh/id_agents", "-o", "IdentitiesOnly=yes",
    ]
    # no ssh block: the URL as written, with the operator's own ssh defaults
    assert run.provider("node-b").plain_inputs["host"] == "ssh://ops@10.0.0.12:2201"
    assert json.loads(run.provider("node-b").plain_inputs["sshOpts"]) == [
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


def test_the_overlay_is_made_through_the_manager_even_when_it_holds_no_container():
    run = Run("spread-on-workers")
    assert "mgr" not in run.plan.agents and run.plan.network.agent == "mgr"
    assert len(run.engine.of_type(PROVIDER)) == 3
    assert run.network.plain_inputs["agent"]["name"] == "mgr"
    assert run.network.plain_inputs["attachable"] is True
    for c in run.plan.containers:
        reg = run.container(c.host)
        assert reg.plain_inputs["networksAdvanced"][0]["name"] == "spread-demo-net-mtu1450"
        assert run.network.urn in reg.dependencies


def test_session_args_refuse_a_plan_made_for_another_pool():
    plan = expected_plan(FIXTURE_STACKS["spread-on-workers"])
    other = load_session(FIXTURES / "sessions" / "spread.yaml").pool
    with pytest.raises(ValueError, match="w1, w2"):
        SessionArgs(plan=plan, pool=other)


def test_containers_run_on_their_agents_and_the_network_on_its_agent(run: Run):
    plan = run.plan
    for c in plan.containers:
        reg = run.container(c.host)
        assert reg.provider_urn == run.provider(c.agent).urn, reg.urn
        assert run.network.urn in reg.dependencies, f"{reg.urn} does not wait for the network"
        assert reg.delete_before_replace, f"{reg.urn}: a fixed name needs delete-before-replace"
    net = run.network
    assert net.plain_inputs["agent"]["name"] == plan.network.agent, net.urn
    assert net.delete_before_replace, f"{net.urn}: a fixed name needs delete-before-replace"


def test_container_identity_env_and_command_come_from_the_plan(run: Run):
    plan = run.plan
    session = plan.session
    for c in plan.containers:
        reg = run.container(c.host)
        inputs = reg.plain_inputs
        assert inputs["name"] == f"{plan.name}-{c.host}", reg.urn
        assert inputs["hostname"] == c.host, reg.urn
        assert inputs["image"] == session.image, reg.urn
        assert inputs["networksAdvanced"] == [{"name": plan.network.name,
                                               "aliases": [c.host]}], reg.urn
        assert inputs["envs"] == [f"{k}={v}" for k, v in c.env.items()], reg.urn
        assert inputs["entrypoints"] == pack_entrypoint_argv(), reg.urn
        assert inputs["command"] == list(container_command(plan, c)), reg.urn
        job = runs_job(plan, c)  # a batch session's main1: it ends, and stays ended
        assert inputs["restart"] == ("no" if job else session.restart), reg.urn
        assert inputs["mustRun"] is not job, reg.urn
        assert inputs["init"] is True, reg.urn  # docker-init reaps sshd's leftovers


def test_container_resources_are_per_container_in_docker_units(run: Run):
    res = run.plan.resources
    for c in run.plan.containers:
        inputs = run.container(c.host).plain_inputs
        # as the provider reads NanoCPUs back (helpers.go nanoInt64ToDecimalString)
        assert inputs["cpus"] == cpus_read_back(round(res.cpu * 1e9))
        assert parse_cpus(inputs["cpus"]) == round(res.cpu * 1e9)
        assert inputs["memory"] == float(-(-res.mem // 2**20))  # MB, numbers arrive as floats
        assert inputs["shmSize"] == float(-(-res.shmem // 2**20))
        # no swap beyond the limit, spelled as read back (rcf.go 940-944): no drift
        assert inputs["memorySwap"] == inputs["memory"]
        assert "gpus" not in inputs
        if c.gpus:
            assert inputs["deviceRequests"] == [{"driver": "nvidia", "capabilities": ["gpu"],
                                                 "deviceIds": [str(g) for g in c.gpus]}]
        else:
            assert "deviceRequests" not in inputs


def test_mounts_are_binds_for_paths_and_volumes_for_names(run: Run):
    # no volumeOptions: the provider refuses them on an engine before API 1.45, and a volume
    # the session makes is made, labelled, by its SessionVolume (test below)
    want = [
        {"target": m.target, "source": m.source, "readOnly": m.read_only,
         "type": "bind" if m.source.startswith("/") else "volume"}
        for m in run.plan.mounts
    ]
    for c in run.plan.containers:
        mine = [{"target": BUNDLE_DIR, "type": "bind", "readOnly": True,
                 "source": host_dir(run.plan.scratch, derived_stack_id(run.stack), c.host)}
                ] if c.agent in run.scratch_agents() else []
        assert run.container(c.host).plain_inputs.get("mounts", []) == want + mine


def test_labels_identify_session_host_role_and_stack(run: Run):
    """A stack config without a stack-id (a bare ``pulumi up``): the id derived from the stack's
    name is on every label, with the stack's name and no made-by."""
    plan = with_identity(run.plan, derived_stack_id(run.stack), run.stack)
    for c in run.plan.containers:
        labels = run.container(c.host).plain_inputs["labels"]
        assert {x["label"]: x["value"] for x in labels
                if x["label"] not in (BUNDLE_DIGEST_LABEL, ENDPOINT_LABEL)
                } == container_labels(plan, c)
        assert sum(x["label"] == ENDPOINT_LABEL for x in labels) == 1
    labels = run.network.plain_inputs["labels"]
    assert {k: v for k, v in labels.items() if k != ENDPOINT_LABEL} == network_labels(plan)
    assert {STACK_ID_LABEL, STACK_LABEL} <= set(labels)
    assert MADE_BY_LABEL not in labels
    assert run.output("session")["stack_id"] == derived_stack_id(run.stack)


def test_a_direct_up_from_a_fresh_clone_keeps_what_the_backend_recorded():
    """Issue 41, item 2: ``pulumi up -s NAME`` where the stack's config keeps no decisions (a
    fresh clone) runs with those its last update recorded in the backend (the ``kept``
    output, read with the CLI: here the stand-in backend's), and records them again; a config
    that keeps its own wins over nothing recorded."""
    first = Run("train-demo")
    kept = first.output("kept")
    assert kept["stack-id"] == derived_stack_id("train-demo")
    assert kept["definition"] == "sessions/train-demo.yaml"
    recorded = {**kept, "stack-id": "0123456789abcdef", "made-by": "ci@runner-7"}
    engine = Engine()
    outputs = run_program(engine, "train-demo", {}, previous={"kept": (recorded, False)})
    session, _ = outputs["session"]
    assert session["stack_id"] == "0123456789abcdef"
    assert outputs["kept"][0]["made-by"] == "ci@runner-7"
    labels = {x["label"]: x["value"] for r in engine.registrations if r.type == CONTAINER
              for x in r.plain_inputs["labels"]}
    assert labels[STACK_ID_LABEL] == "0123456789abcdef"
    assert labels[MADE_BY_LABEL] == "ci@runner-7"
    # a record that is not one the program writes is ignored, never trusted in part
    outputs = run_program(Engine(), "train-demo", {}, previous={
        "kept": ({"stack-id": 7, "made-by": "x@y"}, False)})
    assert outputs["session"][0]["stack_id"] == derived_stack_id("train-demo")


def test_only_main1_publishes_the_definitions_ports(run: Run):
    session = run.plan.session
    for c in run.plan.containers:
        ports = run.container(c.host).plain_inputs.get("ports")
        if c.host != "main1":
            assert ports is None, f"{c.host} publishes {ports}"
            continue
        want = [{"internal": float(p.container), "ip": p.host_ip, "protocol": p.protocol,
                 **({"external": float(p.host)} if p.host else {})} for p in session.ports]
        if not any(p.container == 2200 for p in session.ports):  # sshd, for `sessionctl ssh`
            want.append({"internal": 2200.0, "ip": "127.0.0.1", "protocol": "tcp"})
        # services (no ports recorded by `sessionctl up`: preferred, else first of the range)
        chosen = allocate(session.services, run.plan.services[0].port_range, ()).ports \
            if session.services else {}
        want += [{"internal": float(v.port), "external": float(chosen[v.name]), "ip": v.bind,
                  "protocol": "tcp"} for v in run.plan.services]
        assert ports == want


def test_network_is_a_bridge_or_an_attachable_overlay_with_the_pools_options(run: Run):
    net = run.plan.network
    inputs = run.network.plain_inputs
    assert inputs["name"] == net.name
    assert inputs["driver"] == net.driver
    if net.driver == "overlay":
        assert inputs["attachable"] is True
    else:
        assert inputs["attachable"] is False
    options = inputs.get("options", {})
    assert options.get("com.docker.network.driver.mtu") == (str(net.mtu) if net.mtu else None)
    assert ("encrypted" in options) == net.encrypted


def test_the_bundle_is_one_secret_upload_and_a_label_digests_its_public_files(run: Run,
                                                                              tmp_path):
    _id, state = run.engine.state[run.keys.urn]
    material = keystore.from_state(state)
    for c in run.plan.containers:
        reg = run.container(c.host)
        files = render_container(run.plan, c, material)
        if c.agent in run.scratch_agents():
            # no upload: the agent's delivery carries it, as a secret (issue 45)
            assert not reg.inputs.get("uploads"), f"{reg.urn}: uploaded besides the delivery"
        else:
            uploads = reg.inputs["uploads"]
            assert not is_secret(uploads), f"{reg.urn}: the whole upload list is secret"
            assert [u["file"] for u in uploads] == [f"{BUNDLE_DIR}/bundle.pack"], reg.urn
            (bundle,) = uploads
            # 0600 from the start: it holds the private keys
            assert bundle["permissions"] == "0600", f"{reg.urn}: the private keys are readable"
            assert bundle["executable"] is False, reg.urn
        content, text = run.bundle_text(c.host)
        assert is_secret(content), f"{reg.urn}: the bundle is not secret"
        assert _digest(text) == _digest(pack(files)), f"{reg.urn}: not pack() of the bundle"
        for key in (material.user, material.hosts[c.host]):
            # (booleans only: never print key material)
            assert (key.private_openssh.strip() in text) is True, f"{reg.urn}: key not packed"

        # the label: the digest of the public files, in the clear (a preview shows a change)
        labels = {x["label"]: x["value"] for x in reg.inputs["labels"]}
        digest = labels[BUNDLE_DIGEST_LABEL]
        assert not is_secret(digest), f"{reg.urn}: the bundle digest is secret"
        public = pack([f for f in files if not f.secret])
        assert digest == hashlib.sha256(public.encode()).hexdigest(), reg.urn
        assert all(f.secret is False for f in files if f.path == "entrypoint.sh")

        # unpacked as the entrypoint does, it is exactly the rendered bundle
        out = tmp_path / c.host
        script = tmp_path / f"{c.host}.pack"
        script.write_text(text)
        subprocess.run(["/bin/sh", str(script), str(out)], check=True)
        unpacked = {str(p.relative_to(out)): p for p in out.rglob("*") if p.is_file()}
        assert sorted(unpacked) == sorted(f.path for f in files), reg.urn
        for f in files:
            same = _digest(unpacked[f.path].read_text()) == _digest(f.content)
            assert same, f"{reg.urn}: {f.path} unpacks differently"
            assert unpacked[f.path].stat().st_mode & 0o7777 == f.mode, f"{reg.urn}: {f.path}"
        assert (out / "ssh").stat().st_mode & 0o777 == 0o700, reg.urn


def test_the_bundle_digest_follows_the_public_files_and_never_the_private_keys(run: Run):
    """What a preview can see of the secret upload: a public change moves the digest, a
    different private key (same public keys) does not, and the digest never holds a key."""
    from dataclasses import replace

    from cluster_sessions.core.render import RenderedFile
    from cluster_sessions.pulumi_layer.session import bundle_pack

    _id, state = run.engine.state[run.keys.urn]
    material = keystore.from_state(state)
    c = run.plan.containers[0]
    files = render_container(run.plan, c, material)
    packed, digest = bundle_pack(files)
    assert bundle_pack(list(files)) == (packed, digest)  # deterministic: no diff on re-run
    other_private = [replace(f, content=f.content + "changed\n") if f.secret else f
                     for f in files]
    assert bundle_pack(other_private)[1] == digest
    assert bundle_pack(other_private)[0] != packed
    edited = [replace(f, content=f.content + "# changed\n") if f.path == "entrypoint.sh" else f
              for f in files]
    assert bundle_pack(edited)[1] != digest
    assert bundle_pack([*files, RenderedFile("extra", "x\n", 0o644)])[1] != digest
    for key in (material.user, material.hosts[c.host]):
        assert (key.private_openssh.strip() in digest) is False


def keys_calls(engine: Engine) -> list[str]:
    """The key store's dynamic provider calls (the pids limits make calls of their own)."""
    return [c for c in engine.dynamic_calls if c.endswith("-keys") or "-keys " in c]


def test_keys_are_one_resource_with_secret_private_outputs(run: Run):
    keys = run.keys
    assert keys.plain_inputs["hosts"] == list(run.plan.hosts)
    assert set(keys.additional_secret_outputs) >= {"user_private", "host_private"}
    assert is_secret(keys.inputs["__provider"])
    assert keys_calls(run.engine) == [f"create {run.plan.name}-keys"]


def test_stack_outputs_describe_hosts_agents_network_and_main1(run: Run):
    plan = run.plan
    assert run.output("hosts") == list(plan.hosts)
    agents = run.output("agents")
    assert list(agents) == list(plan.agents)
    for c in plan.containers:
        assert c.host in agents[c.agent]["hosts"]
    network = run.output("network")
    assert (network["name"], network["driver"]) == (plan.network.name, plan.network.driver)
    main1 = run.output("main1")
    assert main1["container"] == f"{plan.name}-main1"
    assert main1["agent"] == plan.containers[0].agent
    assert f"exec -it -u {plan.session.user.name} {plan.name}-main1" in main1["exec"]
    defined = [p.container for p in plan.session.ports]
    assert [p["container"] for p in main1["ports"]] == defined + (
        [] if 2200 in defined else [2200]) + [v.port for v in plan.services]
    assert sorted(run.output("services")) == sorted(v.name for v in plan.services)
    if any(p["container"] == 2200 and p["host"] for p in main1["ports"]):
        published = next(p for p in main1["ports"] if p["container"] == 2200)
        assert f"-p {published['host']} -- {plan.session.user.name}@" in main1["ssh"]["command"]
        host_key = run.engine.state[run.keys.urn][1]["host_public"]["main1"]
        assert main1["ssh"]["known_hosts"] == \
            f"[{published['address']}]:{published['host']} {host_key}"
    else:
        assert main1["ssh"] is None
    _value, secret = run.outputs["ssh_private_key"]
    assert secret, "the private key must be a secret output"
    assert run.outputs["ssh_ca_private_key"][1], "the CA's private key must be a secret output"
    ca_public, secret = run.outputs["ssh_ca_public_key"]
    assert not secret and ca_public.startswith("ssh-ed25519 ")
    assert not run.outputs["main1"][1] and not run.outputs["ssh_public_key"][1]


# --- no perpetual diff ---------------------------------------------------------------------

@pytest.mark.parametrize("stack", EXAMPLES + sorted(FIXTURE_STACKS))
def test_a_second_run_registers_exactly_the_same_inputs(stack):
    engine = Engine()
    first = Run(stack, engine)
    before = {r.urn: r.inputs for r in first.engine.registrations}
    second = Run(stack, engine)
    after = {r.urn: r.inputs for r in second.engine.registrations}
    assert sorted(after) == sorted(before)
    for urn, inputs in before.items():
        same = after[urn] == inputs  # compared whole; the message names only the resource
        assert same, f"{urn}: inputs differ between two runs (perpetual diff)"
    name = first.plan.name
    assert keys_calls(engine) == [f"create {name}-keys", f"diff {name}-keys changes=False"]
    # the pids limits: made once, then nothing to change (the same containers)
    assert sorted(c for c in engine.dynamic_calls if "-limits-" in c) == sorted(
        [f"create {name}-limits-{a}" for a in first.plan.agents]
        + [f"diff {name}-limits-{a} changes=False" for a in first.plan.agents])


def test_a_session_that_grows_keeps_its_keys_and_adds_host_keys(tmp_path):
    grown = tmp_path / "train-demo.yaml"
    text = (STACKS / "sessions" / "train-demo.yaml").read_text()
    grown.write_text(text.replace("size: 4", "size: 3").replace(
        "pool: local", f"pool: {STACKS / 'pools' / 'local.yaml'}"))
    engine = Engine()
    config = {"cluster-sessions:definition": str(grown)}
    run_program(engine, "train-demo", config)
    keys_urn = engine.named(KEYS, "train-demo-keys").urn
    small = keystore.from_state(engine.state[keys_urn][1])
    grown.write_text(grown.read_text().replace("size: 3", "size: 4"))
    run_program(engine, "train-demo", config)
    big = keystore.from_state(engine.state[keys_urn][1])
    assert keys_calls(engine)[-2:] == ["diff train-demo-keys changes=True",
                                       "update train-demo-keys"]
    assert big.user == small.user
    assert list(big.hosts) == ["main1", "sub1", "sub2", "sub3"]
    assert all(big.hosts[h] == small.hosts[h] for h in small.hosts)


# --- failures ------------------------------------------------------------------------------

def test_a_pending_session_creates_nothing_and_fails_with_the_reason():
    engine = Engine()
    config = {"cluster-sessions:definition": str(FIXTURES / "sessions" / "too-big.yaml")}
    with pytest.raises(SessionPending, match="pending.*no single agent can hold all 3"):
        run_program(engine, "too-big", config)
    assert [r.type for r in engine.registrations] == [STACK]
    assert engine.state == {}


def test_an_invalid_definition_fails_with_one_line_per_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((FIXTURES / "sessions" / "too-big.yaml").read_text().replace(
        "shmem: 64m", "shmem: 2g"))
    engine = Engine()
    with pytest.raises(InvalidDefinition, match=r"bad\.yaml: resources\.shmem: must be smaller"):
        run_program(engine, "too-big", {"cluster-sessions:definition": str(bad)})
    assert [r.type for r in engine.registrations] == [STACK]


def test_the_definition_must_be_configured():
    with pytest.raises(Exception, match="cluster-sessions:definition"):
        run_program(Engine(), "nothing", {})


# --- helpers -------------------------------------------------------------------------------

def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()



def test_a_batch_jobs_container_is_never_restarted_or_started_again(tmp_path):
    """main1 of a batch session: restart "no" and must_run off (the provider starts a stopped
    container again on the next up when must_run is on); the subs keep the definition's policy
    and run nothing but the default command."""
    definition = yaml.safe_load((STACKS / "sessions" / "train-demo.yaml").read_text())
    definition.update(type="batch", command=["python3", "-c", "print(1)"], restart="always")
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(definition))
    engine = Engine()
    run_program(engine, "train-demo", {"cluster-sessions:definition": str(path),
                                       "cluster-sessions:pool":
                                       str(STACKS / "pools" / "local.yaml")})
    containers = {r.name.rsplit("-", 1)[1]: r.plain_inputs
                  for r in engine.of_type(CONTAINER)}
    assert containers["main1"]["restart"] == "no"
    assert containers["main1"]["mustRun"] is False
    assert containers["main1"]["command"] == ["python3", "-c", "print(1)"]
    for host, inputs in containers.items():
        if host != "main1":
            assert inputs["restart"] == "always" and inputs["mustRun"] is True, host
            assert inputs["command"] == ["sleep", "infinity"], host


def _counted(tmp_path, count: int = 3) -> str:
    path = tmp_path / "sweep.yaml"
    text = (STACKS / "sessions" / "train-demo.yaml").read_text()
    path.write_text(text.replace("name: train-demo", "name: sweep").replace(
        "size: 4", "size: 1").replace("pool: local", f"pool: {STACKS / 'pools' / 'local.yaml'}")
        + f"count: {count}\n")
    return str(path)


@pytest.mark.parametrize(("stack", "index", "expected"), [
    ("sweep-2", "", "sweep-2"),  # by the stack's name (`pulumi up -s sweep-2`)
    ("mine", "3", "sweep-3"),  # by the index sessionctl sets
])
def test_a_stack_of_a_count_runs_its_own_session(tmp_path, stack, index, expected):
    engine = Engine()
    config = {"cluster-sessions:definition": _counted(tmp_path), "cluster-sessions:index": index}
    outputs = run_program(engine, stack, config)
    assert outputs["session"][0]["name"] == expected
    assert [r.name for r in engine.of_type(CONTAINER)] == [f"{expected}-main1"]


@pytest.mark.parametrize(("stack", "index", "words"), [
    ("other", "", "the definition makes 3 sessions (count) and stack 'other' is none of them"),
    ("sweep-1", "4", "cluster-sessions:index is '4': the definition makes 3 session(s), 1..3"),
])
def test_a_stack_that_is_none_of_a_counts_sessions_creates_nothing(tmp_path, stack, index,
                                                                   words):
    engine = Engine()
    config = {"cluster-sessions:definition": _counted(tmp_path), "cluster-sessions:index": index}
    with pytest.raises(Exception, match=re.escape(words)):
        run_program(engine, stack, config)
    assert engine.of_type(CONTAINER) == []


# --- services (issue 23) ----------------------------------------------------------------------

SERVICES = str(FIXTURES / "sessions" / "services.yaml")


def services_run(tmp_path_name: str, recorded: str | None) -> Run:
    config = {"cluster-sessions:definition": SERVICES,
              **({"cluster-sessions:service-ports": recorded} if recorded else {})}
    FIXTURE_STACKS[tmp_path_name] = config
    try:
        return Run(tmp_path_name)
    finally:
        del FIXTURE_STACKS[tmp_path_name]


def test_services_are_published_on_main1_at_the_ports_up_chose_and_shown_in_the_outputs():
    run = services_run("svc-pair", '{"jupyter":30005,"tensorboard":30006}')
    ports = run.container("main1").plain_inputs["ports"]
    assert {"internal": 8888.0, "external": 30005.0, "ip": "127.0.0.1",
            "protocol": "tcp"} in ports
    # public: the agent's own address, not every address of it
    assert {"internal": 6006.0, "external": 30006.0, "ip": "10.0.0.11",
            "protocol": "tcp"} in ports
    assert run.container("sub1").plain_inputs.get("ports") is None
    services = run.output("services")
    assert services["jupyter"]["host_port"] == 30005
    assert services["jupyter"]["url"] == "http://127.0.0.1:30005/"
    assert services["jupyter"]["agent"] == "node-a"
    assert services["tensorboard"]["url"] == "http://10.0.0.11:30006/"
    assert services["tensorboard"]["public"] is True


def test_without_recorded_ports_a_bare_pulumi_up_takes_preferred_then_first_of_the_range():
    run = services_run("svc-pair", None)
    services = run.output("services")
    assert (services["jupyter"]["host_port"], services["tensorboard"]["host_port"]) == (
        30005, 30000)


def test_recorded_ports_that_are_not_a_json_object_of_ports_are_refused():
    for bad in ('[30000]', '{"jupyter": "x"}', '{"jupyter": 70000}', 'nope'):
        with pytest.raises(Exception, match="service-ports"):
            services_run("svc-pair", bad)


# --- a kept placement (core/decisions.py): the program builds where `sessionctl up` placed ----


def kept_config(slots: list, **shape) -> dict[str, str]:
    base = {"pool": "ssh-pair", "mode": "multi-node", "size": 4, "millicpu": 2000,
            "mem": 2**30, "gpu": 0}
    return {**FIXTURE_STACKS["spread-demo"], "cluster-sessions:placement": json.dumps(
        {"shape": {**base, **shape}, "slots": slots})}


def test_the_program_builds_where_the_stack_s_kept_placement_says():
    # declared capacity puts main1 and sub1 on node-a; up placed them the other way round
    slots = [["node-b", []], ["node-b", []], ["node-a", []], ["node-a", []]]
    engine = Engine()
    run_program(engine, "spread-demo", kept_config(slots))
    providers = {r.urn: r.name for r in engine.of_type(PROVIDER)}
    where = {host: providers[engine.named(CONTAINER, f"spread-demo-{host}").provider_urn]
             for host in ("main1", "sub1", "sub2", "sub3")}
    assert {h: n.split("-")[3] for h, n in where.items()} == {
        "main1": "b", "sub1": "b", "sub2": "a", "sub3": "a"}, where


@pytest.mark.parametrize("config, message", [
    (kept_config([["node-a", []]] * 2, size=2), r"must be placed again \(its shape changed "
     r"\(size 2 -> 4\)\); nothing was changed"),
    (kept_config([["gone", []]] * 4), "agent gone it runs on is no longer in pool ssh-pair"),
    ({**FIXTURE_STACKS["spread-demo"], "cluster-sessions:placement": "[1]"},
     r"placement is '\[1\]', not a placement sessionctl wrote; nothing was created"),
])
def test_a_kept_placement_that_no_longer_holds_is_refused_before_anything_is_made(config,
                                                                                  message):
    engine = Engine()
    with pytest.raises(Exception, match=message):
        run_program(engine, "spread-demo", config)
    assert not engine.of_type(CONTAINER) and not engine.of_type(NETWORK)
