"""A small Mermaid ``flowchart`` of a placement, for ``plan --markdown`` and ``diff``'s Markdown.

Agents are subgraphs holding their containers; the network is one node linked to each agent.
GitHub and GitLab draw a fenced ``mermaid`` block in a pull request, so a reviewer sees the
shape of a session at a glance.

Names come from definitions, so nothing of a name reaches the diagram's syntax: node ids are
ours (``a0``, ``a0c1``, ``net``), and each label is quoted with every character outside a
small safe set written as a Mermaid entity code (``#35;``). A crafted name (quotes, brackets,
``end``, backticks that would close the fence, newlines, ``<script>``) stays text. The output
depends only on its input (order as given), and stays small: at most :data:`MAX_PER_AGENT`
nodes per agent and :data:`MAX_AGENTS` agents, the rest folded into one node each
(``sub5 … sub127 (123 more)``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_PER_AGENT = 6
MAX_AGENTS = 8

_SAFE = re.compile(r"[A-Za-z0-9 _.,:/()+=@-]")


@dataclass(frozen=True)
class Box:
    """One container in the picture: its host, where it goes, and a note (``replace``)."""

    host: str
    agent: str
    note: str = ""


def label(text: str) -> str:
    """A quoted Mermaid label: safe characters as they are, every other one an entity code."""
    return '"' + "".join(ch if _SAFE.fullmatch(ch) else f"#{ord(ch)};" for ch in text) + '"'


def _folded(hosts: Sequence[Box]) -> str:
    return f"{hosts[0].host} … {hosts[-1].host} ({len(hosts)} more)"


def placement_chart(boxes: Sequence[Box], network: str | None, network_driver: str = ""
                    ) -> str:
    """The fenced Mermaid block (no trailing newline); empty when there is nothing placed."""
    if not boxes:
        return ""
    by_agent: dict[str, list[Box]] = {}
    for b in boxes:
        by_agent.setdefault(b.agent, []).append(b)
    agents = list(by_agent)
    lines = ["```mermaid", "flowchart LR"]
    if network:
        shown = f"{network_driver} network {network}" if network_driver else network
        lines.append(f"  net(({label(shown)}))")
    for i, agent in enumerate(agents[:MAX_AGENTS]):
        here = by_agent[agent]
        lines.append(f"  subgraph a{i} [{label('agent ' + agent)}]")
        shown_boxes = here if len(here) <= MAX_PER_AGENT else here[:MAX_PER_AGENT - 1]
        for j, b in enumerate(shown_boxes):
            text = f"{b.host} ({b.note})" if b.note else b.host
            lines.append(f"    a{i}c{j}[{label(text)}]")
        if len(here) > MAX_PER_AGENT:
            lines.append(f"    a{i}more[{label(_folded(here[MAX_PER_AGENT - 1:]))}]")
        lines.append("  end")
        if network:
            lines.append(f"  a{i} --- net")
    rest = agents[MAX_AGENTS:]
    if rest:
        count = sum(len(by_agent[a]) for a in rest)
        lines.append(f"  more[{label(f'{len(rest)} more agents, {count} containers')}]")
        if network:
            lines.append("  more --- net")
    lines.append("```")
    return "\n".join(lines)
