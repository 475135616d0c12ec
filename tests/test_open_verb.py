"""``sessionctl open`` (issue 23, item 1): a local port forwarded to a service of main1 through
the agent's SSH. Offline: which service, which published port. On the lab's multi-node pool:
a service answers through ``open`` over the agent's SSH as the non-root user, a private one is
not reachable at the agent's address, a public one is, and Ctrl-C closes the port."""

from __future__ import annotations

import contextlib
import json
import socket

import pytest

from cluster_sessions.agents.facts import PublishedPort
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.spec import Pool, Session
from cluster_sessions.driver import cli
from cluster_sessions.driver.errors import CommandError, Exit
from cluster_sessions.driver.open_verb import agent_port, find_service

from . import factories
from .lab_support import lab_pool
from .test_runtime import unique
from .test_service_ports import SERVER, closes_on_sigint, fetch, open_session, wait_for_url

PREFIX, SUBNET = "csla", "10.251.106.0/24"


def plan_with(services: list[dict]):
    session = Session.model_validate(factories.session("svc-open", services=services))
    pool = Pool.model_validate(factories.pool("p", factories.agent("a1")))
    return build_plan(session, pool)


def test_an_unknown_service_is_invalid_input_with_a_did_you_mean():
    plan = plan_with([{"name": "jupyter", "port": 8888}])
    with pytest.raises(CommandError) as exc:
        find_service(plan, "jupiter", "s.yaml")
    assert exc.value.code == Exit.INVALID
    assert "did you mean 'jupyter'" in str(exc.value)
    with pytest.raises(CommandError, match="declares none"):
        find_service(plan_with([]), "web", "s.yaml")


def test_the_port_is_main1s_own_for_that_container_port_and_all_addresses_mean_loopback():
    plan = plan_with([{"name": "web", "port": 8080}])
    other = PublishedPort("other-main1", "other", 8080, "127.0.0.1", 30000)
    mine = PublishedPort("svc-open-main1", "svc-open", 8080, "127.0.0.1", 30001)
    assert agent_port(plan, plan.services[0], (other, mine)) == ("127.0.0.1", 30001)
    wild = PublishedPort("svc-open-main1", "svc-open", 8080, "0.0.0.0", 30002)
    assert agent_port(plan, plan.services[0], (wild,)) == ("127.0.0.1", 30002)
    with pytest.raises(CommandError) as exc:
        agent_port(plan, plan.services[0], (other,))
    assert exc.value.code == Exit.ENGINE


def test_a_local_port_outside_0_to_65535_is_invalid_input(capsys):
    for bad in ("70000", "-1", "x"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["open", "s.yaml", "web", f"--local-port={bad}"])
        assert exc.value.code == Exit.INVALID
        assert "--local-port: must be a port" in capsys.readouterr().err


def test_open_has_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["open", "--help"])
    out = capsys.readouterr().out
    assert "SERVICE" in out and "Ctrl-C" in out and "--local-port" in out


TWO_PORTS = ["python3", "-c", SERVER[2].replace(
    "h.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n",
    "import threading\n"
    "threading.Thread(target=h.HTTPServer(('0.0.0.0', 8081), H).serve_forever).start()\n"
    "h.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_pool(tmp_path_factory, PREFIX, SUBNET, 2) as pool:
        yield pool.info, pool.image


@pytest.mark.lab
@pytest.mark.docker
@pytest.mark.slow
def test_a_service_answers_through_open_over_the_agents_ssh_on_the_lab_pool(
        lab, real_engine, tmp_path, capfd):
    info, image = lab
    name = unique("labsvc")
    doc = factories.session(name, str(info.pool_file), image, size=2, mode="multi-node",
                            cpu=0.5, mem="256m", command=TWO_PORTS, services=[
                                {"name": "web", "port": 8080, "protocol": "http"},
                                {"name": "pub", "port": 8081, "protocol": "http",
                                 "public": True}])
    path = str(factories.write(tmp_path / f"{name}.yaml", doc))
    proc = None
    try:
        assert cli.main(["plan", path]) == 0
        assert "service 'pub' is public" in capfd.readouterr().err
        assert cli.main(["up", path, "--yes"]) == 0, capfd.readouterr().err
        capfd.readouterr()
        assert cli.main(["status", path, "--json"]) == 0
        services = {s["name"]: s for s in json.loads(capfd.readouterr().out)["services"]}
        agent = next(a for a in info.agents if a.name == services["web"]["agent"])
        assert services["web"]["bind"] == "127.0.0.1"
        assert services["pub"]["bind"] == agent.address
        assert services["pub"]["url"] == f"http://{agent.address}:{services['pub']['host_port']}/"
        # the private one is bound to the agent's loopback: not reachable at its address
        with pytest.raises(OSError):
            socket.create_connection((agent.address, services["web"]["host_port"]),
                                     timeout=3).close()
        assert fetch(services["pub"]["url"]) == "hello from main1"  # public: directly
        proc = open_session(path, "web")
        url = wait_for_url(proc)
        assert fetch(url) == "hello from main1"
        err = closes_on_sigint(proc, url)
        assert f"via ssh {info.user}@{agent.address}" in err, err  # the agent's SSH, non-root
        proc = None
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(Exception):
            cli.main(["destroy", path, "--yes"])
        capfd.readouterr()
