"""The import rules that keep the layers apart (docs/design-notes.md): the pure core imports
neither pulumi nor anything that reaches the network or runs programs, and only core modules;
the agents layer imports neither the driver nor the Pulumi layer above it; the old module paths
that pickled dynamic providers still name are answered in one place (compat_pickle). Checked on
the source (every import statement, wherever it is in a module), so a lazy import inside a
function counts too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "modules" / "cluster_sessions"
CORE = sorted(p.stem for p in (PACKAGE / "core").glob("*.py") if p.stem != "__init__")
# reach the network, run programs or drive the engine: never in the core
FORBIDDEN = ("pulumi", "pulumi_docker", "docker", "paramiko", "subprocess", "socket",
             "requests", "urllib.request", "http", "asyncio", "multiprocessing", "ssl")


def imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in ``path``; level > 0 for relative imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def package_module(path: Path, level: int, module: str) -> str | None:
    """The cluster_sessions module an import names, as a path below the package, if any."""
    if level == 0:
        return module.removeprefix("cluster_sessions.") if module.startswith(
            "cluster_sessions") else None
    base = path.parent.relative_to(PACKAGE).parts
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([module] if module else [])])


def test_the_core_folder_holds_the_pure_core():
    assert {"spec", "loader", "placement", "clusterenv", "plan", "render", "keys", "units",
            "problems", "review", "provider_facts", "terminal"} <= set(CORE)


@pytest.mark.parametrize("name", CORE)
def test_core_modules_import_only_the_core_and_nothing_that_reaches_out(name):
    path = PACKAGE / "core" / f"{name}.py"
    for level, module in imports(path):
        if level == 0 and not module.startswith("cluster_sessions"):
            top = module.split(".")[0]
            assert module not in FORBIDDEN and top not in FORBIDDEN, f"{name} imports {module}"
            continue
        inner = package_module(path, level, module)
        assert inner is not None and inner.split(".")[0] == "core", f"{name} imports {inner}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "pulumi_layer").glob("*.py")),
                         ids=lambda p: p.stem)
def test_the_pulumi_layer_imports_only_downwards(path):
    """core and agents below it; never the driver, the lab or the test emulation above."""
    for level, module in imports(path):
        inner = package_module(path, level, module)
        assert inner is None or inner.split(".")[0] in ("core", "agents", "pulumi_layer"), (
            f"{path.stem} imports {inner}")


@pytest.mark.parametrize("path", sorted((PACKAGE / "agents").glob("*.py")), ids=lambda p: p.stem)
def test_the_agents_layer_never_imports_the_driver_or_the_pulumi_layer(path):
    for level, module in imports(path):
        inner = package_module(path, level, module)
        assert inner is None or inner.split(".")[0] not in ("driver", "pulumi_layer"), (
            f"{path.stem} imports {inner}")


def test_the_package_root_holds_only_the_compat_module_and_imports_no_layer():
    """Old paths of moved modules live in compat_pickle's table, not as files that import
    upwards from where they used to be."""
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == ["__init__", "compat_pickle"]
    for path in PACKAGE.glob("*.py"):
        for level, module in imports(path):
            inner = package_module(path, level, module)
            assert inner is None or inner == "compat_pickle", f"{path.stem} imports {inner}"


def test_the_rules_see_a_violation():
    """The checks above would fail on an import they forbid (guards against a vacuous pass)."""
    fake = PACKAGE / "agents" / "capacity.py"
    assert package_module(fake, 2, "driver.errors") == "driver.errors"
    assert package_module(PACKAGE / "core" / "render.py", 1, "plan") == "core.plan"
    assert package_module(PACKAGE / "pulumi_layer" / "session.py", 2, "driver") == "driver"
    assert package_module(PACKAGE / "agents" / "reach.py", 2, "pulumi_layer.swarm") == (
        "pulumi_layer.swarm")
    assert package_module(PACKAGE / "__init__.py", 1, "compat_pickle") == "compat_pickle"
    assert (0, "subprocess") in imports(PACKAGE / "lab" / "image.py")


def test_the_design_notes_map_names_modules_and_functions_that_exist():
    """The one-screen map at the top of docs/design-notes.md stays true as modules move."""
    notes = (PACKAGE.parents[1] / "docs" / "design-notes.md").read_text()
    map_ = notes[notes.index("## Map"):notes.index("## Where things are")]
    layer = r"(?:core|agents|pulumi_layer|driver|emulation|lab)"
    paths = set(re.findall(rf"\b({layer}/[a-z_]+\.py)", map_))
    assert len(paths) >= 12, paths
    for path in paths:
        assert (PACKAGE / path).exists(), f"the map names {path}"
    named = re.findall(rf"\b({layer}/[a-z_]+\.py) ([A-Za-z_]+)", map_)
    named = [(path, name) for path, name in named if name not in ("runs", "diffs")]  # words
    assert len(named) >= 6, named
    for path, name in named:
        tree = ast.parse((PACKAGE / path).read_text())
        defined = {node.name for node in tree.body
                   if isinstance(node, ast.FunctionDef | ast.ClassDef)}
        assert name in defined, f"the map says {path} has {name}"
