"""Problems of definitions as the user reads them: one line each, file and field first."""

from __future__ import annotations

from cluster_sessions.core.errors import InvalidInput
from cluster_sessions.core.problems import WHOLE_FILE, DefinitionError, Problem, dotted


def test_a_problem_is_one_line_naming_the_file_then_the_field():
    assert str(Problem("s.yaml", "resources.shmem", "must be greater than zero")) == \
        "s.yaml: resources.shmem: must be greater than zero"
    assert str(Problem("s.yaml", "", "is not YAML")) == f"s.yaml: {WHOLE_FILE}: is not YAML"


def test_a_problem_prints_control_characters_of_the_file_name_visibly():
    text = str(Problem("evil\n\x1b[2J.yaml", "env.A\rB", "bad\tvalue"))
    assert "\n" not in text and "\x1b" not in text and "\r" not in text
    assert text.startswith("evil") and ".yaml: env.A" in text


def test_a_definition_error_lists_each_problem_once_on_its_own_line():
    first = Problem("a.yaml", "size", "must be at least 1")
    second = Problem("a.yaml", "image", "is required")
    error = DefinitionError([first, second, first])
    assert isinstance(error, InvalidInput)
    assert error.problems == [first, second]
    assert str(error) == "a.yaml: size: must be at least 1\na.yaml: image: is required"


def test_dotted_joins_a_location_of_keys_and_indexes():
    assert dotted(("agents", 1, "name")) == "agents.1.name"
    assert dotted(()) == ""
