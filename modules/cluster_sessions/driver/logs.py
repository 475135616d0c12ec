"""``sessionctl logs FILE``: the containers' logs, each line prefixed with its host, found
through :mod:`.observe`.

Exit codes: 0 when the logs were shown; 1 when none of the containers asked for were found
(an agent that did not answer is said on stderr); 2 invalid input.
"""

from __future__ import annotations

import argparse
import codecs
import heapq
import os
import re
import select
import stat
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..core.plan import ClusterPlan
from ..core.terminal import printable
from .errors import CommandError, Exit
from .observe import Connect, Survey, agents_to_ask, connect, label_for, survey
from .session_args import add_session_args, selected, verb_parser

MAX_LINE = 64 * 1024
"""Characters of one log line that are shown; the rest is cut, and the line says how much.
A container writes what it likes (a 20 MB line without a newline, issue 32): every verb that
reads a log (``logs``, ``wait``, ``run``) holds at most this much of a line, however long."""


class LineSplitter:
    """Bytes from a log stream to whole lines; a line split across chunks is joined, and bytes
    that are not UTF-8 become U+FFFD instead of an error.

    Linear in what it is fed: a chunk is scanned once and its pieces kept in a list, joined
    once when their line ends, never added to what came before (which made one long line
    quadratic). A line longer than ``limit`` keeps its first ``limit`` characters and ends
    with a note of how many were cut."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.limit = limit
        self._parts: list[str] = []
        self._held = 0  # characters in _parts
        self._cut = 0  # characters of the current line dropped past the limit

    @property
    def held(self) -> int:
        """Characters of the unfinished line held: never more than ``limit``."""
        return self._held

    def feed(self, chunk: bytes) -> list[str]:
        return self._split(self._decoder.decode(chunk))

    def flush(self) -> list[str]:
        lines = self._split(self._decoder.decode(b"", final=True))
        if self._parts or self._cut:
            lines.append(self._line())
        return lines

    def _split(self, text: str) -> list[str]:
        lines = []
        start = 0
        while (end := text.find("\n", start)) >= 0:
            self._keep(text, start, end - 1 if end > start and text[end - 1] == "\r" else end)
            lines.append(self._line())
            start = end + 1
        self._keep(text, start, len(text))
        return lines

    def _keep(self, text: str, start: int, end: int) -> None:
        room = self.limit - self._held
        if end - start > room:
            self._cut += end - start - room
            end = start + room
        if end > start:
            self._parts.append(text[start:end])
            self._held += end - start

    def _line(self) -> str:
        line = "".join(self._parts).rstrip("\r")
        if self._cut:
            line += f" [line cut: {self._cut:,} more characters not shown]"
        self._parts, self._held, self._cut = [], 0, 0
        return line


def prefixed(host: str, width: int, line: str) -> str:
    """A log line as printed: a container writes any bytes, so controls are escaped (tabs
    kept), and so is a host name read from a container's label."""
    return printable(f"{host.ljust(width)} | {line}", keep="\t")


def reader_gone(stream) -> bool:
    """Whether ``stream`` is a pipe whose reader went away (``| head -1`` done): the kernel
    marks the pipe's write end with an error, seen before anything more is written, so a
    follow that prints nothing for a while still ends when its reader does."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, 0)  # no events asked for: only the error and hang-up ones
        return any(mask & select.POLLERR for _, mask in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def drop_output() -> None:
    """Send whatever is still written to stdout nowhere: its reader went away, and what is
    left to say (a buffered line, a destroy's progress) must not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


class Printer:
    """Writes prefixed lines from several threads without interleaving inside a line.

    A reader that goes away is noticed here, for every thread, in one place: a thread's
    write that finds the pipe closed stops that thread quietly, and :meth:`check`, which the
    verb's own thread calls while it waits, raises the ``BrokenPipeError`` there, where
    ``cli.main`` turns it into a quiet exit 141 like any verb's."""

    def __init__(self, width: int, out=None):
        self.width = width
        self.out = out or sys.stdout
        self._lock = threading.Lock()
        self.gone = threading.Event()

    def lines(self, host: str, lines: Iterable[str]) -> None:
        text = "".join(prefixed(host, self.width, line) + "\n" for line in lines)
        if text and not self.gone.is_set():
            with self._lock:
                try:
                    self.out.write(text)
                    self.out.flush()
                except BrokenPipeError:
                    self.gone.set()

    def check(self, look: bool = True) -> None:
        """Raise ``BrokenPipeError`` in the caller's thread when the reader went away (a
        write found it gone; with ``look``, also when nothing was written yet)."""
        if self.gone.is_set() or (look and reader_gone(self.out)):
            self.gone.set()
            raise BrokenPipeError("the reader of the output went away")


def pump(host: str, chunks: Iterator[bytes], printer: Printer) -> None:
    """One container's log stream to the printer, until it ends or nobody reads."""
    splitter = LineSplitter()
    for chunk in chunks:
        printer.lines(host, splitter.feed(chunk))
        if printer.gone.is_set():
            return
    printer.lines(host, splitter.flush())


def select_hosts(plan: ClusterPlan, present: Iterable[str], wanted: Sequence[str] | None
                 ) -> list[str]:
    """Hosts to show, in host order: all planned ones, or the ``--host`` ones (which may also
    be left-over containers the plan no longer has)."""
    known = list(dict.fromkeys((*plan.hosts, *sorted(present))))
    if not wanted:
        return list(plan.hosts)
    unknown = [h for h in wanted if h not in known]
    if unknown:
        raise CommandError(f"no host {', '.join(unknown)} in session {plan.name} (hosts: "
                           f"{', '.join(known)})", Exit.INVALID)
    return [h for h in known if h in wanted]


def parse_tail(value: str) -> int | str:
    if value == "all":
        return value
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError("must be a number of lines >= 0, or 'all'")
    return n


def cmd_logs(args: argparse.Namespace, connect: Connect = connect) -> int:
    sel = selected(args)
    sources: list[tuple[str, Any]] = []
    surveys = []
    try:
        for _, plan in sel.chosen:
            found = survey(plan, sel.loaded, agents_to_ask(plan, sel.loaded), connect)
            surveys.append(found)
            sources += [(label_for(sel, plan, host), c)
                        for host, c in log_sources(args, plan, found)]
        if not sources:
            shown = ", ".join(p.name for _, p in sel.chosen)
            raise CommandError(f"none of the containers of session {shown} were found; is it "
                               "up?", Exit.ENGINE)
        return show_logs(args, sources)
    finally:
        for found in surveys:
            found.close()


def log_sources(args: argparse.Namespace, plan: ClusterPlan, found: Survey
                ) -> list[tuple[str, Any]]:
    """The containers whose logs to show, host order; what is missing is said on stderr."""
    hosts = select_hosts(plan, found.containers, args.host)
    for agent, why in found.unreachable.items():
        print(printable(f"sessionctl logs: agent {agent} did not answer: {why}"),
              file=sys.stderr)
    sources = []
    for host in hosts:
        containers = found.containers.get(host, [])
        if not containers:
            print(printable(f"sessionctl logs: {plan.name}: {host}: no container found"),
                  file=sys.stderr)
        sources += [(host, c) for c in containers]
    return sources


_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ", re.ASCII)

Stamped = tuple[tuple[str, str], str, str]  # (sort key, the engine's timestamp, the line)


def stamped_lines(chunks: Iterable[bytes]) -> Iterator[Stamped]:
    """One stream's lines read with the engine's timestamps, as they come (one line held at a
    time). A line without a stamp (a continuation) sorts with the one before it."""
    splitter = LineSplitter()
    key = ("", "")
    for chunk in _ended(chunks):
        for line in splitter.feed(chunk) if chunk is not None else splitter.flush():
            match = _STAMP.match(line)
            if match:
                key = (match[1], (match[2] or "").ljust(9, "0"))  # RFC 3339 trims zeros
                yield key, line[:match.end() - 1], line[match.end():]
            else:
                yield key, "", line


def _ended(chunks: Iterable[bytes]) -> Iterator[bytes | None]:
    yield from chunks
    yield None  # the end: what the splitter still holds is the last line


def container_lines(container: Any, tail: int | str) -> Iterator[Stamped]:
    """A container's log in the order it was written, read lazily: the engine copies stdout
    and stderr separately and may store a line after one written later, but it stamps each
    line as it reads it, so each stream alone is in stamp order and the two are merged by
    stamp as they are read: one line of each held, never the whole log. With a number of
    lines to ``tail``, each stream gives its last ones and the merge keeps the last of all."""
    streams = [stamped_lines(container.logs(stdout=name == "stdout", stderr=name == "stderr",
                                            stream=True, follow=False, timestamps=True,
                                            tail=tail))
               for name in ("stdout", "stderr")]
    merged = heapq.merge(*streams, key=lambda item: item[0])
    return iter(deque(merged, maxlen=tail)) if isinstance(tail, int) else merged


def show_logs(args: argparse.Namespace, sources: Sequence[tuple[str, Any]]) -> int:
    printer = Printer(max(len(h) for h, _ in sources))
    options = {"stdout": True, "stderr": True, "stream": True, "tail": args.tail,
               "timestamps": args.timestamps, "follow": args.follow}
    if not args.follow:
        def read(host: str, container: Any) -> Iterator[tuple[Stamped, str]]:
            return ((item, host) for item in container_lines(container, args.tail))

        # one container after the other (its streams opened when its turn comes); with
        # --timestamps all of them by time (hosts in host order on a tie), merged as read
        logs: Iterable[Iterable[tuple[Stamped, str]]] = (read(h, c) for h, c in sources)
        if args.timestamps:
            logs = [heapq.merge(*logs, key=lambda entry: entry[0][0])]
        for entries in logs:
            for (_, stamp, line), host in entries:
                printer.lines(host, [f"{stamp} {line}" if args.timestamps and stamp else line])
                printer.check(look=False)
        return Exit.OK
    threads = [threading.Thread(target=pump, args=(host, container.logs(**options), printer),
                                daemon=True, name=f"logs-{host}")
               for host, container in sources]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)  # short joins keep Ctrl-C responsive, and see a reader go away
            printer.check()
    printer.check()
    return Exit.OK


def register(subparsers) -> None:
    p = verb_parser(
        subparsers, "logs", "the containers' logs, each line prefixed with its host",
        "Print each container's logs (Docker API), in host order, every line "
        "prefixed with its host (`sub1 | ...`); a container's stdout and stderr lines in the "
        "order the engine stamped them. With --timestamps, all containers' lines by time. "
        "With --follow, lines from all containers are printed as they come until Ctrl-C.")
    add_session_args(p)
    p.add_argument("--host", action="append", metavar="HOST",
                   help="only this host (main1, sub1, ...); may be repeated")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    p.add_argument("--tail", type=parse_tail, default="all", metavar="N",
                   help="only the last N lines of each container (default: all)")
    p.add_argument("--timestamps", "-t", action="store_true",
                   help="show the engine's timestamp on each line")
    p.set_defaults(func=cmd_logs)
