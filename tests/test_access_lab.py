"""``sessionctl ssh`` and ``ssh-config`` into a session on a *remote* agent (issue 22): a lab
agent in a network namespace, reached only over its SSH as the pool's non-root user. The way
in goes over that SSH to the agent, to main1's sshd on the agent's loopback, and through main1
to a sub; nothing of the session is published beyond the agent's loopback."""

from __future__ import annotations

import contextlib
import subprocess
import time

import pytest

from cluster_sessions.driver import access, cli

from . import factories
from .lab_support import lab_pool
from .test_access import home, tree  # noqa: F401 (fixture used by name)
from .test_runtime import unique

pytestmark = [pytest.mark.lab, pytest.mark.docker, pytest.mark.slow]

PREFIX, SUBNET = "csls", "10.251.104.0/24"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 1) as pool:
        yield pool.info, pool.image


def test_ssh_reaches_main1_over_the_agents_ssh_and_a_sub_through_main1(
        lab, real_engine, home, tmp_path, capfd):  # noqa: F811
    info, image = lab
    name = unique("lab")
    doc = factories.session(name, str(info.pool_file), image, size=3, cpu=0.5, mem="512m")
    path = str(factories.write(tmp_path / f"{name}.yaml", doc))
    before = tree(home / ".ssh")
    try:
        assert cli.main(["up", path, "--yes"]) == 0, capfd.readouterr().err
        capfd.readouterr()
        deadline, code = time.time() + 120, None
        while time.time() < deadline:  # until main1's entrypoint is ready (its peers answer)
            code = cli.main(["ssh", path, "--", "hostname"])
            if code == 0:
                break
            time.sleep(1)
        out, err = capfd.readouterr()
        assert code == 0, err
        assert out.strip().splitlines()[-1] == "main1"
        assert cli.main(["ssh", path, "sub2", "--", "sh", "-c", "hostname; exit 4"]) == 4
        out, _ = capfd.readouterr()
        assert out.strip() == "sub2"
        assert cli.main(["ssh-config", path]) == 0
        config_text, _ = capfd.readouterr()
        assert f"Host {name}-agent" in config_text
        assert f"ProxyJump {name}-agent" in config_text
        config = tmp_path / "cfg"
        config.write_text(config_text)
        (tmp_path / "x").write_text("payload\n")
        batch = tmp_path / "batch"
        batch.write_text(f"put {tmp_path / 'x'} x\nget x {tmp_path / 'y'}\n")
        done = subprocess.run(["sftp", "-F", str(config), "-b", str(batch), f"{name}-sub1"],
                              capture_output=True, text=True, check=False, timeout=60)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "y").read_text() == "payload\n"
        # main1's sshd is published on the agent's loopback only
        ports = access.stack_outputs(name)["main1"]["ports"]
        assert [(p["container"], p["host_ip"]) for p in ports] == [(2200, "127.0.0.1")]
    finally:
        with contextlib.suppress(Exception):
            cli.main(["destroy", path, "--yes"])
        capfd.readouterr()
    assert tree(home / ".ssh") == before
