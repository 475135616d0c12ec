"""What reaches a terminal: one line per item, no control byte, JSON that reads back the same."""

from __future__ import annotations

import json
import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster_sessions.core.terminal import TerminalGuard, dumps, printable, progress, table

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


@pytest.mark.parametrize(("char", "shown"), [
    ("\x7f", "\\x7f"), ("\xad", "\\xad"),  # DEL; a soft hyphen, the last hidden one below U+0100
    ("\u0600", "\\u0600"), ("\u2028", "\\u2028"), ("\ufeff", "\\ufeff"),
    ("\ufffb", "\\ufffb"),  # the last hidden character below U+10000
    ("\U000110bd", "\\U000110bd"), ("\U000e007f", "\\U000e007f"),
])
def test_printable_spells_a_hidden_character_in_the_shortest_escape_that_holds_it(char, shown):
    assert printable(f"<{char}>") == f"<{shown}>"


@given(st.dictionaries(TEXT, TEXT, max_size=5))
def test_dumps_reads_back_the_same_and_holds_no_control_character(value):
    text = dumps(value, indent=2)
    assert json.loads(text) == value
    assert not hidden(text, allow="\n")


def test_dumps_writes_text_as_it_is_and_escapes_what_printable_escapes():
    """Readable names stay readable in JSON; DEL, C1, a bidi override and characters above
    U+FFFF (a tag, a musical format character: a surrogate pair) are \\u escapes; json.dumps'
    own arguments (indent, sort_keys, separators) are passed on."""
    assert dumps({"name": "é → ┃", "bad": "a\x7fb\x9b\u202e\U000e0041\U0001d173"}, indent=1) == (
        '{\n "name": "é → ┃",\n "bad": "a\\u007fb\\u009b\\u202e\\udb40\\udc41\\ud834\\udd73"\n}')
    assert dumps("a\x7fb") == '"a\\u007fb"'  # all ASCII, DEL included
    assert dumps({"b": 1, "a": [1, 2]}, sort_keys=True, separators=(",", ":")) == \
        '{"a":[1,2],"b":1}'


def test_tables_pad_columns_to_the_widest_cell_and_escape_what_a_terminal_acts_on():
    assert table(("A", "LONG HEADER"), [("wide cell", "x"), ("b\x1b[2J", "")]) == [
        "A          LONG HEADER",
        "wide cell  x",
        "b\\x1b[2J",
    ]


def test_a_row_with_more_cells_than_the_header_is_a_mistake_not_a_dropped_column():
    with pytest.raises(ValueError):
        table(("NAME",), [("main1", "running")])


def test_the_guard_lets_no_control_character_through_but_newline_tab_and_colours():
    """The last line of defence for any path that forgot :func:`printable`: an erase, a title,
    CR, BEL, NUL, C1 (U+009B), a bidi override and a lone surrogate are escaped; a newline, a
    tab and an SGR colour (the engine's output on a terminal) are not."""
    import io

    out = io.StringIO()
    guard = TerminalGuard(out)
    guard.write("a\x1b[2J\x1b]0;t\x07\r\x00\x9b1m\u202e\udcff\x1b[1;31mred\x1b[0m\tb é→\n")
    assert out.getvalue() == ("a\\x1b[2J\\x1b]0;t\\x07\\r\\x00\\x9b1m\\u202e\\udcff"
                              "\x1b[1;31mred\x1b[0m\tb é→\n")
    assert guard.getvalue() == out.getvalue()  # everything else is the stream's


def test_the_guard_spells_what_the_encoding_cannot_hold():
    import io

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    TerminalGuard(stream).write("main1 → sub1 … é ┃\n")
    stream.flush()
    assert raw.getvalue() == b"main1 \\u2192 sub1 \\u2026 \\xe9 \\u2503\n"

    raw = io.BytesIO()  # PYTHONIOENCODING=latin-1: what latin-1 holds is written as it is
    stream = io.TextIOWrapper(raw, encoding="latin-1")
    TerminalGuard(stream).write("main1 → café\n")
    stream.flush()
    assert raw.getvalue() == b"main1 \\u2192 caf\xe9\n"


def test_the_guard_writes_ascii_to_a_stream_that_names_no_encoding():
    class AsciiOnly:  # a stream of some library: no encoding attribute, ASCII only
        def __init__(self) -> None:
            self.written: list[str] = []

        def write(self, text: str) -> int:
            text.encode("ascii")
            self.written.append(text)
            return len(text)

    stream = AsciiOnly()
    TerminalGuard(stream).write("main1 → sub1\n")
    assert stream.written == ["main1 \\u2192 sub1\n"]


def test_a_progress_line_without_a_prefix_is_the_message_alone(capsys):
    progress("docker import rootfs.tar")
    assert capsys.readouterr() == ("", "docker import rootfs.tar\n")


def test_progress_lines_from_threads_are_never_spliced(monkeypatch):
    """The lab imports its image into every agent in parallel; each thread's progress line
    reaches stderr in one write, whole (print() writes the text and the newline apart)."""
    import io
    import sys
    import threading

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
