"""Agent facts parsed from captured output, and the connectors' local behaviour (no network).

The files under tests/data/agents/ were captured from the netns lab (Debian's docker.io 20.10
engines, docker CLI 28 and 20.10): a swarm manager, a worker, an inactive engine, our labelled
containers and overlay, and engines that do not answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import paramiko
import pytest

from cluster_sessions.agents import facts, gathering
from cluster_sessions.agents.capacity import AgentReport, PreflightError, _effective, _held_free
from cluster_sessions.agents.connectors import (
    AUTH_FAILED,
    DOCKER_NOT_ANSWERING,
    HOST_KEY_UNKNOWN,
    MISCONFIGURED,
    TIMEOUT,
    UNREACHABLE,
    AgentError,
    LocalConnector,
    SSHConnector,
    agent_props,
    connector_for,
    connector_from_props,
    fingerprint,
)
from cluster_sessions.core.errors import MissingPrerequisite
from cluster_sessions.core.spec import Agent, Pool

DATA = Path(__file__).resolve().parent / "data" / "agents"


def data(name: str) -> str:
    return (DATA / name).read_text()


def agent(**kw) -> Agent:
    base = {"name": "a1", "docker_host": "unix:///run/x.sock", "capacity": {"cpu": 4, "mem": "8g"}}
    return Agent.model_validate({**base, **kw}, strict=False)


# --- docker info / swarm ----------------------------------------------------------------------


def test_docker_info_of_a_swarm_manager():
    info = facts.DockerInfo().parse(0, data("docker-info-manager.json"), "")
    assert info.server_version == "20.10.24+dfsg1"
    assert info.name == "agent1" and info.ncpu == 2 and info.mem_total > 2**30
    assert info.engine_id.count(":") == 11
    swarm = info.swarm
    assert swarm.role == "manager" and swarm.control_available
    assert swarm.node_id == "pyrhc4jaa3lzqweus4pkpz88n"
    assert swarm.cluster_id == "apwypmghdho6iooejcvj12cwo"
    assert swarm.node_addr == "10.251.103.11"
    assert swarm.remote_managers == ("10.251.103.11:2377",)
    assert (swarm.nodes, swarm.managers) == (2, 1)


def test_docker_info_of_a_swarm_worker_knows_its_managers_not_the_cluster():
    swarm = facts.DockerInfo().parse(0, data("docker-info-worker.json"), "").swarm
    assert swarm.role == "worker"
    assert swarm.node_id == "b73or0h4nv8mwrsafjtmpzpfy"
    assert swarm.remote_managers == ("10.251.103.11:2377",)
    assert swarm.cluster_id == "" and swarm.nodes is None


def test_docker_info_of_an_engine_outside_any_swarm():
    info = facts.DockerInfo().parse(0, data("docker-info-inactive.json"), "")
    assert info.swarm.role == "inactive" and info.swarm.node_id == ""


@pytest.mark.parametrize("cli", ["cli28", "cli20"])
def test_docker_info_when_the_daemon_does_not_answer(cli):
    rc = int(data(f"docker-info-down-{cli}.rc"))
    out, err = data(f"docker-info-down-{cli}.stdout"), data(f"docker-info-down-{cli}.stderr")
    with pytest.raises(gathering.FactError) as caught:
        facts.DockerInfo().parse(rc, out, err)
    assert caught.value.cause == DOCKER_NOT_ANSWERING
    assert "Cannot connect to the Docker daemon" in caught.value.detail


def test_docker_cli_missing_on_the_agent_is_a_misconfiguration():
    with pytest.raises(gathering.FactError) as caught:
        facts.DockerInfo().parse(127, "", "sh: 1: docker: not found\n")
    assert caught.value.cause == MISCONFIGURED and "docker CLI" in caught.value.detail


def test_swarm_info_reads_only_the_swarm_part():
    swarm = json.loads(data("docker-info-worker.json"))["Swarm"]
    state = facts.SwarmInfo().parse(0, json.dumps(swarm) + "\n", "")
    assert state.role == "worker" and state.node_addr == "10.251.103.12"
    # newer CLIs print an empty document (LocalNodeState "") when the engine is gone
    with pytest.raises(gathering.FactError) as caught:
        facts.SwarmInfo().parse(0, json.dumps({**swarm, "LocalNodeState": ""}), "")
    assert caught.value.cause == DOCKER_NOT_ANSWERING


def test_swarm_nodes_as_the_manager_lists_them():
    # captured from a lab manager (docker 20.10): its own ID, then `docker node inspect`
    nodes = facts.SwarmNodes().parse(0, data("docker-node-inspect.txt"), "")
    assert [(n.hostname, n.manager_status, n.ready, n.self, n.availability) for n in nodes] == [
        ("agent1", "Leader", True, True, "Active"), ("agent2", "", True, False, "Active")]


def test_swarm_nodes_read_the_same_over_a_shell_and_through_the_api():
    """One parser: the Engine API's /nodes objects are what `docker node inspect` prints."""
    own, _, listing = data("docker-node-inspect.txt").partition("\n")

    class Api:
        def nodes(self):
            return json.loads(listing)

    class Client:
        api = Api()

        def info(self):
            return {"Swarm": {"NodeID": own.strip()}}

    assert facts.SwarmNodes().from_api(Client()) == facts.SwarmNodes().parse(
        0, data("docker-node-inspect.txt"), "")


def test_swarm_nodes_on_a_worker_fails_with_the_daemons_words():
    with pytest.raises(gathering.FactError) as caught:
        facts.SwarmNodes().parse(int(data("node-inspect-worker.rc")),
                             data("node-inspect-worker.stdout"),
                             data("node-inspect-worker.stderr"))
    assert "not a swarm manager" in caught.value.detail


def test_join_token_is_checked_for_shape():
    token = "SWMTKN-1-" + "a" * 50 + "-" + "b" * 25
    assert facts.SwarmJoinToken().parse(0, token + "\n", "") == token
    with pytest.raises(gathering.FactError):
        facts.SwarmJoinToken().parse(0, "\n", "")


# --- the machine ------------------------------------------------------------------------------


def test_cpu_count_and_memory():
    assert facts.CpuCount().parse(0, "2\n", "") == 2
    kib = int(data("meminfo.txt").splitlines()[0].split()[1])  # "MemTotal:  N kB"
    assert facts.MemTotal().parse(0, data("meminfo.txt"), "") == kib * 1024
    assert facts.MemTotal().process("MemTotal:       16384 kB\nMemFree: 1 kB\n") == 16384 * 1024
    with pytest.raises(gathering.FactError):
        facts.CpuCount().parse(0, "lots\n", "")
    with pytest.raises(gathering.FactError):
        facts.MemTotal().parse(0, "MemFree: 1 kB\n", "")


def test_gpus_without_nvidia_smi():
    assert facts.Gpus().parse(0, facts.NO_NVIDIA_SMI + "\n", "") == facts.GpuProbe(False)


def test_gpus_listed_by_nvidia_smi():
    # `nvidia-smi --query-gpu=index --format=csv,noheader` on a 4-GPU machine
    assert facts.Gpus().parse(0, "0\n1\n2\n3\n", "") == facts.GpuProbe(True, (0, 1, 2, 3))


def test_gpus_when_nvidia_smi_cannot_reach_the_driver():
    out = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
           "Make sure that the latest NVIDIA driver is installed and running.\n")
    probe = facts.Gpus().parse(9, out, "")
    assert probe.present and probe.ids == () and "couldn't communicate" in probe.error


# --- our containers and networks ----------------------------------------------------------------


def test_session_containers_read_what_they_hold_from_labels():
    held = facts.SessionContainers().parse(0, data("docker-inspect-containers-worker.json"), "")
    assert len(held) == 1
    sub1 = held[0]
    assert (sub1.name, sub1.session, sub1.session_id, sub1.host, sub1.state) == (
        "demo-mn-sub1", "demo-mn", "abc123", "sub1", "running")
    assert (sub1.millicpu, sub1.mem, sub1.gpus) == (1500, 2**30, (0, 1))


def test_session_containers_without_resource_labels_fall_back_to_the_host_config():
    held = facts.SessionContainers().parse(0, data("docker-inspect-containers-manager.json"), "")
    main1 = held[0]
    assert main1.state == "exited"  # a stopped container still belongs to its stack
    assert (main1.millicpu, main1.mem, main1.gpus) == (500, 512 * 2**20, ())


def test_session_containers_when_there_are_none_or_they_vanished():
    assert facts.SessionContainers().parse(0, "[]\n", "") == ()
    assert facts.SessionContainers().parse(0, "", "") == ()  # removed between ps and inspect


def test_session_containers_of_one_session_only():
    fact = facts.SessionContainers("other")
    assert "label=cluster-sessions.session=other" in fact.cmd()
    assert fact.parse(0, data("docker-inspect-containers-worker.json"), "") == ()


def test_session_filter_is_quoted_for_the_shell():
    fact = facts.SessionContainers("it's")
    assert "'label=cluster-sessions.session=it'\\''s'" in fact.cmd()


def test_session_networks():
    nets = facts.SessionNetworks().parse(0, data("docker-network-inspect-manager.json"), "")
    assert [(n.name, n.driver, n.scope, n.session) for n in nets] == [
        ("demo-mn-net", "overlay", "swarm", "demo-mn")]


# --- encrypted overlays -----------------------------------------------------------------------


def test_encryption_probe_as_root_on_a_kernel_without_esp_and_gcm():
    support = facts.EncryptedOverlaySupport().parse(0, data("encryption-probe-root.txt"), "")
    assert support.supported is False
    assert "CONFIG_CRYPTO_GCM" in support.detail and "CONFIG_INET_ESP" in support.detail


def test_encryption_probe_without_root_reads_the_kernel_configuration():
    support = facts.EncryptedOverlaySupport().parse(0, data("encryption-probe-nonroot.txt"), "")
    assert support.supported is False
    assert "CONFIG_INET_ESP" in support.detail and "CONFIG_CRYPTO_GCM" in support.detail
    assert "CONFIG_XFRM_USER" not in support.detail


def test_encryption_probe_results_that_pass_or_are_unknown():
    fact = facts.EncryptedOverlaySupport()
    assert fact.parse(0, "#probe ok\n", "").supported is True
    stock = "\n".join(["#config", "CONFIG_MODULES=y", "CONFIG_XFRM_USER=m", "CONFIG_INET_ESP=m",
                       "CONFIG_CRYPTO_GCM=m", "CONFIG_NETFILTER_XT_MATCH_U32=m",
                       "CONFIG_NETFILTER_XT_MATCH_POLICY=m"])
    assert fact.parse(0, stock, "").supported is True
    assert fact.parse(0, "#config\n", "").supported is None


# --- batching ---------------------------------------------------------------------------------


def test_a_batch_keeps_each_commands_output_and_status_apart():
    conn = LocalConnector("here")
    marker = "@@test-marker"
    rc, out, _ = conn.run(gathering.batch_script(
        ["echo a; echo b >&2; exit 3", "printf 'no newline'", "printf '\\n\\n'", "true"], marker))
    assert rc == 0
    assert gathering.split_batch(out, marker, 4) == [
        (3, "a\n", "b\n"), (0, "no newline", ""), (0, "\n\n", ""), (0, "", "")]


def test_gather_all_reports_failing_facts_without_losing_the_others():
    conn = LocalConnector("here")
    ok, bad = gathering.gather_all(conn, [facts.CpuCount(), facts.SwarmJoinToken()])
    assert ok.ok and ok.value >= 1
    assert not bad.ok and bad.error.agent == "here"


# --- connectors -------------------------------------------------------------------------------


def test_local_connector_runs_with_the_agents_docker_host():
    conn = connector_for(agent(docker_host="unix:///run/somewhere.sock"))
    assert isinstance(conn, LocalConnector)
    assert conn.run("echo $DOCKER_HOST")[1] == "unix:///run/somewhere.sock\n"
    assert conn.run("exit 7")[0] == 7


def test_local_connector_timeout_names_the_agent():
    with pytest.raises(AgentError) as caught:
        LocalConnector("slow", timeout=0.2).run("sleep 5")
    assert caught.value.agent == "slow" and caught.value.cause == TIMEOUT


def test_connector_choice_follows_the_pool_definition():
    ssh = connector_for(agent(ssh={"host": "10.0.0.5", "port": 2022, "user": "ops",
                                   "key_file": "~/k", "known_hosts": "/etc/kh"},
                              docker_host="unix:///var/run/docker.sock"))
    assert isinstance(ssh, SSHConnector)
    assert (ssh.host, ssh.port, ssh.user, ssh.key_file, ssh.known_hosts) == (
        "10.0.0.5", 2022, "ops", "~/k", "/etc/kh")
    assert ssh.env == {"DOCKER_HOST": "unix:///var/run/docker.sock"}
    url = connector_for(agent(docker_host="ssh://deploy@gpu7:2222"))
    assert isinstance(url, SSHConnector)
    assert (url.host, url.port, url.user, url.env) == ("gpu7", 2222, "deploy", {})
    api = connector_for(agent(docker_host="tcp://10.0.0.9:2376"))
    assert not api.shell
    with pytest.raises(AgentError) as caught:
        api.run("nproc")
    assert caught.value.cause == MISCONFIGURED


def test_agent_props_round_trip_without_capacity():
    a = agent(ssh={"host": "h", "key_file": "/k"}, address="10.0.0.1")
    props = agent_props(a)
    assert "capacity" not in props and props["ssh"]["host"] == "h"
    json.dumps(props)  # plain data: it goes into Pulumi state
    conn = connector_from_props(props)
    assert isinstance(conn, SSHConnector) and conn.key_file == "/k"


def test_ssh_connector_refuses_an_unknown_policy_and_missing_files(tmp_path):
    with pytest.raises(ValueError):
        SSHConnector("a", "h", host_keys="yolo")
    missing = SSHConnector("a1", "127.0.0.1", known_hosts=str(tmp_path / "nope"))
    with pytest.raises(AgentError) as caught:
        missing.connect()
    assert caught.value.cause == MISCONFIGURED and "does not exist" in str(caught.value)
    (tmp_path / "kh").write_text("")
    nokey = SSHConnector("a1", "127.0.0.1", known_hosts=str(tmp_path / "kh"),
                         key_file=str(tmp_path / "id"))
    with pytest.raises(AgentError) as caught:
        nokey.connect()
    assert caught.value.cause == MISCONFIGURED and "key file" in str(caught.value)


def _fake_connect(monkeypatch, exc):
    def connect(self, *a, **kw):
        raise exc
    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)


@pytest.mark.parametrize("exc, cause", [
    (paramiko.AuthenticationException("Authentication failed."), AUTH_FAILED),
    (paramiko.ssh_exception.NoValidConnectionsError(
        {("10.0.0.5", 22): ConnectionRefusedError(111, "Connection refused")}), UNREACHABLE),
    (TimeoutError("timed out"), UNREACHABLE),
    (OSError(113, "No route to host"), UNREACHABLE),
    (paramiko.SSHException("Error reading SSH protocol banner"), UNREACHABLE),
])
def test_ssh_failures_are_named(monkeypatch, tmp_path, exc, cause):
    (tmp_path / "kh").write_text("")
    _fake_connect(monkeypatch, exc)
    conn = SSHConnector("agent7", "10.0.0.5", known_hosts=str(tmp_path / "kh"))
    with pytest.raises(AgentError) as caught:
        conn.run("true")
    assert caught.value.agent == "agent7" and caught.value.cause == cause
    assert str(caught.value).startswith(f"agent agent7: {cause}: ssh ")


def test_ssh_host_key_changed_shows_both_fingerprints(monkeypatch, tmp_path):
    (tmp_path / "kh").write_text("")
    key_a = paramiko.RSAKey.generate(1024)
    key_b = paramiko.RSAKey.generate(1024)
    _fake_connect(monkeypatch, paramiko.BadHostKeyException("10.0.0.5", key_b, key_a))
    with pytest.raises(AgentError) as caught:
        SSHConnector("agent7", "10.0.0.5", known_hosts=str(tmp_path / "kh")).connect()
    assert caught.value.cause == "host key changed"
    assert fingerprint(key_a) in str(caught.value) and fingerprint(key_b) in str(caught.value)


def test_ssh_unknown_host_key_is_refused_by_default(monkeypatch, tmp_path):
    (tmp_path / "kh").write_text("")
    key = paramiko.RSAKey.generate(1024)

    def connect(self, hostname, *a, **kw):
        self._policy.missing_host_key(self, hostname, key)
    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    with pytest.raises(AgentError) as caught:
        SSHConnector("agent7", "10.0.0.5", known_hosts=str(tmp_path / "kh")).connect()
    assert caught.value.cause == HOST_KEY_UNKNOWN and fingerprint(key) in str(caught.value)
    # the command it suggests ends ssh-keyscan's options before the host
    assert "`ssh-keyscan -p 22 -- 10.0.0.5 >> " in str(caught.value)
    # accept-new records it instead
    SSHConnector("agent7", "10.0.0.5", known_hosts=str(tmp_path / "kh"),
                 host_keys="accept-new").connect()
    assert (tmp_path / "kh").read_text() == f"10.0.0.5 ssh-rsa {key.get_base64()}\n"


# --- capacity arithmetic ------------------------------------------------------------------------


def _report(a: Agent, held=(), cpus=None, mem=None, gpus=None) -> AgentReport:
    r = AgentReport(a.name, cpus=cpus, mem=mem, gpus=gpus, held=tuple(held))
    _effective(a, r)
    _held_free(r)
    return r


def _holding(session, cpu, mem, gpus=()):
    return facts.HeldContainer("id", f"{session}-x", session, "sid", "main1", "running", cpu, mem,
                           tuple(gpus))


def test_free_is_declared_capacity_less_what_sessions_hold():
    a = agent(capacity={"cpu": 8, "mem": "16g", "gpus": [0, 1, 2, 3]})
    r = _report(a, [_holding("s1", 2000, 4 * 2**30, (1,)), _holding("s2", 500, 2**30, (3,))],
                cpus=8, mem=32 * 2**30, gpus=facts.GpuProbe(True, (0, 1, 2, 3)))
    assert (r.free.millicpu, r.free.mem, r.free.gpus) == (5500, 11 * 2**30, (0, 2))
    assert r.warnings == []


def test_declared_gpus_the_machine_lacks_are_not_offered():
    a = agent(capacity={"cpu": 8, "mem": "16g", "gpus": [0, 1]})
    r = _report(a, gpus=facts.GpuProbe(False))
    assert r.free.gpus == () and "nvidia-smi is not installed" in r.warnings[0]
    r = _report(a, gpus=facts.GpuProbe(True, (0,)))
    assert r.free.gpus == (0,) and "GPUs 1" in r.warnings[0]


def test_overcommitted_declarations_are_kept_but_warned_about():
    a = agent(capacity={"cpu": 3, "mem": "8g"})
    r = _report(a, cpus=2, mem=4 * 2**30)
    assert r.total.millicpu == 3000 and r.total.mem == 8 * 2**30
    assert any("3 CPUs, the machine has 2" in w for w in r.warnings)
    assert any("memory" in w for w in r.warnings)


def test_free_never_goes_negative():
    a = agent(capacity={"cpu": 1, "mem": "1g"})
    r = _report(a, [_holding("big", 4000, 4 * 2**30)])
    assert (r.free.millicpu, r.free.mem) == (0, 0)
    assert any("hold more than declared" in w for w in r.warnings)


def test_preflight_error_lists_every_failing_agent():
    pool = Pool.model_validate({"kind": "AgentPool", "name": "p", "agents": [
        {"name": "a1", "docker_host": "unix:///x", "capacity": {"cpu": 1, "mem": "1g"}}]},
        strict=False)
    ok = AgentReport("a1")
    bad = AgentReport("a2")
    bad.fail(UNREACHABLE, "ssh root@h:22: Connection refused")
    err = PreflightError(pool, [ok, bad], "; nothing was created")
    assert str(err).splitlines() == [
        "pool p: 1 of 2 agent(s) cannot be used; nothing was created:",
        "  agent a2: unreachable: ssh root@h:22: Connection refused"]
    # what it means is its class in the error tree (core/errors.py): a missing prerequisite
    assert isinstance(err, MissingPrerequisite) and err.code == 4
