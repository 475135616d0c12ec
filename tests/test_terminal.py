"""What reaches a terminal: one line per item, no control byte, JSON that reads back the same."""

from __future__ import annotations

import json
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from cluster_sessions.core.terminal import dumps, printable

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)


def hidden(text: str, allow: str = "") -> list[str]:
    return [c for c in text if c not in allow
            and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


@given(TEXT)
def test_printable_is_one_line_with_no_control_character(text):
    shown = printable(text)
    assert not hidden(shown)
    assert len(shown.splitlines()) <= 1


def test_printable_spells_what_it_escapes():
    assert printable("a\nb\r\t\x1b[2J\x9b\u202e\U000e0041 é") == \
        "a\\nb\\r\\t\\x1b[2J\\x9b\\u202e\\U000e0041 é"
    assert printable("plain text, unchanged") == "plain text, unchanged"


@given(st.dictionaries(TEXT, TEXT, max_size=5))
def test_dumps_reads_back_the_same_and_holds_no_control_character(value):
    text = dumps(value, indent=2)
    assert json.loads(text) == value
    assert not hidden(text, allow="\n")


def test_tables_pad_columns_to_the_widest_cell_and_escape_what_a_terminal_acts_on():
    from cluster_sessions.core.terminal import table

    assert table(("A", "LONG HEADER"), [("wide cell", "x"), ("b\x1b[2J", "")]) == [
        "A          LONG HEADER",
        "wide cell  x",
        "b\\x1b[2J",
    ]
