"""Nothing is published beyond the agent's loopback without ``public: true`` (issue 32, class
5): one rule for every published port, and every public binding warned about wherever a
public service is (``plan``, ``plan --markdown``, ``diff``, ``status``)."""

from __future__ import annotations

import pytest

from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit

from . import factories

ISSUE_PORTS = [{"container": 2200, "host_ip": "0.0.0.0"}, {"container": 8000, "host_ip": "::"}]


def definition(tmp_path, ports, name="pub-ports", **over):
    return factories.write_pair(tmp_path, factories.session(name, ports=ports, **over),
                                factories.pool("p", factories.agent("agent1")))


def test_the_issues_ports_on_every_address_are_refused_naming_file_and_field(tmp_path, capsys):
    file = definition(tmp_path, ISSUE_PORTS)
    for verb in (["validate"], ["plan"], ["plan", "--markdown"], ["diff", "/dev/null"]):
        assert main([*verb, str(file)]) == Exit.INVALID, verb
        err = capsys.readouterr().err
        assert f"{file}: ports.0.host_ip: 0.0.0.0 is not a loopback address" in err, verb
        assert f"{file}: ports.1.host_ip: :: is not a loopback address" in err, verb
        assert "add public: true to this port" in err and "Traceback" not in err


@pytest.mark.parametrize("verb", [["preview"], ["up", "--yes"]])
def test_engine_verbs_refuse_it_before_anything_is_made(tmp_path, capsys, monkeypatch, verb):
    """Refused at load, before the pulumi CLI is even looked for (nothing can be made)."""
    from cluster_sessions.driver import stacks

    def no_cli(*args, **kwargs):
        raise AssertionError("the engine was reached")

    monkeypatch.setattr(stacks, "find_pulumi", no_cli)
    file = definition(tmp_path, ISSUE_PORTS)
    assert main([*verb, str(file)]) == Exit.INVALID
    err = capsys.readouterr().err
    assert f"{file}: ports.0.host_ip: 0.0.0.0 is not a loopback address" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("host_ip", [
    "0.0.0.0", "::", "10.0.0.11", "192.168.1.5", "fd00::1", "0:0:0:0:0:0:0:0", "::ffff:0.0.0.0",
    "::ffff:10.0.0.1", "169.254.1.1"])
def test_every_address_beyond_the_loopback_needs_public(tmp_path, capsys, host_ip):
    file = definition(tmp_path, [{"container": 8080, "host_ip": host_ip, "protocol": "udp"}])
    assert main(["validate", str(file)]) == Exit.INVALID
    assert f"{file}: ports.0.host_ip: {host_ip} is not a loopback address: port 8080/udp " \
        in capsys.readouterr().err
    public = definition(tmp_path, [{"container": 8080, "host_ip": host_ip, "protocol": "udp",
                                    "public": True}])
    assert main(["validate", str(public)]) == Exit.OK


@pytest.mark.parametrize("host_ip", ["127.0.0.1", "127.0.0.53", "::1", "::ffff:127.0.0.1",
                                     "0:0:0:0:0:0:0:1"])
def test_a_loopback_address_needs_no_public_and_public_there_is_refused(tmp_path, capsys,
                                                                        host_ip):
    from cluster_sessions.core.spec import is_loopback

    assert is_loopback(host_ip)
    assert main(["validate", str(definition(tmp_path, [
        {"container": 8080, "host_ip": host_ip}]))]) == Exit.OK
    file = definition(tmp_path, [{"container": 8080, "host_ip": host_ip, "public": True}])
    assert main(["validate", str(file)]) == Exit.INVALID
    assert f"{file}: ports.0.public: public: true, but host_ip {host_ip} is the agent's " \
        "loopback" in capsys.readouterr().err


def test_a_port_without_host_ip_stays_on_the_loopback(tmp_path, capsys):
    assert main(["validate", str(definition(tmp_path, [{"container": 8080}]))]) == Exit.OK


PUBLIC = [{"container": 2200, "host_ip": "0.0.0.0", "public": True},
          {"container": 8000, "host_ip": "::", "public": True},
          {"container": 9000, "host_ip": "10.0.0.11", "public": True, "protocol": "udp"}]
WARNINGS = [
    "port 2200/tcp of main1 is public: published on every address of agent agent1, not on its "
    "loopback; anyone who reaches it reaches sshd there",
    "port 8000/tcp of main1 is public: published on every address of agent agent1, not on its "
    "loopback; anyone who reaches it reaches whatever listens there",
    "port 9000/udp of main1 is public: published on agent agent1's address 10.0.0.11, not on "
    "its loopback; anyone who reaches it reaches whatever listens there"]


def test_plan_and_plan_markdown_warn_of_every_public_port(tmp_path, capsys):
    file = definition(tmp_path, PUBLIC)
    assert main(["plan", str(file)]) == Exit.OK
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "warning" in line] == [
        f"{file}: warning: {w}" for w in WARNINGS]
    assert main(["plan", str(file), "--markdown"]) == Exit.OK
    shown = capsys.readouterr()
    for w in WARNINGS:  # in the document a pull request shows, and on stderr
        assert f"> ⚠️ {w}" in shown.out.splitlines()
        assert f"{file}: warning: {w}" in shown.err.splitlines()


def test_a_public_service_is_warned_in_plan_markdown_too(tmp_path, capsys):
    file = definition(tmp_path, [], services=[{"name": "web", "port": 8080, "public": True}])
    assert main(["plan", str(file), "--markdown"]) == Exit.OK
    out = capsys.readouterr().out
    assert any(line.startswith("> ⚠️ service 'web' is public") for line in out.splitlines())


def test_diff_warns_of_every_public_port_of_the_new_definition(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    old = definition(tmp_path / "old", [{"container": 2200}])
    new = definition(tmp_path, PUBLIC)
    assert main(["diff", str(old), str(new)]) == Exit.OK
    lines = capsys.readouterr().out.splitlines()
    for w in WARNINGS:
        assert f"> ⚠️ {w}" in lines
    assert main(["diff", "/dev/null", str(new)]) == Exit.OK  # a new session too
    lines = capsys.readouterr().out.splitlines()
    assert all(f"> ⚠️ {w}" in lines for w in WARNINGS)


def test_status_warns_of_every_public_port(tmp_path, capsys):
    """Even when the agent does not answer: the warning is the definition's, not the
    engine's."""
    pool = factories.pool("p", factories.agent(
        "agent1", f"unix://{tmp_path / 'no-docker.sock'}"))
    file = factories.write_pair(tmp_path, factories.session(
        "pub-status", ports=PUBLIC, services=[{"name": "web", "port": 8080, "public": True}]),
        pool)
    assert main(["status", str(file)]) == Exit.ENGINE
    err = capsys.readouterr().err.splitlines()
    warned = [line for line in err if "warning" in line]
    assert warned[1:] == [f"sessionctl status: warning: {w}" for w in WARNINGS]
    assert warned[0].startswith("sessionctl status: warning: service 'web' is public")
