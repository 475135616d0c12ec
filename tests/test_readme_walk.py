"""The README walked in its own order (issue 41): every engine command line it shows for the
embedded `local` pool, run against the shipped files, one state backend, the driver in a
process of its own as a user runs it (the installed ``sessionctl`` through the real engine, in
a checkout of the test's own: the CLI writes the shipped stacks' config files there, not into
this one, where other tests read the shipped stacks). Following the README never ends in
PENDING (item 4) and each line does what its comment says. The lab's lines are the lab
tests' (tests/test_access_lab.py, tests/test_multinode.py); `open` and `logs --follow` run
until Ctrl-C (tests/test_open_verb.py, tests/test_observe.py)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cluster_sessions.agents import cleanup
from cluster_sessions.core.loader import load_file

from .conftest import PROJECT, SESSIONCTL, backend_env
from .test_runtime import image  # noqa: F401 (a fixture, used by name)

pytestmark = pytest.mark.docker

README = (PROJECT / "README.md").read_text()
LONG_RUNNING = (" --follow", "sessionctl open ", "sessionctl lab ", "--pool lab", " lab ",
                "sessionctl diff ", "sessionctl validate", "sessionctl plan", "--version")
SHIPPED = ("train-demo", "apps-demo", "job-demo", "sweep-1", "sweep-2")


def readme_engine_lines() -> list[str]:
    """Every `sessionctl` line of the README's sh blocks, in order, that acts on the engine
    with the shipped local-pool examples (comments and redirections dropped)."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for raw in block.splitlines():
            line = raw.split("#", 1)[0].strip()
            if line.startswith("bash scripts/setup.sh && "):
                line = line.removeprefix("bash scripts/setup.sh && ")
            if not line.startswith("sessionctl ") or any(x in line for x in LONG_RUNNING) \
                    or "lab" in line.split():
                continue
            lines.append(line.split(" > ", 1)[0].strip())
    return lines


def test_the_walk_covers_the_readme_s_engine_lines():
    lines = readme_engine_lines()
    assert lines[0] == "sessionctl up stacks/sessions/train-demo.yaml --yes"
    for verb in ("preview", "up", "status", "logs", "refresh", "destroy", "ssh", "ssh-config",
                 "key", "wait", "run", "ls", "pool"):
        assert any(line.split()[1] == verb for line in lines), verb


def checkout(path: Path) -> Path:
    """What a reader's checkout holds for the walk: the project file, the program, the
    set-up's virtualenv and the shipped ``stacks/`` (no stack file)."""
    path.mkdir()
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(PROJECT / name, path / name)
    (path / ".venv").symlink_to(PROJECT / ".venv")
    shutil.copytree(PROJECT / "stacks", path / "stacks",
                    ignore=shutil.ignore_patterns("Pulumi.*.yaml"))
    return path


@pytest.fixture
def walk_env(tmp_path, docker_client):
    state = tmp_path / "state"
    state.mkdir()
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(home / ".ssh" / "id_ed25519")], check=True)
    env = backend_env(state, "walk", HOME=str(home))
    env.pop("SSH_AUTH_SOCK", None)
    yield env
    pool = load_file(PROJECT / "stacks" / "pools" / "local.yaml", expect="AgentPool")
    for name in SHIPPED:
        cleanup.sweep(pool, name, wait=10)


def test_the_readme_in_its_order_on_the_embedded_pool(walk_env, image, tmp_path):  # noqa: F811
    def run(line: str) -> subprocess.CompletedProcess:
        argv = shlex.split(line)[1:]
        if argv[:1] == ["ssh"] and "nvidia-smi" in argv:  # no GPU here: a command all the same
            argv[argv.index("nvidia-smi")] = "hostname"
        if argv[:1] == ["key"]:
            argv[argv.index("--out") + 1] = str(tmp_path / "id_container")
        done = subprocess.run([SESSIONCTL, *argv], cwd=reader, env=walk_env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=600, check=False)
        ran.append((line, done.returncode))
        if argv[:1] == ["up"] and done.returncode == 0:
            ready(argv[1])
        return done

    def ready(definition: str, timeout: float = 120) -> None:
        """Until main1 says ready (sshd up, every peer answers), as tests/test_access.py
        waits: `up` returns once the containers run, before the mesh is ready."""
        name = load_file(reader / definition).name
        deadline = time.time() + timeout
        while time.time() < deadline:
            logs = subprocess.run(["docker", "logs", f"{name}-main1"], capture_output=True,
                                  text=True, check=False)
            if "ready:" in logs.stderr or logs.returncode != 0:
                return
            time.sleep(0.5)

    reader = checkout(tmp_path / "checkout")
    ran: list[tuple[str, int]] = []
    lines = readme_engine_lines()
    # a reader keeps the demo up through "Getting in" and the rest: the destroys come last
    destroys = [line for line in lines if line.split()[1] == "destroy"]
    for line in [x for x in lines if x not in destroys] + destroys:
        if line.startswith("sessionctl ssh stacks/sessions/train-demo.yaml") and \
                line.split()[-1] == "stacks/sessions/train-demo.yaml":
            continue  # the interactive login: tests/test_access.py types into it on a pty
        if line.startswith(("sessionctl wait stacks/sessions/job.yaml",
                            "sessionctl status stacks/sessions/apps.yaml")):
            # the README's prose says `up` first (Jobs, Apps and data)
            what = line.split()[2]
            made = run(f"sessionctl up {what} --yes")
            assert made.returncode == 0, made.stderr
        done = run(line)
        expected = {"sessionctl wait stacks/sessions/job.yaml --timeout 3600": None,
                    "sessionctl status stacks/sessions/sweep.yaml --index 2": None}
        if line in expected:  # a job's own exit code, or a session run already destroyed
            assert "pending" not in done.stderr, (line, done.stderr)
            continue
        assert done.returncode == 0, f"{line}: exit {done.returncode}\n{done.stderr}"
        if line.startswith("sessionctl run "):
            doc = json.loads(done.stdout)
            assert doc, done.stdout
    assert [line for line, _ in ran if "destroy stacks/sessions/train-demo.yaml" in line]
    for what in ("apps.yaml", "job.yaml"):
        run(f"sessionctl destroy stacks/sessions/{what} --yes")
