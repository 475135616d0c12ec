"""Memory sizes: parsing the definition's spelling and printing it back."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster_sessions.core.units import format_size, parse_size, size_json_schema


@pytest.mark.parametrize(
    ("text", "size"),
    [("512m", 512 * 1024**2), ("4g", 4 * 1024**3), ("4G", 4 * 1024**3), ("1.5g", 1536 * 1024**2),
     ("64k", 65536), ("2gb", 2 * 1024**3), ("2Gi", 2 * 1024**3), (1000, 1000), ("1t", 1024**4)],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "g", "4x", "-1g", "0", 0, True, 1.5, None, "1e9", "4 gg"])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError):
        parse_size(text)


@given(st.integers(1, 2**50))
def test_format_then_parse_is_exact(size):
    assert parse_size(format_size(size)) == size


@pytest.mark.parametrize(("size", "text"), [(0, "0"), (1000, "1000"), (4 * 1024**3, "4g"),
                                             (1536 * 1024**2, "1536m")])
def test_format_size_spells_nothing_as_0_not_0t(size, text):
    assert format_size(size) == text  # `pool usage`, `plan --probe`: "mem 0", not "mem 0t"


@pytest.mark.parametrize(("text", "size"), [("1.1g", 1181116006), ("0.5k", 512),
                                             ("1.000000000000000001t", 1024**4),
                                             ("9007199254740993.0", 9007199254740993)])
def test_fractions_are_exact_not_float_rounded(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["9" * 400 + ".5g", "9" * 5000, "8388608t", 2**63])
def test_sizes_beyond_int64_are_refused_not_overflowed(text):
    with pytest.raises(ValueError, match="too large"):
        parse_size(text)


def test_bounds_are_inclusive_and_named_in_the_message():
    assert parse_size("6m", minimum=6 * 1024**2) == 6 * 1024**2
    with pytest.raises(ValueError, match="below the minimum of 6m"):
        parse_size("6291455", minimum=6 * 1024**2)
    with pytest.raises(ValueError, match="at most 1g"):
        parse_size("1025m", maximum=1024**3)


@pytest.mark.parametrize(("value", "message"), [
    (True, "expected a size such as 512m or 4g, not a boolean"),
    (1.5, "expected a size such as 512m or 4g"),
    (None, "expected a size such as 512m or 4g"),
    (0, "must be greater than zero"),
    ("0g", "must be greater than zero"),
])
def test_each_refusal_says_what_a_size_is(value, message):
    """The loader prints these after the file and field: each must say what was wrong."""
    with pytest.raises(ValueError) as refused:
        parse_size(value, minimum=0)
    assert str(refused.value) == message


def test_leading_zeros_up_to_the_digit_guard_are_still_a_size():
    """The digit guard keeps huge numbers out of the arithmetic, not 40 written digits."""
    assert parse_size("0" * 39 + "1") == 1
    with pytest.raises(ValueError, match="too large"):
        parse_size("0" * 40 + "1")


@pytest.mark.parametrize(("minimum", "maximum"), [(1, 2**63 - 1), (6 * 1024**2, 1024**3)])
def test_the_schema_of_a_size_accepts_the_spellings_parse_size_reads(minimum, maximum):
    """``sessionctl schema`` describes sizes with the same pattern and bounds as the loader."""
    schema = size_json_schema(minimum, maximum)
    validator = jsonschema.Draft202012Validator(schema)
    for good in ["512m", " 4G ", "1.5gb", "2Gi", "64k", "1000", minimum, maximum]:
        assert validator.is_valid(good), good
    for bad in ["", "g", "4x", "-1g", "1e9", "4 gg", "1.g", minimum - 1, maximum + 1, 1.5, True]:
        assert not validator.is_valid(bad), bad
    assert schema["description"] == ("a size: a number with k, m, g or t (1024-based), e.g. "
                                     "512m or 4g; or whole bytes")
    # every JSON Schema validator reads it (ECMA-262 has no Python-style named groups)
    assert "(?P<" not in schema["anyOf"][0]["pattern"]


def test_the_schema_of_a_size_by_default_takes_any_count_of_bytes_from_one():
    validator = jsonschema.Draft202012Validator(size_json_schema())
    assert validator.is_valid(1) and validator.is_valid(2**63 - 1)
    assert not validator.is_valid(0) and not validator.is_valid(2**63)
