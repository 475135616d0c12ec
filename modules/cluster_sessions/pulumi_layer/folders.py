"""Data folders as Pulumi dynamic resources: ``<root>/<folder>`` on one agent, made if missing
with the session user's uid and gid (agents/folders.py), and **never deleted**: ``destroy``
forgets the resource and leaves the directory and what is in it (Backend.AI's storage
folders outlive sessions). One resource per folder and agent the session uses; the session's
containers depend on them, so a refused folder stops ``up`` before any container is made.

Like the swarm resources, the provider holds only plain data and opens its connection inside
each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult

from ..agents.connectors import agent_props
from ..agents.folders import ensure_folder
from ..core.folders import folder_name_problem
from ..core.spec import Agent
from .engine_resource import EnsuredProvider, unknown


class DataFolderProvider(EnsuredProvider):
    """Makes (or adopts) one data folder on one agent; delete leaves it. An update (another
    owner or image) checks the folder, and makes it if it went, again."""

    INPUTS = ("agent", "image", "root", "folder", "uid", "gid")
    # A change to these is another directory: a new resource (the old one's delete leaves it).
    REPLACES = ("root", "folder", "agent")

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        folder = news.get("folder")
        if not unknown(folder) and (not isinstance(folder, str) or folder_name_problem(folder)):
            failures.append(CheckFailure("folder", "must be a folder name (core.folders)"))
        root = news.get("root")
        if not unknown(root) and (not isinstance(root, str) or not root.startswith("/")):
            failures.append(CheckFailure("root", "must be an absolute host directory"))
        return CheckResult(news, failures)

    def object_id(self, props: Mapping[str, Any]) -> str:
        return f"{props['agent']['name']}:{props['root']}/{props['folder']}"

    def ensure(self, props: Mapping[str, Any]) -> dict[str, Any]:
        with self.client(props) as client:
            outcome = ensure_folder(client, props["image"], props["root"], props["folder"],
                                    int(props["uid"]), int(props["gid"]))
        return {**props, "outcome": outcome}

    # read: the state's (base); delete: nothing, a data folder outlives its sessions (base)


class DataFolder(pulumi.dynamic.Resource):
    """``<root>/<folder>`` on ``agent``, owned by ``uid``:``gid``. Output ``outcome``: ``made``
    or ``kept`` (it was there, this user's directory)."""

    outcome: pulumi.Output[str]

    def __init__(self, name: str, agent: Agent, image: str, root: str, folder: str, uid: int,
                 gid: int, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(DataFolderProvider(), name, {
            "agent": agent_props(agent), "image": image, "root": root, "folder": folder,
            "uid": uid, "gid": gid, "outcome": None}, opts)
