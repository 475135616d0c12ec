"""Names decided once (core/names.py): label keys, the stacks folder and the default engine
socket are written in core/names.py and nowhere else in the package (docstrings may mention
them). Checked on the source's string constants, so an f-string's text counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cluster_sessions
from cluster_sessions.core import names
from cluster_sessions.core.plan import container_labels, network_labels

# where the package is imported from (the checkout's modules/, or a mutation run's copy)
PACKAGE = Path(cluster_sessions.__file__).resolve().parent
NAMES = PACKAGE / "core" / "names.py"


def constants(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant but docstrings."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def written_inline(path: Path, source: str | None = None) -> list[str]:
    text = source if source is not None else path.read_text()
    found = []
    for line, value in constants(text):
        if value.startswith(f"{names.LABEL_PREFIX}."):
            found.append(f"{path.name}:{line}: label key {value!r}")
        if "/var/run/docker.sock" in value or "/run/docker.sock" in value.removeprefix(
                "unix:///var"):
            found.append(f"{path.name}:{line}: the default socket {value!r}")
        if value == names.STACKS_DIR:
            found.append(f"{path.name}:{line}: the stacks folder")
    found += [f"{path.name}:{node.lineno}: builds a label key from LABEL_PREFIX"
              for node in ast.walk(ast.parse(text))
              if isinstance(node, ast.Name) and node.id == "LABEL_PREFIX"]
    return found


def test_label_keys_the_stacks_folder_and_the_default_socket_live_only_in_names():
    bad = [f for path in sorted(PACKAGE.rglob("*.py")) if path != NAMES
           for f in written_inline(path)]
    assert bad == []


@pytest.mark.parametrize("source", [
    'x = "cluster-sessions.cpu"', 'x = f"{LABEL_PREFIX}.cpu"',
    'x = "unix:///var/run/docker.sock"', 'x = "unix:///run/docker.sock"',
    'x = base / "stacks"'])
def test_the_names_check_sees_a_name_written_inline(source):
    assert written_inline(PACKAGE / "driver" / "fake.py", source)


def test_every_label_the_plan_writes_is_a_named_key(tmp_path):
    from cluster_sessions.core.plan import build_plan
    from tests import factories

    from .factories import load_session

    factories.write(tmp_path / "pool.yaml", factories.pool("p", factories.agent()))
    path = factories.write(tmp_path / "s.yaml", factories.session("labelled", str(tmp_path /
                                                                          "pool.yaml")))
    loaded = load_session(path)
    plan = build_plan(loaded.session, loaded.pool)
    keys = {v for k, v in vars(names).items() if k.endswith("_LABEL")}
    assert set(container_labels(plan, plan.containers[0])) <= keys
    assert set(network_labels(plan)) <= keys
    assert names.session_label_filter("x") == f"{names.SESSION_LABEL}=x"
    assert names.session_label_filter() == names.SESSION_LABEL
