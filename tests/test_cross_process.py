"""The verbs in processes of their own (the installed ``sessionctl``, through the real engine
on a file backend): what one process brought up, the next lists, reaches and removes; an access
verb of a stack no process made says so in one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from . import factories
from .conftest import PROJECT, SESSIONCTL, backend_env
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def sessionctl(backend: Path, *argv: str, env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """One ``sessionctl`` process on the file backend ``backend`` through the real engine."""
    return subprocess.run([SESSIONCTL, *argv], cwd=PROJECT, env=backend_env(backend, **(env or {})),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def home(tmp_path) -> Path:
    """A ``HOME`` of the test's own with an SSH key (what ``key`` and ``ssh-config`` read)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me",
                    "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    return home


def test_access_verbs_of_a_stack_no_process_made_say_so_without_a_traceback(tmp_path, home):
    """A second process's ``ssh-config`` of a session never brought up: the backend's "no
    stack" said in one line (exit 1), not a KeyError."""
    path = factories.write(tmp_path / "never-up.yaml", factories.session("never-up"))
    (tmp_path / "state").mkdir()
    done = sessionctl(tmp_path / "state", "ssh-config", str(path), env={"HOME": str(home)})
    assert done.returncode == 1, done.stderr
    assert "no stack named 'never-up' found" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "KeyError" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.docker
def test_a_session_one_process_brought_up_is_listed_and_reached_by_the_next(
        docker_client, image, home, tmp_path):  # noqa: F811
    """``up`` in one process; ``ls``, ``ssh-config`` and ``key`` in others see it; ``destroy``
    in another removes it."""
    name = unique("xproc")
    path = str(factories.write(tmp_path / f"{name}.yaml",
                               factories.session(name, image=image, size=2, cpu=0.5,
                                                 mem="256m")))
    state = tmp_path / "state"
    state.mkdir()
    env = {"HOME": str(home)}
    try:
        up = sessionctl(state, "up", path, "--yes", env=env)
        assert up.returncode == 0, up.stderr
        listed = sessionctl(state, "ls", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)["sessions"]
        assert [r["name"] for r in rows] == [name], rows
        config = sessionctl(state, "ssh-config", path, env=env)
        assert config.returncode == 0, config.stderr
        assert f"Host {name}" in config.stdout, config.stdout
        key = sessionctl(state, "key", path, "--out", str(tmp_path / "k"), env=env)
        assert key.returncode == 0, key.stderr
        assert (tmp_path / "k").read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    finally:
        down = sessionctl(state, "destroy", path, "--yes", "--remove", env=env)
    assert down.returncode == 0, down.stderr
    assert not docker_client.containers.list(all=True, filters={"name": name})
    assert not docker_client.networks.list(names=[f"{name}-net"])
