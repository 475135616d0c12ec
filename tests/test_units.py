"""Memory sizes: parsing the definition's spelling and printing it back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster_sessions.units import format_size, parse_size


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
