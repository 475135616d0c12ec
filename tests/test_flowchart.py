"""The Mermaid picture of a placement in ``plan --markdown`` and ``diff``'s Markdown."""

from __future__ import annotations

import html
import re

import pytest

from cluster_sessions.core.flowchart import MAX_AGENTS, MAX_PER_AGENT, Box, label, placement_chart

LABEL = r'"((?:[A-Za-z0-9 _.,:/()+=@-]|#\d+;)*)"'
LINE = re.compile("|".join([
    r"flowchart LR",
    rf"  net\(\({LABEL}\)\)",
    rf"  subgraph a\d+ \[{LABEL}\]",
    rf"    a\d+(?:c\d+|more)\[{LABEL}\]",
    r"  end",
    r"  (?:a\d+|more) --- net",
    rf"  more\[{LABEL}\]",
]))

HOSTILE = [
    'x"] --> evil["pwned',
    "end",
    "```\n# not a heading",
    "<script>alert(1)</script>",
    "%%{init: {'securityLevel': 'loose'}}%%",
    "a;b#quot;c|d`e",
    "ünïcødé 名前",
]


def decoded(text: str) -> str:
    return html.unescape(re.sub(r"#(\d+);", r"&#\1;", text))


def check_syntax(chart: str) -> list[str]:
    """Every line one of the few shapes we write; returns the labels, decoded."""
    lines = chart.split("\n")
    assert lines[0] == "```mermaid" and lines[-1] == "```"
    labels = []
    for line in lines[1:-1]:
        match = LINE.fullmatch(line)
        assert match, f"not a line we write: {line!r}"
        labels += [decoded(g) for g in match.groups() if g is not None]
    return labels


def test_agents_hold_their_containers_and_link_to_the_named_network():
    chart = placement_chart([Box("main1", "a1"), Box("sub1", "a1"), Box("sub2", "a2", "add")],
                            "s-net", "overlay")
    assert chart.split("\n") == [
        "```mermaid", "flowchart LR",
        '  net(("overlay network s-net"))',
        '  subgraph a0 ["agent a1"]', '    a0c0["main1"]', '    a0c1["sub1"]', "  end",
        "  a0 --- net",
        '  subgraph a1 ["agent a2"]', '    a1c0["sub2 (add)"]', "  end",
        "  a1 --- net",
        "```"]


def test_nothing_placed_draws_nothing():
    assert placement_chart([], "net") == ""


@pytest.mark.parametrize("name", HOSTILE)
def test_a_crafted_name_stays_text_in_the_diagram(name):
    chart = placement_chart([Box(name, name, name)], name, name)
    labels = check_syntax(chart)
    assert f"agent {name}" in labels and f"{name} ({name})" in labels
    assert f"{name} network {name}" in labels
    assert chart.count("```") == 2
    assert "\n" not in label(name) and '"' not in label(name)[1:-1]


def test_the_same_placement_draws_the_same_text():
    boxes = [Box(f"sub{i}", f"agent{i % 3}") for i in range(20)]
    assert placement_chart(boxes, "n") == placement_chart(list(boxes), "n")


def test_a_big_session_is_folded_per_agent_and_beyond_a_few_agents():
    hosts = ["main1", *(f"sub{i}" for i in range(1, 128))]
    chart = placement_chart([Box(h, "a1") for h in hosts], "n", "bridge")
    labels = check_syntax(chart)
    assert len([x for x in chart.split("\n") if x.startswith("    a0")]) == MAX_PER_AGENT
    folded = 128 - (MAX_PER_AGENT - 1)
    assert f"sub{MAX_PER_AGENT - 1} … sub127 ({folded} more)" in labels
    many = placement_chart([Box(f"h{i}", f"agent{i}") for i in range(MAX_AGENTS + 12)], "n")
    labels = check_syntax(many)
    assert many.count("subgraph") == MAX_AGENTS
    assert "12 more agents, 12 containers" in labels
    assert len(many.split("\n")) < 60


def test_an_agent_with_exactly_the_most_shown_draws_them_all_and_folds_nothing():
    boxes = [Box(f"sub{i}", "a1") for i in range(MAX_PER_AGENT)]
    chart = placement_chart(boxes, None)
    labels = check_syntax(chart)
    assert labels == ["agent a1", *(f"sub{i}" for i in range(MAX_PER_AGENT))]
    assert "more" not in chart and "net" not in chart


def test_a_network_without_a_driver_is_shown_by_its_name_alone():
    assert '  net(("s-net"))' in placement_chart([Box("main1", "a1")], "s-net").split("\n")
