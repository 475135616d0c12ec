"""The cluster plan and its static environment (clusterenv)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_sessions.core.clusterenv import kernel_id, members
from cluster_sessions.core.loader import Loaded
from cluster_sessions.core.plan import (
    PlannedMount,
    build_plan,
    build_plans,
    check_usable,
    container_command,
    container_labels,
    definition_problems,
    network_labels,
    network_name,
    plan_to_dict,
    planned_mounts,
    session_copies,
    with_service_ports,
)
from cluster_sessions.core.problems import DefinitionError, Problem
from cluster_sessions.core.spec import Pool, PortRange, Session

from . import factories

DERIVED = {"MASTER_ADDR", "MASTER_PORT", "TF_CONFIG", "WORLD_SIZE", "RANK", "LOCAL_RANK",
           "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}


def session(**over) -> Session:
    data = factories.session("train-demo", "lab", "img:1", size=4, cpu=2, mem="4g", shmem="1g",
                             env={"FOO": "bar"})
    return Session.model_validate({**data, **over})


def pool(*caps, swarm=True, **over) -> Pool:
    agents = [{"name": f"agent{i + 1}", "docker_host": "unix:///s",
               "capacity": {"cpu": c, "mem": "64g", "gpus": list(range(g))}}
              for i, (c, g) in enumerate(caps)]
    data = {"kind": "AgentPool", "name": "lab", "agents": agents, **over}
    if swarm:
        data["swarm"] = {"manager": "agent1"}
    return Pool.model_validate(data)


def test_hosts_are_main1_then_subs_in_index_order_everywhere():
    plan = build_plan(session(cluster={"size": 12}), pool((64, 0)))
    expected = ["main1"] + [f"sub{i}" for i in range(1, 12)]
    assert list(plan.hosts) == expected
    for rank, c in enumerate(plan.containers):
        assert c.env["BACKENDAI_CLUSTER_HOSTS"] == ",".join(expected)
        assert c.local_rank == rank
        assert c.env["BACKENDAI_CLUSTER_LOCAL_RANK"] == str(rank)
        assert c.env["BACKENDAI_CLUSTER_HOST"] == c.host
        assert c.idx == (1 if c.role == "main" else rank)


def test_static_env_has_every_cluster_variable_and_none_of_the_users():
    plan = build_plan(session(distributed={"master_port": 23456}), pool((64, 0)))
    sub2 = plan.containers[2]
    assert sub2.user_env == {"FOO": "bar"}  # the bundle gives it to the user's processes only
    assert sub2.env == {
        "BACKENDAI_SESSION_NAME": "train-demo",
        "BACKENDAI_SESSION_ID": plan.session_id,
        "BACKENDAI_KERNEL_ID": sub2.kernel_id,
        "BACKENDAI_CLUSTER_MODE": "single-node",
        "BACKENDAI_CLUSTER_SIZE": "4",
        "BACKENDAI_CLUSTER_HOSTS": "main1,sub1,sub2,sub3",
        "BACKENDAI_CLUSTER_REPLICAS": "main:1,sub:3",
        "BACKENDAI_CLUSTER_HOST": "sub2",
        "BACKENDAI_CLUSTER_IDX": "2",
        "BACKENDAI_CLUSTER_ROLE": "sub",
        "BACKENDAI_CLUSTER_LOCAL_RANK": "2",
        "BACKENDAI_DIST_MASTER_PORT": "23456",
    }


def test_derived_variables_are_never_baked_into_the_static_env():
    plan = build_plan(session(), pool((64, 0)))
    for c in plan.containers:
        assert not DERIVED & set(c.env)
    assert "BACKENDAI_DIST_MASTER_PORT" not in plan.containers[0].env


def test_the_user_may_set_master_port_and_it_is_kept_verbatim():
    plan = build_plan(session(env={"MASTER_PORT": "1234"}), pool((64, 0)))
    assert all(c.user_env["MASTER_PORT"] == "1234" for c in plan.containers)
    assert not any("MASTER_PORT" in c.env for c in plan.containers)


def test_single_container_session_is_main1_only():
    plan = build_plan(session(cluster={"size": 1}), pool((64, 0)))
    [main] = plan.containers
    assert main.env["BACKENDAI_CLUSTER_HOSTS"] == "main1"
    assert main.env["BACKENDAI_CLUSTER_REPLICAS"] == "main:1"
    assert main.env["BACKENDAI_CLUSTER_SIZE"] == "1"


def test_ids_are_stable_across_runs_and_main1_kernel_is_the_session():
    first = build_plan(session(), pool((64, 0)))
    again = build_plan(session(), pool((64, 0), (64, 0)))
    assert [c.kernel_id for c in first.containers] == [c.kernel_id for c in again.containers]
    assert first.session_id == first.containers[0].kernel_id
    assert len({c.kernel_id for c in first.containers}) == 4
    other = build_plan(session(name="other-run"), pool((64, 0)))
    assert other.session_id != first.session_id


def test_multi_node_that_fits_one_agent_gets_a_bridge_but_keeps_the_requested_mode():
    plan = build_plan(session(cluster={"mode": "multi-node", "size": 4}), pool((4, 0), (16, 0)))
    assert plan.agents == ("agent2",)
    assert plan.network.driver == "bridge" and plan.network.agent == "agent2"
    assert plan.containers[0].env["BACKENDAI_CLUSTER_MODE"] == "multi-node"
    assert plan_to_dict(plan)["mode"] == "multi-node"


def test_multi_node_across_agents_gets_an_overlay_made_by_the_manager():
    p = pool((4, 0), (4, 0), (4, 0), network={"mtu": 1450, "encrypted": True})
    plan = build_plan(session(cluster={"mode": "multi-node", "size": 5}), p)
    assert plan.network.driver == "overlay"
    assert plan.network.agent == "agent1"
    assert (plan.network.mtu, plan.network.encrypted) == (1450, True)
    assert [c.agent for c in plan.containers] == ["agent1"] * 2 + ["agent2"] * 2 + ["agent3"]


def test_pending_plan_has_a_reason_and_no_agents():
    plan = build_plan(session(cluster={"size": 8}), pool((4, 0), (4, 0)))
    assert plan.pending
    assert "no single agent can hold all 8 containers" in plan.reason
    doc = plan_to_dict(plan)
    assert doc["status"] == "pending" and doc["reason"] == plan.reason
    assert {c["agent"] for c in doc["containers"]} == {None}


def test_plan_json_follows_contract_2():
    plan = build_plan(session(resources={"cpu": 1, "mem": "2g", "shmem": "512m", "gpu": 1},
                              mounts=[{"source": "/data", "target": "/home/work/data",
                                       "read_only": True}]), pool((8, 4)))
    doc = json.loads(json.dumps(plan_to_dict(plan)))
    assert doc["session"] == {"name": "train-demo", "id": plan.session_id}
    assert doc["status"] == "scheduled" and "reason" not in doc
    assert doc["network"]["driver"] == "bridge"
    assert doc["network"]["name"] == "train-demo-net"
    main = doc["containers"][0]
    assert {"host", "role", "idx", "local_rank", "agent", "kernel_id", "env", "resources",
            "mounts"} <= set(main)
    assert main["resources"] == {"cpu": 1.0, "mem": "2g", "shmem": "512m", "gpu": 1,
                                 "gpus": [0]}
    assert doc["containers"][3]["resources"]["gpus"] == [3]
    assert main["mounts"] == [{"source": "/data", "target": "/home/work/data",
                               "read_only": True}]


def test_labels_identify_session_host_and_role():
    plan = build_plan(session(), pool((64, 0)))
    labels = container_labels(plan, plan.containers[1])
    assert labels["cluster-sessions.session"] == "train-demo"
    assert labels["cluster-sessions.host"] == "sub1"
    assert labels["cluster-sessions.role"] == "sub"


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 300))
def test_members_order_and_ranks(size):
    group = members(size)
    assert [m.local_rank for m in group] == list(range(size))
    assert group[0].host == "main1"
    assert [m.host for m in group[1:]] == [f"sub{i}" for i in range(1, size)]


@pytest.mark.parametrize("host", ["main1", "sub1"])
def test_kernel_id_is_a_uuid(host):
    import uuid

    assert uuid.UUID(kernel_id("train-demo", host)).version == 5


@pytest.mark.parametrize(("resources_gpu", "distributed", "slots"), [
    (0, None, 1), (2, None, 2), (2, {"slots": 1}, 1), (0, {"slots": 6}, 6)])
def test_plan_json_shows_the_hostfile_slots_of_every_container(resources_gpu, distributed,
                                                                slots):
    over = {"resources": {"cpu": 1, "mem": "2g", "shmem": "512m", "gpu": resources_gpu}}
    if distributed:
        over["distributed"] = distributed
    plan = build_plan(session(**over), pool((8, 8)))
    doc = json.loads(json.dumps(plan_to_dict(plan)))
    assert [c["slots"] for c in doc["containers"]] == [slots] * 4


def test_plan_json_says_whether_the_session_is_a_batch_job():
    plan = build_plan(session(), pool((64, 0)))
    assert plan_to_dict(plan)["type"] == "interactive"
    batch = build_plan(session(type="batch", command=["python3", "job.py"]), pool((64, 0)))
    assert plan_to_dict(batch)["type"] == "batch"


def test_count_makes_k_sessions_placed_together_on_what_the_others_left():
    # each session: 2 containers of cpu 2 and 1 GPU; agent1 holds one session, agent2 two
    plans = build_plans(session(count=3, cluster={"size": 2},
                                resources={"cpu": 2, "mem": "4g", "shmem": "1g", "gpu": 1}),
                        pool((4, 2), (8, 4)))
    assert [p.name for p in plans] == ["train-demo-1", "train-demo-2", "train-demo-3"]
    assert [p.agents for p in plans] == [("agent1",), ("agent2",), ("agent2",)]
    assert [[c.gpus for c in p.containers] for p in plans] == [
        [(0,), (1,)], [(0,), (1,)], [(2,), (3,)]]  # no GPU given twice on one agent
    assert len({p.session_id for p in plans}) == 3
    assert all(p.containers[0].env["BACKENDAI_SESSION_NAME"] == p.name for p in plans)
    assert all(p.session.count == 1 for p in plans)


def test_count_sessions_that_do_not_fit_together_are_all_pending_with_the_reason():
    plans = build_plans(session(count=3, cluster={"size": 2}), pool((8, 0), swarm=False))
    assert [p.status for p in plans] == ["pending"] * 3
    assert all(c.agent is None for p in plans for c in p.containers)
    assert plans[0].reason.startswith("the 3 sessions of count: 3 do not fit together, "
                                      "train-demo-3 is left over: no single agent")
    assert [p.status for p in build_plans(session(count=2, cluster={"size": 2}),
                                          pool((8, 0)))] == ["scheduled"] * 2


def test_a_definition_without_count_is_one_session_under_its_own_name():
    (plan,) = build_plans(session(), pool((64, 0)))
    assert plan.name == "train-demo" and plan == build_plan(session(), pool((64, 0)))
    with pytest.raises(ValueError, match="use build_plans"):
        build_plan(session(count=2), pool((64, 0)))


def test_live_capacity_that_spreads_a_session_in_a_pool_without_a_swarm_makes_it_pending():
    """Declared capacity fits one agent (no swarm needed); what is free now does not, so the
    plan would need an overlay nobody can create: pending with the reason, not scheduled with
    a network on no agent."""
    from cluster_sessions.core.placement import Free

    s = session(cluster={"mode": "multi-node", "size": 2})
    p = pool((8, 0), (8, 0), swarm=False)
    assert build_plan(s, p).network.driver == "bridge"  # declared: one agent holds both
    free = [Free("agent1", 2000, 64 << 30), Free("agent2", 2000, 64 << 30)]
    plan = build_plan(s, p, free)
    assert plan.pending and plan.reason == (
        "multi-node needs a swarm manager, but pool 'lab' has no swarm.manager, and no one "
        "agent holds the whole session")
    assert plan.network.agent is None and all(c.agent is None for c in plan.containers)


# --- issue 25 item 9: any pool, size, mode and count plans within declared capacity ----------


@st.composite
def pools_and_sessions(draw):
    """A pool of 1-6 agents (declared CPU, memory, GPU ids; a swarm manager or not) and a
    definition asking for any size, mode, count and resources."""
    agents = []
    next_gpu = 0
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.integers(0, 4))
        agents.append({"name": f"agent{i + 1}", "docker_host": "unix:///s", "capacity": {
            "cpu": draw(st.integers(1, 16)), "mem": f"{draw(st.integers(4, 128))}g",
            "gpus": list(range(next_gpu, next_gpu + gpus))}})
        next_gpu += draw(st.sampled_from([0, gpus]))  # ids shared between agents, or not
    data = {"kind": "AgentPool", "name": "lab", "agents": agents}
    if draw(st.sampled_from([True, True, False])):
        data["swarm"] = {"manager": "agent1"}
    mem_gib = draw(st.integers(1, 8))
    definition = factories.session(
        "prop", "lab", "img:1", size=draw(st.integers(1, 12)),
        mode=draw(st.sampled_from(["single-node", "multi-node", "multi-node"])),
        cpu=draw(st.sampled_from([0.5, 1, 2, 3.25, 8])), mem=f"{mem_gib}g", shmem="64m",
        count=draw(st.integers(1, 3)))
    definition["resources"]["gpu"] = draw(st.sampled_from([0, 0, 1, 2]))
    return Pool.model_validate(data), Session.model_validate(definition)


@settings(max_examples=150, deadline=None)
@given(pools_and_sessions())
def test_any_pool_size_mode_and_count_plans_within_declared_capacity_or_says_why(pair):
    """Every container on an agent of the pool, the agents' declared CPU, memory and GPUs
    never exceeded by all the definition's sessions together, no GPU given twice, single-node
    on one agent, several agents only with a swarm; or every session pending with a reason
    and no agent."""
    pool, definition = pair
    plans = build_plans(definition, pool)
    assert len(plans) == definition.count
    if any(p.pending for p in plans):
        assert all(p.pending and p.reason and p.reason.strip() for p in plans)
        assert all(c.agent is None and c.gpus == () for p in plans for c in p.containers)
        assert all(p.reason == plans[0].reason for p in plans)
        return
    capacity = {a.name: a.capacity for a in pool.agents}
    used_cpu: dict[str, int] = {}
    used_mem: dict[str, int] = {}
    used_gpus: dict[str, list[int]] = {}
    res = definition.resources
    for plan in plans:
        assert plan.reason is None and len(plan.containers) == definition.cluster.size
        if definition.cluster.mode == "single-node" or pool.swarm is None:
            assert len(plan.agents) == 1, plan.agents
        assert plan.network.driver == ("overlay" if len(plan.agents) > 1 else "bridge")
        for c in plan.containers:
            assert c.agent in capacity
            used_cpu[c.agent] = used_cpu.get(c.agent, 0) + res.millicpu
            used_mem[c.agent] = used_mem.get(c.agent, 0) + res.mem
            assert len(c.gpus) == res.gpu
            used_gpus.setdefault(c.agent, []).extend(c.gpus)
    for name, cpu in used_cpu.items():
        assert cpu <= capacity[name].millicpu and used_mem[name] <= capacity[name].mem
        assert len(used_gpus[name]) == len(set(used_gpus[name]))
        assert set(used_gpus[name]) <= set(capacity[name].gpus)


# --- the whole of contract 2 and the labels, word for word (mutants of plan.py survived) -------


def rich_plan():
    """A multi-node plan over two agents with every part of contract 2 set: start-up variables
    in env, a bind mount, a data folder and a volume, three services (private; public on an
    agent with an address; on the agent's own port range) with host ports chosen twice."""
    definition = Session.model_validate(factories.session(
        "rich", "lab", "img:2", size=3, mode="multi-node",
        env={"FOO": "bar", "LD_PRELOAD": "/x.so", "LANG": "/opt/loc"},
        mounts=[{"source": "/data", "target": "/home/work/data", "read_only": True},
                {"folder": "mine", "target": "/home/work/mine"},
                {"source": "vol", "target": "/mnt/v"}],
        services=[{"name": "jupyter", "port": 8888},
                  {"name": "tb", "port": 6006, "public": True, "protocol": "tcp",
                   "preferred_port": 40050},
                  {"name": "web", "port": 80, "protocol": "https", "public": True}],
        distributed={"master_port": 23456},
        resources={"cpu": 1.5, "mem": "3g", "shmem": "256m", "gpu": 1}))
    agents = [{"name": "a1", "docker_host": "ssh://ops@h1",
               "capacity": {"cpu": 4, "mem": "8g", "gpus": [0, 1]},
               "service_ports": {"first": 40000, "last": 40100}},
              {"name": "a2", "docker_host": "unix:///s",
               "capacity": {"cpu": 2, "mem": "8g", "gpus": [0, 1]}}]
    p = Pool.model_validate({"kind": "AgentPool", "name": "lab", "agents": agents,
                             "swarm": {"manager": "a2"},
                             "network": {"mtu": 1450, "encrypted": True},
                             "mount_sources": ["/data"], "storage": {"nfs": "/srv/vf/"},
                             "limits": {"log_max_size": "5m", "log_max_files": 2,
                                        "pids_limit": 500},
                             "privileges": {"capabilities": ["SETUID", "KILL"],
                                            "no_new_privileges": False}})
    plan = build_plan(definition, p)
    # a second choice keeps the ports it does not name (tb's) and changes the others
    return with_service_ports(with_service_ports(plan, {"jupyter": 40001, "tb": 40050}),
                              {"jupyter": 40002, "web": 40003})


# kernel ids are part of every container's identity: a change would replace every session
RICH_IDS = {"main1": "88752ca2-b0ff-51d1-882f-dddd99c9705f",
            "sub1": "fce1e5d0-8b73-50ea-a893-5097c5ccceda",
            "sub2": "26c9a446-6648-55c7-8c9c-6aa3809b6925"}


def test_plan_json_is_contract_2_word_for_word():
    doc = json.loads(json.dumps(plan_to_dict(rich_plan())))
    mounts = [{"source": "/data", "target": "/home/work/data", "read_only": True},
              {"source": "/srv/vf/mine", "target": "/home/work/mine", "read_only": False,
               "folder": "mine", "storage": "nfs"},
              {"source": "vol", "target": "/mnt/v", "read_only": False}]
    user_env = {"FOO": "bar", "LD_PRELOAD": "/x.so", "LANG": "/opt/loc"}

    def container(host, role, idx, rank, agent, gpu):
        return {
            "host": host, "role": role, "idx": idx, "local_rank": rank, "agent": agent,
            "kernel_id": RICH_IDS[host],
            "env": {"BACKENDAI_SESSION_NAME": "rich", "BACKENDAI_SESSION_ID": RICH_IDS["main1"],
                    "BACKENDAI_CLUSTER_MODE": "multi-node", "BACKENDAI_CLUSTER_SIZE": "3",
                    "BACKENDAI_CLUSTER_HOSTS": "main1,sub1,sub2",
                    "BACKENDAI_CLUSTER_REPLICAS": "main:1,sub:2",
                    "BACKENDAI_DIST_MASTER_PORT": "23456", "BACKENDAI_KERNEL_ID": RICH_IDS[host],
                    "BACKENDAI_CLUSTER_HOST": host, "BACKENDAI_CLUSTER_ROLE": role,
                    "BACKENDAI_CLUSTER_IDX": str(idx), "BACKENDAI_CLUSTER_LOCAL_RANK": str(rank)},
            "user_env": user_env,
            "exec_env": {"LD_PRELOAD": "/x.so", "LANG": "/opt/loc"},
            "slots": 1,
            "resources": {"cpu": 1.5, "mem": "3g", "shmem": "256m", "gpu": 1, "gpus": [gpu]},
            "mounts": mounts,
        }

    def service(name, port, protocol, public, preferred, bind, host_port, url):
        return {"name": name, "port": port, "protocol": protocol, "public": public,
                "preferred_port": preferred, "agent": "a1", "bind": bind,
                "port_range": [40000, 40100], "host_port": host_port, "url": url}

    assert doc == {
        "session": {"name": "rich", "id": RICH_IDS["main1"]},
        "type": "interactive",
        "mode": "multi-node",
        "status": "scheduled",
        "project": "default",
        "priority": 0,
        "image": "img:2",
        "network": {"driver": "overlay", "name": "rich-net-mtu1450-enc", "agent": "a2",
                    "mtu": 1450, "encrypted": True},
        "agents": ["a1", "a2"],
        "ssh_port": 2200,
        "services": [
            service("jupyter", 8888, "http", False, None, "127.0.0.1", 40002,
                    "http://127.0.0.1:40002/"),
            service("tb", 6006, "tcp", True, 40050, "h1", 40050, "tcp://h1:40050"),
            service("web", 80, "https", True, None, "h1", 40003, "https://h1:40003/"),
        ],
        "limits": {"log_max_size": "5m", "log_max_files": 2, "pids_limit": 500},
        "privileges": {"capabilities": ["SETUID", "KILL"], "no_new_privileges": False},
        # the pool drops DAC_OVERRIDE: its root could not read a 0000 bundle file
        "delivery": {"scratch": "/var/lib/cluster-sessions", "agents": {
            a: {"delivery": "upload", "why": "the pool drops DAC_OVERRIDE: the sessions' root "
                "could not read a bundle file of the SSH user's"} for a in ("a1", "a2")}},
        "containers": [container("main1", "main", 1, 0, "a1", 0),
                       container("sub1", "sub", 1, 1, "a1", 1),
                       container("sub2", "sub", 2, 2, "a2", 0)],
    }
    assert list(doc) == ["session", "type", "mode", "status", "project", "priority", "image",
                         "network", "agents", "ssh_port", "services", "limits", "privileges",
                         "delivery",
                         "containers"]


def test_a_pending_plan_json_says_why_and_places_nothing():
    plan = build_plan(session(cluster={"size": 2}, services=[{"name": "web", "port": 80}]),
                      pool((1, 0), swarm=False))
    doc = plan_to_dict(plan)
    assert (doc["status"], doc["reason"]) == ("pending", plan.reason)
    assert plan.reason and plan.pending and plan.agents == ()
    assert doc["network"] == {"driver": "bridge", "name": "train-demo-net", "agent": None,
                              "mtu": None, "encrypted": False}
    assert doc["services"] == [{"name": "web", "port": 80, "protocol": "http", "public": False,
                                "preferred_port": None, "agent": None, "bind": "127.0.0.1",
                                "port_range": [30000, 31000], "host_port": None, "url": None}]
    assert [(c["agent"], c["resources"]["gpus"]) for c in doc["containers"]] == [
        (None, []), (None, [])]


def test_a_public_service_of_a_local_agent_binds_every_address_and_is_reached_on_loopback():
    plan = build_plan(session(services=[{"name": "web", "port": 80, "public": True},
                                        {"name": "db", "port": 5432, "protocol": "tcp"}]),
                      pool((64, 0)))
    web, db = with_service_ports(plan, {"web": 30005, "db": 30006}).services
    assert (web.agent, web.bind, web.url) == ("agent1", "0.0.0.0", "http://127.0.0.1:30005/")
    assert (db.bind, db.url) == ("127.0.0.1", "tcp://127.0.0.1:30006")
    assert web.port_range == PortRange(first=30000, last=31000)


def test_labels_of_a_container_and_of_the_network_word_for_word():
    plan = rich_plan()
    assert container_labels(plan, plan.containers[2]) == {
        "cluster-sessions.session": "rich",
        "cluster-sessions.session-id": RICH_IDS["main1"],
        "cluster-sessions.host": "sub2",
        "cluster-sessions.role": "sub",
        "cluster-sessions.kernel-id": RICH_IDS["sub2"],
        "cluster-sessions.cpu": "1.5",
        "cluster-sessions.mem": "3221225472",
        "cluster-sessions.gpus": "0",
    }
    assert network_labels(plan) == {
        "cluster-sessions.session": "rich", "cluster-sessions.session-id": RICH_IDS["main1"],
        "cluster-sessions.mtu": "1450", "cluster-sessions.encrypted": "true"}
    plain = build_plan(session(resources={"cpu": 2, "mem": "4g", "shmem": "1g", "gpu": 2}),
                       pool((64, 8)))
    assert network_labels(plain) == {
        "cluster-sessions.session": "train-demo",
        "cluster-sessions.session-id": plain.session_id,
        "cluster-sessions.mtu": "", "cluster-sessions.encrypted": "false"}
    labels = container_labels(plain, plain.containers[1])
    assert (labels["cluster-sessions.cpu"], labels["cluster-sessions.gpus"]) == ("2", "2,3")


def test_mounts_resolve_folders_below_their_storage_root():
    plan = rich_plan()
    bind, folder, volume = plan.mounts
    assert (bind.type, folder.type, volume.type) == ("bind", "bind", "volume")
    assert folder == PlannedMount("/srv/vf/mine", "/home/work/mine", False, "mine", "nfs",
                                  "/srv/vf/")
    assert plan.folders == (folder,)
    # a pool without the storage: no host path (definition_problems refuses it)
    s = session(mounts=[{"folder": "mine", "target": "/home/work/mine", "read_only": True}])
    assert planned_mounts(s, pool((64, 0))) == (
        PlannedMount("", "/home/work/mine", True, "mine", None, None),)


def test_a_folder_mount_uses_the_storage_it_names():
    s = session(mounts=[{"folder": "mine", "storage": "scratch", "target": "/home/work/a"},
                        {"folder": "mine", "storage": "nfs", "target": "/home/work/b"}])
    plan = build_plan(s, pool((64, 0), storage={"nfs": "/srv/nfs", "scratch": "/scratch"}))
    assert plan.mounts == (
        PlannedMount("/scratch/mine", "/home/work/a", False, "mine", "scratch", "/scratch"),
        PlannedMount("/srv/nfs/mine", "/home/work/b", False, "mine", "nfs", "/srv/nfs"))
    assert plan.folders == plan.mounts


def test_the_same_folder_mounted_twice_is_made_once():
    s = session(mounts=[{"folder": "mine", "target": "/home/work/a"},
                        {"folder": "mine", "target": "/home/work/b", "read_only": True}])
    plan = build_plan(s, pool((64, 0), storage={"nfs": "/srv"}))
    assert [(m.source, m.target) for m in plan.folders] == [("/srv/mine", "/home/work/b")]


def test_only_main1_of_a_batch_session_runs_the_command():
    batch = build_plan(session(type="batch", command=["python3", "job.py"]), pool((64, 0)))
    assert [container_command(batch, c) for c in batch.containers] == [
        ("python3", "job.py")] + [("sleep", "infinity")] * 3
    interactive = build_plan(session(command=["python3", "serve.py"]), pool((64, 0)))
    assert [container_command(interactive, c) for c in interactive.containers] == [
        ("python3", "serve.py")] * 4


def test_container_names_are_session_dash_host():
    plan = build_plan(session(cluster={"size": 2}), pool((64, 0)))
    assert [c.container_name for c in plan.containers] == ["train-demo-main1",
                                                           "train-demo-sub1"]


@pytest.mark.parametrize(("mtu", "encrypted", "name"), [
    (None, False, "train-demo-net"), (1450, False, "train-demo-net-mtu1450"),
    (None, True, "train-demo-net-enc"), (9000, True, "train-demo-net-mtu9000-enc")])
def test_the_network_name_carries_its_options(mtu, encrypted, name):
    assert network_name(session(), mtu, encrypted) == name
    assert network_name(session()) == "train-demo-net"


def test_encryption_is_asked_of_an_overlay_only():
    p = pool((64, 0), network={"encrypted": True})
    plan = build_plan(session(cluster={"mode": "multi-node", "size": 2}), p)
    assert (plan.network.driver, plan.network.encrypted, plan.network.name) == (
        "bridge", False, "train-demo-net")


def test_a_multi_node_plan_on_one_agent_keeps_its_network_there_not_on_the_manager():
    p = pool((1, 0), (64, 0))
    plan = build_plan(session(cluster={"mode": "multi-node", "size": 2}), p)
    assert (plan.agents, plan.network.agent) == (("agent2",), "agent2")


def test_count_that_does_not_fit_names_the_session_left_over_word_for_word():
    plans = build_plans(session(count=2, cluster={"size": 2}), pool((4, 0), swarm=False))
    [reason] = {p.reason for p in plans}
    assert reason == ("the 2 sessions of count: 2 do not fit together, train-demo-2 is left "
                      "over: no single agent can hold all 2 containers (cpu=2, mem=4g, gpu=0 "
                      "each): agent1 holds 0 (short of cpu)")
    assert [p.name for p in plans] == ["train-demo-1", "train-demo-2"]


def test_build_plan_refuses_a_count_word_for_word():
    with pytest.raises(ValueError) as info:
        build_plan(session(count=3), pool((64, 0)))
    assert str(info.value) == "session train-demo has count 3: use build_plans"


def test_session_copies_are_named_one_to_k_each_of_count_one():
    assert session_copies(session()) == (session(),)
    copies = session_copies(session(count=2))
    assert [(c.name, c.count) for c in copies] == [("train-demo-1", 1), ("train-demo-2", 1)]
    assert copies[0] == session(name="train-demo-1")


SWARM_REASON = ("multi-node needs a swarm manager, but pool 'lab' has no swarm.manager, and no "
                "one agent holds the whole session")


@pytest.mark.parametrize(("mode", "caps", "swarm", "found"), [
    ("multi-node", [(4, 0), (4, 0)], False, [("cluster.mode", SWARM_REASON)]),
    ("multi-node", [(4, 0), (4, 0)], True, []),
    ("multi-node", [(8, 0), (2, 0)], False, []),  # one agent holds it all
    ("single-node", [(4, 0), (4, 0)], False, []),  # pending, not unusable
])
def test_definition_problems_name_a_session_only_a_swarm_could_hold(mode, caps, swarm, found):
    s = session(cluster={"mode": mode, "size": 4})
    assert definition_problems(s, pool(*caps, swarm=swarm)) == found


def test_definition_problems_keep_the_mount_problems_first():
    s = session(cluster={"mode": "multi-node", "size": 4},
                mounts=[{"source": "/etc", "target": "/home/work/etc"}])
    found = definition_problems(s, pool((4, 0), (4, 0), swarm=False))
    assert [path for path, _ in found] == ["mounts.0.source", "cluster.mode"]
    assert found[1] == ("cluster.mode", SWARM_REASON)
    assert definition_problems(s, pool((4, 0), (4, 0))) == found[:1]


def test_check_usable_names_the_file_and_field_of_each_problem(tmp_path):
    s = session(cluster={"mode": "multi-node", "size": 4})
    loaded = Loaded(session=s, pool=pool((4, 0), (4, 0), swarm=False),
                    session_file=tmp_path / "s.yaml", pool_file=tmp_path / "p.yaml")
    with pytest.raises(DefinitionError) as info:
        check_usable(loaded)
    assert info.value.problems == [Problem(str(tmp_path / "s.yaml"), "cluster.mode",
                                           SWARM_REASON)]
    fine = replace(loaded, pool=pool((4, 0), (4, 0)))
    assert check_usable(fine) is fine
