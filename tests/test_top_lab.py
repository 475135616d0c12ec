"""``sessionctl top``, ``ls --sample`` and ``pool usage`` on a 3-agent netns lab (issue 43):
agents reached over SSH as a real pool is (each container's figures from its cgroup files, one
command per agent), a multi-node session spread over all three (the pool's swarm made by the
pool program), each verb on a pseudo-terminal and with ``--json``; GPU figures from a stand-in
``nvidia-smi`` on one lab agent mapped to the right session by GPU id, and the agents without
it saying "unknown"."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from cluster_sessions.driver import cli

from . import conftest
from .conftest import PROJECT, SESSIONCTL
from .lab_support import lab_pool, pool_swarm
from .test_top import STAND_IN

PREFIX, SUBNET = "cstl", "10.251.144.0/24"
LABEL = "cluster-sessions"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Three agents of one CPU each (a multi-node session of three one-CPU containers spans
    all three), their swarm formed by the pool program."""
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 3, name="toplab",
                  capacity={"cpu": 1, "mem": "8g", "gpus": [0, 1, 2, 3]}) as built, \
            pool_swarm(built.pool_file, "pool-toplab"):
        yield built


def stand_in_on(lab, k: int, tmp_path) -> None:
    """The stand-in as agent k's ``nvidia-smi``: a tmpfs over /usr/local/bin in the mount
    namespace of that agent's sshd only (its SSH sessions find it on their PATH; the machine
    and the other agents do not)."""
    tool = tmp_path / "nvidia-smi"
    tool.write_text(STAND_IN)
    tool.chmod(0o755)
    pid = (lab.info.state_dir / f"agent{k}" / "sshd.pid").read_text().strip()
    subprocess.run(["nsenter", "-t", pid, "-m", "--", "sh", "-c",
                    'mount -t tmpfs -o mode=755 stand-in /usr/local/bin && '
                    'cp "$0" /usr/local/bin/nvidia-smi', str(tool)], check=True)


def labelled(lab, agent: str, session: str, host: str, gpus: str):
    return lab.client(agent).containers.run(
        lab.image, ["sleep", "600"], detach=True, name=f"{session}-{host}",
        labels={f"{LABEL}.session": session, f"{LABEL}.host": host,
                f"{LABEL}.role": host.rstrip("0123456789"), f"{LABEL}.cpu": "0.5",
                f"{LABEL}.mem": str(128 * 2**20), f"{LABEL}.gpus": gpus},
        nano_cpus=500_000_000, mem_limit="128m")


@pytest.mark.lab
def test_gpus_on_a_lab_agent_map_by_id_and_an_agent_without_nvidia_smi_says_unknown(
        lab, tmp_path, capfd):
    stand_in_on(lab, 1, tmp_path)
    made = [labelled(lab, "agent1", "gpu-one", "main1", "1"),
            labelled(lab, "agent1", "gpu-two", "main1", "0,2"),
            labelled(lab, "agent2", "gpu-two", "sub1", "3")]
    try:
        definitions = {}
        for name in ("gpu-one", "gpu-two"):
            definitions[name] = tmp_path / f"{name}.yaml"
            definitions[name].write_text(yaml.safe_dump({
                "kind": "ClusterSession", "name": name, "pool": str(lab.pool_file),
                "image": lab.image, "cluster": {"mode": "single-node", "size": 2},
                "resources": {"cpu": 0.5, "mem": "128m", "shmem": "8m"}}))
        assert cli.main(["top", str(definitions["gpu-one"]), "--once", "--json"]) == 0
        (one,) = json.loads(capfd.readouterr().out)["containers"]
        assert one["agent"] == "agent1"
        assert one["gpus"] == [{"id": 1, "util_percent": 91, "mem_used": 40960 * 2**20,
                                "mem_total": 81559 * 2**20}]
        assert cli.main(["top", str(definitions["gpu-two"]), "--once", "--json"]) == 0
        rows = {c["host"]: c for c in json.loads(capfd.readouterr().out)["containers"]}
        assert [(g["id"], g["util_percent"]) for g in rows["main1"]["gpus"]] == [(0, 10), (2, 20)]
        assert rows["sub1"]["agent"] == "agent2" and rows["sub1"]["gpus"] is None  # unknown
        assert cli.main(["top", str(definitions["gpu-two"]), "--once"]) == 0
        out = capfd.readouterr().out
        assert "0,2 · 10 % 20 %" in out and "3 · unknown" in out
        assert cli.main(["pool", "usage", str(lab.pool_file)]) == 0
        out = capfd.readouterr().out
        with capfd.disabled():
            print(out)  # the closing note's sample (with -s)
        assert "session gpu-one: cpu 0.5 (used " in out and "gpus 1 (91 %)" in out
        assert "agent2  " in out and "used unknown (no nvidia-smi)" in out
    finally:
        for c in made:
            c.remove(force=True)


def wait_ready(container, timeout: float = 180) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if b"ready:" in container.logs(stdout=False, stderr=True):
            return
        time.sleep(0.5)
    raise AssertionError(f"{container.name} not ready")


def sessionctl(state, *argv: str, **kw) -> subprocess.CompletedProcess:
    """The installed ``sessionctl`` as a process of its own, through the real engine, its
    stacks in the file backend ``state`` (the next process sees what this one made)."""
    return subprocess.run([SESSIONCTL, *argv], cwd=PROJECT, env=backend_env(state),
                          capture_output=True, text=True, timeout=600, **kw)


def backend_env(state) -> dict[str, str]:
    env = conftest.backend_env(state, COLUMNS="160", LINES="50")
    env.pop("SESSIONCTL_DEBUG", None)
    return env


def on_a_terminal(state, *argv: str, until: Any = None, timeout: float = 120) -> str:
    """What ``sessionctl ARGV`` draws on a pseudo-terminal: to its end, or for one that goes
    on (``top``) until it prints ``until`` (a regular expression), then Ctrl-C; it must end
    with 0, quietly."""
    import pexpect

    until = pexpect.EOF if until is None else until
    child = pexpect.spawn(SESSIONCTL, list(argv), cwd=str(PROJECT), env=backend_env(state),
                          dimensions=(50, 160), timeout=timeout, encoding="utf-8",
                          use_poll=True)  # select() fails past fd 1024 in a long run
    try:
        seen = ""
        if until is not pexpect.EOF:
            child.expect(until)
            seen = child.before + child.after
            child.sendintr()  # Ctrl-C, through the terminal's line discipline: SIGINT
        child.expect(pexpect.EOF)
        seen += child.before
        child.close()
        assert child.exitstatus == 0, (child.exitstatus, child.signalstatus, seen[-3000:])
    finally:
        if child.isalive():
            child.terminate(force=True)
    assert "Traceback" not in seen and "\\x1b" not in seen, seen[-3000:]
    return seen


@pytest.mark.lab
@pytest.mark.docker
def test_top_ls_and_pool_usage_of_a_session_over_the_labs_3_agents(lab, tmp_path):
    from . import factories
    from .test_runtime import unique

    name = unique("toplab")
    state = tmp_path / "state"
    state.mkdir()
    path = factories.write(tmp_path / f"{name}.yaml", factories.session(
        name, str(lab.pool_file), lab.image, size=3, mode="multi-node", cpu=1, mem="256m",
        shmem="16m"))
    try:
        done = sessionctl(state, "up", str(path), "--yes")
        assert done.returncode == 0, done.stderr
        found = {}
        for agent in ("agent1", "agent2", "agent3"):
            for c in lab.client(agent).containers.list(
                    filters={"label": f"{LABEL}.session={name}"}):
                found[c.labels[f"{LABEL}.host"]] = (agent, c)
        # spread over all three agents (one CPU each)
        assert {h: a for h, (a, _) in found.items()} == {
            "main1": "agent1", "sub1": "agent2", "sub2": "agent3"}
        wait_ready(found["main1"][1])

        # top --json: every container, its agent, figures from its cgroup files
        done = sessionctl(state, "top", str(path), "--once", "--json")
        assert done.returncode == 0, done.stderr
        before = {c["host"]: c for c in json.loads(done.stdout)["containers"]}
        assert {h: c["agent"] for h, c in before.items()} == {
            "main1": "agent1", "sub1": "agent2", "sub2": "agent3"}
        for c in before.values():
            assert c["source"] == "cgroup" and c["state"] == "running", c
            assert c["cpus"] == 1.0 and c["mem_limit"] == 256 * 2**20
            assert c["cpu_percent"] is not None and c["mem_used"] > 0 and c["pids"] >= 1
        assert before["main1"]["last_login"] is None
        # a login from sub1 (agent2) into main1 (agent1), over the session's overlay
        code, out = found["sub1"][1].exec_run(["ssh", "main1", "true"], user="work")
        assert code == 0, out
        done = sessionctl(state, "top", str(path), "--once", "--json")
        after = {c["host"]: c for c in json.loads(done.stdout)["containers"]}
        assert after["main1"]["last_login"] is not None
        assert after["sub1"]["net_tx"] > before["sub1"]["net_tx"]  # the login's bytes

        # top on a terminal: redrawn in place, a row per container and agent; Ctrl-C ends it
        text = on_a_terminal(state, "top", str(path), "--interval", "0.5",
                             until=r"(?s)\x1b\[H.*\x1b\[H.*\x1b\[H")
        frames = [f for f in text.split("\x1b[H") if "\x1b[J" in f]
        assert frames, text[-3000:]
        last = frames[-1]
        for host, agent in (("main1", "agent1"), ("sub1", "agent2"), ("sub2", "agent3")):
            assert any(host in line and agent in line for line in last.splitlines()), last
        assert "main1 last login " in last and "CPU 60s avg" in last

        # ls --sample: one row, measured over the three agents; on a terminal, USED and
        # IDLE-SINCE
        done = sessionctl(state, "ls", "--sample", "--json")
        assert done.returncode == 0, done.stderr
        (row,) = [r for r in json.loads(done.stdout)["sessions"] if r["name"] == name]
        assert row["used"]["measured"] == 3 and row["used"]["cpu_percent"] is not None
        assert row["idle_since"] is not None  # idle: nobody busy, the last login just now
        text = on_a_terminal(state, "ls", "--sample")
        lines = text.splitlines()
        header = next(line for line in lines if "USED" in line)
        assert "IDLE-SINCE" in header, text
        assert any(line.startswith(f"{name} ") for line in lines), text

        # pool usage: bars for each of the three agents and the pool, the session's share
        done = sessionctl(state, "pool", "usage", str(lab.pool_file), "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        (share,) = [s for s in doc["sessions"] if s["session"] == name]
        assert share["allocated"]["cpu"] == 3.0 and share["used"]["measured_containers"] == 3
        assert all(doc["used"][a]["measured_containers"] >= 1
                   for a in ("agent1", "agent2", "agent3")), doc["used"]
        text = on_a_terminal(state, "pool", "usage", str(lab.pool_file))
        lines = [line.rstrip("\r") for line in text.splitlines()]
        for agent in ("agent1", "agent2", "agent3"):
            cpu = next(line for line in lines if line.startswith(f"{agent}  cpu  alloc ["))
            assert "1/1  used [" in cpu and " cores" in cpu, cpu
        assert any(line.startswith(f"session {name}: cpu 3 (used ") for line in lines), text
        print(text)  # the closing note's sample (with -s)
    finally:
        sessionctl(state, "destroy", str(path), "--yes")
        for agent in ("agent1", "agent2", "agent3"):  # whatever the destroy left
            for c in lab.client(agent).containers.list(
                    all=True, filters={"label": f"{LABEL}.session={name}"}):
                c.remove(force=True)
        (PROJECT / "stacks" / f"Pulumi.{name}.yaml").unlink(missing_ok=True)  # the CLI's
