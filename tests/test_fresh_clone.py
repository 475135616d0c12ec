"""CI applies definitions from a fresh clone every time (issue 41, item 2): the stack's backend
is the truth of what its stack decided (stack id, who made it, placement, image, service
ports), so ``up``, ``preview`` and ``destroy`` from any clone agree, and no clone's checkout
needs a stack file that another run wrote.

Each "clone" is a project directory of its own (``Pulumi.yaml``, the program ``__main__.py``,
the set-up's ``.venv`` and an empty ``stacks/``, where the CLI keeps a stack's config); one
file backend; the installed ``sessionctl`` in a process of its own, as CI runs it, through the
real ``pulumi`` CLI (the ``real_engine`` fixture: the CLI built by scripts/install-pulumi.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_sessions.core.names import LABEL_PREFIX

from . import factories
from .conftest import PROJECT
from .test_runtime import image, unique  # noqa: F401 (a fixture, used by name)

pytestmark = pytest.mark.docker

SESSIONCTL = str(Path(sys.executable).with_name("sessionctl"))


def fresh_clone(path):
    """What a clone holds for the CLI: the project file, the program, the set-up's virtualenv
    (the project's ``.venv``, as ``Pulumi.yaml`` names it) and no stack file."""
    path.mkdir()
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(PROJECT / name, path / name)
    (path / ".venv").symlink_to(PROJECT / ".venv")
    (path / "stacks").mkdir()
    return path


def sessionctl(clone, state, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{state}",
           "PULUMI_CONFIG_PASSPHRASE": "ci secret"}
    return subprocess.run([SESSIONCTL, *argv], cwd=clone, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300, check=False)


def containers(docker_client, name: str) -> dict[str, dict]:
    found = docker_client.containers.list(
        all=True, filters={"label": f"{LABEL_PREFIX}.session={name}"})
    return {c.name: c.attrs for c in found}


def test_two_fresh_clones_one_backend_up_edit_up_preview_destroy(real_engine, docker_client,
                                                                 image, tmp_path):  # noqa: F811
    name = unique("ci")
    state = tmp_path / "ci-state"  # (real_engine has its own "state", unused here)
    state.mkdir()
    definitions = tmp_path / "definitions"  # the same path in every clone's run
    definitions.mkdir()
    definition = definitions / f"{name}.yaml"
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(unique("pool")))
    doc = factories.session(name, str(pool), image=image, size=2, cpu=0.25, mem="256m",
                            env={"EXPERIMENT": "one"})
    factories.write(definition, doc)
    first, second, third = (fresh_clone(tmp_path / c) for c in ("one", "two", "three"))
    try:
        made = sessionctl(first, state, "up", str(definition), "--yes")
        assert made.returncode == 0, made.stderr
        before = containers(docker_client, name)
        assert len(before) == 2
        stack_ids = {a["Config"]["Labels"][f"{LABEL_PREFIX}.stack-id"] for a in before.values()}
        assert len(stack_ids) == 1

        # a second clone, with no stack file: the same session, nothing replaced
        again = sessionctl(second, state, "up", str(definition), "--yes")
        assert again.returncode == 0, again.stderr
        assert "held on pool" not in again.stderr
        assert {n: a["Id"] for n, a in containers(docker_client, name).items()} == \
            {n: a["Id"] for n, a in before.items()}

        # the definition changes (a new commit); a third fresh clone reviews it: only the
        # containers' env changes, nothing else is made or removed
        factories.write(definition, {**doc, "env": {"EXPERIMENT": "two"}})
        review = sessionctl(third, state, "preview", str(definition), "--json")
        assert review.returncode == 0, review.stderr
        reviewed = json.loads(review.stdout)
        changes = reviewed["changes"]
        assert set(changes) <= {"same", "replace", "update"}, changes
        assert changes.get("replace") == 2, changes
        # issue 41, items 10 and 11: each step, its resource and what forces a replacement
        steps = {(s["op"], s["name"]) for s in reviewed["steps"]}
        assert {("replace", f"{name}-main1"), ("replace", f"{name}-sub1")} <= steps, steps
        # besides the containers, at most the agent's bundle delivery (issue 45) and the pids
        # limits of the containers it names (their IDs change) are updated: the real engine
        assert {s["type"].rsplit(":", 1)[-1] for s in reviewed["steps"]
                if s["op"] == "update"} <= {"BundleDelivery", "ContainerLimits"}, reviewed["steps"]
        assert changes.get("update", 0) <= 2, changes
        assert all(s["replace_keys"] for s in reviewed["steps"] if s["op"] == "replace")
        shown = sessionctl(third, state, "preview", str(definition))
        assert shown.returncode == 0, shown.stderr
        lines = [x for x in shown.stderr.splitlines() if x.startswith("  replace ")]
        assert len(lines) == 2 and all("(replaced: " in x for x in lines), shown.stderr

        applied = sessionctl(second, state, "up", str(definition), "--yes")
        assert applied.returncode == 0, applied.stderr
        after = containers(docker_client, name)
        assert {a["Config"]["Labels"][f"{LABEL_PREFIX}.stack-id"]
                for a in after.values()} == stack_ids
        # the env travels in each container's bundle: both containers were made anew
        assert not {a["Id"] for a in after.values()} & {a["Id"] for a in before.values()}

        settled = sessionctl(third, state, "preview", str(definition), "--json")
        assert settled.returncode == 0, settled.stderr
        assert set(json.loads(settled.stdout)["changes"]) <= {"same"}, settled.stdout

        gone = sessionctl(third, state, "destroy", str(definition), "--yes")
        assert gone.returncode == 0, gone.stderr
        assert containers(docker_client, name) == {}
        assert not docker_client.networks.list(names=[f"{name}-net"])
    finally:
        sessionctl(first, state, "destroy", str(definition), "--yes")
        for c in docker_client.containers.list(
                all=True, filters={"label": f"{LABEL_PREFIX}.session={name}"}):
            c.remove(force=True)


def test_a_checkout_whose_config_contradicts_the_backend_is_told_and_the_backend_wins(
        real_engine, docker_client, image, tmp_path):  # noqa: F811
    """One checkout, two DIY backends: the stack file the checkout kept for one backend says
    another stack id than the stack's own backend; ``up`` uses the backend's and says so."""
    name = unique("two")
    state = tmp_path / "ci-state"  # (real_engine has its own "state", unused here)
    state.mkdir()
    definition = tmp_path / f"{name}.yaml"
    pool = factories.write(tmp_path / "pool.yaml", factories.pool(unique("pool")))
    factories.write(definition, factories.session(name, str(pool), image=image, size=1,
                                                  cpu=0.25, mem="256m"))
    clone = fresh_clone(tmp_path / "clone")
    try:
        assert sessionctl(clone, state, "up", str(definition), "--yes").returncode == 0
        before = containers(docker_client, name)
        stack_file = clone / "stacks" / f"Pulumi.{name}.yaml"
        text = stack_file.read_text()
        kept = next(line for line in text.splitlines() if "stack-id" in line)
        stack_file.write_text(text.replace(kept, "  cluster-sessions:stack-id: 0123456789abcdef"))
        again = sessionctl(clone, state, "up", str(definition), "--yes")
        assert again.returncode == 0, again.stderr
        assert "using the backend's" in again.stderr and "0123456789abcdef" in again.stderr
        assert {n: a["Id"] for n, a in containers(docker_client, name).items()} == \
            {n: a["Id"] for n, a in before.items()}
    finally:
        sessionctl(clone, state, "destroy", str(definition), "--yes")
