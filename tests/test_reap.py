"""``sessionctl pool reap`` (issue 44, part 4) on the real engine: an idle interactive session
is ended through its stack's destroy, while a busy one (cpu load the test makes in it) and a
batch job are not; two reapers at once end it once."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from cluster_sessions.agents import engine
from cluster_sessions.core.names import HOST_LABEL, SESSION_LABEL
from cluster_sessions.driver import cli, reap_verb
from cluster_sessions.driver.pool_verbs import load_pool

from . import factories
from .test_runtime import image, unique  # noqa: F401 (fixtures used by name)

TIMEOUT = 5  # seconds: the idle policy's window


def _main1(docker_client, session):
    found = docker_client.containers.list(filters={"label": [f"{SESSION_LABEL}={session}",
                                                             f"{HOST_LABEL}=main1"]})
    return found[0] if found else None


@pytest.mark.docker
def test_pool_reap_ends_the_idle_session_once_and_keeps_the_busy_one_and_the_batch_job(
        real_engine, docker_client, image, tmp_path, capfd):  # noqa: F811
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        unique("reap"), factories.agent("local", cpu=64, mem="1000g"),
        policies={"default": {"idle": {"timeout": f"{TIMEOUT}s", "cpu_below": 20,
                                       "gpu_below": 5, "grace": "1s"}}}))
    idle, busy, job = unique("idle"), unique("busy"), unique("job")
    files = {}
    for name, over in ((idle, {}), (busy, {}),
                       (job, {"type": "batch", "command": ["sleep", "300"]})):
        files[name] = str(factories.write(tmp_path / f"{name}.yaml", factories.session(
            name, pool=str(pool), image=image, cpu=0.5, mem="256m", shmem="8m", **over)))
        assert cli.main(["up", files[name], "--yes"]) == 0, capfd.readouterr().err
    capfd.readouterr()
    burner = _main1(docker_client, busy)
    burner.exec_run(["sh", "-c", "while :; do :; done"], detach=True, user="work")

    # the first pass keeps every session: no sample covers the window yet
    assert cli.main(["pool", "reap", str(pool), "--json"]) == 0, capfd.readouterr().err
    first = {r["session"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}
    assert {first[n]["action"] for n in (idle, busy, job)} == {"kept"}, first
    assert "batch" in first[job]["reason"], first[job]
    # a dry run past the window says it would end the idle one and ends nothing
    time.sleep(TIMEOUT + 1)
    assert cli.main(["pool", "reap", str(pool), "--json", "--dry-run"]) == 0
    dry = {r["session"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}
    assert dry[idle]["action"] == "would end" and dry[idle]["kind"] == "idle", dry[idle]
    quiet = _main1(docker_client, idle)
    assert quiet is not None
    # the samples are root's: the session user cannot forge them (nor anyone's but root)
    forged = quiet.exec_run(["sh", "-c", f"echo '[]' > {engine.IDLE_SAMPLES}"], user="work")
    assert forged.exit_code != 0, forged.output
    assert quiet.exec_run(["cat", engine.IDLE_SAMPLES], user="0").output.startswith(b"[[")

    # two reapers at once: the idle session is ended by one of them, once
    loaded, _ = load_pool(str(pool))
    passes: list = []
    errors: list = []

    def one() -> None:
        try:
            passes.append(reap_verb.reap(loaded, False, lambda line: print(line, file=sys.stderr)))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(passes) == 2, errors
    rows = [o for p in passes for o in p.outcomes]
    ended = [o for o in rows if o.session == idle and o.action == "ended"]
    assert len(ended) == 1 and ended[0].kind == "idle", rows
    assert not [o for o in rows if o.action == "failed"], rows
    assert all(o.action == "skipped" for o in rows if o.session == idle and o not in ended)
    for o in rows:
        if o.session == busy:
            assert o.action == "kept" and o.reason.startswith("busy: cpu"), o
        if o.session == job:
            assert o.action == "kept" and "batch" in o.reason, o
    assert _main1(docker_client, idle) is None  # its stack's destroy removed it
    assert _main1(docker_client, busy) is not None and _main1(docker_client, job) is not None
    assert cli.main(["ls", "--json", "--all"]) == 0
    listed = {r["name"]: r for r in json.loads(capfd.readouterr().out)["sessions"]}
    assert listed[idle]["state"] == "empty", listed[idle]  # destroyed: the stack stays, empty


def test_reap_of_an_invalid_pool_exits_2_naming_the_file_and_field(tmp_path, capsys):
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(
        "p", factories.agent(), policies={"default": {"idle": {"timeout": "soon"}}}))
    assert cli.main(["pool", "reap", str(pool)]) == 2
    err = capsys.readouterr().err
    assert f"{pool}: policies.default.idle.timeout" in err, err
    assert cli.main(["pool", "reap", str(tmp_path / "missing.yaml")]) == 2


def test_reap_without_the_pulumi_cli_exits_4_saying_how_to_install_it(tmp_path, monkeypatch,
                                                                      capsys):
    from cluster_sessions.driver import stacks

    pool = factories.write(tmp_path / "pool.yaml", factories.pool("p", factories.agent()))
    monkeypatch.setattr(stacks, "find_pulumi", lambda environ: None)
    assert cli.main(["pool", "reap", str(pool), "--dry-run"]) == 4
    assert "pulumi" in capsys.readouterr().err
