"""The cluster plan and its static environment (clusterenv)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_sessions.core.clusterenv import kernel_id, members
from cluster_sessions.core.plan import build_plan, build_plans, container_labels, plan_to_dict
from cluster_sessions.core.spec import Pool, Session

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
