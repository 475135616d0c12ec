"""Readiness in O(N) (issue 35) on a real Docker Engine, under bash, dash and busybox sh.

main1 probes each sub's sshd once and, when every sub answered, says "go" at each sub's sshd
(the text of an ssh disconnect, which the sub's sshd logs and its set-up reads); a sub that
hears nothing from main1 logs in to main1 once and asks its gate (``wait-peers.sh --gate``): a
restarted sub, or every sub when main1 cannot say it (no bash, no nc). The sshd start-ups are
counted as the TCP connections each container accepted (``PassiveOpens`` of its own network
namespace, ``/proc/net/snmp``): until the session is ready only sshd listens in a container, and
sshd forks for every connection it accepts. The pairwise wait before it cost N·(N−1).

Sessions are started from the rendered files as ``test_runtime`` starts them (bundle mounted
read-only, so main1's run directory outlives a restart: a stale "go" is really there).
"""

from __future__ import annotations

import re
import time

import pytest

from cluster_sessions.core.render import READINESS

from .test_runtime import (  # noqa: F401 # image, session_factory: fixtures
    READY,
    Running,
    _docker_time,
    image,
    remove,
    session_def,
    session_factory,
    start,
    unique,
    wait_ready,
)

pytestmark = pytest.mark.docker

ASK_AFTER = READINESS.ask_after  # rule 10: a sub not probed by then asks main1's gate

# what is taken out of the test image just before the entrypoint runs (as root)
SHELLS = {
    "bash": None,
    # /bin/sh is dash; no bash, no nc: main1 probes with ssh-keyscan
    "dash": "rm -f /bin/bash /usr/bin/bash",  # nor a "go": the subs ask main1's gate
    # /bin/sh is busybox's, and so is nc
    "busybox": ("rm -f /bin/bash /usr/bin/bash && ln -sf /bin/busybox /bin/sh"
                " && ln -sf /bin/busybox /usr/local/bin/nc"),
}


SUBS = ("sub1", "sub2", "sub3")


def passive_opens(running: Running, host: str) -> int:
    """The TCP connections the container has accepted since its network namespace was made."""
    out = running.ok(host, "cat /proc/net/snmp", user="root")
    header, values = (line.split() for line in out.splitlines() if line.startswith("Tcp:"))
    return int(values[header.index("PassiveOpens")])


def opens(running: Running) -> dict[str, int]:
    return {host: passive_opens(running, host) for host in running.hosts}


def ready_count(running: Running, host: str) -> int:
    return len(READY.findall(running.logs(host)))


def wait_for(running: Running, host: str, count: int, timeout: float = 60) -> None:
    wait_ready(Running(running.plan, running.keys, running.bundles,
                       {host: running.containers[host]}), timeout=timeout, count=count)


def last_ready_at(running: Running, host: str) -> str:
    lines = [line for line in running.containers[host].logs(timestamps=True).splitlines()
             if READY.search(line)]
    return lines[-1].split(b" ", 1)[0].decode()


@pytest.fixture(scope="module", params=list(SHELLS))
def quad(request, session_factory):  # noqa: F811
    """A session of four containers under each shell, with the connections each had accepted
    when every one was ready."""
    running = session_factory(session_def(unique(f"ready-{request.param}"), 4),
                              before=SHELLS[request.param])
    running.timings["opens_at_ready"] = opens(running)
    running.timings["shell"] = request.param
    return running


def test_a_session_of_four_is_ready_after_at_most_two_sshd_start_ups_per_container(quad):
    counted = quad.timings["opens_at_ready"]
    print(f"\n{quad.timings['shell']}: sshd start-ups until ready, N = 4: {counted}")
    assert sum(counted.values()) <= 2 * 4, counted
    if quad.timings["shell"] == "dash":  # the shape: main1's probe, then each sub's login
        assert counted["main1"] == 3 and all(counted[h] == 1 for h in SUBS), counted
    else:  # no login on main1; each sub: main1's probe, which says the go on its connection
        # in bash; nc's probe leaves at once and the go is one more connection
        said = {"bash": 1, "busybox": 2}[quad.timings["shell"]]
        assert counted["main1"] == 0 and all(counted[h] == said for h in SUBS), counted


def test_a_sub_says_ready_as_soon_as_it_hears_main1_s_go(quad):
    """The sub's wait pauses a second at a time (bash) or 50 ms (sh), and the reader of its
    sshd's log wakes it when the go is heard: each sub's ready line within 0.5 s of its sshd's
    line about main1's go (with the pause alone, three subs would all make it one time in 8).
    Its pid file is emptied once it is done (no late signal goes to a pid used again)."""
    for host in SUBS:
        lines = quad.containers[host].logs(timestamps=True).splitlines()
        go = [line for line in lines if b":11: cluster-session-go" in line]
        if quad.timings["shell"] == "dash":  # without bash or nc: no go, the gate instead
            assert not go, lines
            continue
        ready = [line for line in lines if READY.search(line)]
        assert go and ready, lines
        heard, said = (_docker_time(x[0].split(b" ", 1)[0].decode()) for x in (go, ready))
        assert 0 <= (said - heard).total_seconds() < 0.5, (host, heard, said)
        assert quad.ok(host, "cat /run/cluster-session/ready-waiter 2>/dev/null || :",
                       user="root").strip() == ""


def test_a_session_of_eight_is_ready_after_at_most_two_sshd_start_ups_per_container(
        session_factory):  # noqa: F811
    running = session_factory(session_def(unique("ready-8"), 8))
    counted = opens(running)
    print(f"\nsshd start-ups until ready, N = 8: {counted} (pairwise: 56 at least)")
    assert sum(counted.values()) <= 2 * 8, counted
    for host in running.hosts[1:]:  # and ssh works at once, from every container to any
        assert running.ok(host, f"ssh -o BatchMode=yes {running.hosts[-1]} hostname && "
                                f"ssh -o BatchMode=yes main1 hostname").split() == [
            running.hosts[-1], "main1"]


def test_a_sub_restarted_alone_is_let_through_main1_s_open_gate(quad):
    """main1 does not probe it again: after ASK_AFTER s the sub asks main1's gate, which
    is open (the "go" is main1's state, not only a word said once)."""
    before = opens(quad)
    quad.containers["sub2"].restart(timeout=2)
    restarted = time.monotonic()
    wait_for(quad, "sub2", count=2)
    took = time.monotonic() - restarted
    after = opens(quad)
    # one login on main1; nobody else probed; the sub's new network namespace: nothing yet
    assert after["main1"] - before["main1"] == 1, (before, after)
    assert after["sub1"] == before["sub1"] and after["sub3"] == before["sub3"], (before, after)
    assert took < ASK_AFTER + 7, took
    assert ready_count(quad, "main1") == 1
    assert quad.ok("sub2", "ssh -o BatchMode=yes sub3 hostname && "
                           "ssh -o BatchMode=yes main1 hostname").split() == ["sub3", "main1"]


def test_main1_restarted_alone_probes_each_sub_once_and_the_subs_keep_running(quad):
    before = opens(quad)
    ready_before = {h: ready_count(quad, h) for h in quad.hosts}
    quad.containers["main1"].restart(timeout=2)
    wait_for(quad, "main1", count=ready_before["main1"] + 1)
    after = opens(quad)
    # its probe (which says the go in bash), and its "go" with nc; dash: no go
    said = 2 if quad.timings["shell"] == "busybox" else 1
    for host in SUBS:
        assert after[host] - before[host] == said, (before, after)
        assert ready_count(quad, host) == ready_before[host]  # its command never stopped
    assert quad.ok("main1", "for p in sub1 sub2 sub3; do ssh -o BatchMode=yes $p hostname; "
                            "done").split() == ["sub1", "sub2", "sub3"]


def test_a_sub_restarted_while_main1_is_down_waits_for_main1_s_next_go(quad):
    """main1's run directory still holds the "go" of its earlier run; the sub must not take it."""
    main1, sub2 = quad.containers["main1"], quad.containers["sub2"]
    ready_before = {h: ready_count(quad, h) for h in ("main1", "sub2")}
    code, _, _ = quad.run("main1", "test -e /run/cluster-session/ready-go", user="root")
    assert code == 0
    main1.stop(timeout=2)
    try:
        sub2.restart(timeout=2)
        time.sleep(3)
        assert ready_count(quad, "sub2") == ready_before["sub2"], "sub2 took a stale go"
        sub2.reload()
        assert sub2.status == "running"
    finally:
        main1.start()
    wait_for(quad, "main1", count=ready_before["main1"] + 1)
    wait_for(quad, "sub2", count=ready_before["sub2"] + 1)
    # let through by main1's new run (whose go may come a moment before main1's own line)
    listening = [line.split(b" ", 1)[0].decode() for line in
                 main1.logs(timestamps=True).splitlines() if b"Server listening" in line]
    assert listening[-1] <= last_ready_at(quad, "sub2")
    assert quad.ok("sub2", "ssh -o BatchMode=yes sub1 hostname").strip() == "sub1"


def test_subs_that_main1_holds_wait_for_its_go_past_the_time_to_ask_its_gate(
        session_factory):  # noqa: F811
    """main1's probe (bash) holds its connection until the go: a sub waiting longer than
    ASK_AFTER for a late peer sees it open and does not log in to main1's gate. sub3's
    entrypoint starts ASK_AFTER + 3 s late; no login on main1, one connection per sub."""
    late = ASK_AFTER + 3
    running = session_factory(session_def(unique("held"), 4),
                              before=f'case $(cat /etc/hostname) in (sub3) sleep {late};; esac')
    counted = opens(running)
    assert counted == {"main1": 0, "sub1": 1, "sub2": 1, "sub3": 1}, counted
    first = _docker_time(last_ready_at(running, "sub1"))
    sshd = [line for line in running.containers["sub1"].logs(timestamps=True).splitlines()
            if b"Server listening" in line]
    waited = (first - _docker_time(sshd[0].split(b" ", 1)[0].decode())).total_seconds()
    assert waited > ASK_AFTER + 1, waited  # it did wait past the time to ask


# sshd's processes for connections (not its listener, whose pid is in sshd.pid): killed, the
# connection closes as at sshd's LoginGraceTime
DROP_HELD = ("l=$(cat /run/cluster-session/sshd.pid); for d in /proc/[0-9]*; do p=${d#/proc/}; "
             "[ \"$p\" != \"$l\" ] || continue; c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null) "
             "|| continue; case $c in (sshd:*) kill -9 $p ;; esac; done; true")


def test_a_sub_whose_held_probe_sshd_closed_is_probed_again_not_sent_to_the_gate(
        session_factory):  # noqa: F811
    """sshd closes a held probe at its LoginGraceTime (120 s: the lab's N = 128 took longer,
    and 32 subs asked main1's gate in the moment before main1 probed them again). The sub's
    held connection is closed six times past ASK_AFTER; main1 probes it again each
    time, and the sub does not log in to main1."""
    late = ASK_AFTER + 10
    running = session_factory(session_def(unique("grace"), 4), wait=False,
                              before=f'case $(cat /etc/hostname) in (sub3) sleep {late};; esac')
    time.sleep(ASK_AFTER + 1.5)
    for _ in range(6):  # each leaves the sub without one for about a second
        running.ok("sub1", DROP_HELD, user="root")
        time.sleep(1.1)
    wait_ready(running, timeout=60)
    counted = opens(running)
    assert counted["main1"] == 0 and counted["sub1"] >= 3, counted


def test_a_sub_that_heard_the_go_waits_for_main1_s_name_not_at_the_gate(
        session_factory):  # noqa: F811
    """On an overlay a sub may hear main1's go seconds before its agent resolves main1's name
    (the lab, N = 128). It waits for the name; it does not log in to main1's gate once the
    held probe is gone (7 subs did at N = 128). Here sub1's getent does not find main1 for
    ASK_AFTER + 3 s (a getent of the test's own, first in root's PATH)."""
    late = ASK_AFTER + 3
    fake = ("printf '%s\\n' '#!/bin/sh' "
            "'[ \"$2\" = main1 ] && [ ! -e /tmp/resolves ] && exit 2' "
            "'exec /usr/bin/getent \"$@\"' > /usr/local/bin/getent"
            " && chmod 755 /usr/local/bin/getent"
            f" && {{ sleep {late} && : > /tmp/resolves; }} &")
    before = f'case $(cat /etc/hostname) in (sub1) {fake} ;; esac; true'
    running = session_factory(session_def(unique("name"), 2), before=before)
    assert opens(running) == {"main1": 0, "sub1": 1}
    lines = running.containers["sub1"].logs(timestamps=True).splitlines()
    go, ready = ([_docker_time(x.split(b" ", 1)[0].decode()) for x in lines if pattern in x]
                 for pattern in (b":11: cluster-session-go", b"ready:"))
    assert (ready[0] - go[0]).total_seconds() > ASK_AFTER, (go, ready)


@pytest.mark.parametrize("shell", list(SHELLS))
def test_a_lost_sub_is_named_by_main1_and_by_the_subs_after_the_timeout(
        docker_client, image, tmp_path, shell):  # noqa: F811
    session = session_def(unique(f"lost-{shell}"), 3, readiness={"timeout": 3})
    running = start(docker_client, image, session, tmp_path, only=["main1", "sub1"],
                    wait=False, before=SHELLS[shell])
    try:
        for host in ("main1", "sub1"):
            result = running.containers[host].wait(timeout=60)
            logs = running.logs(host).decode(errors="replace")
            assert result["StatusCode"] == 75, f"{host}:\n{logs}"
            assert re.search(r"peers not ready after 3s .*sub2 \(does not resolve\)", logs), (
                f"{host}:\n{logs}")
        assert "as main1 sees them" in running.logs("sub1").decode(errors="replace")
    finally:
        remove(docker_client, running)


@pytest.mark.parametrize("shell", list(SHELLS))
def test_a_sub_whose_main1_never_comes_names_main1_after_the_timeout(
        docker_client, image, tmp_path, shell):  # noqa: F811
    session = session_def(unique(f"nomain-{shell}"), 2, readiness={"timeout": 2})
    running = start(docker_client, image, session, tmp_path, only=["sub1"], wait=False,
                    before=SHELLS[shell])
    try:
        result = running.containers["sub1"].wait(timeout=60)
        logs = running.logs("sub1").decode(errors="replace")
        assert result["StatusCode"] == 75, logs
        assert "peers not ready after 2s (readiness.timeout): main1 (does not resolve)" in logs
    finally:
        remove(docker_client, running)


@pytest.mark.parametrize("shell", ["bash", "busybox"])
def test_a_sub_tells_main1_its_address_as_soon_as_its_sshd_listens(
        docker_client, image, tmp_path, shell):  # noqa: F811
    """On a bridge, main1 may ask for a sub's address (ARP) before the sub's network is up;
    its kernel then holds every probe's packets for the sub until it asks again, a second
    later (seen here: main1's probes connected ~1 s after the subs' sshd listened, in about
    half the runs at N = 4). The sub's wait sends main1 one datagram at once, whose ARP
    request gives main1's kernel the sub's address. Here main1 is a container that sends
    nothing: it knows sub1's address only if sub1 told it, long before sub1 would ask the gate
    (after 5 s)."""
    session = session_def(unique(f"arp-{shell}"), 2)
    # sub1's entrypoint starts 2 s late, once the silent main1 below is on the network
    running = start(docker_client, image, session, tmp_path, only=["sub1"], wait=False,
                    before=" && ".join(filter(None, ["sleep 2", SHELLS[shell]])))
    silent = docker_client.containers.run(
        image, ["sleep", "60"], entrypoint=[], detach=True, name=f"{running.plan.name}-m",
        network=running.plan.network.name)
    try:
        docker_client.api.disconnect_container_from_network(silent.id,
                                                            running.plan.network.name)
        docker_client.api.connect_container_to_network(silent.id, running.plan.network.name,
                                                       aliases=["main1"])
        deadline = time.monotonic() + 30
        while b"Server listening" not in running.logs("sub1"):
            assert time.monotonic() < deadline, running.logs("sub1")
            time.sleep(0.05)
        listening = time.monotonic()
        running.containers["sub1"].reload()
        address = running.containers["sub1"].attrs["NetworkSettings"]["Networks"][
            running.plan.network.name]["IPAddress"]
        known = False
        while not known and time.monotonic() < listening + ASK_AFTER - 1:
            _, table = silent.exec_run(["cat", "/proc/net/arp"])
            known = any(line.split()[:1] == [address] and line.split()[2] == "0x2"
                        for line in table.decode().splitlines()[1:])
            time.sleep(0.1)
        assert known, f"main1 does not know sub1 ({address}):\n{table.decode()}"
    finally:
        silent.remove(force=True)
        remove(docker_client, running)
