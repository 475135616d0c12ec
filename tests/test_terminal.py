"""What reaches a terminal: one line per item, no control byte, JSON that reads back the same."""

from __future__ import annotations

import json
import re
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


def test_the_guard_lets_no_control_character_through_but_newline_tab_and_colours():
    """The last line of defence for any path that forgot :func:`printable`: an erase, a title,
    CR, BEL, NUL, C1 (U+009B), a bidi override and a lone surrogate are escaped; a newline, a
    tab and an SGR colour (the engine's output on a terminal) are not."""
    import io

    from cluster_sessions.core.terminal import TerminalGuard

    out = io.StringIO()
    guard = TerminalGuard(out)
    guard.write("a\x1b[2J\x1b]0;t\x07\r\x00\x9b1m\u202e\udcff\x1b[1;31mred\x1b[0m\tb\n")
    assert out.getvalue() == ("a\\x1b[2J\\x1b]0;t\\x07\\r\\x00\\x9b1m\\u202e\\udcff"
                              "\x1b[1;31mred\x1b[0m\tb\n")
    assert guard.getvalue() == out.getvalue()  # everything else is the stream's


def test_the_guard_spells_what_the_encoding_cannot_hold():
    import io

    from cluster_sessions.core.terminal import TerminalGuard

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    TerminalGuard(stream).write("main1 → sub1 … é ┃\n")
    stream.flush()
    assert raw.getvalue() == b"main1 \\u2192 sub1 \\u2026 \\xe9 \\u2503\n"


def test_progress_lines_from_threads_are_never_spliced(monkeypatch):
    """The lab imports its image into every agent in parallel; each thread's progress line
    reaches stderr in one write, whole (print() writes the text and the newline apart)."""
    import io
    import sys
    import threading

    from cluster_sessions.core.terminal import progress

    writes: list[str] = []

    class Recording(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    monkeypatch.setattr(sys, "stderr", Recording())
    threads = [threading.Thread(target=lambda n=n: [progress(f"engine {n}: line {i}", "lab: ")
                                                    for i in range(200)])
               for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(writes) == 800
    assert all(re.fullmatch(r"lab: engine \d: line \d+\n", w) for w in writes), writes[:4]
