"""``sessionctl top`` (issue 43): what a session's containers use, on the real local engine.

Sessions built by ``sessionctl up`` (emulated Automation API, real engine) for the figures
that need a real session (cpu under ``cpus: 2``, memory, bytes between two containers, an ssh
login into main1); containers carrying our labels by hand where only the labels matter (GPU
ids mapped from a stand-in ``nvidia-smi``, the terminal, a closed pipe), which is cheaper.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_sessions.agents import sampling
from cluster_sessions.agents.connectors import SSHConnector
from cluster_sessions.core import stats
from cluster_sessions.driver import cli, top
from cluster_sessions.driver.errors import Exit

from . import factories
from .conftest import PROJECT, skip_or_fail
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

LABEL = "cluster-sessions"



def _readable(fd: int, timeout: float) -> bool:
    """select() on ``fd`` without select's FD_SETSIZE (a long run holds fds past 1024)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))

def run_top(*args: str, capfd) -> tuple[int, str, str]:
    code = cli.main(["top", *args])
    out, err = capfd.readouterr()
    return code, out, err


# --- without an engine --------------------------------------------------------------------


def test_an_agent_that_does_not_answer_is_a_row_that_says_so_and_exit_1(tmp_path, capfd):
    pool = factories.pool("twoagents",
                          factories.agent("gone", f"unix://{tmp_path}/no-docker.sock"),
                          factories.agent("alsogone", f"unix://{tmp_path}/none.sock"))
    path = factories.write_pair(tmp_path, factories.session("quiet-one"), pool)
    code, out, err = run_top(str(path), "--once", capfd=capfd)
    assert code == Exit.ENGINE, err
    rows = [line.split() for line in out.splitlines()]
    assert ["?", "gone", "unreachable", "-", "-", "-", "-"] in rows
    assert ["?", "alsogone", "unreachable", "-", "-", "-", "-"] in rows
    assert any(line.startswith("agent gone: ") for line in out.splitlines())
    code, out, err = run_top(str(path), "--once", "--json", capfd=capfd)
    doc = json.loads(out)
    assert code == Exit.ENGINE and doc["containers"] == []
    assert sorted(doc["unreachable"]) == ["alsogone", "gone"]


def test_bad_input_exits_2_naming_the_file_and_field(tmp_path, capfd):
    path = factories.write(tmp_path / "bad.yaml", factories.session("bad-one", cpu=-1))
    code, out, err = run_top(str(path), "--once", capfd=capfd)
    assert code == Exit.INVALID and "Traceback" not in err
    assert f"{path}: resources.cpu: " in err
    code, out, err = run_top("no-such-session", "--once", capfd=capfd)
    assert code == Exit.INVALID and "no-such-session: no such definition file" in err


def sampled_with(*containers: stats.ContainerUse, unreachable=None) -> sampling.Sampled:
    return sampling.Sampled(sampled_at=time.time(), containers=list(containers),
                            unreachable=dict(unreachable or {}))


def test_the_table_shows_allocated_beside_used_and_gpus_unknown_or_by_id():
    target = top.Target("demo", (), None, "session demo on pool p")
    main1 = stats.ContainerUse("main1", "agent1", 4.0, 8 * 2**30, cpu_percent=87.0,
                               mem_used=int(6.1 * 2**30), pids=12, net_rx=2**20, net_tx=2048,
                               gpu_ids=(0, 1), gpus=[{"id": 0, "util_percent": 93},
                                                     {"id": 1, "util_percent": 71}],
                               last_login=time.time(), connections={2200: 1})
    sub1 = stats.ContainerUse("sub1", "agent2", 4.0, 8 * 2**30, cpu_percent=3.0,
                              mem_used=2**20, pids=2, net_rx=0, net_tx=0, gpu_ids=(2,),
                              gpus=None)
    gone = stats.ContainerUse("sub2", "agent2", 4.0, 8 * 2**30, state="gone")
    lines = top.top_lines(target, sampled_with(main1, sub1, gone, unreachable={"agent3": "x"}),
                          now_text=lambda t: "12:00:00Z")
    assert lines[0] == ("session demo on pool p · sampled 12:00:00Z · main1 last login "
                        "12:00:00Z (1 open)")
    cells = {line.split()[0]: line for line in lines[2:]}
    assert "4 · 87 %" in cells["main1"] and "8.0 GiB · 6.1 GiB" in cells["main1"]
    assert cells["main1"].endswith("0,1 · 93 % 71 %")
    assert cells["sub1"].endswith("2 · unknown")
    assert "4 · gone" in cells["sub2"]
    assert "unreachable" in cells["?"] and lines[-1] == "agent agent3: x"


# --- hand-labelled containers on the local engine -------------------------------------------


def labelled(docker_client, image_ref: str, session: str, host: str, *, gpus: str | None = None,
             command: str = "sleep 600", cpus: float = 1.0):
    labels = {f"{LABEL}.session": session, f"{LABEL}.host": host,
              f"{LABEL}.role": host.rstrip("0123456789"), f"{LABEL}.cpu": f"{cpus:g}",
              f"{LABEL}.mem": str(256 * 2**20)}
    if gpus is not None:
        labels[f"{LABEL}.gpus"] = gpus
    return docker_client.containers.run(image_ref, ["sh", "-c", command], detach=True,
                                        name=f"{session}-{host}", labels=labels,
                                        nano_cpus=int(cpus * 1e9), mem_limit="256m")


@pytest.fixture
def labelled_sessions(docker_client, image, tmp_path):  # noqa: F811
    """Two sessions' worth of labelled containers on the local engine, and a definition (on
    a pool whose one agent is this engine) for each; removed afterwards."""
    made = []
    names = [unique("gpua"), unique("gpub")]
    pool = factories.pool("gpupool", factories.agent("agent1", gpus=(0, 1, 2, 3)))
    paths = []
    try:
        made.append(labelled(docker_client, image, names[0], "main1", gpus="1"))
        made.append(labelled(docker_client, image, names[1], "main1", gpus="0,2"))
        made.append(labelled(docker_client, image, names[1], "sub1", gpus="3"))
        for name in names:
            directory = tmp_path / name
            directory.mkdir()
            paths.append(factories.write_pair(directory, factories.session(name, size=2),
                                              pool))
        yield names, paths
    finally:
        for c in made:
            c.remove(force=True)


# `nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total
# --format=csv,noheader,nounits` exactly as NVIDIA's tool prints it (nvidia-smi(1),
# --help-query-gpu: ", " between the fields asked, memory in MiB, no header, no units)
STAND_IN = """#!/bin/sh
case "$*" in
*--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total*--format=csv,noheader,nounits*)
  cat <<'EOF'
0, GPU-5d7a1a9c-0000-4000-8000-000000000000, 10, 1024, 81559
1, GPU-5d7a1a9c-0000-4000-8000-000000000001, 91, 40960, 81559
2, GPU-5d7a1a9c-0000-4000-8000-000000000002, 20, 2048, 81559
3, GPU-5d7a1a9c-0000-4000-8000-000000000003, 33, 3072, 81559
EOF
  ;;
*) echo "stand-in nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""


@pytest.mark.docker
def test_gpu_figures_map_to_each_session_by_gpu_id_and_without_nvidia_smi_are_unknown(
        labelled_sessions, tmp_path, monkeypatch, capfd):
    names, paths = labelled_sessions
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(STAND_IN)
    tool.chmod(0o755)
    plain_path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{plain_path}")  # the local agent's
    code, out, err = run_top(str(paths[0]), "--once", "--json", capfd=capfd)
    assert code == 0, err
    (a_main,) = json.loads(out)["containers"]
    assert a_main["gpus"] == [{"id": 1, "util_percent": 91, "mem_used": 40960 * 2**20,
                               "mem_total": 81559 * 2**20}]
    code, out, err = run_top(str(paths[1]), "--once", "--json", capfd=capfd)
    rows = {c["host"]: c["gpus"] for c in json.loads(out)["containers"]}
    assert [g["util_percent"] for g in rows["main1"]] == [10, 20]
    assert [g["id"] for g in rows["main1"]] == [0, 2]
    assert [g["util_percent"] for g in rows["sub1"]] == [33]
    code, out, err = run_top(str(paths[1]), "--once", capfd=capfd)
    assert "0,2 · 10 % 20 %" in out and "3 · 33 %" in out
    # the same agent without the tool: unknown, never 0 %
    monkeypatch.setenv("PATH", plain_path)
    assert not any((Path(d) / "nvidia-smi").exists() for d in plain_path.split(os.pathsep))
    code, out, err = run_top(str(paths[1]), "--once", "--json", capfd=capfd)
    assert [c["gpus"] for c in json.loads(out)["containers"]] == [None, None]
    code, out, err = run_top(str(paths[1]), "--once", capfd=capfd)
    gpu_cells = [line.rsplit("  ", 1)[-1] for line in out.splitlines()[2:]]
    assert gpu_cells == ["0,2 · unknown", "3 · unknown"]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT / "modules")
    env.pop("SESSIONCTL_DEBUG", None)
    return env


def sessionctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "cluster_sessions.driver.cli", *args]


@pytest.mark.docker
def test_on_a_terminal_top_redraws_in_place_and_ctrl_c_ends_it_quietly(labelled_sessions):
    names, paths = labelled_sessions
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its terminal
        os.execvpe(sys.executable, sessionctl("top", str(paths[1]), "--interval", "0.3",
                                              "--sample-interval", "0.2"), child_env())
    seen = b""
    deadline = time.time() + 60
    while seen.count(b"\x1b[H") < 3 and time.time() < deadline:
        if _readable(fd, 1):
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    assert seen.count(b"\x1b[H") >= 3, seen[-2000:]
    os.write(fd, b"\x03")  # Ctrl-C, through the terminal's line discipline: SIGINT
    rest = b""
    while time.time() < deadline:
        if _readable(fd, 1):
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            rest += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    text = (seen + rest).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
    assert "Traceback" not in text and "interrupted" not in text
    # each redraw starts at the top left corner, erases what was below; rows are there, and
    # no control sequence reached the screen escaped (the guard let these three through)
    frames = [f for f in text.split("\x1b[H") if "\x1b[J" in f]  # the ones drawn whole
    assert len(frames) >= 2 and "main1" in frames[-1] and "sub1" in frames[-1]
    assert "CPU 60s avg" in frames[-1]
    assert frames[-1].count("\n") == frames[0].count("\n")  # drawn over, not below
    assert "\\x1b" not in text


@pytest.mark.docker
def test_a_reader_that_goes_away_ends_top_quietly(labelled_sessions):
    names, paths = labelled_sessions
    proc = subprocess.Popen(sessionctl("top", str(paths[1]), "--watch", "--json",
                                       "--interval", "0.2", "--sample-interval", "0.1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
    first = json.loads(proc.stdout.readline())
    assert first["session"] == names[1] and first["window_s"] == 60
    second = json.loads(proc.stdout.readline())  # the mean over the watch so far
    assert all(c["cpu_percent_avg"] is not None for c in second["containers"])
    proc.stdout.close()  # as `| head -1` does
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    err = proc.stderr.read().decode()
    assert code == 141 and err == "", err


# --- a session `up` built ------------------------------------------------------------------


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True,
                          timeout=120).stdout


def wait_ready(name: str) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if "ready:" in subprocess.run(["docker", "logs", f"{name}-main1"], capture_output=True,
                                      text=True, check=False).stderr:
            return
        time.sleep(0.5)
    pytest.fail(f"{name} did not become ready")


def sample_json(path: Path, capfd, interval: str = "2") -> dict[str, dict]:
    code, out, err = run_top(str(path), "--once", "--json", "--sample-interval", interval,
                             capfd=capfd)
    assert code == 0, err
    return {c["host"]: c for c in json.loads(out)["containers"]}


@pytest.mark.docker
def test_cpu_memory_network_and_logins_of_a_session_as_top_reads_them(
        real_engine, image, tmp_path, capfd):  # noqa: F811
    if os.cpu_count() and os.cpu_count() < 2:
        skip_or_fail("burning two cores needs a machine with two")
    name = unique("top")
    # declared large: other sessions on this shared engine count against it (live capacity)
    pool = factories.pool("toppool", factories.agent("agent1", cpu=100000, mem="1000000g"))
    path = factories.write_pair(tmp_path, factories.session(name, image=image, size=2, cpu=2,
                                                            mem="512m", shmem="128m"), pool)
    assert cli.main(["up", str(path), "--yes"]) == 0, capfd.readouterr().err
    capfd.readouterr()
    wait_ready(name)
    before = sample_json(path, capfd, "1")
    assert set(before) == {"main1", "sub1"}
    assert before["main1"]["cpus"] == 2.0 and before["main1"]["mem_limit"] == 512 * 2**20
    assert before["main1"]["last_login"] is None  # nobody logged in yet
    # two cores busy in main1, 64 MiB written to sub1's /dev/shm (memory of the container)
    docker("exec", "-d", f"{name}-main1", "sh", "-c",
           "for i in 1 2; do (while :; do :; done) & done; wait")
    docker("exec", f"{name}-sub1", "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M",
           "count=64", "status=none")
    # The machine is shared (2 cores, other developers' sessions and builds: up to 18
    # runnable tasks seen): main1's two burners get both cores only when the others leave
    # them. For these seconds main1 weighs the most the engine allows among the engine's
    # containers (cpu-shares; its `cpus: 2` quota still caps it), and up to 10 samples look
    # for a moment calm enough. Under a load like 18 runnable tasks it reads ~20 %, which is
    # what it gets: then this fails, saying so.
    docker("update", "--cpu-shares", "262144", f"{name}-main1")
    seen = []
    for _ in range(10):
        busy = sample_json(path, capfd, "2")
        seen.append(busy["main1"]["cpu_percent"])
        assert seen[-1] <= 100
        if seen[-1] >= 90:
            break
    assert 90 <= seen[-1] <= 100, f"main1 never got its two cores (machine too busy?): {seen}"
    docker("update", "--cpu-shares", "1024", f"{name}-main1")  # the others' CPU back
    assert busy["sub1"]["cpu_percent"] < 5, busy["sub1"]
    assert busy["sub1"]["mem_used"] - before["sub1"]["mem_used"] >= 60 * 2**20
    assert busy["main1"]["mem_used"] < busy["sub1"]["mem_used"]
    # ls --sample: USED is the mean over the containers (main1 ~100 %, sub1 ~0 %), not idle
    assert cli.main(["ls", "--sample", "--json"]) == 0
    (row,) = [r for r in json.loads(capfd.readouterr().out)["sessions"] if r["name"] == name]
    # (the machine is shared: main1 gets what others leave it over the one second)
    assert 10 <= row["used"]["cpu_percent"] <= 55 and row["used"]["gpu_percent"] is None
    assert row["idle_since"] is None
    assert cli.main(["ls", "--sample"]) == 0
    out = capfd.readouterr().out.splitlines()
    assert "USED" in out[0] and "IDLE-SINCE" in out[0]
    line = next(line for line in out if line.startswith(name))
    assert " cpu " in line and " busy " in line
    # 8 MB from sub1 to main1 over ssh: sub1's tx and main1's rx grow by that much, and it
    # is a login into main1
    login_at = time.time()
    docker("exec", "-u", "work", f"{name}-sub1", "bash", "-lc",
           "head -c 8000000 /dev/zero | ssh main1 'cat > /dev/null'")
    after = sample_json(path, capfd, "1")
    assert after["sub1"]["net_tx"] - busy["sub1"]["net_tx"] >= 8_000_000
    assert after["main1"]["net_rx"] - busy["main1"]["net_rx"] >= 8_000_000
    assert after["main1"]["last_login"] is not None
    assert login_at - 2 <= after["main1"]["last_login"] <= time.time()
    assert after["sub1"]["last_login"] is None  # measured on main1 only
    # the text says the same
    code, out, err = run_top(str(path), "--once", capfd=capfd)
    assert code == 0 and "main1 last login " in out.splitlines()[0]
    # by the session stack's name: its config names the definition
    code, out, err = run_top(name, "--once", "--json", capfd=capfd)
    assert code == 0, err
    assert json.loads(out)["session"] == name
    assert {c["host"] for c in json.loads(out)["containers"]} == {"main1", "sub1"}
    assert cli.main(["destroy", str(path), "--yes"]) == 0


class FakeContainer:
    def __init__(self, host: str):
        self.attrs = {"Id": f"{host:0<64}"[:64], "Name": f"/demo-{host}",
                      "State": {"Status": "running", "StartedAt": "2026-12-01T10:00:00Z"},
                      "Config": {"Labels": {f"{LABEL}.session": "demo", f"{LABEL}.host": host,
                                            f"{LABEL}.cpu": "1", f"{LABEL}.mem": "1024"}}}


class FakeClient:
    """An engine whose sub1 is removed between the listing and its stats reading."""

    def __init__(self):
        import docker.errors

        self.containers = self
        outer = self

        class Api:
            def stats(self, cid, stream, one_shot):
                if cid.startswith("sub1"):
                    raise docker.errors.NotFound("No such container")
                outer.reads += 1
                return {"read": f"2026-12-01T10:00:0{outer.reads}Z",
                        "cpu_stats": {"cpu_usage": {"total_usage": outer.reads * 10**8},
                                      "online_cpus": 2},
                        "memory_stats": {"usage": 100, "limit": 1024}}

            def logs(self, cid, **kw):
                return b""

            def exec_create(self, cid, argv, **kw):
                return {"Id": "x"}

            def exec_start(self, exec_id, demux):
                return b""

        self.api = Api()
        self.reads = 0

    def list(self, **kw):
        return [FakeContainer("main1"), FakeContainer("sub1")]

    def close(self):
        pass


def test_a_container_gone_between_listing_and_reading_is_gone_not_a_traceback():
    from cluster_sessions.core.spec import Agent

    agent = Agent.model_validate({"name": "agent1", "docker_host": "unix:///x.sock",
                                  "capacity": {"cpu": 1, "mem": "1g"}})
    got = sampling.sample([agent], "demo", interval=0.01, connect=lambda a: FakeClient())
    assert got.unreachable == {}
    rows = {c.host: c for c in got.containers}
    assert rows["sub1"].state == "gone" and rows["sub1"].cpu_percent is None
    assert rows["main1"].state == "running" and rows["main1"].cpu_percent == 10.0  # 0.1 s of 1 s


@pytest.mark.docker
def test_pool_usage_draws_bars_of_allocated_and_used_and_each_sessions_share(
        labelled_sessions, tmp_path, monkeypatch, capfd):
    names, paths = labelled_sessions
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    pool = str(paths[0].parent / "pool.yaml")
    code = cli.main(["pool", "usage", pool, "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    shares = {s["session"]: s for s in doc["sessions"]}
    assert shares[names[1]]["allocated"] == {"cpu": 2.0, "mem": 512 * 2**20, "gpus": [0, 2, 3]}
    assert shares[names[1]]["used"]["gpu_percent"] == 21.0  # (10 + 20 + 33) / 3
    assert shares[names[0]]["used"]["gpu_percent"] == 91.0
    assert doc["used"]["agent1"]["measured_containers"] >= 3
    code = cli.main(["pool", "usage", pool])
    out, err = capfd.readouterr()
    assert code == 0, err
    out = out.splitlines()
    cpu = next(line for line in out if line.startswith("agent1  cpu  alloc ["))
    assert "/8  used [" in cpu and " cores" in cpu
    assert any(line.startswith(f"session {names[1]}: cpu 2 (used ") and "gpus 0,2,3 (21 %)"
               in line for line in out), out
    assert "\\n" not in "\n".join(out)


def test_a_watch_reuses_each_agents_connection_from_sample_to_sample():
    from cluster_sessions.core.spec import Agent

    agent = Agent.model_validate({"name": "agent1", "docker_host": "unix:///x.sock",
                                  "capacity": {"cpu": 1, "mem": "1g"}})
    opened = []

    def connect(a):
        opened.append(FakeClient())
        return opened[-1]

    kept: dict = {}
    for _ in range(3):
        got = sampling.sample([agent], "demo", interval=0.01, connect=connect, kept=kept)
        assert got.ok
    assert len(opened) == 1 and kept == {"agent1": opened[0]}
    sampling.close_kept(kept)
    assert kept == {}
    sampling.sample([agent], "demo", interval=0.01, connect=connect)
    sampling.sample([agent], "demo", interval=0.01, connect=connect)
    assert len(opened) == 3  # without `kept`, each sample opens (and closes) its own


@pytest.mark.docker
def test_one_connection_pool_per_engine_socket_not_one_per_url(docker_client):
    """Over an SSH agent every pooled connection is a channel: docker-py kept one pool (and
    its idle connection) per request URL, so a sample of 11 containers outgrew sshd's
    MaxSessions (benchmarks/sample_cost.py: 25 channels, 3 connections)."""
    import docker

    from cluster_sessions.agents import docker_transport

    plain = docker.DockerClient(base_url="unix:///var/run/docker.sock")
    pooled = docker.DockerClient(base_url="unix:///var/run/docker.sock")
    docker_transport.one_pool_per_engine(pooled)

    def pools(client) -> int:
        return len(client.api.adapters["http+docker://"].pools)

    try:
        before = {id(c): pools(c) for c in (plain, pooled)}  # the version asked at creation
        for client in (plain, pooled):
            client.api.version()
            client.api.containers(all=True)
            client.api.info()
        assert pools(plain) - before[id(plain)] >= 2  # the quirk, still there
        assert pools(pooled) - before[id(pooled)] == 1
    finally:
        plain.close()
        pooled.close()


# --- the cgroup read (agents reached over SSH: one command, one channel, no stats API) -------


def test_the_cgroup_command_refuses_an_id_or_pid_that_is_not_one_and_quotes_them():
    good = "a" * 64
    text = sampling.cgroup_command([(good, 42), ("b" * 64, 7)], 1.0)
    assert text.startswith(f"targets='{good}:42 {'b' * 64}:7'\ninterval=1.000\n")
    for bad in [("a" * 63, 1), ("A" * 64, 1), (good + ";rm -rf /", 1), ("$(id)", 1),
                (good, 0), (good, -1), (good, "1; id"), (good, True), (good, 2**31)]:
        with pytest.raises(ValueError):
            sampling.cgroup_command([bad], 1.0)
    with pytest.raises(ValueError):
        sampling.cgroup_command([(good, 1)], 3600)


@pytest.mark.docker
def test_the_cgroup_command_as_an_unprivileged_user_reads_a_burning_and_an_idle_container(
        docker_client, image):  # noqa: F811
    """What the agent's SSH user (not root, in the docker group) runs: here as ``nobody``,
    which is not even in the docker group; the engine's stats API is not asked."""
    if os.geteuid() != 0:
        skip_or_fail("runs the command as nobody through su (needs root)")
    burner = docker_client.containers.run(image, ["sh", "-c", "while :; do :; done"],
                                          detach=True, nano_cpus=500_000_000, mem_limit="64m",
                                          labels={f"{LABEL}.test": "cgroup-read"})
    idle = docker_client.containers.run(image, ["sleep", "120"], detach=True,
                                        labels={f"{LABEL}.test": "cgroup-read"})
    try:
        targets = []
        for c in (burner, idle):
            c.reload()
            targets.append((c.id, c.attrs["State"]["Pid"]))
        text = sampling.cgroup_command(targets, 1.0)
        done = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", "sh -s"], input=text,
                              capture_output=True, text=True, timeout=30)
        found = stats.cgroup_readings(done.stdout)
        assert set(found) == {burner.id, idle.id}, done.stdout + done.stderr
        hot, cold = (stats.cpu_percent(*found[c.id], cpus) for c, cpus in
                     ((burner, 0.5), (idle, 1.0)))
        assert hot >= 80, hot  # half a core's quota, busy (a shared machine: 80, not 90)
        assert cold < 5, cold
        assert found[burner.id][1].mem_limit == 64 * 2**20
    finally:
        for c in (burner, idle):
            c.remove(force=True)


class FakeSSH(SSHConnector):
    """An SSH agent's connector answering the cgroup read with ``printed`` (no connection)."""

    def __init__(self, printed: str):
        self.printed, self.commands = printed, []

    def run(self, cmd, timeout=None):
        self.commands.append(cmd)
        return 0, self.printed, ""

    def close(self):
        pass


def test_over_ssh_the_files_are_read_and_the_api_asked_only_for_what_they_could_not_give():
    from cluster_sessions.core.spec import Agent

    agent = Agent.model_validate({"name": "agent1", "docker_host": "unix:///x.sock",
                                  "capacity": {"cpu": 1, "mem": "1g"}})
    main1 = "a" * 64

    def with_pids(client):
        """main1 with a container id as the engine gives them; sub1 with one that is not
        (``sub1000...``: never written into the command, its readings the API's)."""
        listed = client.list()
        listed[0].attrs["Id"] = main1
        for n, c in enumerate(listed):
            c.attrs["State"]["Pid"] = 100 + n
        client.list = lambda **kw: listed
        return client

    one = (f"R {main1} {{t}}000000000\ncpu_ns {{cpu}}\nmem 300\nlimit 1024\ninactive 100\n"
           f"pids 2\nN   eth0: {{rx}} 1 0 0 0 0 0 0 50 1 0 0 0 0 0 0\nE {main1}\n")
    printed = ("cs-cgroup-read 1\nH 2 1000\n" + one.format(t=10, cpu=0, rx=1000)
               + one.format(t=12, cpu=10**9, rx=3000))
    client = with_pids(FakeClient())
    client.connector = FakeSSH(printed)
    got = sampling.sample([agent], "demo", interval=0.01, connect=lambda a: client)
    rows = {c.host: c for c in got.containers}
    # main1 from its files (1 s of CPU in 2 s, of 1 allocated core), one command for both
    assert (rows["main1"].source, rows["main1"].cpu_percent) == ("cgroup", 50.0)
    assert (rows["main1"].mem_used, rows["main1"].net_rx_rate) == (200, 1000.0)
    assert f"targets={main1}:100\n" in client.connector.commands[0]
    assert len(client.connector.commands) == 1
    # sub1 (not an id: not in the command): the API asked, which says it is gone; main1 was
    # never asked there
    assert rows["sub1"].state == "gone" and client.reads == 0
    # what is not the format (a shell's error): every container through the API
    client = with_pids(FakeClient())
    client.connector = FakeSSH("sh: 1: getconf: Permission denied\n")
    got = sampling.sample([agent], "demo", interval=0.01, connect=lambda a: client)
    rows = {c.host: c for c in got.containers}
    assert rows["main1"].source == "api" and rows["main1"].cpu_percent == 10.0
    assert rows["main1"].to_dict()["source"] == "api"
