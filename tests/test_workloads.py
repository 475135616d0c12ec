"""Distributed jobs on a session with their real launchers: Open MPI's ``mpirun`` (and mpi4py)
and TensorFlow's ``MultiWorkerMirroredStrategy``, with nothing but what the session provides
(hostfiles, the derived variables, the ssh mesh with strict host-key checking)."""

from __future__ import annotations

import json
import re

import pytest

from .test_runtime import (  # noqa: F401 (fixtures used by name)
    POOL,
    Running,
    script_dir,
    session_def,
    session_factory,
    unique,
)

# As the session user would type it in main1 after "sessionctl ssh": a login over the mesh, so
# the session's environment is in effect exactly as in an interactive shell.
SSH = "ssh -o BatchMode=yes main1 "


def test_deepspeeds_own_parser_reads_the_hostfile_in_rank_order():
    """DeepSpeed's launcher (``deepspeed --hostfile``) parses with ``_parse_hostfile`` of its
    runner.py: run that very function, taken from DeepSpeed's source, on a rendered hostfile."""
    import ast
    import collections
    import logging

    from cluster_sessions.core.keys import generate_session_keys
    from cluster_sessions.core.plan import build_plan
    from cluster_sessions.core.render import render_session
    from cluster_sessions.lab.pydirs import InstallError, deepspeed_runner_source

    from .conftest import skip_or_fail

    try:
        source = deepspeed_runner_source(progress=lambda _m: None)
    except InstallError as exc:
        skip_or_fail(f"DeepSpeed's source archive cannot be downloaded: {exc}")
    tree = ast.parse(source)
    [function] = [n for n in tree.body
                  if isinstance(n, ast.FunctionDef) and n.name == "_parse_hostfile"]
    scope = {"collections": collections, "re": re, "logger": logging.getLogger("deepspeed")}
    exec(compile(ast.Module([function], []), "runner.py", "exec"), scope)  # noqa: S102
    plan = build_plan(session_def("ds-test", 3, resources={"cpu": 1, "mem": "1g", "gpu": 0},
                                  distributed={"slots": 2}), POOL)
    files = render_session(plan, generate_session_keys(plan.hosts))["sub1"]
    hostfile = next(f for f in files if f.path == "hostfile").content
    pool = scope["_parse_hostfile"](hostfile.splitlines(keepends=True))
    assert list(pool.items()) == [("main1", 2), ("sub1", 2), ("sub2", 2)]


@pytest.fixture(scope="module")
def image(docker_client) -> str:
    """The test image with Open MPI and mpi4py (Debian packages), for this module's sessions."""
    from cluster_sessions.lab.image import ensure_image

    return ensure_image(docker_client, flavour="mpi")


@pytest.fixture(scope="module")
def four(session_factory) -> Running:  # noqa: F811
    return session_factory(session_def(unique("mpi"), 4))


@pytest.mark.docker
@pytest.mark.slow
def test_mpirun_with_no_hostfile_or_host_flags_runs_one_rank_per_container(four):
    code, out, err = four.run("main1", SSH + "'mpirun -np 4 hostname'")
    assert code == 0, err.decode()
    assert sorted(out.decode().split()) == sorted(four.hosts)
    # no "Read -1, expected ..." (cross-memory attach), no ssh host-key prompt or warning
    assert err.decode() == "", err.decode()
    config = four.ok("main1", "cat ~/.ssh/config")
    assert re.search(r"^\s*StrictHostKeyChecking yes$", config, re.M)


@pytest.mark.docker
@pytest.mark.slow
def test_mpi4py_allreduce_over_four_ranks_gives_the_sum(four):
    program = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
               "print(c.rank, socket.gethostname(), c.allreduce(c.rank + 1), c.size)")
    code, out, err = four.run("main1", SSH + f"'mpirun -np 4 python3 -c \"{program}\"'")
    assert code == 0, err.decode()
    rows = sorted(line.split() for line in out.decode().splitlines())
    assert rows == [[str(r), h, "10", "4"] for r, h in enumerate(four.hosts)], out.decode()
    assert err.decode() == "", err.decode()


@pytest.mark.docker
@pytest.mark.slow
def test_the_hostfiles_and_variables_are_what_launchers_read(four):
    env = dict(line.split("=", 1) for line in four.ok(
        "sub2", "ssh -o BatchMode=yes sub2 env").splitlines() if "=" in line)
    assert env["CLUSTER_SESSION_HOSTFILE"] == "/opt/cluster-session/hostfile"
    assert env["OMPI_MCA_orte_default_hostfile"] == env["CLUSTER_SESSION_HOSTFILE"]
    assert env["PRTE_MCA_prte_default_hostfile"] == env["CLUSTER_SESSION_HOSTFILE"]
    assert env["HYDRA_HOST_FILE"] == "/opt/cluster-session/hostfile.hydra"
    assert env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    assert env["OMPI_MCA_btl_tcp_if_include"] == env["OMPI_MCA_oob_tcp_if_include"] == "eth0"
    assert four.ok("sub2", "cat $CLUSTER_SESSION_HOSTFILE".replace(
        "$CLUSTER_SESSION_HOSTFILE", env["CLUSTER_SESSION_HOSTFILE"])).splitlines() == [
        f"{h} slots=1" for h in four.hosts]
    assert four.ok("sub2", f"cat {env['HYDRA_HOST_FILE']}").splitlines() == [
        f"{h}:1" for h in four.hosts]


@pytest.mark.docker
@pytest.mark.slow
def test_a_users_own_hostfile_wins(session_factory, tmp_path_factory):  # noqa: F811
    hosts = tmp_path_factory.mktemp("hosts")
    (hosts / "two").write_text("main1 slots=1\nsub1 slots=1\n")
    hosts.chmod(0o755)
    (hosts / "two").chmod(0o644)
    running = session_factory(session_def(
        unique("ownhf"), 3, env={"CLUSTER_SESSION_HOSTFILE": "/opt/hosts/two"},
        mounts=[{"source": str(hosts), "target": "/opt/hosts", "read_only": True}]))
    code, out, err = running.run("main1", SSH + "'mpirun -np 2 hostname'")
    assert code == 0, err.decode()
    assert sorted(out.decode().split()) == ["main1", "sub1"]


TF_PROGRAM = """\
import json, os, socket
import tensorflow as tf

config = json.loads(os.environ["TF_CONFIG"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()


@tf.function
def step():
    context = tf.distribute.get_replica_context()
    return context.all_reduce("sum", tf.constant(float(config["task"]["index"] + 1)))


local = strategy.experimental_local_results(strategy.run(step))[0]
rank = os.environ["BACKENDAI_CLUSTER_LOCAL_RANK"]
print("tf", socket.gethostname(), config["task"]["index"], rank,
      json.dumps(config["cluster"], sort_keys=True), float(local), flush=True)
"""


@pytest.mark.docker
@pytest.mark.slow
def test_tensorflow_multi_worker_all_reduce_with_nothing_but_tf_config(
        session_factory, tmp_path_factory):  # noqa: F811
    from cluster_sessions.lab.pydirs import ensure_tensorflow_dir

    tf_dir = ensure_tensorflow_dir()
    scripts = script_dir(tmp_path_factory, "allreduce.py", TF_PROGRAM)
    session = session_def(
        unique("tf"), 3,
        resources={"cpu": 1, "mem": "3g", "shmem": "256m"},
        env={"PYTHONPATH": "/opt/tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2",
             "OMP_NUM_THREADS": "1"},
        mounts=[{"source": str(tf_dir), "target": "/opt/tensorflow", "read_only": True},
                {"source": str(scripts), "target": "/opt/test", "read_only": True}],
        command=["python3", "/opt/test/allreduce.py"],
    )
    running = session_factory(session, wait=False)
    results = {h: c.wait(timeout=600) for h, c in running.containers.items()}
    logs = {h: running.logs(h).decode(errors="replace") for h in running.hosts}
    for host in running.hosts:
        assert results[host]["StatusCode"] == 0, f"{host}:\n{logs[host][-3000:]}"
    seen = {}
    for host, text in logs.items():
        match = re.search(r"^tf (\S+) (\d+) (\d+) (\{.*\}) (\S+)$", text, re.M)
        assert match, f"{host}:\n{text[-3000:]}"
        name, index, rank, cluster, total = match.groups()
        assert name == host and index == rank, (host, index, rank)
        assert float(total) == 6.0, (host, total)  # 1 + 2 + 3: every worker took part
        seen[host] = (int(index), json.loads(cluster))
    assert sorted(i for i, _ in seen.values()) == [0, 1, 2]
    clusters = {json.dumps(c, sort_keys=True) for _, c in seen.values()}
    assert len(clusters) == 1, f"the containers disagree on the cluster: {clusters}"
    assert json.loads(clusters.pop()) == {
        "worker": ["main1:29500", "sub1:29501", "sub2:29502"]}
