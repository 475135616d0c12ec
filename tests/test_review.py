"""``sessionctl diff``: the review of a definition change, on the pairs in tests/fixtures/diff/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster_sessions.core.loader import load_session
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.review import code, diff_plans, review_to_dict, to_markdown
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit

PAIRS = Path(__file__).parent / "fixtures" / "diff"
PROJECT_SESSIONS = sorted((Path(__file__).parent.parent / "stacks" / "sessions").glob("*.yaml"))


def side(file: Path | None):
    if file is None:
        return None, {}
    loaded = load_session(file)
    return (build_plan(loaded.session, loaded.pool),
            {a.name: a.docker_host for a in loaded.pool.agents})


def review_of(case: str, old: str | None = "old.yaml", new: str | None = "new.yaml"):
    (o, oh), (n, nh) = (side(PAIRS / case / old if old else None),
                        side(PAIRS / case / new if new else None))
    return diff_plans(o, n, oh, nh)


def actions(review) -> dict[str, str]:
    return {c.host: c.action for c in review.containers}


def why(review, host: str) -> tuple[str, ...]:
    return next(c.why for c in review.containers if c.host == host)


def test_identical_definitions_change_nothing():
    review = review_of("identical")
    assert not review.changed
    assert actions(review) == {"main1": "same", "sub1": "same"}
    assert review.network.action == "same"
    assert review.summary == "train: no changes"


@pytest.mark.parametrize("file", PROJECT_SESSIONS, ids=lambda p: p.name)
def test_every_example_session_against_itself_is_unchanged(file):
    plan, hosts = side(file)
    assert not diff_plans(plan, plan, hosts, hosts).changed


def test_growing_the_cluster_replaces_every_existing_container():
    review = review_of("size-grow")
    assert actions(review) == {"main1": "replace", "sub1": "replace", "sub2": "add",
                               "sub3": "add"}
    assert "cluster variables" in why(review, "main1")
    shared = {c.what: (c.old, c.new) for c in review.cluster_env}
    assert shared == {"BACKENDAI_CLUSTER_SIZE": ("2", "4"),
                      "BACKENDAI_CLUSTER_HOSTS": ("main1,sub1", "main1,sub1,sub2,sub3"),
                      "BACKENDAI_CLUSTER_REPLICAS": ("main:1,sub:1", "main:1,sub:3")}
    assert review.host_env == {}  # nothing particular to one container
    assert review.network.action == "same"
    assert review.summary == "train: containers 2 to add, 2 to replace; network kept"
    md = to_markdown(review)
    assert "replaces **every** existing container: the cluster size changes" in md
    assert "| cluster.size | `2` | `4` |" in md


def test_shrinking_removes_the_last_hosts_and_replaces_the_rest():
    review = review_of("size-shrink")
    assert actions(review) == {"main1": "replace", "sub1": "replace", "sub2": "remove",
                               "sub3": "remove"}
    assert why(review, "sub2") == ("host no longer in the session",)


def test_env_changes_replace_all_and_hide_credential_values():
    review = review_of("env")
    assert set(actions(review).values()) == {"replace"}
    assert why(review, "sub2") == ("user env",)
    changes = {c.what: (c.old, c.new) for c in review.user_env}
    assert changes == {"DEBUG": ("1", None), "EXPERIMENT": ("baseline", "lr sweep | 2"),
                       "LR": (None, "0.1"), "WANDB_API_KEY": ("old-key", "new-key")}
    assert review.cluster_env == ()
    md = to_markdown(review)
    assert "- added `LR` = `0.1`" in md
    assert "- removed `DEBUG` (was `1`)" in md
    assert "- `EXPERIMENT`: `baseline` → `lr sweep | 2`" in md
    assert "old-key" not in md and "new-key" not in md
    assert "old-key" not in json.dumps(review_to_dict(review))


def test_image_change_replaces_every_container():
    review = review_of("image")
    assert set(actions(review).values()) == {"replace"}
    assert why(review, "main1") == ("image",)


def test_memory_change_replaces_because_labels_carry_it():
    review = review_of("memory")
    assert set(actions(review).values()) == {"replace"}
    assert why(review, "sub1") == ("resources",)


def test_gpu_change_replaces_with_new_gpu_ids():
    review = review_of("gpu")
    assert set(actions(review).values()) == {"replace"}
    assert why(review, "main1") == ("GPU ids",)


def test_restart_policy_is_the_one_in_place_update():
    review = review_of("restart")
    assert set(actions(review).values()) == {"update"}
    assert review.summary == "train: containers 3 to update in place; network kept"


def test_ports_change_replaces_only_main1():
    review = review_of("ports")
    assert actions(review) == {"main1": "replace", "sub1": "same", "sub2": "same"}
    assert why(review, "main1") == ("published ports",)


def test_spreading_to_a_second_agent_replaces_the_network_and_everything_on_it():
    review = review_of("spread")
    assert review.network.action == "replace"
    assert [(c.what, c.old, c.new) for c in review.network.changes] == [
        ("driver", "bridge", "overlay")]
    assert actions(review) == {"main1": "replace", "sub1": "replace", "sub2": "replace",
                               "sub3": "replace", "sub4": "add", "sub5": "add"}
    assert "network replaced" in why(review, "sub3")
    assert {c.host: c.new_agent for c in review.containers}["sub5"] == "agent2"


def test_pool_mtu_change_replaces_network_and_all_containers():
    review = review_of("mtu")
    assert review.definition == ()  # the session did not change; its pool did
    # the MTU is part of the network's name: another MTU is another network (issue 20)
    assert [(c.what, c.old, c.new) for c in review.network.changes] == [
        ("name", "train-net-mtu1450", "train-net-mtu1400"), ("mtu", "1450", "1400")]
    assert set(actions(review).values()) == {"replace"}
    assert all(why(review, h) == ("network replaced",) for h in actions(review))


def test_an_agent_pointing_at_another_engine_is_flagged():
    review = review_of("moved")
    assert [(c.what, c.old, c.new) for c in review.agents] == [
        ("agent1", "unix:///var/run/docker.sock", "ssh://ops@gpu-box-2.example")]
    assert set(actions(review).values()) == {"replace"}
    assert "agent1's docker_host" in why(review, "main1")
    assert any("old containers stay behind" in w for w in review.warnings)


def test_a_renamed_session_is_a_new_stack_and_the_old_one_keeps_running():
    review = review_of("rename")
    assert actions(review) == {"main1": "add", "sub1": "add"}
    assert review.network.action == "add"
    assert any("leaves train running" in w for w in review.warnings)


def test_a_pending_new_definition_changes_nothing():
    review = review_of("pending")
    assert review.pending
    assert set(actions(review).values()) == {"same"}
    assert review.network is None
    assert review.summary == "train: PENDING, `pulumi up` fails and changes nothing"
    assert "no single agent can hold all 12 containers" in to_markdown(review)


def test_an_added_file_creates_everything():
    review = review_of("added", old=None)
    assert actions(review) == {"main1": "add", "sub1": "add"}
    assert review.network.action == "add"


def test_a_deleted_file_removes_everything_through_destroy():
    review = review_of("added", old="new.yaml", new=None)
    assert review.deleted
    assert actions(review) == {"main1": "remove", "sub1": "remove"}
    md = to_markdown(review)
    assert "| host | agent | `sessionctl destroy` | why |" in md
    assert "run `sessionctl destroy` on the old definition" in md


def test_code_spans_survive_backticks_pipes_and_newlines():
    assert code("a`b") == "``a`b``"
    assert code("`x`") == "`` `x` ``"
    assert code("a|b") == "`a|b`"
    assert code("a|b", cell=True) == "`a\\|b`"
    assert code("two\nlines") == "`two\\nlines`"
    assert code("x" * 200).endswith("…`")
    assert code(None) == "*(absent)*"


# --- the verb ------------------------------------------------------------------------------------


def test_diff_verb_prints_markdown_and_exits_0(capsys):
    assert main(["diff", str(PAIRS / "size-grow/old.yaml"),
                 str(PAIRS / "size-grow/new.yaml")]) == Exit.OK
    out = capsys.readouterr().out
    assert out.startswith("### `sessionctl diff`: train\n")
    assert "| sub2 | agent1 | add | new host |" in out


def test_exit_code_flag_reports_changes_like_git_diff(capsys):
    same = [str(PAIRS / "identical/old.yaml"), str(PAIRS / "identical/new.yaml")]
    changed = [str(PAIRS / "image/old.yaml"), str(PAIRS / "image/new.yaml")]
    assert main(["diff", *same, "--exit-code"]) == 0
    assert main(["diff", *changed, "--exit-code"]) == 1
    assert main(["diff", *changed]) == 0


def test_dev_null_stands_for_a_missing_side(capsys):
    assert main(["diff", "/dev/null", str(PAIRS / "added/new.yaml"), "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    assert [c["action"] for c in doc["containers"]] == ["add", "add"]
    assert main(["diff", "/dev/null", "-"]) == Exit.INVALID


def test_pool_options_override_each_side(capsys):
    old = PAIRS / "mtu/old.yaml"
    assert main(["diff", str(old), str(old), "--new-pool", str(PAIRS / "pools/two-mtu.yaml"),
                 "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["network"]["action"] == "replace"


def test_invalid_side_exits_2_with_the_problem(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((PAIRS / "image/new.yaml").read_text().replace("image:", "imgae:")
                   .replace("pool: ../pools/one.yaml", f"pool: {PAIRS / 'pools/one.yaml'}"))
    assert main(["diff", str(PAIRS / "image/old.yaml"), str(bad)]) == Exit.INVALID
    assert "imgae: unknown key" in capsys.readouterr().err
