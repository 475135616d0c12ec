"""core/container_args.py: a plan as the docker provider's arguments, decided once.

The Session component passes these arguments and ``diff`` compares them, so the two cannot
disagree about what a change does (before issue 20 the Session published ports on
``role == "main"`` while the review looked at ``host == "main1"``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cluster_sessions
from cluster_sessions.core.container_args import (
    MIB,
    ContainerArgs,
    MountArgs,
    NetworkArgs,
    PortArgs,
    container_args,
    memory_mb,
    network_args,
)
from cluster_sessions.core.names import ENDPOINT_LABEL
from cluster_sessions.core.plan import build_plan, with_service_ports
from cluster_sessions.core.provider_facts import CONTAINER_FORCE_NEW, cpus_read_back, parse_cpus
from cluster_sessions.core.render import pack_entrypoint_argv
from cluster_sessions.core.spec import Pool, Session
from tests import factories


def plan_of(pool_over: dict | None = None, agents: list[dict] | None = None, **over):
    session = Session.model_validate(factories.session("args-test", "p", **over))
    pool = Pool.model_validate(factories.pool("p", *(agents or [factories.agent(
        gpus=(0, 1, 2, 3))]), **(pool_over or {})))
    return build_plan(session, pool)


def test_gpus_are_one_device_request_the_engine_accepts():
    plan = plan_of(resources={"cpu": 1, "mem": "2g", "shmem": "64m", "gpu": 2},
                   cluster={"mode": "single-node", "size": 2})
    main, sub = (container_args(plan, c) for c in plan.containers)
    assert main.device_requests == ({"driver": "nvidia", "device_ids": ("0", "1"),
                                     "capabilities": ("gpu",)},)
    assert sub.device_requests[0]["device_ids"] == ("2", "3")
    assert not container_args(plan_of(), plan_of().containers[0]).device_requests


def test_memory_swap_is_the_memory_so_the_read_back_matches():
    args = container_args(plan_of(mem="1500m"), plan_of(mem="1500m").containers[0])
    assert args.memory == args.memory_swap == 1500
    assert memory_mb(1024**2 + 1) == 2  # never less than asked


def test_only_the_main_role_publishes_ports():
    plan = plan_of(cluster={"mode": "single-node", "size": 3}, ports=[{"container": 8888}])
    published = {c.host: container_args(plan, c).ports for c in plan.containers}
    assert [p.internal for p in published["main1"]] == [8888, 2200]
    assert published["sub1"] == published["sub2"] == ()


def test_main1_always_publishes_its_sshd_on_the_agents_loopback_at_a_port_the_engine_picks():
    for ports in ([], [{"container": 8888}]):
        plan = plan_of(ports=ports)
        ssh = [p for p in container_args(plan, plan.containers[0]).ports if p.internal == 2200]
        assert [(p.external, p.ip, p.protocol) for p in ssh] == [(None, "127.0.0.1", "tcp")]
    # a definition that publishes 2200 itself keeps its own setting
    plan = plan_of(ports=[{"container": 2200, "host": 2222}])
    assert [(p.internal, p.external) for p in container_args(plan, plan.containers[0]).ports
            ] == [(2200, 2222)]


def test_the_endpoint_rides_in_a_label_so_a_changed_one_forces_a_new_container():
    plan = plan_of()
    c = plan.containers[0]
    here, there = container_args(plan, c, "ssh://ops@h1:22"), container_args(plan, c,
                                                                             "ssh://ops@h2:22")
    assert dict(here.labels)[ENDPOINT_LABEL] == "ssh://ops@h1:22"
    assert there.changed(here) == ("labels",) and CONTAINER_FORCE_NEW["labels"]
    assert dict(network_args(plan, "ssh://ops@h1:22").labels)[ENDPOINT_LABEL] == (
        "ssh://ops@h1:22")


@pytest.mark.parametrize(("mtu", "encrypted", "name"), [
    (None, False, "args-test-net"), (1450, False, "args-test-net-mtu1450"),
    (1400, True, "args-test-net-mtu1400-enc")])
def test_the_networks_options_are_part_of_its_name(mtu, encrypted, name):
    two = [factories.agent("a1", cpu=1), factories.agent("a2", cpu=1)]
    plan = plan_of({"network": {"mtu": mtu, "encrypted": encrypted}, "swarm": {"manager": "a1"}},
                   agents=two, cluster={"mode": "multi-node", "size": 2})
    net = network_args(plan)
    assert net.name == name and plan.network.name == name
    assert all(container_args(plan, c).network == name for c in plan.containers)
    assert dict(net.options).get("com.docker.network.driver.mtu") == (str(mtu) if mtu else None)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 6), cpu=st.sampled_from([0.5, 1, 2, 10, 16]),
       env=st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True),
                           st.text(max_size=20), max_size=4))
def test_the_same_plan_gives_the_same_arguments_in_the_same_order(size, cpu, env):
    env = {k: v.replace("\0", "") for k, v in env.items() if not k.startswith("BACKENDAI")}
    first = plan_of(cluster={"mode": "single-node", "size": size}, cpu=cpu, env=env)
    again = plan_of(cluster={"mode": "single-node", "size": size}, cpu=cpu, env=env)
    assert [container_args(first, c) for c in first.containers] == [
        container_args(again, c) for c in again.containers]


ARGS_OF_A_RICH_PLAN = """
import sys
sys.path[:0] = [{project!r}, {modules!r}]
from tests.test_container_args import rich_plan
from cluster_sessions.core.container_args import container_args, network_args
plan = rich_plan()
print(repr(network_args(plan, "ssh://ops@agent1")))
for c in plan.containers:
    print(repr(container_args(plan, c, "ssh://ops@agent1")))
"""


def rich_plan():
    """Every argument that holds a collection: envs, labels, mounts, ports, GPUs, options."""
    return plan_of(
        pool_over={"network": {"mtu": 1450}},
        cluster={"mode": "single-node", "size": 3},
        resources={"cpu": 2, "mem": "2g", "shmem": "64m", "gpu": 1},
        mounts=[{"source": "/srv/a", "target": "/data/a"},
                {"source": "vol1", "target": "/mnt/b", "read_only": True}],
        ports=[{"container": 8888}, {"container": 6006, "host": 16006}],
        distributed={"master_port": 29500})


def test_the_arguments_are_the_same_text_in_every_process():
    """No key reordering across runs: a set or hash order anywhere would show here as another
    ordering under another PYTHONHASHSEED (and as a change on the next ``up``)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    project = Path(__file__).resolve().parent.parent
    modules = Path(cluster_sessions.__file__).resolve().parents[1]  # where this run imports it from
    code = ARGS_OF_A_RICH_PLAN.format(project=str(project), modules=str(modules))
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": seed},
                              timeout=120).stdout
               for seed in ("0", "1", "4242")}
    assert len(outputs) == 1, outputs
    [text] = outputs
    assert text.count("ContainerArgs(") == 3 and "BACKENDAI_DIST_MASTER_PORT=29500" in text
    assert text.index("'/data/a'") < text.index("'/mnt/b'") and "device_ids=" not in text
    assert "'device_ids': ('2',)" in text and "16006" in text


@pytest.mark.parametrize(("cpu", "text"), [
    (10, "10."), (20, "20."), (100, "100."), (1000, "1000."), (12, "12.0"), (64, "64.0"),
    (0.5, "0.5"), (2, "2.0"), (10.5, "10.5"),
])
def test_cpus_is_passed_as_the_provider_reads_it_back_not_as_str_float(cpu, text):
    """Whole numbers of ten and more whose nine-decimal text has exactly nine zeros come back
    from the provider as ``10.``, not ``10.0`` (``str(float)``): anything else is a diff on
    every ``up`` (provider_facts.cpus_read_back)."""
    plan = plan_of(cpu=cpu, agents=[factories.agent(cpu=2048)])
    [args] = [container_args(plan, c) for c in plan.containers]
    assert args.cpus == text == cpus_read_back(round(cpu * 10**9))
    assert parse_cpus(args.cpus) == round(cpu * 10**9)


# --- every argument, word for word (mutants of container_args.py survived) --------------------


def two_container_plan(**over):
    return plan_of(pool_over={"network": {"mtu": 1450}},
                   cluster={"mode": "single-node", "size": 2},
                   resources={"cpu": 2, "mem": "1500m", "shmem": "65m", "gpu": 1},
                   mounts=[{"source": "/srv/a", "target": "/data/a"},
                           {"source": "vol1", "target": "/mnt/b", "read_only": True}],
                   ports=[{"container": 8888},
                          {"container": 6006, "host": 16006, "host_ip": "0.0.0.0",
                           "protocol": "udp", "public": True}],
                   services=[{"name": "web", "port": 80}], restart="on-failure",
                   command=["python3", "x.py"], **over)


SESSION_ID = "13471ad2-457d-5bc3-8c41-6cfb9f79754d"  # main1's kernel id
SUB1_ID = "caba6761-9542-5e09-a682-511d3730bb8d"


def expected_args(host: str, role: str, kernel: str, rank: int, gpu: str,
                  ports: tuple[PortArgs, ...]) -> ContainerArgs:
    return ContainerArgs(
        name=f"args-test-{host}", image="img", hostname=host, network="args-test-net-mtu1450",
        aliases=(host,),
        envs=("BACKENDAI_SESSION_NAME=args-test", f"BACKENDAI_SESSION_ID={SESSION_ID}",
              "BACKENDAI_CLUSTER_MODE=single-node", "BACKENDAI_CLUSTER_SIZE=2",
              "BACKENDAI_CLUSTER_HOSTS=main1,sub1", "BACKENDAI_CLUSTER_REPLICAS=main:1,sub:1",
              f"BACKENDAI_KERNEL_ID={kernel}", f"BACKENDAI_CLUSTER_HOST={host}",
              f"BACKENDAI_CLUSTER_ROLE={role}", "BACKENDAI_CLUSTER_IDX=1",
              f"BACKENDAI_CLUSTER_LOCAL_RANK={rank}"),
        entrypoints=tuple(pack_entrypoint_argv()),
        command=("python3", "x.py"),
        cpus="2.0", memory=1500, memory_swap=1500, shm_size=65,
        device_requests=({"driver": "nvidia", "device_ids": (gpu,), "capabilities": ("gpu",)},),
        mounts=(MountArgs("/data/a", "/srv/a", "bind", False),
                MountArgs("/mnt/b", "vol1", "volume", True,  # the session's own volume
                          (("cluster-sessions.session", "args-test"),))),
        labels=(("cluster-sessions.session", "args-test"),
                ("cluster-sessions.session-id", SESSION_ID),
                ("cluster-sessions.host", host), ("cluster-sessions.role", role),
                ("cluster-sessions.kernel-id", kernel), ("cluster-sessions.cpu", "2"),
                ("cluster-sessions.mem", "1572864000"), ("cluster-sessions.gpus", gpu),
                ("cluster-sessions.endpoint", "ssh://ops@agent1")),
        restart="on-failure", must_run=True, init=True, wait=False, ports=ports,
        tmpfs=(("/run/cluster-session", "rw,nosuid,nodev,noexec,mode=0755,size=64m"),),
        log_driver="json-file", log_opts=(("max-file", "4"), ("max-size", "16777216")),
        capabilities_add=("CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER",
                          "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SYS_CHROOT"),
        capabilities_drop=("ALL",), security_opts=("no-new-privileges:true",))


def test_every_argument_of_main1_and_a_sub_word_for_word():
    """main1 publishes the definition's ports, its sshd on loopback and each service; a sub
    nothing. docker-init is PID 1, nobody waits on a healthcheck, an interactive container
    runs again after a stop (must_run)."""
    plan = two_container_plan()
    main, sub = (container_args(plan, c, "ssh://ops@agent1") for c in plan.containers)
    assert main == expected_args("main1", "main", SESSION_ID, 0, "0", (
        PortArgs(8888, None, "127.0.0.1", "tcp"), PortArgs(6006, 16006, "0.0.0.0", "udp"),
        PortArgs(2200, None, "127.0.0.1", "tcp"), PortArgs(80, None, "127.0.0.1", "tcp")))
    assert sub == expected_args("sub1", "sub", SUB1_ID, 1, "1", ())


def test_a_service_port_chosen_at_up_is_published_on_its_bind_address():
    plan = with_service_ports(plan_of(services=[{"name": "web", "port": 80, "public": True}]),
                              {"web": 30001})
    assert container_args(plan, plan.containers[0]).ports == (
        PortArgs(2200, None, "127.0.0.1", "tcp"), PortArgs(80, 30001, "0.0.0.0", "tcp"))


def test_a_udp_port_2200_does_not_stand_in_for_main1s_sshd():
    plan = plan_of(ports=[{"container": 2200, "host": 2222, "protocol": "udp"}])
    assert container_args(plan, plan.containers[0]).ports == (
        PortArgs(2200, 2222, "127.0.0.1", "udp"), PortArgs(2200, None, "127.0.0.1", "tcp"))


def test_a_batch_job_is_never_restarted_and_its_subs_stay_up():
    plan = plan_of(type="batch", command=["python3", "job.py"], restart="always",
                   cluster={"mode": "single-node", "size": 2})
    main, sub = (container_args(plan, c) for c in plan.containers)
    assert (main.command, main.restart, main.must_run) == (("python3", "job.py"), "no", False)
    assert (sub.command, sub.restart, sub.must_run) == (("sleep", "infinity"), "always", True)


def test_without_an_endpoint_no_endpoint_label_is_set():
    plan = two_container_plan()
    labels = dict(container_args(plan, plan.containers[0]).labels)
    assert ENDPOINT_LABEL not in labels and len(labels) == 8
    assert ENDPOINT_LABEL not in dict(network_args(plan).labels)


def test_changed_names_each_provider_argument_once():
    plan = two_container_plan()
    args = container_args(plan, plan.containers[0])
    moved = replace(args, network="other-net", aliases=("x",), memory=1, init=False)
    assert moved.changed(args) == ("networks_advanced", "memory", "init")
    assert replace(args, aliases=("x",)).changed(args) == ("networks_advanced",)
    assert args.changed(args) == ()


def test_an_encrypted_overlay_is_attachable_with_both_options():
    two = [factories.agent("a1", cpu=1), factories.agent("a2", cpu=1)]
    plan = plan_of({"network": {"mtu": 1400, "encrypted": True}, "swarm": {"manager": "a1"}},
                   agents=two, cluster={"mode": "multi-node", "size": 2})
    assert network_args(plan, "ssh://ops@h1") == NetworkArgs(
        name="args-test-net-mtu1400-enc", driver="overlay", attachable=True,
        options=(("com.docker.network.driver.mtu", "1400"), ("encrypted", "true")),
        labels=(("cluster-sessions.session", "args-test"),
                ("cluster-sessions.session-id", SESSION_ID),
                ("cluster-sessions.mtu", "1400"), ("cluster-sessions.encrypted", "true"),
                ("cluster-sessions.endpoint", "ssh://ops@h1")))
    bridge = network_args(plan_of())
    assert (bridge.driver, bridge.attachable, bridge.options) == ("bridge", None, ())


@pytest.mark.parametrize(("size", "mib"), [(1, 1), (MIB - 1, 1), (MIB, 1), (MIB + 1, 2),
                                           (1536 * MIB, 1536)])
def test_memory_is_whole_mib_rounded_up(size, mib):
    assert memory_mb(size) == mib


# --- the pool's log bound and privileges (issue 32, classes 6 and 7) ----------------------------


def test_every_container_keeps_only_the_pool_s_capabilities_and_a_bounded_log():
    widened = plan_of(pool_over={
        "limits": {"log_max_size": "1m", "log_max_files": 1},
        "privileges": {"capabilities": ["SETUID", "AUDIT_WRITE"], "no_new_privileges": False}},
        cluster={"mode": "single-node", "size": 2})
    for c in widened.containers:
        args = container_args(widened, c)
        assert (args.log_driver, args.log_opts) == ("json-file", (("max-file", "1"),
                                                                  ("max-size", "1048576")))
        assert (args.capabilities_add, args.capabilities_drop) == (
            ("CAP_AUDIT_WRITE", "CAP_SETUID"), ("ALL",))
        assert args.security_opts == ()
    default = plan_of()
    before = container_args(default, default.containers[0])
    after = container_args(widened, widened.containers[0])
    assert before.security_opts == ("no-new-privileges:true",)
    assert {"capabilities", "security_opts", "log_opts"} <= set(after.changed(before))
    assert all(CONTAINER_FORCE_NEW[name] for name in after.changed(before))
