"""scripts/mutation.py stays in step with the package: every module of core/, agents/ and
pulumi_layer/ has the offline tests that reach it named, and every test file it names exists
(a module left out would be mutated against no test, or not at all when run with --only)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]


def mutation_script():
    spec = importlib.util.spec_from_file_location("mutation", PROJECT / "scripts" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("layer", ["core", "agents", "pulumi_layer"])
def test_every_module_of_the_layer_has_its_tests_named_and_they_exist(layer):
    script = mutation_script()
    modules = {p.stem for p in (PROJECT / "modules" / "cluster_sessions" / layer).glob("*.py")}
    assert set(script.MODULE_TESTS[layer]) == modules - {"__init__"}
    named = {t for tests in script.MODULE_TESTS[layer].values() for t in tests}
    assert named and all((PROJECT / "tests" / t).is_file() for t in named)


def test_an_unknown_module_is_refused_before_anything_is_staged(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        mutation_script().main(["core", "--only", "placement,nosuch",
                                "--staging", str(tmp_path / "s")])
    assert refused.value.code == 2
    assert "--only: no module nosuch in core/" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
