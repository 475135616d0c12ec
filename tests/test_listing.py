"""``sessionctl ls``: the session stacks of the backend with a status read from the engines."""

from __future__ import annotations

import json
import time

import pytest

from cluster_sessions.driver import cli, stacks
from cluster_sessions.driver.listing import session_state
from cluster_sessions.driver.observe import Found

from . import factories
from .test_runtime import image, unique  # noqa: F401 (a fixture, used by name)


def found(host: str, state: str, exit_code: int | None = None) -> Found:
    return Found("a1", "id", f"s-{host}", host, "main" if host == "main1" else "sub", state,
                 None, None, exit_code, "img")


@pytest.mark.parametrize(("kind", "states", "unreachable", "expected"), [
    ("interactive", {"main1": "running", "sub1": "running"}, {}, ("running", "", None)),
    ("batch", {"main1": "exited", "sub1": "running"}, {}, ("finished", "exit code 3", 3)),
    ("interactive", {"main1": "exited", "sub1": "running"}, {}, ("degraded", "main1 exited",
                                                                  None)),
    ("batch", {"main1": "running"}, {}, ("degraded", "sub1 missing", None)),
    ("interactive", {"sub1": "restarting"}, {}, ("degraded", "main1 missing, sub1 restarting",
                                                  None)),
    ("interactive", {}, {}, ("down", "no container of it on its agents", None)),
    ("interactive", {"main1": "running"}, {"a2": "gone"}, ("unreachable", "a2: gone", None)),
])
def test_the_status_of_a_listed_session(kind, states, unreachable, expected):
    codes = {"main1": 3}
    seen = [found(h, s, codes.get(h) if s == "exited" else None) for h, s in states.items()]
    assert session_state(kind, ["main1", "sub1"], seen, unreachable) == expected


def test_ls_without_the_pulumi_cli_exits_4_saying_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: None)
    assert cli.main(["ls"]) == 4
    assert "the pulumi CLI is missing" in capsys.readouterr().err


@pytest.mark.docker
def test_ls_lists_each_session_with_what_its_engine_says(
        emulated_automation, docker_client, image, tmp_path, capsys):  # noqa: F811
    name = unique("ls")
    small = {"image": image, "size": 2, "cpu": 0.25, "mem": "256m"}
    inter = factories.write(tmp_path / "i.yaml", factories.session(f"{name}-i", **small))
    batch = factories.write(tmp_path / "b.yaml", factories.session(
        f"{name}-b", **small, type="batch", command=["sh", "-c", "exit 7"]))
    assert cli.main(["ls"]) == 0
    assert "no sessions in file://" in capsys.readouterr().err
    assert cli.main(["up", str(inter), "--yes"]) == 0
    assert cli.main(["up", str(batch), "--yes"]) == 0
    assert cli.main(["wait", str(batch), "--timeout", "60"]) == 5
    capsys.readouterr()
    assert cli.main(["ls", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sessions"]}
    assert rows[f"{name}-i"] == {
        "stack": f"{name}-i", "name": f"{name}-i", "type": "interactive", "mode": "single-node",
        "size": 2, "agents": ["local"], "state": "running", "detail": "", "exit_code": None,
        "services": []}
    assert (rows[f"{name}-b"]["state"], rows[f"{name}-b"]["exit_code"]) == ("finished", 7)
    assert "stack_outputs " + f"{name}-b" in emulated_automation.calls

    docker_client.containers.get(f"{name}-i-sub1").kill()
    time.sleep(0.5)
    assert cli.main(["ls"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "TYPE", "MODE", "SIZE", "AGENTS", "STATUS"]
    line = next(x for x in table if x.startswith(f"{name}-i "))
    assert line.split()[1:] == ["interactive", "single-node", "2", "local", "degraded",
                                "(sub1", "exited)"]
    assert cli.main(["destroy", str(inter), "--yes"]) == 0
    assert cli.main(["ls", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sessions"]}
    assert rows[f"{name}-i"]["state"] == "empty"
