"""One image on every agent (issue 33), the pure parts: references and their pinned form, the
kept ``image`` decision, why an engine's error failed a pull, a pull's progress from the
engine's events and how it is shown, and where credentials come from."""

from __future__ import annotations

import base64
import io
import json

import pytest
import yaml

from cluster_sessions.agents.images import (
    Held,
    ImageAuthError,
    RegistryAuthInvalid,
    differing,
    held_of,
    registry_auth,
    same_local,
)
from cluster_sessions.core import images
from cluster_sessions.core.container_args import container_args
from cluster_sessions.core.decisions import KEPT_KEYS, KeptImage, image_reason, read_kept
from cluster_sessions.core.errors import Exit
from cluster_sessions.core.images import PullProgress, cause_of, tenths_crossed
from cluster_sessions.core.names import IMAGE_KEY
from cluster_sessions.core.plan import build_plans, plan_to_dict, with_image
from cluster_sessions.core.spec import Pool, Session
from cluster_sessions.driver.image_step import PullReport

from . import factories

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


@pytest.mark.parametrize(("ref", "parts"), [
    ("img", ("img", None, None)),
    ("debian:12", ("debian", "12", None)),
    ("reg.example:5000/team/img", ("reg.example:5000/team/img", None, None)),
    ("reg.example:5000/team/img:2.3", ("reg.example:5000/team/img", "2.3", None)),
    (f"reg.example:5000/img:2.3@{DIGEST}", ("reg.example:5000/img", "2.3", DIGEST)),
    (f"img@{DIGEST}", ("img", None, DIGEST)),
])
def test_a_reference_splits_as_docker_reads_it(ref, parts):
    assert images.split_reference(ref) == parts


@pytest.mark.parametrize(("ref", "registry"), [
    ("pytorch/pytorch:2.3", "docker.io"), ("debian", "docker.io"),
    ("reg.example/pytorch:2.3", "reg.example"), ("10.0.0.1:5000/x:1", "10.0.0.1:5000"),
    ("localhost/x", "localhost"),
])
def test_the_registry_of_a_reference_is_its_first_component_when_that_is_a_host(ref, registry):
    assert images.registry_of(ref) == registry


def test_the_pinned_reference_drops_the_tag_and_names_the_digest():
    assert images.pinned_reference("reg:5000/a/b:1", DIGEST) == f"reg:5000/a/b@{DIGEST}"


def test_a_kept_image_reads_back_what_it_wrote_and_pins_registry_and_local_images():
    kept = KeptImage("reg:5000/a:1", DIGEST)
    assert read_kept(IMAGE_KEY, kept.to_config()) == kept
    assert kept.pinned == f"reg:5000/a@{DIGEST}"
    local = KeptImage("built:latest", OTHER, local=True)
    assert read_kept(IMAGE_KEY, local.to_config()) == local
    assert local.pinned == OTHER
    assert read_kept(IMAGE_KEY, None) is None and read_kept(IMAGE_KEY, "") is None
    assert IMAGE_KEY in KEPT_KEYS


@pytest.mark.parametrize("text", [
    "[]", '{"ref":"a","digest":"sha256:12","local":false}',
    json.dumps({"ref": "a", "digest": DIGEST}),
    json.dumps({"ref": "a b", "digest": DIGEST, "local": False}),
    json.dumps({"ref": "a", "digest": DIGEST, "local": "no"}),
    json.dumps({"ref": "a", "digest": DIGEST, "local": False, "more": 1}),
])
def test_a_kept_image_that_is_not_one_sessionctl_wrote_is_refused(text):
    with pytest.raises(ValueError):
        read_kept(IMAGE_KEY, text)


def test_a_kept_image_holds_until_the_reference_changes_or_a_refresh_is_asked():
    kept = KeptImage("reg:5000/a:1", DIGEST)
    assert image_reason(kept, "reg:5000/a:1") is None
    assert "changed" in image_reason(kept, "reg:5000/a:2")
    assert image_reason(kept, "reg:5000/a:1", refresh=True) == "--refresh-image"
    assert image_reason(None, "reg:5000/a:1") == "it has not been resolved yet"


def plan_of(image: str = "reg:5000/a:1"):
    pool = Pool.model_validate(factories.pool("p", factories.agent("a1"), factories.agent("a2"),
                                              swarm={"manager": "a1"}))
    doc = factories.session("sess", pool="p", image=image, size=2, mode="multi-node", cpu=8)
    return build_plans(Session.model_validate(doc), pool)[0]


def test_every_container_is_created_from_the_pinned_image_and_the_plan_shows_it():
    plan = plan_of()
    assert len(plan.agents) == 2
    assert {container_args(plan, c).image for c in plan.containers} == {"reg:5000/a:1"}
    pinned = with_image(plan, f"reg:5000/a@{DIGEST}")
    assert {container_args(pinned, c).image for c in pinned.containers} == {
        f"reg:5000/a@{DIGEST}"}
    doc = plan_to_dict(pinned)
    assert doc["image"] == "reg:5000/a:1" and doc["image_pinned"] == f"reg:5000/a@{DIGEST}"
    assert "image_pinned" not in plan_to_dict(plan)


@pytest.mark.parametrize(("text", "cause"), [
    ("Head \"https://reg/v2/a/manifests/1\": no basic auth credentials", images.AUTH),
    ("unauthorized: authentication required", images.AUTH),
    ("manifest for reg/a:9 not found: manifest unknown", images.NOT_FOUND),
    ("write /var/lib/docker/tmp/x: no space left on device", images.NO_SPACE),
    ("Get \"https://reg:5000/v2/\": dial tcp 10.0.0.1:5000: connect: connection refused",
     images.UNREACHABLE),
    ("something else", images.ENGINE),
])
def test_an_engine_error_names_its_cause(text, cause):
    assert cause_of(text) == cause


def events(*layers: tuple[str, int], steps: int = 4):
    """A pull's events as the engine sends them: per layer, Pulling fs layer, then Downloading
    in ``steps`` steps, then Pull complete."""
    yield {"status": "Pulling from a", "id": "1"}
    for layer, _ in layers:
        yield {"status": "Pulling fs layer", "id": layer, "progressDetail": {}}
    for layer, size in layers:
        for k in range(1, steps + 1):
            yield {"status": "Downloading", "id": layer,
                   "progressDetail": {"current": size * k // steps, "total": size}}
        yield {"status": "Pull complete", "id": layer, "progressDetail": {}}
    yield {"status": f"Digest: {DIGEST}"}


def test_a_pulls_progress_counts_bytes_of_every_layer():
    p = PullProgress("a1")
    seen = []
    for e in events(("l1", 100), ("l2", 300)):
        p.feed(e)
        seen.append(p.percent())
    assert seen == sorted(seen)  # never goes back
    assert p.current == p.total == 400 and len(p.done_layers) == 2
    assert p.percent() == 99  # 100 only once the engine holds the image
    p.status = "done"
    assert p.percent() == 100
    assert "a1:" in p.line() and "2/2 layers" in p.line()


def test_a_pull_error_event_fails_the_progress_with_the_engine_words():
    p = PullProgress("a1")
    p.feed({"error": "x", "errorDetail": {"message": "unauthorized: authentication required"}})
    assert p.status == "failed" and "unauthorized" in p.error


def test_tenths_are_crossed_once_each():
    assert tenths_crossed(0, 25) == [10, 20]
    assert tenths_crossed(25, 25) == []
    assert tenths_crossed(95, 100) == [100]


def test_without_a_terminal_a_pull_shows_a_line_per_agent_per_ten_percent():
    out = io.StringIO()
    report = PullReport("sessionctl up", "a:1", ["a1"], "lines", out)
    p = PullProgress("a1")
    for e in events(("l1", 1000), steps=100):
        p.feed(e)
        report.update(p)
    p.status = "done"
    report.update(p)
    lines = out.getvalue().splitlines()
    assert all(line.startswith("sessionctl up: a1:") for line in lines)
    # the first, one per tenth crossed (10..90, and 99 at the last byte), and done
    assert 10 <= len(lines) <= 13, lines
    assert lines[-1].split()[3] == "100%"


def test_with_json_a_pull_shows_an_event_per_ten_percent():
    out = io.StringIO()
    report = PullReport("sessionctl up", "a:1", ["a1", "a2"], "json", out)
    for agent in ("a1", "a2"):
        p = PullProgress(agent)
        for e in events(("l1", 1000), steps=50):
            p.feed(e)
            report.update(p)
        p.status = "done"
        report.update(p)
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {d["agent"] for d in docs} == {"a1", "a2"}
    assert all(d["event"] == "pull" and d["image"] == "a:1" for d in docs)
    a1 = [d["percent"] for d in docs if d["agent"] == "a1"]
    assert a1 == sorted(a1) and a1[-1] == 100 and len(a1) <= 13


def test_on_a_terminal_each_agent_has_one_line_redrawn_in_place():
    out = io.StringIO()
    report = PullReport("sessionctl up", "a:1", ["a1", "a2"], "tty", out)
    report.REDRAW = 0
    p = PullProgress("a1")
    for e in events(("l1", 100)):
        p.feed(e)
        report.update(p)
    q = PullProgress("a2")
    q.status = "present"
    report.update(q)
    text = out.getvalue()
    assert "\x1b[2F" in text  # back up over the two lines
    last = text.rsplit("\x1b[2F", 1)[-1]
    assert "a1:" in last and "a2: 100%" in last and "present" in last


def test_present_and_differing_holdings_are_told_apart():
    same = [Held("a1", OTHER), Held("a2", OTHER)]
    assert same_local(same) == OTHER
    assert same_local([Held("a1", OTHER), Held("a2", DIGEST)]) is None
    assert same_local([Held("a1", OTHER), Held("a2")]) is None
    assert differing([Held("a1", OTHER), Held("a2")]) == f"a1 {OTHER[:19]}…, a2 none"
    assert held_of("a1", None) == Held("a1")
    assert held_of("a1", {"Id": OTHER, "RepoDigests": [f"r/a@{DIGEST}"]}).repo_digests


def test_credentials_come_from_the_named_docker_config_file_and_are_not_shown(tmp_path):
    config = tmp_path / "config.json"
    token = base64.b64encode(b"alice:s3cret").decode()
    config.write_text(json.dumps({"auths": {"10.0.0.1:5000": {"auth": token}}}))
    found = registry_auth("10.0.0.1:5000/a:1", config)
    assert found["username"] == "alice" and found["password"] == "s3cret"
    assert registry_auth("other.example/a:1", config) is None


def test_an_unreadable_registry_auth_file_is_invalid_input_naming_the_field(tmp_path):
    with pytest.raises(RegistryAuthInvalid) as caught:
        registry_auth("a", tmp_path / "missing.json", source="pool.yaml: registry_auth."
                      "config_file")
    assert str(caught.value).startswith("pool.yaml: registry_auth.config_file: cannot read")
    assert caught.value.code == Exit.INVALID
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(RegistryAuthInvalid, match="not a docker config file"):
        registry_auth("a", bad)


def test_refused_credentials_exit_4():
    assert ImageAuthError("x", images.AUTH).code == Exit.MISSING


def test_a_pool_names_its_registry_auth_and_unknown_keys_there_are_errors():
    doc = factories.pool("p", factories.agent("a1"), registry_auth={"config_file": "auth.json"})
    assert Pool.model_validate(doc).registry_auth.config_file == "auth.json"
    doc["registry_auth"]["password"] = "x"
    with pytest.raises(ValueError):
        Pool.model_validate(doc)


def test_plan_json_shows_the_image_the_stack_keeps_beside_the_project(tmp_path, monkeypatch,
                                                                       capsys):
    from cluster_sessions.driver import cli

    project = tmp_path / "proj"
    (project / "stacks").mkdir(parents=True)
    (project / "Pulumi.yaml").write_text("name: cluster-sessions\nruntime: python\n")
    pool = factories.write(project / "pool.yaml", factories.pool("p", factories.agent("a1")))
    path = factories.write(project / "sess.yaml",
                           factories.session("sess", pool=str(pool), image="reg:5000/a:1"))
    monkeypatch.chdir(project)
    assert cli.main(["plan", str(path), "--json"]) == 0
    assert "image_pinned" not in json.loads(capsys.readouterr().out)
    kept = KeptImage("reg:5000/a:1", DIGEST)
    (project / "stacks" / "Pulumi.sess.yaml").write_text(
        yaml.safe_dump({"config": {"cluster-sessions:image": kept.to_config()}}))
    assert cli.main(["plan", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["image_pinned"] == f"reg:5000/a@{DIGEST}"


def test_the_redraw_passes_the_terminal_guard_and_a_hostile_text_does_not():
    from cluster_sessions.core.terminal import TerminalGuard

    raw = io.StringIO()
    report = PullReport("sessionctl up", "a:1", ["a1"], "tty", TerminalGuard(raw))
    p = PullProgress("a1")
    p.status = "failed"
    p.error = "denied\x1b[31m\x07"  # the engine's words, shown, never obeyed
    report.update(p)
    report.update(p)
    text = raw.getvalue()
    assert "\x1b[1F\x1b[2K" in text  # the cursor moves reach the terminal
    assert "\x07" not in text and "\x1b[31m" not in text
