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
    """core and agents below it; never the driver or the lab above."""
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
    layer = r"(?:core|agents|pulumi_layer|driver|lab)"
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


# --- the whole map: floors, rooms and circles ------------------------------------------------

PROJECT = PACKAGE.parents[1]
#: each room (a folder of the package, or the package root's compat module) on its floor: a
#: module imports its own room or a room on a lower floor, never one on its floor or above
FLOORS = {"compat_pickle": 0, "core": 1, "agents": 2, "pulumi_layer": 3, "lab": 3, "driver": 4}
#: outside the package, above every room: what runs it and the tests' stand-ins (nothing in the
#: package imports them)
TOP = ("__main__.py", "scripts", "benchmarks", "tests/standin")


def module_name(path: Path) -> str:
    """``cluster_sessions.core.plan`` for the package's files; ``benchmarks.soak`` and the like
    for the files above it."""
    base = PACKAGE.parent if path.is_relative_to(PACKAGE) else PROJECT
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    found = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    for top in TOP:
        where = PROJECT / top
        for path in ([where] if where.is_file() else sorted(where.glob("*.py"))):
            found[module_name(path)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports, every import statement counted: at the
    top, inside a function, under ``TYPE_CHECKING``. ``from . import x`` names the module ``x``
    when there is one; a package's ``__init__`` run on the way is not counted."""
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                named.add(module)
                named.update(f"{module}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in named if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that reach each other through imports (Tarjan's strongly
    connected components with more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "cluster_sessions":
        return parts[0]
    return parts[1] if len(parts) > 1 else "compat_pickle"  # the root runs only that


def floor(module: str) -> int:
    """A room's floor; outside the package, the tests' stand-ins stand above the driver and
    what runs things (benchmarks, scripts) above them."""
    if room(module) == "tests":
        return len(FLOORS)
    return FLOORS.get(room(module), len(FLOORS) + 1)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in another room on the same floor or a higher one."""
    return sorted(f"{a} imports {b}" for a, bs in graph.items() for b in bs
                  if room(a) != room(b) and floor(b) >= floor(a))


def test_every_room_of_the_package_has_a_floor():
    rooms = {room(m) for m in sources() if m.startswith("cluster_sessions")}
    assert rooms == set(FLOORS)


def test_the_tree_s_imports_make_no_circle():
    assert circles(import_graph(sources())) == []


def test_no_import_runs_up_or_sideways_to_another_room():
    graph = import_graph(sources())
    assert sum(len(b) for b in graph.values()) > 300, "the graph sees the imports"
    assert upward(graph) == []


def test_the_circle_and_floor_checks_see_a_violation(tmp_path):
    """A lazy import back and a TYPE_CHECKING import back are circles; an agents module that
    imports the driver, or the Pulumi layer the lab, runs up or sideways."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from . import b\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from .a import x\n")
    (tmp_path / "pkg" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import D\n")
    (tmp_path / "pkg" / "d.py").write_text("import pkg.c\n")
    (tmp_path / "pkg" / "e.py").write_text("import pkg.a\n")
    made = {f"pkg.{n}": tmp_path / "pkg" / f"{n}.py" for n in "abcde"}
    made["pkg"] = tmp_path / "pkg" / "__init__.py"
    assert circles(import_graph(made)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert upward({"cluster_sessions.agents.reach": {"cluster_sessions.driver.cli"},
                   "cluster_sessions.pulumi_layer.x": {"cluster_sessions.lab.netns"},
                   "cluster_sessions.driver.cli": {"cluster_sessions.core.plan"}}) == [
        "cluster_sessions.agents.reach imports cluster_sessions.driver.cli",
        "cluster_sessions.pulumi_layer.x imports cluster_sessions.lab.netns"]
