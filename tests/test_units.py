"""Memory sizes: parsing the definition's spelling and printing it back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster_sessions.core.units import format_size, parse_size


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
