"""``sessionctl diff``: the review of a definition change, on the pairs in tests/fixtures/diff/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_sessions.core.plan import build_plan, build_plans
from cluster_sessions.core.review import (
    MAX_VALUE,
    Change,
    ContainerAction,
    NetworkAction,
    Review,
    changed,
    code,
    definition_fields,
    diff_plans,
    digest,
    plan_chart,
    plan_markdown,
    review_chart,
    review_to_dict,
    to_markdown,
)
from cluster_sessions.core.terminal import is_hidden
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.errors import Exit

from . import factories
from .factories import load_session

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
    assert [(c.host, c.action, c.old_agent, c.new_agent, c.why) for c in review.containers] == [
        ("main1", "same", "agent1", "agent1", ()), ("sub1", "same", "agent1", "agent1", ())]
    assert review.network.action == "same"
    assert review.summary == "train: no changes"


@pytest.mark.parametrize("file", PROJECT_SESSIONS, ids=lambda p: p.name)
def test_every_example_session_against_itself_is_unchanged(file):
    loaded = load_session(file)
    hosts = {a.name: a.docker_host for a in loaded.pool.agents}
    for plan in build_plans(loaded.session, loaded.pool):  # with count: each of the K
        assert not diff_plans(plan, plan, hosts, hosts).changed, plan.name


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
    # the GPUs are the hostfiles' default slots: the bundle up uploads changes with them
    assert why(review, "main1") == ("GPU ids", "rendered files")
    assert review.files == {"main1": ("cluster-hosts.sh",), "sub1": ("cluster-hosts.sh",)}


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
    assert [(c.what, c.old, c.new) for c in review.network.changes] == [
        ("agent1's docker_host", "unix:///var/run/docker.sock", "ssh://ops@gpu-box-2.example")]
    assert review.warnings == (
        "agent agent1 now points at ssh://ops@gpu-box-2.example (was unix:///var/run/docker.sock)"
        ": resources are recreated through the new host, and if that is another engine the old "
        "containers stay behind there; destroy with the old definition first.",)


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
    assert review.network == NetworkAction("train-net", "add", "bridge", "agent1")


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
    assert code("x" * 200) == f"`{'x' * 79}…` (200 characters, {digest('x' * 200)})"
    assert code(None) == "*(absent)*"


# --- a reviewer sees every change (issue 21, class 9) -------------------------------------------


def shown_line(md: str, start: str) -> str:
    return next(line for line in md.splitlines() if line.startswith(start))


def env_review(tmp_path, old_env: dict, new_env: dict, image=("img:1", "img:1")):
    base = (PAIRS / "env/old.yaml").read_text().replace(
        "pool: ../pools/one.yaml", f"pool: {PAIRS / 'pools/one.yaml'}")
    sides = []
    for env, img in zip((old_env, new_env), image, strict=True):
        text = "\n".join(line for line in base.splitlines()
                         if not line.startswith(("env:", "image:")))
        f = tmp_path / f"side{len(sides)}.yaml"
        f.write_text(text + f"\nimage: {json.dumps(img)}\nenv: {json.dumps(env)}\n")
        sides.append(side(f))
    (o, oh), (n, nh) = sides
    return diff_plans(o, n, oh, nh)


def test_two_values_that_differ_past_the_cut_never_look_equal(tmp_path):
    """Env values and definition fields (a table cell) that differ only after MAX_VALUE
    characters: each side says where they differ, its length and a digest, and the part
    shown holds the difference."""
    long = "x" * 150
    review = env_review(tmp_path, {"ARGS": long + "-old", "SAME": "1"},
                        {"ARGS": long + "-new", "SAME": "1"},
                        image=("registry.example/" + "a" * 120 + ":1",
                               "registry.example/" + "a" * 120 + ":2"))
    md = to_markdown(review)
    line = shown_line(md, "- `ARGS`:")
    old, new = line.split(" → ")
    assert old != new.rstrip()
    assert "-old" in old and "-new" in new and "changed after character 151" in line
    assert digest(long + "-old") in old and digest(long + "-new") in new
    row = shown_line(md, "| image |")
    old_cell, new_cell = row.split(" | ")[1:3]
    assert old_cell != new_cell and ":1`" in old_cell and ":2`" in new_cell
    assert "changed after character 138" in row


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200), st.integers(0, 200))
def test_any_two_different_values_are_shown_differently(a, b, prefix_len):
    prefix = (a * 3)[:prefix_len]
    old, new = prefix + a, prefix + b
    if old == new:
        return
    left, right = changed(old, new)
    assert left != right
    for shown in (left, right):  # one line, nothing a terminal acts on
        assert "\n" not in shown and not any(is_hidden(c) for c in shown)


def test_escaping_never_makes_two_values_look_alike():
    left, right = changed("a\nb", "a\\nb")  # a newline, and a backslash followed by n
    assert left != right and "changed after character 1" in left


def test_cut_values_are_never_cut_silently():
    assert code("y" * (MAX_VALUE + 1)).endswith(f"({MAX_VALUE + 1} characters, "
                                                f"{digest('y' * (MAX_VALUE + 1))})")
    assert code("y" * MAX_VALUE) == f"`{'y' * MAX_VALUE}`"


def test_credential_values_stay_hidden_but_their_change_shows(tmp_path):
    import hashlib

    review = env_review(tmp_path, {"WANDB_API_KEY": "k" * 100 + "1", "DB_PASSWORD": "same"},
                        {"WANDB_API_KEY": "k" * 100 + "2", "DB_PASSWORD": "other"})
    md = to_markdown(review)
    for var, values in {"WANDB_API_KEY": ("k" * 100 + "1", "k" * 100 + "2"),
                        "DB_PASSWORD": ("same", "other")}.items():
        line = shown_line(md, f"- `{var}`:")
        old, new = line.split(" → ")
        assert "hidden" in old and "hidden" in new and old != new.rstrip()
        for value in values:
            assert value not in md and "kkkk" not in md
            assert hashlib.sha256(value.encode()).hexdigest()[:12] not in md  # no plain hash
    assert to_markdown(review) != md  # digests are keyed per review: not matchable later


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


# --- the placement picture (Mermaid) -------------------------------------------------------------


def mermaid_block(md: str) -> list[str]:
    lines = md.split("\n")
    start = lines.index("```mermaid")
    return lines[start:lines.index("```", start) + 1]


def test_the_diff_pictures_the_placement_up_leaves_with_what_happens_to_each():
    md = to_markdown(review_of("spread"))
    block = mermaid_block(md)
    assert '  net(("overlay network ' in block[2]
    agents = [line for line in block if line.startswith("  subgraph")]
    assert agents == ['  subgraph a0 ["agent agent1"]', '  subgraph a1 ["agent agent2"]']
    assert '    a1c1["sub5 (add)"]' in block
    assert '    a0c0["main1 (replace)"]' in block


def test_a_pending_review_draws_no_placement():
    assert "```mermaid" not in to_markdown(review_of("pending"))


def test_a_deleted_definition_pictures_what_destroy_removes():
    md = to_markdown(review_of("added", old="new.yaml", new=None))
    assert "#### Placement now" in md
    assert '    a0c1["sub1 (remove)"]' in mermaid_block(md)


def test_plan_markdown_has_the_table_and_the_picture(capsys):
    assert main(["plan", str(PROJECT_SESSIONS[0].parent / "multi-demo.yaml"), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("### `sessionctl plan`: `multi-demo`")
    assert "| main1 | main | `agent1` |" in md
    block = mermaid_block(md)
    hosts = [line for line in block if re.fullmatch(r'    a\dc\d\["\w+"\]', line)]
    assert len(hosts) == 8


def test_plan_markdown_and_json_are_one_or_the_other(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(PROJECT_SESSIONS[0]), "--markdown", "--json"])
    assert exc.value.code == 2


def test_agents_named_like_mermaid_keywords_stay_labels(tmp_path, capsys):
    """Names are ASCII words here, but `end`, `subgraph` or `click` are Mermaid keywords: in
    an unquoted label `end` closes the subgraph. Ours are quoted, ids are our own."""
    names = ["end", "subgraph", "click"]
    pool = factories.pool("p", *(factories.agent(n, cpu=1, mem="2g") for n in names),
                          swarm={"manager": "end"})
    path = factories.write_pair(tmp_path, factories.session(
        "keywords", size=3, mode="multi-node", cpu=1, mem="1g"), pool)
    assert main(["plan", str(path), "--markdown"]) == 0
    block = mermaid_block(capsys.readouterr().out)
    assert [line for line in block if line.startswith("  subgraph")] == [
        f'  subgraph a{i} ["agent {n}"]' for i, n in enumerate(names)]
    assert block.count("  end") == 3


def test_a_crafted_agent_name_is_refused_before_any_markdown(tmp_path, capsys):
    path = factories.write_pair(tmp_path, factories.session("hostile", size=2),
                                factories.pool("p", factories.agent('a1"] --> x["pwn')))
    assert main(["plan", str(path), "--markdown"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "pool.yaml: agents.0.name:" in err


def test_plan_markdown_of_a_scheduled_plan_is_the_whole_document():
    """Title, status line, network, one row per container (GPU ids), the picture."""
    plan, _ = side(PAIRS / "gpu/new.yaml")
    assert plan_markdown(plan) == """\
### `sessionctl plan`: `train`

**scheduled**, single-node, 2 container(s), image `registry.example/pytorch:2.3`

Network `train-net` (bridge on `agent1`)

| host | role | agent | cpu | mem | shmem | gpus |
|---|---|---|---|---|---|---|
| main1 | main | `agent1` | 2 | 4g | 1g | 0,1 |
| sub1 | sub | `agent1` | 2 | 4g | 1g | 2,3 |

```mermaid
flowchart LR
  net(("bridge network train-net"))
  subgraph a0 ["agent agent1"]
    a0c0["main1"]
    a0c1["sub1"]
  end
  a0 --- net
```
"""


def test_plan_markdown_of_a_pending_plan_says_why_and_draws_nothing():
    plan, _ = side(PAIRS / "pending/new.yaml")
    rows = [f"| {h} | {'main' if h == 'main1' else 'sub'} | - | 2 | 4g | 1g | - |"
            for h in ["main1", *(f"sub{i}" for i in range(1, 12))]]
    assert plan_markdown(plan, name_from_file=True) == "\n".join([
        "### `sessionctl plan`: `train` (name from the file name)",
        "",
        "**pending**, single-node, 12 container(s), image `registry.example/pytorch:2.3`",
        "",
        "> ⚠️ pending: no single agent can hold all 12 containers (cpu=2, mem=4g, gpu=0 each): "
        "agent1 holds 8 (short of cpu)",
        "",
        "| host | role | agent | cpu | mem | shmem | gpus |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]) + "\n"
    assert plan_chart(plan) == ""


def full_review() -> Review:
    """A review with every part filled in, built by hand (review_to_dict is a pure mapping)."""
    return Review(
        name="train", old_name="train",
        containers=(ContainerAction("main1", "replace", "agent1", "agent2",
                                    ("network replaced", "moves agent1 -> agent2")),
                    ContainerAction("sub1", "add", None, "agent2", ("new host",))),
        network=NetworkAction("train-net", "replace", "overlay", "agent1",
                              (Change("driver", "bridge", "overlay"),)),
        definition=(Change("cluster.size", "1", "2"),),
        user_env=(Change("API_TOKEN", None, "t0k3n"), Change("DB_PASSWORD", "a\udcff", "b"),
                  Change("LR", "0.1", "0.2"), Change("WANDB_API_KEY", "k", None)),
        cluster_env=(Change("BACKENDAI_CLUSTER_SIZE", "1", "2"),),
        host_env={"main1": (Change("BACKENDAI_CLUSTER_HOST", "main1", "main2"),)},
        agents=(Change("agent1", "unix:///var/run/docker.sock", "ssh://ops@box"),),
        warnings=("agent agent1 now points at ssh://ops@box",),
    )


def test_the_json_review_is_the_whole_review_with_credentials_hidden():
    assert review_to_dict(full_review()) == {
        "session": "train",
        "old_session": "train",
        "summary": "train: containers 1 to add, 1 to replace; network replaced",
        "changed": True,
        "pending": False,
        "deleted": False,
        "containers": [
            {"host": "main1", "action": "replace", "old_agent": "agent1", "new_agent": "agent2",
             "why": ["network replaced", "moves agent1 -> agent2"]},
            {"host": "sub1", "action": "add", "old_agent": None, "new_agent": "agent2",
             "why": ["new host"]}],
        "network": {"name": "train-net", "action": "replace", "driver": "overlay",
                    "agent": "agent1",
                    "changes": [{"what": "driver", "old": "bridge", "new": "overlay"}]},
        "definition": [{"what": "cluster.size", "old": "1", "new": "2"}],
        "user_env": [{"what": "API_TOKEN", "old": None, "new": "[hidden]"},
                     {"what": "DB_PASSWORD", "old": "[hidden]", "new": "[hidden]"},
                     {"what": "LR", "old": "0.1", "new": "0.2"},
                     {"what": "WANDB_API_KEY", "old": "[hidden]", "new": None}],
        "cluster_env": [{"what": "BACKENDAI_CLUSTER_SIZE", "old": "1", "new": "2"}],
        "host_env": {"main1": [{"what": "BACKENDAI_CLUSTER_HOST", "old": "main1",
                                "new": "main2"}]},
        "agents": [{"what": "agent1", "old": "unix:///var/run/docker.sock",
                    "new": "ssh://ops@box"}],
        "files": {}, "left": False,
        "pool": [],
        "warnings": ["agent agent1 now points at ssh://ops@box"],
    }


def test_the_json_review_of_a_pending_definition_has_no_network():
    review = review_of("pending")
    doc = review_to_dict(review)
    assert doc["network"] is None and doc["pending"] is True
    assert doc["summary"] == "train: PENDING, `pulumi up` fails and changes nothing"


def hidden_digests(md: str) -> tuple[str, list[str]]:
    """The Markdown with each keyed digest (random per review) as ``<digest>``, and the digests."""
    pattern = r"digest ([0-9a-f]{12}), keyed"
    return re.sub(pattern, "digest <digest>, keyed", md), re.findall(pattern, md)


def test_the_markdown_review_is_the_whole_review_with_credentials_hidden():
    md, digests = hidden_digests(to_markdown(full_review()))
    secret = ("*(hidden: the name looks like a credential; digest <digest>, keyed for this "
              "review only)*")
    assert md == f"""\
### `sessionctl diff`: train

**train: containers 1 to add, 1 to replace; network replaced**

`old` → `new`

> ⚠️ agent agent1 now points at ssh://ops@box

Containers are deleted before their replacements start: the session is interrupted while `up` runs.

| host | agent | `pulumi up` | why |
|---|---|---|---|
| main1 | agent1 → agent2 | **replace** | network replaced, moves agent1 -> agent2 |
| sub1 | agent2 | add | new host |

#### Placement after the change

```mermaid
flowchart LR
  net(("overlay network train-net"))
  subgraph a0 ["agent agent2"]
    a0c0["main1 (replace, from agent1)"]
    a0c1["sub1 (add)"]
  end
  a0 --- net
```

#### Definition

| field | old | new |
|---|---|---|
| cluster.size | `1` | `2` |

#### Environment

User env (every container):

- added `API_TOKEN` = {secret}
- `DB_PASSWORD`: {secret} → {secret}
- `LR`: `0.1` → `0.2`
- removed `WANDB_API_KEY` (was {secret})

Cluster variables (every container that stays):

- `BACKENDAI_CLUSTER_SIZE`: `1` → `2`

Cluster variables of main1:

- `BACKENDAI_CLUSTER_HOST`: `main1` → `main2`

#### Network

`train-net` (overlay on agent1): **replaced**
- driver: `bridge` → `overlay`

#### Agents

- agent1 docker_host: `unix:///var/run/docker.sock` → `ssh://ops@box`
"""
    assert len(set(digests)) == 4  # four different values (one with a lone surrogate)


def test_the_review_of_a_size_change_says_why_every_container_is_replaced():
    assert to_markdown(review_of("size-grow"), "old.yaml", "new.yaml") == """\
### `sessionctl diff`: train

**train: containers 2 to add, 2 to replace; network kept**

`old.yaml` → `new.yaml`

> ⚠️ the session's shape changes (size 2 -> 4): `up` places it again on what the pool's \
agents hold then, so its containers may move to other agents than shown here.

`pulumi up` replaces **every** existing container: the cluster size changes, which rewrites \
each container's `BACKENDAI_CLUSTER_*` variables.

Containers are deleted before their replacements start: the session is interrupted while `up` runs.

| host | agent | `pulumi up` | why |
|---|---|---|---|
| main1 | agent1 | **replace** | cluster variables, rendered files |
| sub1 | agent1 | **replace** | cluster variables, rendered files |
| sub2 | agent1 | add | new host |
| sub3 | agent1 | add | new host |

#### Placement after the change

```mermaid
flowchart LR
  net(("bridge network train-net"))
  subgraph a0 ["agent agent1"]
    a0c0["main1 (replace)"]
    a0c1["sub1 (replace)"]
    a0c2["sub2 (add)"]
    a0c3["sub3 (add)"]
  end
  a0 --- net
```

#### Definition

| field | old | new |
|---|---|---|
| cluster.size | `2` | `4` |

#### Rendered files

What `up` uploads changes (the bundle's digest label with it):

- `static-env.sh`, `setup.sh`: main1, sub1

#### Environment

Cluster variables (every container that stays):

- `BACKENDAI_CLUSTER_HOSTS`: `main1,sub1` → `main1,sub1,sub2,sub3`
- `BACKENDAI_CLUSTER_REPLICAS`: `main:1,sub:1` → `main:1,sub:3`
- `BACKENDAI_CLUSTER_SIZE`: `2` → `4`

#### Network

`train-net` (bridge on agent1): kept
"""


def test_the_review_of_a_network_change_lists_each_changed_field():
    assert to_markdown(review_of("mtu")) == """\
### `sessionctl diff`: train

**train: containers 6 to replace; network replaced**

`old` → `new`

`pulumi up` replaces **every** existing container.

Containers are deleted before their replacements start: the session is interrupted while `up` runs.

| host | agent | `pulumi up` | why |
|---|---|---|---|
| main1 | agent1 | **replace** | network replaced |
| sub1 | agent1 | **replace** | network replaced |
| sub2 | agent1 | **replace** | network replaced |
| sub3 | agent1 | **replace** | network replaced |
| sub4 | agent2 | **replace** | network replaced |
| sub5 | agent2 | **replace** | network replaced |

#### Placement after the change

```mermaid
flowchart LR
  net(("overlay network train-net-mtu1400"))
  subgraph a0 ["agent agent1"]
    a0c0["main1 (replace)"]
    a0c1["sub1 (replace)"]
    a0c2["sub2 (replace)"]
    a0c3["sub3 (replace)"]
  end
  a0 --- net
  subgraph a1 ["agent agent2"]
    a1c0["sub4 (replace)"]
    a1c1["sub5 (replace)"]
  end
  a1 --- net
```

#### Network

`train-net-mtu1400` (overlay on agent1): **replaced**
- name: `train-net-mtu1450` → `train-net-mtu1400`
- mtu: `1450` → `1400`
"""


def test_the_review_of_an_in_place_update_interrupts_nothing():
    assert to_markdown(review_of("restart")) == """\
### `sessionctl diff`: train

**train: containers 3 to update in place; network kept**

`old` → `new`

| host | agent | `pulumi up` | why |
|---|---|---|---|
| main1 | agent1 | update in place | restart policy |
| sub1 | agent1 | update in place | restart policy |
| sub2 | agent1 | update in place | restart policy |

#### Placement after the change

```mermaid
flowchart LR
  net(("bridge network train-net"))
  subgraph a0 ["agent agent1"]
    a0c0["main1 (update)"]
    a0c1["sub1 (update)"]
    a0c2["sub2 (update)"]
  end
  a0 --- net
```

#### Definition

| field | old | new |
|---|---|---|
| restart | `unless-stopped` | `on-failure` |

#### Network

`train-net` (bridge on agent1): kept
"""


def test_the_review_of_a_deleted_definition_is_what_destroy_removes():
    assert to_markdown(review_of("added", old="new.yaml", new=None)) == """\
### `sessionctl diff`: train

**train: containers 2 to remove; network removed**

`old` → `new`

> ⚠️ the definition is deleted: nothing destroys its stack by itself; run `sessionctl destroy` \
on the old definition (the CI example does).

| host | agent | `sessionctl destroy` | why |
|---|---|---|---|
| main1 | agent1 | **remove** | definition deleted |
| sub1 | agent1 | **remove** | definition deleted |

#### Placement now

```mermaid
flowchart LR
  net(("bridge network train-net"))
  subgraph a0 ["agent agent1"]
    a0c0["main1 (remove)"]
    a0c1["sub1 (remove)"]
  end
  a0 --- net
```

#### Definition

| field | old | new |
|---|---|---|
| image | `registry.example/pytorch:2.3` | *(absent)* |
| cluster.mode | `single-node` | *(absent)* |
| cluster.size | `2` | *(absent)* |
| resources.cpu | `2` | *(absent)* |
| resources.mem | `4g` | *(absent)* |
| resources.shmem | `1g` | *(absent)* |
| resources.gpu | `0` | *(absent)* |
| mounts | `/srv/datasets:/home/work/datasets:ro` | *(absent)* |
| command | `sleep infinity` | *(absent)* |
| ports | `127.0.0.1:*->2200/tcp` | *(absent)* |
| services | `(none)` | *(absent)* |
| user | `work (9001:9001)` | *(absent)* |
| readiness.timeout | `120s` | *(absent)* |
| restart | `unless-stopped` | *(absent)* |
| distributed.master_port | `29500` | *(absent)* |
| project | `default` | *(absent)* |
| lifetime | `(policy's)` | *(absent)* |
| priority | `0` | *(absent)* |
| preemptible | `false` | *(absent)* |
| type | `interactive` | *(absent)* |
| distributed.slots | `(unset)` | *(absent)* |
| plan status | `scheduled` | *(absent)* |

#### Environment

User env (every container):

- removed `EXPERIMENT` (was `baseline`)
- removed `OMP_NUM_THREADS` (was `4`)

#### Network

`train-net` (bridge on agent1): **removed**
"""


def test_network_fields_are_spelled_for_a_reviewer():
    from dataclasses import replace

    old, hosts = side(PAIRS / "spread/new.yaml")  # overlay on agent1, MTU 1450
    new = replace(old, network=replace(old.network, agent=None, mtu=None, encrypted=True))
    review = diff_plans(old, new, hosts, hosts)
    assert [(c.what, c.old, c.new) for c in review.network.changes] == [
        ("agent", "agent1", "(none)"), ("mtu", "1450", "(engine default)"),
        ("encrypted", "no", "yes")]


def test_definition_fields_spell_each_field_a_reviewer_compares(tmp_path):
    pool = factories.pool("p", factories.agent("agent1"), storage={"nfs": "/srv/nfs"})
    doc = factories.session(
        "fields", image="img:2", cpu=1.5, mem="2g", command=["python", "train.py"],
        mounts=[{"source": "/srv/a", "target": "/data/a"},
                {"folder": "results", "target": "/data/results", "read_only": True}],
        ports=[{"container": 22, "host": 2222}, {"container": 80}],
        services=[{"name": "web", "port": 8080, "protocol": "http", "public": True},
                  {"name": "tb", "port": 6006, "preferred_port": 30606}],
        distributed={"master_port": 29400})
    plan, _ = side(factories.write_pair(tmp_path, doc, pool))
    assert definition_fields(plan) == {
        "image": "img:2", "cluster.mode": "single-node", "cluster.size": "1",
        "resources.cpu": "1.5", "resources.mem": "2g", "resources.shmem": "64m",
        "resources.gpu": "0",
        "mounts": ("/srv/a:/data/a", "folder results (/srv/nfs/results, kept after destroy)"
                   ":/data/results:ro"),
        "command": "python train.py",
        "ports": ("127.0.0.1:2222->22/tcp", "127.0.0.1:*->80/tcp"),
        "services": ("web=8080/http PUBLIC", "tb=6006/http preferred 30606"),
        "user": "work (9001:9001)", "readiness.timeout": "120s", "restart": "unless-stopped",
        "distributed.master_port": "29400",
        # the rest of the definition, from the model itself (the pool has rows of its own)
        "type": "interactive", "distributed.slots": "(unset)",
        "project": "default", "lifetime": "(policy's)", "priority": "0",
        "preemptible": "false",
        "plan status": "scheduled"}
    plan, _ = side(factories.write_pair(tmp_path, factories.session("bare"), pool))
    fields = definition_fields(plan)
    assert {k: fields[k] for k in ("mounts", "ports", "services", "distributed.master_port",
                                   "distributed.slots")} \
        == {"mounts": (), "ports": (), "services": (), "distributed.master_port": "(unset)",
            "distributed.slots": "(unset)"}


def test_diff_plans_refuses_two_empty_sides():
    with pytest.raises(ValueError) as exc:
        diff_plans(None, None)
    assert str(exc.value) == "nothing to compare: both sides are empty"


PENDING_BEFORE = ("the old definition was pending, so nothing of it can be running (unless an "
                  "earlier version was applied); every container is new.")


def test_the_warnings_of_a_pending_definition_word_for_word():
    assert review_of("pending").warnings == (
        "the new definition is PENDING: no single agent can hold all 12 containers (cpu=2, "
        "mem=4g, gpu=0 each): agent1 holds 8 (short of cpu). `pulumi up` fails before "
        "changing anything.",)
    # pending before, scheduled now: nothing ran, every container is added
    review = review_of("pending", old="new.yaml", new="old.yaml")
    assert review.warnings == (PENDING_BEFORE,)
    assert set(actions(review).values()) == {"add"}
    assert review_of("pending", old="new.yaml", new=None).warnings[0] == PENDING_BEFORE


def test_a_pending_definition_renamed_is_only_a_rename(tmp_path):
    from dataclasses import replace

    old, hosts = side(PAIRS / "pending/new.yaml")
    new, _ = side(PAIRS / "pending/old.yaml")
    renamed = replace(new, session=new.session.model_copy(update={"name": "train2"}))
    warnings = diff_plans(old, renamed, hosts, hosts).warnings
    assert len(warnings) == 1 and warnings[0].startswith("the session is renamed train -> train2")


def test_a_change_of_user_or_readiness_rewrites_the_rendered_files(tmp_path):
    """The bundle uploaded into each container carries the user and the readiness timeout:
    either alone replaces every container, for that reason alone."""
    pool = factories.pool("p", factories.agent("agent1"))
    base = factories.session("bundle", size=2)
    old, hosts = side(factories.write_pair(tmp_path, base, pool))
    for change in ({"user": {"name": "alice", "uid": 1234, "gid": 1234}},
                   {"readiness": {"timeout": 300}}):
        new, _ = side(factories.write_pair(tmp_path, {**base, **change}, pool))
        review = diff_plans(old, new, hosts, hosts)
        assert [(c.action, c.why) for c in review.containers] == [
            ("replace", ("rendered files",))] * 2, change
    both = {**base, "user": {"name": "alice", "uid": 1234, "gid": 1234},
            "readiness": {"timeout": 300}}
    new, _ = side(factories.write_pair(tmp_path, both, pool))
    assert [c.what for c in diff_plans(old, new, hosts, hosts).definition] == [
        "user", "readiness.timeout"]  # in the definition's order, not the alphabet's


def test_a_container_that_moves_to_another_agent_says_so(tmp_path):
    pool = factories.pool("p", factories.agent("agent1", cpu=4),
                          factories.agent("agent2", "ssh://ops@node2.example", cpu=4),
                          swarm={"manager": "agent1"})
    old, hosts = side(factories.write_pair(tmp_path, factories.session(
        "move", size=4, mode="multi-node", cpu=1), pool))
    new, _ = side(factories.write_pair(tmp_path, factories.session(
        "move", size=4, mode="multi-node", cpu=2), pool))
    review = diff_plans(old, new, hosts, hosts)
    assert [(c.host, c.action, c.old_agent, c.new_agent, c.why) for c in review.containers] == [
        ("main1", "replace", "agent1", "agent1", ("resources", "network replaced")),
        ("sub1", "replace", "agent1", "agent1", ("resources", "network replaced")),
        ("sub2", "replace", "agent1", "agent2",
         ("resources", "network replaced", "moves agent1 -> agent2")),
        ("sub3", "replace", "agent1", "agent2",
         ("resources", "network replaced", "moves agent1 -> agent2"))]


def test_an_argument_the_providers_schema_does_not_list_is_taken_to_replace(monkeypatch):
    """The safe guess: a review that says "replace" where the provider updates in place
    overstates; the other way round it would hide an interruption."""
    from cluster_sessions.core import provider_facts

    monkeypatch.delitem(provider_facts.CONTAINER_FORCE_NEW, "restart")
    assert set(actions(review_of("restart")).values()) == {"replace"}


def test_a_long_value_in_a_table_cell_keeps_its_pipes_escaped():
    value = "a|b" * 40  # 79 characters shown: 26 times "a|b", and "a"
    assert code(value, cell=True) == "`" + "a\\|b" * 26 + f"a…` (120 characters, {digest(value)})"


def test_an_agent_the_session_does_not_use_may_point_elsewhere_unremarked(tmp_path):
    pool = factories.pool("p", factories.agent("agent1"),
                          factories.agent("spare", "ssh://ops@spare.example"))
    path = factories.write_pair(tmp_path, factories.session("solo", size=2), pool)
    plan, hosts = side(path)
    assert {c.agent for c in plan.containers} == {"agent1"}
    review = diff_plans(plan, plan, hosts, {**hosts, "spare": "ssh://ops@other.example"})
    assert review.agents == () and review.warnings == () and not review.changed


def test_changes_particular_to_one_container_have_an_environment_section_of_their_own():
    review = Review(name="train", old_name="train", network=None, definition=(), user_env=(),
                    containers=(ContainerAction("main1", "same", "agent1", "agent1"),
                                ContainerAction("sub1", "replace", "agent1", "agent1",
                                                ("cluster variables",))),
                    cluster_env=(), agents=(),
                    host_env={"sub1": (Change("BACKENDAI_CLUSTER_LOCAL_RANK", "0", "1"),)})
    assert to_markdown(review) == """\
### `sessionctl diff`: train

**train: containers 1 to replace, 1 unchanged**

`old` → `new`

Containers are deleted before their replacements start: the session is interrupted while `up` runs.

| host | agent | `pulumi up` | why |
|---|---|---|---|
| main1 | agent1 | unchanged |  |
| sub1 | agent1 | **replace** | cluster variables |

#### Placement after the change

```mermaid
flowchart LR
  subgraph a0 ["agent agent1"]
    a0c0["main1"]
    a0c1["sub1 (replace)"]
  end
```

#### Environment

Cluster variables of sub1:

- `BACKENDAI_CLUSTER_LOCAL_RANK`: `0` → `1`
"""


def test_two_replaced_containers_of_two_are_every_container():
    md = to_markdown(review_of("moved"))
    assert "\n\n`pulumi up` replaces **every** existing container.\n\n" in md


# --- the helpers that show values, exactly ------------------------------------------------------

def test_a_digest_is_twelve_hex_digits_of_sha256_any_string_included():
    import hashlib

    assert digest("abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()[:12]
    lone = "\udcff"  # a lone surrogate (from a file read with surrogateescape) has a digest too
    assert digest(lone) == "sha256:" + hashlib.sha256(b"\xed\xb3\xbf").hexdigest()[:12]


@pytest.mark.parametrize(("text", "cell", "span"), [
    ("", False, "*(empty)*"), ("", True, "*(empty)*"),
    ("a`b", False, "``a`b``"), ("`a", False, "`` `a ``"), ("a`", False, "`` a` ``"),
    ("a|b", True, "`a\\|b`"), ("a|b", False, "`a|b`"),
])
def test_code_spans_pad_only_a_backtick_at_an_edge_and_escape_pipes_in_cells(text, cell, span):
    assert code(text, cell) == span


def test_changed_shows_an_absent_side_and_escapes_the_other_in_a_cell():
    assert changed(None, "a|b", cell=True) == ("*(absent)*", "`a\\|b`")
    assert changed("a|b", None, cell=True) == ("`a\\|b`", "*(absent)*")
    assert changed("a|b", "a|c", cell=True) == ("`a\\|b`", "`a\\|c`")
    assert changed(None, "x") == ("*(absent)*", "`x`")


def test_values_of_exactly_the_most_shown_are_shown_whole():
    old, new = "a" * MAX_VALUE, "a" * (MAX_VALUE - 1) + "b"
    assert changed(old, new) == (f"`{old}`", f"`{new}`")


def test_a_long_change_is_shown_from_a_quarter_window_before_where_it_differs():
    head = "0123456789" * 5  # the values differ after character 50
    old, new = head + "A" + "x" * 69, head + "B" + "x" * 69  # 120 characters each
    start = 50 - MAX_VALUE // 4  # 30
    shown = changed(old, new)
    for side, value in zip(shown, (old, new), strict=True):
        assert side == (f"`…{value[start:start + MAX_VALUE - 2]}…` (changed after character "
                        f"50; 120 characters, {digest(value)})")


def test_a_long_change_near_the_start_is_shown_from_the_start_and_pipes_stay_escaped():
    old, new = "|" * 10 + "A" + "x" * 89, "|" * 10 + "B" + "x" * 89  # differ after 10 of 100
    shown = changed(old, new, cell=True)
    cut = (old[:MAX_VALUE - 1]).replace("|", "\\|")
    assert shown[0] == f"`{cut}…` (changed after character 10; 100 characters, {digest(old)})"


@pytest.mark.parametrize(("start", "window"), [
    (0, "a" * 79 + "…"),
    (1, "…" + "a" * 78 + "…"),
    (22, "…" + "a" * 78),  # the last 78: nothing cut at the end
    (50, "…" + "a" * 78),  # never past the end
])
def test_a_window_of_a_long_value_marks_every_cut(start, window):
    text = "a" * 100
    assert code(text) == f"`{'a' * 79}…` (100 characters, {digest(text)})"
    from cluster_sessions.core.review import _window
    assert _window(text, start) == window
    assert _window("b" * MAX_VALUE, 5) == "b" * MAX_VALUE


def test_a_pending_definition_keeps_every_container_where_it_is_and_a_pending_new_one_adds_none():
    review = review_of("pending")
    assert [c.host for c in review.containers][:2] == ["main1", "sub1"]
    assert all(c == ContainerAction(c.host, "same", c.old_agent, c.old_agent,
                                    ("update fails: pending",))
               and c.old_agent for c in review.containers)
    assert review_chart(review) == ""
    fresh = review_of("pending", old=None)
    assert fresh.pending and fresh.containers == ()


def test_removed_hosts_keep_the_agent_they_leave_and_an_added_network_is_created():
    review = review_of("size-shrink")
    removed = [c for c in review.containers if c.action == "remove"]
    assert removed and all(c.old_agent and c.new_agent is None for c in removed)
    added = review_of("size-shrink", old=None)
    assert f"{code(added.network.name)} (" in to_markdown(added)
    assert to_markdown(added).split(f"{code(added.network.name)} (")[1].split("\n")[0] \
        .endswith("): created")


def hand_built(**over) -> Review:
    fields = dict(name="s", old_name="s", containers=(), network=None, definition=(),
                  user_env=(), cluster_env=(), host_env={}, agents=())
    return Review(**{**fields, **over})


def test_a_hand_built_review_shows_pipes_in_cells_and_a_network_without_an_agent():
    review = hand_built(
        containers=(ContainerAction("sub9", "add", None, None, ("new host",)),
                    ContainerAction("main1", "same", "a1", "a1")),
        network=NetworkAction("s-net", "same", None, None),
        definition=(Change("command", "a|b", "c|d"),))
    md = to_markdown(review)
    assert "| command | `a\\|b` | `c\\|d` |" in md.splitlines()
    assert "| sub9 | - | add | new host |" in md.splitlines()  # no agent yet: a dash
    assert "`s-net` (?): kept" in md.splitlines()
    chart = review_chart(review)  # the host with no agent is left out, the others drawn
    assert '    a0c0["main1"]' in chart.splitlines() and "sub9" not in chart
    assert '  net(("s-net"))' in chart.splitlines()
    bridge = hand_built(network=NetworkAction("s-net", "add", "bridge", None))
    assert "`s-net` (bridge): created" in to_markdown(bridge).splitlines()


SHAPE_WARNING = "the session's shape changes"


@pytest.mark.parametrize("case, says", [
    ("memory", f"mem {4 * 2**30} -> {8 * 2**30}"), ("gpu", "gpu 1 -> 2"),
    ("size-grow", "size 2 -> 4")])
def test_a_change_of_shape_says_up_places_the_session_again(case, says):
    review = review_of(case)
    shape = [w for w in review.warnings if w.startswith(SHAPE_WARNING)]
    assert len(shape) == 1 and says in shape[0], review.warnings
    assert "places it again on what the pool's agents hold then" in shape[0]


@pytest.mark.parametrize("case", ["image", "env"])
def test_a_change_that_keeps_the_shape_keeps_the_placement(case):
    assert not [w for w in review_of(case).warnings if w.startswith(SHAPE_WARNING)]
