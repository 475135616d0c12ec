"""``sessionctl status`` and ``sessionctl logs`` on the real engine.

The containers are made here, labelled exactly as the component labels them
(``container_labels``), from a tiny image imported from this machine's own /bin/busybox (no
registry); the pool's agent is the local engine's unix socket. Everything made is removed
afterwards, whatever happens. The pure parts (parsing, line splitting, the report) are tested
without an engine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from cluster_sessions.core.names import HOST_LABEL, ROLE_LABEL, SESSION_LABEL
from cluster_sessions.core.plan import build_plan, container_labels, network_labels
from cluster_sessions.driver import logs, observe, status, wait_verb
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import CommandError, Exit

from . import factories
from .factories import load_session

DOCKER_HOST = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
BUSYBOX = Path("/bin/busybox")



def busybox_rootfs() -> bytes:
    """A root filesystem tarball: /bin/busybox, its applets (sh, sleep, ...) as links to it, and
    the libraries it links to."""
    libs = []
    for line in subprocess.run(["ldd", str(BUSYBOX)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_file(name: str, source: str, mode: int) -> None:
            data = Path(source).read_bytes()  # follows symlinks: the real file's bytes
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))

        add_file("bin/busybox", str(BUSYBOX), 0o755)
        for lib in sorted(set(libs)):
            add_file(lib, lib, 0o755)
        applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                                 check=True).stdout.split()
        for applet in sorted(set(applets) | {"sh"}):
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "busybox", 0
                tar.addfile(link)
        for d in ("tmp",):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777, 0
            tar.addfile(info)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiny_image(docker_client):
    """A few-MB image from the host's busybox (seconds); else the project's test image."""
    import docker

    if not BUSYBOX.is_file() or not shutil.which("ldd"):
        from cluster_sessions.lab.image import ensure_image

        return ensure_image(docker_client)
    data = busybox_rootfs()
    tag = f"cluster-sessions/test-busybox:{hashlib.sha256(data).hexdigest()[:12]}"
    try:
        docker_client.images.get(tag)
    except docker.errors.ImageNotFound:
        docker_client.api.import_image_from_data(
            data, repository=tag.split(":")[0], tag=tag.split(":")[1],
            changes=["ENV PATH=/bin", 'CMD ["/bin/sh"]'])
    return tag


def remove_session(client, name: str) -> None:
    for c in client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={name}"}):
        c.remove(force=True)
    for n in client.networks.list(filters={"label": f"{SESSION_LABEL}={name}"}):
        n.remove()


def wait_for_logs(container, *needles: bytes, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = container.logs()
        if all(n in logs for n in needles):
            return
        time.sleep(0.1)
    raise AssertionError(f"{container.name} never logged {needles}: {container.logs()!r}")


def make_session(tmp_path: Path, image: str, size: int, docker_host: str = DOCKER_HOST):
    name = f"obs-{uuid.uuid4().hex[:10]}"
    file = factories.write_pair(
        tmp_path, factories.session(name, image=image, size=size, cpu=0.1, mem="64m",
                                    shmem="8m"),
        factories.pool("observe-test", factories.agent(docker_host=docker_host)))
    loaded = load_session(file)
    return file, build_plan(loaded.session, loaded.pool)


def run_container(client, plan, host: str, script: str, network=None, labels=None):
    c = next(c for c in plan.containers if c.host == host)
    return client.containers.run(
        plan.session.image, ["/bin/sh", "-c", script], name=c.container_name, hostname=host,
        environment=dict(c.env), labels=labels or container_labels(plan, c), detach=True,
        network=network.name if network else None)


@pytest.fixture
def session(docker_client, tiny_image, tmp_path):
    """A 3-host plan: main1 and sub1 running on a session network, sub2 never created, and a
    left-over sub7 (exited, code 3) that the plan does not have."""
    file, plan = make_session(tmp_path, tiny_image, size=3)
    try:
        net = docker_client.networks.create(plan.network.name, driver="bridge",
                                            labels=network_labels(plan))
        # stdout and stderr are copied separately by the engine: their relative order is not
        # kept, so the last line comes well after the stderr one.
        script = ('echo "hello from $BACKENDAI_CLUSTER_HOST"; echo "size $BACKENDAI_CLUSTER_SIZE";'
                  ' echo "oops on stderr" >&2; sleep 0.5; echo ready; exec sleep 600')
        made = [run_container(docker_client, plan, h, script, net) for h in ("main1", "sub1")]
        leftover = {**container_labels(plan, plan.containers[0]),
                    f"{HOST_LABEL}": "sub7", f"{ROLE_LABEL}": "sub"}
        gone = docker_client.containers.run(
            plan.session.image, ["/bin/sh", "-c", "echo bye; exit 3"],
            name=f"{plan.name}-sub7", labels=leftover, detach=True)
        for c in made:
            wait_for_logs(c, b"hello from", b"oops on stderr", b"ready")
        gone.wait(timeout=30)
        yield file, plan
    finally:
        remove_session(docker_client, plan.name)


# --- on the real engine ------------------------------------------------------------------------


@pytest.mark.docker
def test_status_shows_running_missing_and_leftover_containers_and_the_network(
        session, tiny_image, capsys):
    file, plan = session
    # sub2 is planned but missing: a fault, named with its cause, exit 1 (issue 13)
    assert main(["status", str(file), "--json"]) == Exit.ENGINE
    captured = capsys.readouterr()
    assert "sessionctl status: sub2: no container (is the session up?)" in captured.err
    report = json.loads(captured.out)
    assert report["faults"] == ["sub2: no container (is the session up?)"]
    rows = {r["host"]: r for r in report["containers"]}
    assert [r["host"] for r in report["containers"]] == ["main1", "sub1", "sub2", "sub7"]
    for host in ("main1", "sub1"):
        assert rows[host]["state"] == "running", rows[host]
        assert rows[host]["agent"] == "agent1"
        assert rows[host]["image"] == tiny_image
        assert rows[host]["name"] == f"{plan.name}-{host}"
        assert rows[host]["started_at"]
        assert rows[host]["note"] is None
    assert rows["main1"]["role"] == "main" and rows["sub1"]["role"] == "sub"
    assert rows["sub2"]["state"] == "missing" and rows["sub2"]["planned"]
    assert rows["sub7"]["state"] == "exited" and not rows["sub7"]["planned"]
    assert "exit code 3" not in (rows["sub7"]["note"] or "")  # leftovers get the leftover note
    assert report["network"]["state"] == "present"
    assert report["network"]["containers"] == 2
    assert report["network"]["actual_driver"] == "bridge"
    assert report["unreachable"] == {}


@pytest.mark.docker
def test_status_table_for_people(session, capsys):
    file, plan = session
    assert main(["status", str(file)]) == Exit.ENGINE  # sub2 is missing
    out = capsys.readouterr().out
    assert f"network  {plan.name}-net [bridge] on agent1: present" in out
    lines = {line.split()[0]: line for line in out.splitlines()[3:] if line.strip()}
    assert lines["main1"].split()[:4] == ["main1", "main", "agent1", "running"]
    assert lines["sub2"].split()[:4] == ["sub2", "sub", "agent1", "missing"]
    assert "not in the plan" in lines["sub7"]


@pytest.mark.docker
def test_logs_prefix_every_line_with_its_host_in_host_order(session, capsys):
    file, plan = session
    assert main(["logs", str(file)]) == Exit.OK
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    for host, part in (("main1", lines[:4]), ("sub1 ", lines[4:])):
        assert [line for line in part if "stderr" not in line] == [
            f"{host} | hello from {host.strip()}", f"{host} | size 3", f"{host} | ready"]
        assert f"{host} | oops on stderr" in part
    assert len(lines) == 8
    assert "sub2: no container found" in captured.err


@pytest.mark.docker
def test_logs_of_one_host_with_tail(session, capsys):
    file, plan = session
    assert main(["logs", str(file), "--host", "sub1", "--tail", "1"]) == Exit.OK
    assert capsys.readouterr().out.splitlines() == ["sub1 | ready"]


@pytest.mark.docker
def test_logs_of_a_leftover_host_can_be_asked_for(session, capsys):
    file, plan = session
    assert main(["logs", str(file), "--host", "sub7"]) == Exit.OK
    assert capsys.readouterr().out.splitlines() == ["sub7 | bye"]


@pytest.mark.docker
def test_logs_of_an_unknown_host_is_invalid_input(session, capsys):
    file, plan = session
    assert main(["logs", str(file), "--host", "sub9"]) == Exit.INVALID
    assert "no host sub9" in capsys.readouterr().err


@pytest.mark.docker
def test_logs_follow_interleaves_hosts_until_the_containers_stop(
        docker_client, tiny_image, tmp_path, capsys):
    file, plan = make_session(tmp_path, tiny_image, size=2)
    try:
        script = ('sleep 2; for i in 1 2 3; do echo "tick $i $BACKENDAI_CLUSTER_HOST"; '
                  'sleep 0.3; done')
        for host in ("main1", "sub1"):
            run_container(docker_client, plan, host, script)
        started = time.monotonic()
        assert main(["logs", str(file), "--follow"]) == Exit.OK
        assert time.monotonic() - started > 1  # it followed, rather than printing and leaving
        lines = capsys.readouterr().out.splitlines()
        assert sorted(lines) == sorted(
            [f"main1 | tick {i} main1" for i in (1, 2, 3)]
            + [f"sub1  | tick {i} sub1" for i in (1, 2, 3)])
        for host in ("main1", "sub1"):  # each host's own lines stay in order
            mine = [line for line in lines if line.startswith(host)]
            assert mine == sorted(mine)
    finally:
        remove_session(docker_client, plan.name)


@pytest.mark.docker
def test_session_with_nothing_running(docker_client, tiny_image, tmp_path, capsys):
    file, plan = make_session(tmp_path, tiny_image, size=2)
    assert main(["status", str(file), "--json"]) == Exit.ENGINE  # nothing is up
    report = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in report["containers"]] == ["missing", "missing"]
    assert len(report["faults"]) == 2
    assert report["network"]["state"] == "missing"
    assert main(["logs", str(file)]) == Exit.ENGINE
    assert "is it up?" in capsys.readouterr().err


# --- an agent that does not answer (no engine needed) -------------------------------------------


def test_status_with_an_unreachable_agent_exits_1_and_still_reports(tmp_path, capsys):
    socket = tmp_path / "no-docker.sock"
    file, plan = make_session(tmp_path, "busybox", size=2, docker_host=f"unix://{socket}")
    assert main(["status", str(file), "--json"]) == Exit.ENGINE
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [r["state"] for r in report["containers"]] == ["unknown", "unknown"]
    assert report["network"]["state"] == "unknown"
    assert "agent1" in report["unreachable"]
    assert "agent agent1 did not answer" in captured.err


# --- pure parts ----------------------------------------------------------------------------------


def test_line_splitter_joins_lines_split_across_chunks_and_survives_bad_utf8():
    s = logs.LineSplitter()
    assert s.feed(b"one\ntw") == ["one"]
    assert s.feed(b"o\r\nthr\xc3") == ["two"]  # CRLF trimmed, half a UTF-8 character kept
    assert s.feed(b"\xa9e\n\xff\n") == ["thr\u00e9e", "\ufffd"]
    assert s.feed(b"last") == []
    assert s.flush() == ["last"]
    assert s.flush() == []


# --- a container cannot make our verbs slow or large (issue 32, class 6) ------------------------


def test_a_log_line_past_the_bound_is_cut_and_says_how_much_was_cut():
    """20 MB without a newline: at most ``MAX_LINE`` characters are ever held, and the line
    shown is its head with a note of what was cut; the next line is whole again."""
    s = logs.LineSplitter()
    chunk = b"x" * 65536
    for _ in range(320):  # 20 MiB
        assert s.feed(chunk) == []
        assert s.held <= logs.MAX_LINE
    [cut, whole] = s.feed(b"y\r\nnext\n")
    assert cut == "x" * logs.MAX_LINE + f" [line cut: {320 * 65536 + 1 - logs.MAX_LINE:,} more " \
        "characters not shown]"
    assert whole == "next"
    s.feed(b"z" * (logs.MAX_LINE + 5))
    assert s.flush() == ["z" * logs.MAX_LINE + " [line cut: 5 more characters not shown]"]
    assert s.held == 0


def test_a_line_exactly_at_the_bound_is_not_cut():
    s = logs.LineSplitter(limit=8)
    assert s.feed(b"12345") == []
    assert s.feed(b"678\n123456789\n") == ["12345678", "12345678 [line cut: 1 more characters "
                                                          "not shown]"]


def peak_allocation_of(call) -> int:
    """Bytes allocated at the peak of ``call()`` beyond what was allocated before it."""
    import tracemalloc

    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    call()
    return tracemalloc.get_traced_memory()[1] - before


@pytest.mark.parametrize("piece", [b"x" * 65536, b"x" * 65535 + b"\n", b"ab\n" * 2048],
                         ids=["no-newline", "one-line-each", "many-lines"])
def test_the_line_splitter_s_work_per_chunk_never_grows_with_what_came_before(piece):
    """The structural proof that splitting is linear: each chunk costs what it allocates and
    copies, and that is bounded by the chunk itself (and the line bound) whether 64 KiB or
    8 MiB came before it. Joining each chunk to the line held so far (issue 32: 0.86 s for
    5 MB, 18 s for 20 MB) allocates the whole line again at every chunk."""
    import tracemalloc

    tracemalloc.start()
    try:
        s = logs.LineSplitter()
        costs = [peak_allocation_of(lambda: s.feed(piece)) for _ in range(128)]  # 8 MiB
    finally:
        tracemalloc.stop()
    per_line = 100  # a short line's str and its place in the list
    assert max(costs) < 4 * len(piece) + per_line * piece.count(b"\n") + 2 * logs.MAX_LINE
    assert max(costs[64:]) <= 2 * max(costs[:8])  # the 64th MiB costs as the first did


def test_found_from_inspect_attributes():
    attrs = {"Id": "0123456789abcdef", "Name": "/demo-sub1",
             "Config": {"Image": "img:1", "Labels": {HOST_LABEL: "sub1",
                                                      ROLE_LABEL: "sub"}},
             "State": {"Status": "exited", "ExitCode": 137,
                       "StartedAt": "2025-01-02T03:04:05.123456789Z",
                       "Health": {"Status": "unhealthy"}}}
    f = observe.found_from_attrs("agent2", attrs)
    assert f == observe.Found("agent2", "0123456789ab", "demo-sub1", "sub1", "sub", "exited",
                              "unhealthy", "2025-01-02T03:04:05.123456789Z", 137, "img:1")
    never = observe.found_from_attrs("a", {"State": {"Status": "created",
                                                     "StartedAt": "0001-01-01T00:00:00Z"}})
    assert never.started_at is None and never.exit_code is None and never.host is None


def test_report_notes_a_container_on_another_agent_than_planned(tmp_path):
    file, plan = make_session(tmp_path, "busybox", size=2)
    net = observe.NetworkState(plan.network.name, "agent1", "bridge", "present")
    found = [observe.Found("agent9", "id1", f"{plan.name}-main1", "main1", "main", "running",
                           "healthy", "2025-01-02T03:04:05Z", None, "busybox")]
    report = status.status_report(plan, found, net, {})
    assert report.rows[0].note == "planned on agent1"
    assert report.rows[1].state == "missing"
    table = status.report_table(report)
    assert "2025-01-02 03:04:05Z" in table and "healthy" in table


def test_tail_accepts_numbers_and_all():
    assert logs.parse_tail("10") == 10
    assert logs.parse_tail("all") == "all"
    import argparse

    for bad in ("-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            logs.parse_tail(bad)


def test_select_hosts_keeps_host_order(tmp_path):
    file, plan = make_session(tmp_path, "busybox", size=3)
    assert logs.select_hosts(plan, [], None) == ["main1", "sub1", "sub2"]
    assert logs.select_hosts(plan, [], ["sub2", "main1"]) == ["main1", "sub2"]
    with pytest.raises(CommandError):
        logs.select_hosts(plan, [], ["nope"])


def test_an_agent_that_does_not_answer_is_one_line_with_the_cause(tmp_path, capsys):
    """After ``lab down``: each agent's socket is gone. One stderr line per agent, no repr."""
    socket = tmp_path / "no-docker.sock"
    file, plan = make_session(tmp_path, "busybox", size=2, docker_host=f"unix://{socket}")
    assert main(["status", str(file)]) == Exit.ENGINE
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"sessionctl status: agent agent1 did not answer: docker not answering at "
        f"unix://{socket}: No such file or directory"]
    assert "DockerException" not in captured.out + captured.err
    assert "FileNotFoundError" not in captured.out + captured.err


def test_the_status_line_says_how_many_containers_run_not_only_the_plan(tmp_path):
    """Nothing created yet: the plan is scheduled, but the first line must not read as if the
    session were there."""
    _, plan = make_session(tmp_path, "busybox", size=3)
    network = observe.NetworkState(plan.network.name, plan.network.agent, plan.network.driver,
                                   "missing")
    report = status.status_report(plan, [], network, {})
    first = status.report_table(report).splitlines()[0]
    assert first.endswith("plan scheduled, 0 of 3 running (3 missing)"), first
    assert "status scheduled" not in first


@pytest.mark.docker
def test_a_killed_container_is_a_fault_named_with_its_exit_code(session, docker_client, capsys):
    file, plan = session
    docker_client.containers.get(f"{plan.name}-sub1").kill()
    assert main(["status", str(file), "--json"]) == Exit.ENGINE
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "sub1: exited (exit code 137)" in report["faults"]
    assert "sessionctl status: sub1: exited (exit code 137)" in captured.err
    assert not any(f.startswith("main1") for f in report["faults"])


def test_a_batch_jobs_finished_main1_is_not_a_fault(tmp_path):
    """main1 of a batch session exits when its job ends: that is the job's outcome (`wait`),
    not a fault; a sub that exited is one."""
    file, plan = make_session(tmp_path, "busybox", size=2)
    batch = plan.__class__(**{**plan.__dict__, "session": plan.session.model_copy(
        update={"type": "batch", "command": ("true",)})})
    net = observe.NetworkState(plan.network.name, "agent1", "bridge", "present")
    rows = (status.Row("main1", "main", "agent1", "exited", note="exit code 0"),
            status.Row("sub1", "sub", "agent1", "running"))
    assert status.Report(batch, rows, net, {}).faults == []
    assert status.Report(plan, rows, net, {}).faults == ["main1: exited (exit code 0)"]
    dead_sub = (rows[0], status.Row("sub1", "sub", "agent1", "exited", note="exit code 1"))
    assert status.Report(batch, dead_sub, net, {}).faults == ["sub1: exited (exit code 1)"]


@pytest.mark.docker
def test_a_restarting_container_is_a_fault(docker_client, tiny_image, tmp_path, capsys):
    file, plan = make_session(tmp_path, tiny_image, size=2)
    try:
        run_container(docker_client, plan, "main1", "exec sleep 600")
        sub1 = next(c for c in plan.containers if c.host == "sub1")
        crashing = docker_client.containers.run(
            plan.session.image, ["/bin/sh", "-c", "exit 1"], name=sub1.container_name,
            labels=container_labels(plan, sub1), detach=True,
            restart_policy={"Name": "always"})
        # Docker doubles its wait between restarts (0.1 s, 0.2 s, ...): after five, the next
        # wait is 3.2 s, in which the container is "restarting" whenever it is asked
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            crashing.reload()
            if crashing.attrs["RestartCount"] >= 5 and crashing.status == "restarting":
                break
            time.sleep(0.1)
        assert crashing.status == "restarting"
        code = main(["status", str(file), "--json"])
        captured = capsys.readouterr()
        assert code == Exit.ENGINE, captured
        assert any(f.startswith("sub1: restarting") for f in json.loads(captured.out)["faults"])
        assert "sessionctl status: sub1: restarting" in captured.err
    finally:
        remove_session(docker_client, plan.name)


# --- what a container writes never acts on the operator's terminal (issue 21, class 9) --------

# An erase-screen, a window-title OSC, a colour, CR, BEL, NUL, an 8-bit CSI (U+009B), a bidi
# override, and a tab (kept: it is readable)
NASTY = ("esc \x1b[2J title \x1b]0;pwned\x07 colour \x1b[31mred cr \rover bel \x07 nul \x00 "
         "c1 \x9b31m bidi \u202eevil del \x7f\tafter a tab")
NASTY_SHOWN = ("esc \\x1b[2J title \\x1b]0;pwned\\x07 colour \\x1b[31mred cr \\rover bel "
               "\\x07 nul \\x00 c1 \\x9b31m bidi \\u202eevil del \\x7f\tafter a tab")


def acts_on_a_terminal(text: str) -> list[str]:
    """Characters a terminal would act on or a reader could not see (newline and tab aside)."""
    import unicodedata

    return [c for c in text if c not in "\n\t"
            and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


class FakeContainer:
    def __init__(self, plan, host: str, state: str = "running", exit_code: int = 0,
                 logs: bytes = b"", name: str | None = None):
        c = next(c for c in plan.containers if c.host == host)
        self.attrs = {"Id": "0123456789abcdef", "Name": "/" + (name or c.container_name),
                      "Config": {"Image": plan.session.image,
                                 "Labels": container_labels(plan, c)},
                      "State": {"Status": state, "ExitCode": exit_code,
                                "StartedAt": "2025-01-02T03:04:05Z"}}
        self._logs = logs

    def logs(self, **options):
        data = self._logs if options.get("stdout", True) else b""  # all of it on stdout
        return iter([data[:7], data[7:]])  # split mid-sequence: the splitter joins them

    def reload(self):
        pass


class FakeClient:
    def __init__(self, containers, network_error: str | None = None):
        self._containers = containers
        self._network_error = network_error
        self.containers = self
        self.networks = self

    def list(self, **_):
        return self._containers

    def get(self, name):
        raise RuntimeError(self._network_error or "gone")

    def close(self):
        pass


def fake_connect(monkeypatch, verb, client):
    module = {"status": status, "logs": logs, "wait": wait_verb}[verb]
    func = getattr(module, f"cmd_{verb}")
    monkeypatch.setattr(func, "__defaults__", (lambda agent: client,))


def test_logs_escape_every_control_character_a_container_writes(tmp_path, monkeypatch, capsys):
    file, plan = make_session(tmp_path, "busybox", size=2)
    data = (NASTY + "\n").encode() + b"second line\r\n" + b"\xc2\x9b\xff no newline at the end"
    fake_connect(monkeypatch, "logs", FakeClient([FakeContainer(plan, "main1", logs=data),
                                                  FakeContainer(plan, "sub1", logs=data)]))
    assert main(["logs", str(file)]) == Exit.OK
    out = capsys.readouterr().out
    assert not acts_on_a_terminal(out)
    assert out.splitlines() == [
        f"main1 | {NASTY_SHOWN}", "main1 | second line", "main1 | \\x9b\ufffd no newline at "
        "the end", f"sub1  | {NASTY_SHOWN}", "sub1  | second line",
        "sub1  | \\x9b\ufffd no newline at the end"]


def test_status_and_wait_escape_what_the_engine_reports(tmp_path, monkeypatch, capsys):
    """A state, a network error and a job's log, as an engine (or whoever labels containers
    there) may spell them: the table, the fault lines, the JSON and wait's messages."""
    name = f"obs-{uuid.uuid4().hex[:10]}"
    file = factories.write_pair(tmp_path, factories.session(
        name, image="busybox", size=2, type="batch", command=["true"]),
        factories.pool("observe-test", factories.agent()))
    plan = build_plan(load_session(file).session, load_session(file).pool)
    weird = "exited\x1b]0;owned\x07\u202e"
    client = FakeClient([FakeContainer(plan, "main1", "running", 0, (NASTY + "\n").encode()),
                         FakeContainer(plan, "sub1", weird, 1)],
                        network_error="boom \x1b[2J\rnetwork")
    fake_connect(monkeypatch, "status", client)
    assert main(["status", str(file)]) == Exit.ENGINE
    shown = capsys.readouterr()
    assert not acts_on_a_terminal(shown.out + shown.err)
    assert "boom \\x1b[2J\\rnetwork" in shown.out
    assert "sessionctl status: sub1: exited\\x1b]0;owned\\x07\\u202e" in shown.err
    assert main(["status", str(file), "--json"]) == Exit.ENGINE
    shown = capsys.readouterr()
    assert not acts_on_a_terminal(shown.out + shown.err)
    assert json.loads(shown.out)["containers"][1]["state"] == weird  # the same value, escaped
    fake_connect(monkeypatch, "wait", client)
    monkeypatch.setattr(wait_verb, "POLL_S", 0.01)
    assert main(["wait", str(file)]) == Exit.JOB_LOST
    shown = capsys.readouterr()
    assert not acts_on_a_terminal(shown.out + shown.err)
    assert f"main1 | {NASTY_SHOWN}" in shown.out.splitlines()
    assert "sub1 is exited\\x1b]0;owned\\x07\\u202e before" in shown.err


@pytest.mark.docker
def test_logs_of_a_real_container_reach_the_terminal_escaped(docker_client, tiny_image, tmp_path,
                                                             capsys):
    file, plan = make_session(tmp_path, tiny_image, size=1)
    try:
        octal = "".join(f"\\{b:03o}" for b in (NASTY + "\n").encode())
        c = run_container(docker_client, plan, "main1", f"printf '{octal}'; exec sleep 600")
        wait_for_logs(c, b"after a tab")
        assert main(["logs", str(file)]) == Exit.OK
        out = capsys.readouterr().out
        assert out.splitlines() == [f"main1 | {NASTY_SHOWN}"]
        assert not acts_on_a_terminal(out)
    finally:
        remove_session(docker_client, plan.name)


class StampedContainer(FakeContainer):
    """A container whose engine gives each line a timestamp (``timestamps=True``), stored in
    the order given, which need not be the order of the stamps across its stdout and its
    stderr (a line is on stdout unless a third item says ``stderr``)."""

    def __init__(self, plan, host: str, lines: list[tuple[str, ...]]):
        super().__init__(plan, host)
        self._lines = lines
        self.calls: list[dict] = []

    def logs(self, **options):
        self.calls.append(options)
        chosen = [line for line in self._lines
                  if options.get((line[2:] or ("stdout",))[0], True)]
        if isinstance(options.get("tail"), int):
            chosen = chosen[len(chosen) - options["tail"]:] if options["tail"] else []
        return iter([(f"{line[0]} " if options.get("timestamps") else "").encode()
                     + f"{line[1]}\n".encode() for line in chosen])


def test_logs_show_a_container_s_lines_in_the_order_the_engine_stamped_them(
        tmp_path, monkeypatch, capsys):
    file, plan = make_session(tmp_path, "busybox", size=1)
    stored = [("2026-01-02T03:04:05.1Z", "first"),
              ("2026-01-02T03:04:05.4Z", "cluster-session[main1]: job exited with code 0",
               "stderr"),
              ("2026-01-02T03:04:05.25Z", "last stdout line")]
    fake_connect(monkeypatch, "logs", FakeClient([StampedContainer(plan, "main1", stored)]))
    assert main(["logs", str(file)]) == Exit.OK
    assert capsys.readouterr().out.splitlines() == [
        "main1 | first", "main1 | last stdout line",
        "main1 | cluster-session[main1]: job exited with code 0"]


def test_logs_with_timestamps_interleave_the_containers_by_time(tmp_path, monkeypatch, capsys):
    file, plan = make_session(tmp_path, "busybox", size=2)
    fake_connect(monkeypatch, "logs", FakeClient([
        StampedContainer(plan, "main1", [("2026-01-02T03:04:05.1Z", "a"),
                                         ("2026-01-02T03:04:06Z", "c")]),
        StampedContainer(plan, "sub1", [("2026-01-02T03:04:05.5Z", "b")])]))
    assert main(["logs", str(file), "--timestamps"]) == Exit.OK
    assert capsys.readouterr().out.splitlines() == [
        "main1 | 2026-01-02T03:04:05.1Z a", "sub1  | 2026-01-02T03:04:05.5Z b",
        "main1 | 2026-01-02T03:04:06Z c"]


@pytest.mark.docker
def test_logs_with_timestamps_interleave_real_containers_by_time(docker_client, tiny_image,
                                                                 tmp_path, capsys):
    file, plan = make_session(tmp_path, tiny_image, size=2)
    try:
        # the order is forced, not timed: main1 says "three" only once sub1 has said "two"
        main1 = run_container(docker_client, plan, "main1",
                              "echo one; until [ -e /tmp/go ]; do sleep 0.05; done; "
                              "echo three >&2; exec sleep 600")
        wait_for_logs(main1, b"one")
        sub1 = run_container(docker_client, plan, "sub1", "echo two; exec sleep 600")
        wait_for_logs(sub1, b"two")
        main1.exec_run(["touch", "/tmp/go"])
        wait_for_logs(main1, b"three")
        assert main(["logs", str(file), "--timestamps"]) == Exit.OK
        lines = capsys.readouterr().out.splitlines()
        assert [(line.split()[0], line.split()[-1]) for line in lines] == [
            ("main1", "one"), ("sub1", "two"), ("main1", "three")]
    finally:
        remove_session(docker_client, plan.name)


# --- issue 25: fault states and job outcomes, without an engine --------------------------------


def found(host: str, state: str, exit_code: int | None = None) -> observe.Found:
    return observe.Found(agent="agent1", id="0123456789ab", name=f"x-{host}", host=host,
                         role="main" if host == "main1" else "sub", state=state, health=None,
                         started_at=None, exit_code=exit_code, image="img")


@pytest.mark.parametrize(("state", "fault"), [
    ("running", None), ("unknown", None), ("missing", "sub1: no container (is the session up?)"),
    ("restarting", "sub1: restarting"), ("dead", "sub1: dead"), ("paused", "sub1: paused"),
    ("created", "sub1: created"), ("exited", "sub1: exited"),
])
def test_every_state_but_running_is_a_fault_of_a_planned_host(tmp_path, state, fault):
    """A planned host is a fault in any state but running (``unknown``: its agent did not
    answer, reported as unreachable instead); a container the plan does not have is none."""
    file, plan = make_session(tmp_path, "busybox", size=2)
    net = observe.NetworkState(plan.network.name, "agent1", "bridge", "present")
    rows = (status.Row("main1", "main", "agent1", "running"),
            status.Row("sub1", "sub", "agent1", state))
    report = status.Report(plan, rows, net, {})
    assert report.faults == ([fault] if fault else [])
    assert report.ok == (fault is None)
    leftover = (*rows[:1], status.Row("sub7", "sub", "agent1", state, planned=False))
    assert status.Report(plan, leftover, net, {}).faults == []
    assert not status.Report(plan, rows[:1], net, {"agent2": "refused"}).ok


def test_a_job_ends_by_main1_s_exit_code_or_by_a_sub_that_stopped_first(tmp_path):
    """job_outcome: main1 exited decides (0 or 5, its code kept), whatever the subs do; before
    that a sub not running or gone, or main1 gone, ends the wait with 6; else it goes on."""
    file, plan = make_session(tmp_path, "busybox", size=3)
    running = {h: found(h, "running") for h in ("main1", "sub1", "sub2")}
    assert wait_verb.job_outcome(plan, running) is None
    ok = wait_verb.job_outcome(plan, {**running, "main1": found("main1", "exited", 0)})
    assert (ok.code, ok.job_exit_code) == (Exit.OK, 0) and "succeeded" in ok.message
    failed = wait_verb.job_outcome(plan, {**running, "main1": found("main1", "exited", 3),
                                        "sub1": found("sub1", "exited", 1)})
    assert (failed.code, failed.job_exit_code) == (Exit.JOB_FAILED, 3)
    assert failed.message == "the job on main1 failed with exit code 3"
    dead = wait_verb.job_outcome(plan, {**running, "main1": found("main1", "dead", 137)})
    assert (dead.code, dead.job_exit_code) == (Exit.JOB_FAILED, 137)
    lost = wait_verb.job_outcome(plan, {k: v for k, v in running.items() if k != "main1"})
    assert lost.code == Exit.JOB_LOST and "main1: container" in lost.message
    assert lost.job_exit_code is None
    gone = wait_verb.job_outcome(plan, {k: v for k, v in running.items() if k != "sub2"})
    assert (gone.code, gone.message) == (Exit.JOB_LOST, "sub2 disappeared before the job ended")
    sub_died = wait_verb.job_outcome(plan, {**running, "sub1": found("sub1", "exited", 137)})
    assert (sub_died.code, sub_died.message) == (
        Exit.JOB_LOST, "sub1 is exited (exit code 137) before the job ended")
    restarting = wait_verb.job_outcome(plan, {**running, "sub2": found("sub2", "restarting")})
    assert restarting.message == "sub2 is restarting before the job ended"
    exited_without_code = wait_verb.job_outcome(plan, {**running,
                                                     "main1": found("main1", "exited")})
    assert exited_without_code is None  # no code yet: still ending


def test_a_session_is_observed_where_the_engines_show_it_not_where_declared_capacity_puts_it():
    from cluster_sessions.core.loader import Loaded
    from cluster_sessions.core.spec import Pool, Session

    pool = Pool.model_validate(factories.pool(
        "p", factories.agent("agent1"), factories.agent("agent2"), swarm={"manager": "agent1"}))
    session = Session.model_validate(factories.session("obs-moved", pool="p", size=2))
    loaded = Loaded(session, Path("s.yaml"), pool, Path("p.yaml"))
    plan = build_plan(session, pool)
    assert plan.agents == ("agent1",)  # declared capacity: the first agent
    assert observe.agents_to_ask(plan, loaded) == ("agent1", "agent2")
    found = [observe.Found("agent2", f"id{i}", f"obs-moved-{h}", h, r, "running", None, None,
                           None, "img") for i, (h, r) in enumerate([("main1", "main"),
                                                                   ("sub1", "sub")])]
    moved = observe.placed_as_found(plan, loaded, found)
    assert moved.agents == ("agent2",) and moved.network.agent == "agent2"
    # one host found elsewhere, the other not found: it keeps the offline plan's agent
    spread = observe.placed_as_found(plan, loaded, found[:1])
    assert [c.agent for c in spread.containers] == ["agent2", "agent1"]
    assert spread.network.driver == "overlay"
    assert observe.placed_as_found(plan, loaded, []) is plan


# --- a reader that goes away (issue 34, item 1) --------------------------------------------------


def first_line_then_close(argv: list[str], timeout: float = 30) -> tuple[int, bytes, bytes]:
    """``sessionctl ARGV | head -1``: a real pipe whose reader takes one line and closes it.
    The verb's exit code, the line read, and everything on stderr."""
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "cluster_sessions.driver.cli", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        proc.stdout.close()
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{argv[0]} kept going {timeout} s after its reader went away: "
                             f"{proc.stderr.read()!r}") from None
    return code, line, proc.stderr.read()


@pytest.mark.docker
@pytest.mark.parametrize("script", [
    "while true; do echo tick; sleep 0.1; done",  # the next write finds the pipe closed
    "echo tick; exec sleep 600",  # nothing more is written: the closed pipe is seen anyway
], ids=["chatty", "silent"])
def test_logs_follow_ends_quietly_with_141_when_its_reader_goes_away(
        docker_client, tiny_image, tmp_path, script):
    file, plan = make_session(tmp_path, tiny_image, size=2)
    try:
        for host in ("main1", "sub1"):
            wait_for_logs(run_container(docker_client, plan, host, script), b"tick")
        code, line, err = first_line_then_close(["logs", str(file), "--follow"])
        assert line.endswith(b"| tick\n")
        assert (code, err) == (141, b"")  # no thread's traceback, never a success
    finally:
        remove_session(docker_client, plan.name)


@pytest.mark.docker
def test_wait_stops_waiting_quietly_with_141_when_its_reader_goes_away(
        docker_client, tiny_image, tmp_path):
    name = f"obs-{uuid.uuid4().hex[:10]}"
    file = factories.write_pair(tmp_path, factories.session(
        name, image=tiny_image, size=2, cpu=0.1, mem="64m", shmem="8m", type="batch",
        command=["sh", "-c", "true"]), factories.pool("observe-test", factories.agent()))
    plan = build_plan(load_session(file).session, load_session(file).pool)
    try:
        run_container(docker_client, plan, "sub1", "exec sleep 600")
        main1 = run_container(docker_client, plan, "main1", "echo started; exec sleep 600")
        wait_for_logs(main1, b"started")
        started = time.monotonic()
        code, line, err = first_line_then_close(["wait", str(file)])
        assert line == b"main1 | started\n"
        assert (code, err) == (141, b"")
        assert time.monotonic() - started < 20  # not until the job ends (600 s)
    finally:
        remove_session(docker_client, plan.name)


class StreamedContainer(FakeContainer):
    """A container whose log is long and read lazily from the engine, as the SDK streams it:
    ``lines`` lines of ``width`` characters on stdout, stamped a microsecond apart."""

    def __init__(self, plan, host: str, lines: int, width: int = 200):
        super().__init__(plan, host)
        self.lines, self.width = lines, width

    def logs(self, **options):
        if not options.get("stdout", True):
            return iter(())
        body = "x" * self.width
        return (f"2026-01-02T03:{i // 60_000_000 % 60:02}:{i // 1_000_000 % 60:02}."
                f"{i % 1_000_000:06}Z {body}\n".encode() for i in range(self.lines))


@pytest.mark.parametrize("extra", [[], ["--timestamps"]])
def test_logs_without_follow_holds_a_bounded_part_of_the_log_in_memory(
        tmp_path, monkeypatch, extra):
    """Containers' logs are printed while they are read: the verb's memory does not grow with
    the log (it held every line of every container to sort them). 2 x 4 MB of log costs what
    2 x 200 kB costs, within 1 MB."""
    import sys
    import tracemalloc

    file, plan = make_session(tmp_path, "busybox", size=2)
    devnull = open(os.devnull, "w")  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stdout", devnull)

    def peak(lines: int) -> int:
        fake_connect(monkeypatch, "logs", FakeClient([StreamedContainer(plan, "main1", lines),
                                                      StreamedContainer(plan, "sub1", lines)]))
        return peak_allocation_of(lambda: main(["logs", str(file), *extra]))

    tracemalloc.start()
    try:
        peak(10)  # what the first call imports is not the log's
        small, large = peak(1_000), peak(20_000)
    finally:
        tracemalloc.stop()
        devnull.close()
    assert large < small + 1024**2, (small, large)


def test_logs_merge_a_container_s_stdout_and_stderr_by_stamp_and_tail_the_merge(
        tmp_path, monkeypatch, capsys):
    """Each stream is asked for on its own (each is in stamp order as the engine stored it)
    and the two merged; ``--tail N`` is the last N lines of the merge."""
    file, plan = make_session(tmp_path, "busybox", size=1)
    container = StampedContainer(plan, "main1", [
        ("2026-01-02T03:04:05.1Z", "out 1"), ("2026-01-02T03:04:05.3Z", "out 3"),
        ("2026-01-02T03:04:05.2Z", "err 2", "stderr"), ("2026-01-02T03:04:05.4Z", "out 4"),
        ("2026-01-02T03:04:05.5Z", "err 5", "stderr")])
    fake_connect(monkeypatch, "logs", FakeClient([container]))
    assert main(["logs", str(file)]) == Exit.OK
    assert capsys.readouterr().out.splitlines() == [
        f"main1 | {w}" for w in ("out 1", "err 2", "out 3", "out 4", "err 5")]
    assert main(["logs", str(file), "--tail", "2"]) == Exit.OK
    assert capsys.readouterr().out.splitlines() == ["main1 | out 4", "main1 | err 5"]
    assert {(c["stdout"], c["stderr"]) for c in container.calls} == {(True, False),
                                                                   (False, True)}


def test_logs_follow_cuts_a_container_s_endless_line(tmp_path, monkeypatch, capsys):
    file, plan = make_session(tmp_path, "busybox", size=2)
    line = b"y" * (3 * logs.MAX_LINE) + b"\n"
    fake_connect(monkeypatch, "logs", FakeClient([FakeContainer(plan, "main1", logs=line)]))
    assert main(["logs", str(file), "--follow"]) == Exit.OK
    out = capsys.readouterr().out
    assert out == "main1 | " + "y" * logs.MAX_LINE + (
        f" [line cut: {2 * logs.MAX_LINE:,} more characters not shown]\n")


@pytest.mark.docker
def test_logs_of_a_real_container_s_20_mb_line_are_cut_and_said(docker_client, tiny_image,
                                                              tmp_path, capsys):
    """The engine stores a long line as 16 KiB pieces; ``logs`` joins them up to the bound,
    says what it cut, and goes on with the next line (it took 33 s and 120 MB on 60f9838)."""
    file, plan = make_session(tmp_path, tiny_image, size=1)
    try:
        main1 = run_container(docker_client, plan, "main1", "head -c 20000000 /dev/zero | "
                              "tr '\\0' a; echo; echo after; exec sleep 600")
        wait_for_logs(main1, b"after", timeout=60)
        assert main(["logs", str(file)]) == Exit.OK
        [cut, after] = capsys.readouterr().out.splitlines()
        assert cut.startswith("main1 | aaaa") and "more characters not shown]" in cut
        assert len(cut) < logs.MAX_LINE + 100
        assert after == "main1 | after"
    finally:
        remove_session(docker_client, plan.name)
