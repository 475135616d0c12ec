"""Service ports at `up` on the real engine (issue 23, item 1): chosen from what the agent
publishes, under the pool's lock, carried by the program onto main1, shown by the outputs,
`status` and `ls --json`."""

from __future__ import annotations

import json
import subprocess

import pytest

from cluster_sessions.driver import cli

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)


def published(container: str) -> dict[str, str]:
    """`docker port` of a container: container port -> host address:port, as the engine says."""
    out = subprocess.run(["docker", "port", container], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split(" -> ", 1) for line in out.splitlines() if line.strip())


@pytest.mark.docker
def test_two_sessions_asking_the_same_preferred_port_get_different_ports(
        real_engine, image, tmp_path, capfd):  # noqa: F811
    first, last = 31490, 31499
    pool = factories.pool("svcpool", factories.agent("local", cpu=4, mem="8g"),
                          service_ports={"first": first, "last": last})
    pool_file = factories.write(tmp_path / "pool.yaml", pool)
    names, paths = [unique("svca"), unique("svcb")], []
    for name in names:
        doc = factories.session(name, pool=str(pool_file), image=image, cpu=0.5, mem="256m",
                                services=[{"name": "web", "port": 8080, "protocol": "http",
                                           "preferred_port": first + 3}])
        paths.append(str(factories.write(tmp_path / f"{name}.yaml", doc)))
    docs = []
    for path in paths:
        code = cli.main(["up", path, "--yes", "--json"])
        out, err = capfd.readouterr()
        assert code == 0, err
        docs.append(json.loads(out))
    ports = [published(f"{n}-main1")["8080/tcp"] for n in names]
    assert ports == [f"127.0.0.1:{first + 3}", f"127.0.0.1:{first}"], ports
    outputs = [d["outputs"]["services"]["web"] for d in docs]
    assert [o["host_port"] for o in outputs] == [first + 3, first]
    assert outputs[1]["url"] == f"http://127.0.0.1:{first}/"
    # status reads each service's port on the engine; ls --json shows it too
    assert cli.main(["status", paths[0], "--json"]) == 0
    status = json.loads(capfd.readouterr().out)
    assert [(v["name"], v["host_port"], v["url"]) for v in status["services"]] == [
        ("web", first + 3, f"http://127.0.0.1:{first + 3}/")]
    assert cli.main(["ls", "--json"]) == 0
    listed = {r["name"]: r["services"] for r in json.loads(capfd.readouterr().out)["sessions"]}
    assert [(v["name"], v["agent"], v["host_port"]) for v in listed[names[1]]] == [
        ("web", "local", first)]
    # a second up keeps each where it is (no replacement), although the preferred port is
    # still the first's
    assert cli.main(["up", paths[1], "--yes", "--json"]) == 0, capfd.readouterr().err
    again = json.loads(capfd.readouterr().out)
    assert again["outputs"]["services"]["web"]["host_port"] == first
    assert again["changes"].get("replace", 0) == 0, again["changes"]


def wait_for_url(proc: subprocess.Popen, timeout: float = 30) -> str:
    """The URL `sessionctl open` prints first on its stdout."""
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "sessionctl open printed no URL"
    return proc.stdout.readline().strip()


def fetch(url: str, timeout: float = 60) -> str:
    """GET ``url``, retried while the server in main1 is still starting."""
    import time
    import urllib.request

    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.read().decode()
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def open_session(path: str, service: str, pool: str | None = None) -> subprocess.Popen:
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root / 'modules'}:{root}"}
    return subprocess.Popen(
        [sys.executable, "-m", "cluster_sessions.driver.cli", "open", path, service,
         *(["--pool", pool] if pool else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def closes_on_sigint(proc: subprocess.Popen, url: str) -> str:
    """Ctrl-C ends `open` with exit 0 and frees its local port."""
    import signal
    import socket
    from urllib.parse import urlsplit

    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"closed {url}" in err
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", urlsplit(url).port), timeout=2).close()
    return err


SERVER = ["python3", "-c", "import http.server as h, os\n"
          "class H(h.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        body = ('hello from ' + os.uname().nodename).encode()\n"
          "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
          "h.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n"]


@pytest.mark.docker
def test_open_forwards_a_local_port_to_the_service_on_a_local_agent(
        real_engine, image, tmp_path, capfd):  # noqa: F811
    name = unique("svcopen")
    doc = factories.session(name, image=image, cpu=0.5, mem="256m", command=SERVER,
                            services=[{"name": "web", "port": 8080, "protocol": "http"}])
    path = str(factories.write(tmp_path / f"{name}.yaml", doc))
    assert cli.main(["up", path, "--yes"]) == 0, capfd.readouterr().err
    proc = open_session(path, "web")
    try:
        url = wait_for_url(proc)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/"), url
        assert fetch(url) == "hello from main1"
        assert fetch(url) == "hello from main1"  # a second connection through the same port
        assert "via local" in closes_on_sigint(proc, url)
    finally:
        proc.kill()
        proc.wait()


# --- choosing at up, offline (what the engine publishes given) ---------------------------------

def _pool_and_session(count: int = 1, last: int = 31009):
    from cluster_sessions.core.spec import Pool, Session

    pool = Pool.model_validate(factories.pool("p", factories.agent("a1"),
                                              service_ports={"first": 31000, "last": last}))
    session = Session.model_validate(factories.session("svc-up", count=count, services=[
        {"name": "web", "port": 8080, "preferred_port": 31005}]))
    return pool, session


def test_up_keeps_what_main1_holds_and_skips_what_others_publish():
    from cluster_sessions.agents.facts import PublishedPort
    from cluster_sessions.core.plan import build_plans
    from cluster_sessions.driver.service_ports import choose

    pool, session = _pool_and_session()
    plans = build_plans(session, pool)
    assert choose(plans, pool, read=lambda a: ()) == {"svc-up": {"web": 31005}}
    others = [PublishedPort("x", "", 80, "0.0.0.0", 31005)]
    assert choose(plans, pool, read=lambda a: others) == {"svc-up": {"web": 31000}}
    held = [*others, PublishedPort("svc-up-main1", "svc-up", 8080, "127.0.0.1", 31007)]
    assert choose(plans, pool, read=lambda a: held) == {"svc-up": {"web": 31007}}
    # a container of the same name but another session's label is not ours
    forged = [PublishedPort("svc-up-main1", "other", 8080, "127.0.0.1", 31007)]
    assert choose(plans, pool, read=lambda a: forged) == {"svc-up": {"web": 31005}}


def test_the_sessions_of_a_count_get_different_ports_and_the_agent_is_read_once():
    from cluster_sessions.core.plan import build_plans
    from cluster_sessions.driver.service_ports import choose

    pool, session = _pool_and_session(count=3)
    reads = []
    got = choose(build_plans(session, pool), pool, read=lambda a: reads.append(a.name) or ())
    assert got == {"svc-up-1": {"web": 31005}, "svc-up-2": {"web": 31000},
                   "svc-up-3": {"web": 31001}}
    assert reads == ["a1"]


def test_a_full_range_is_pending_and_an_unreadable_agent_an_engine_failure():
    from cluster_sessions.agents.connectors import UNREACHABLE, AgentError
    from cluster_sessions.core.plan import build_plans
    from cluster_sessions.driver.errors import CommandError, Exit
    from cluster_sessions.driver.service_ports import choose

    pool, session = _pool_and_session(count=2, last=31000)
    with pytest.raises(CommandError) as exc:
        choose(build_plans(session, pool), pool, read=lambda a: ())
    assert exc.value.code == Exit.PENDING and "31000-31000 of agent a1" in str(exc.value)

    def unreachable(agent):
        raise AgentError(agent.name, UNREACHABLE, "no route")

    pool, session = _pool_and_session()
    with pytest.raises(CommandError) as exc:
        choose(build_plans(session, pool), pool, read=unreachable)
    assert exc.value.code == Exit.ENGINE and "nothing was created" in str(exc.value)


def test_ports_another_up_under_way_reserved_are_not_chosen():
    from cluster_sessions.agents.engine import MarkerFacts
    from cluster_sessions.agents.pool_ledger import HOLDS_LABEL, entry_of
    from cluster_sessions.core.plan import build_plans
    from cluster_sessions.driver.placing import holds_of, reserved_ports
    from cluster_sessions.driver.service_ports import choose

    pool, session = _pool_and_session()
    plans = build_plans(session, pool)
    # what the other `up` wrote in its reservation, read back as the ledger reads it
    other_plan = build_plans(_pool_and_session()[1].model_copy(update={"name": "other"}),
                             pool)[0]
    holds = holds_of(other_plan, {"web": 31005})
    assert holds == {"a1": {"cpu": 1000, "mem": 2**30, "gpus": [], "ports": [31005]}}
    import json
    entry = entry_of(MarkerFacts("id", "n", "2026-11-27T15:40:00Z",
                                 {HOLDS_LABEL: json.dumps(holds)}))
    reserved = reserved_ports([entry], exclude=())
    assert reserved == {"a1": {31005}}
    assert choose(plans, pool, read=lambda a: (), reserved=reserved) == {
        "svc-up": {"web": 31000}}
    # its own reservation (an `up` again) does not stand in its way
    assert reserved_ports([entry], exclude=[entry.identity]) == {}
