"""The image step of ``preview``/``up`` and ``pool pull`` (issue 33): the definition's image
resolved once and kept in the stack's config (core.decisions ``image``), then, for ``up``,
pulled onto every agent of the plan that lacks it, all at once, before the engine runs: a pull
that fails stops the ``up`` with nothing created.

Progress goes to stderr: on a terminal one line per agent, redrawn in place; otherwise (CI) a
line per agent per 10 %, and with ``--json`` the same as JSON objects, one a line.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..agents.images import pull_everywhere, registry_auth, resolve
from ..core.decisions import KeptImage, image_reason, read_kept, read_kept_or_again
from ..core.errors import ClusterSessionsError
from ..core.images import PullProgress, tenths_crossed
from ..core.names import IMAGE_KEY, STACKS_DIR, config_key
from ..core.spec import Pool
from ..core.terminal import TerminalGuard, printable
from .errors import CommandError, Exit


def credentials(pool: Pool, pool_file: Path | None, ref: str) -> dict[str, str] | None:
    """The registry credentials for ``ref``: the pool's ``registry_auth.config_file``
    (relative to the pool file's folder), else the operator's docker config."""
    if pool.registry_auth is None:
        return registry_auth(ref)
    path = Path(pool.registry_auth.config_file).expanduser()
    if not path.is_absolute() and pool_file is not None:
        path = pool_file.parent / path
    return registry_auth(ref, path, source=f"{pool_file or pool.name}: "
                         "registry_auth.config_file")


class PullReport:
    """Shows the pulls' progress on ``out``: ``tty`` (a line per agent, redrawn), ``lines``
    (a line per agent per 10 %) or ``json`` (the same as JSON objects)."""

    REDRAW = 0.1  # seconds between redraws on a terminal

    def __init__(self, prefix: str, image: str, agents: Sequence[str], mode: str,
                 out: TextIO | None = None):
        self.prefix, self.image, self.mode = prefix, image, mode
        self.out = out or sys.stderr
        # the redraw's own cursor moves go past the guard that keeps control characters off
        # the terminal (core.terminal); every text in them is made printable here
        self.raw = self.out.stream if isinstance(self.out, TerminalGuard) else self.out
        self.agents = list(agents)
        self.latest: dict[str, PullProgress] = {}
        self.shown: dict[str, int] = {}
        self.states: dict[str, str] = {}
        self.drawn = 0
        self.last = 0.0
        self.lock = threading.Lock()

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _event(self, p: PullProgress, percent: int) -> None:
        if self.mode == "json":
            self._write(json.dumps({"event": "pull", "image": self.image, "agent": p.agent,
                                    "status": p.status, "percent": percent,
                                    "bytes": p.current, "total": p.total,
                                    **({"error": p.error} if p.error else {})}) + "\n")
        else:
            self._write(f"{self.prefix}: {printable(p.line())}\n")

    def update(self, p: PullProgress) -> None:
        with self.lock:
            self.latest[p.agent] = p
            if self.mode == "tty":
                now = time.monotonic()
                final = p.status in ("present", "done", "failed")
                if final or now - self.last >= self.REDRAW:
                    self.last = now
                    self._draw()
                return
            percent = p.percent() if p.status != "present" else 100
            before = self.shown.get(p.agent, -1)
            changed = p.status in ("present", "done", "failed") and \
                self.states.get(p.agent) != p.status
            crossed = tenths_crossed(max(before, 0), percent) if before >= 0 else []
            if before < 0 or crossed or changed:
                self.shown[p.agent] = percent
                self.states[p.agent] = p.status
                self._event(p, percent)

    def _draw(self) -> None:
        lines = [f"{self.prefix}: {printable(self.latest[a].line())}" if a in self.latest
                 else f"{self.prefix}: {a}: waiting" for a in self.agents]
        up = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.raw.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self.raw.flush()
        self.drawn = len(lines)

    def finish(self) -> None:
        with self.lock:
            if self.mode == "tty" and self.latest:
                self._draw()


def report_mode(json_mode: bool, out: TextIO | None = None) -> str:
    out = out or sys.stderr
    if json_mode:
        return "json"
    return "tty" if out.isatty() else "lines"


def pull(pool: Pool, agents: Sequence[str], kept: KeptImage, auth: Mapping[str, str] | None,
         prefix: str, json_mode: bool) -> list[Any]:
    """``kept`` onto ``agents`` with the progress shown; a summary line per agent (none with
    ``--json``). Raises the ImageError of agents.images."""
    report = PullReport(prefix, kept.ref, agents, report_mode(json_mode))
    try:
        done = pull_everywhere(pool, agents, kept, auth, report.update)
    finally:
        report.finish()
    return done


def decide_images(verb: str, pool: Pool, pool_file: Path | None, plans: Sequence[Any],
                  recorded: Mapping[str, Mapping[str, str] | None], refresh: bool,
                  json_mode: bool) -> dict[str, tuple[KeptImage, str]]:
    """Each plan's image (by session name): the stack's kept one while it holds (same
    reference, no ``--refresh-image``), else resolved now on the plan's agents; with how it
    was decided ("kept", or how it was resolved). One resolution per reference and agents."""
    out: dict[str, tuple[KeptImage, str]] = {}
    resolved: dict[tuple[str, tuple[str, ...]], tuple[KeptImage, str]] = {}
    for plan in plans:
        config = recorded.get(plan.name) or {}
        kept = read_kept_or_again(
            IMAGE_KEY, config.get(config_key(IMAGE_KEY)),
            lambda why, name=plan.name: print(f"sessionctl {verb}: {name}: recorded "
                                              f"{printable(why)}; resolving it again",
                                              file=sys.stderr))
        reason = image_reason(kept, plan.session.image, refresh)
        if reason is None and kept is not None:
            out[plan.name] = (kept, "kept")
            continue
        key = (plan.session.image, tuple(plan.agents))
        if key not in resolved:
            auth = credentials(pool, pool_file, plan.session.image)
            resolved[key] = resolve(pool, plan.agents, plan.session.image, auth)
        new, how = resolved[key]
        if kept is not None and kept.digest != new.digest:
            how += f"; was {kept.digest[:19]}… ({reason})"
        out[plan.name] = (new, how)
    if not json_mode:
        for plan in plans:
            kept, how = out[plan.name]
            print(f"sessionctl {verb}: {plan.name} image {plan.session.image} -> "
                  f"{kept.pinned} ({how})", file=sys.stderr)
    return out


def pull_for(verb: str, pool: Pool, pool_file: Path | None, plans: Sequence[Any],
             images: Mapping[str, tuple[KeptImage, str]], json_mode: bool) -> None:
    """Every agent of ``plans`` gets its plan's image before anything is created."""
    by_image: dict[KeptImage, list[str]] = {}
    for plan in plans:
        kept = images[plan.name][0]
        agents = by_image.setdefault(kept, [])
        agents += [a for a in plan.agents if a not in agents]
    for kept, agents in by_image.items():
        auth = None if kept.local else credentials(pool, pool_file, kept.ref)
        done = pull(pool, agents, kept, auth, f"sessionctl {verb}", json_mode)
        if not json_mode:
            print(f"sessionctl {verb}: image {kept.pinned}: "
                  + ", ".join(f"{d.agent} {d.how}" for d in done), file=sys.stderr)


def recorded_image(project: Path | None, plan: Any) -> str:
    """The pinned image the session's stack keeps in its config file beside the project
    (``stacks/Pulumi.<session>.yaml``, where the pulumi CLI keeps it), when it still holds for
    the definition's image; "" otherwise. Offline: a file read, no engine, no backend."""
    import yaml

    if project is None:
        return ""
    path = project / STACKS_DIR / f"Pulumi.{plan.name}.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        kept = read_kept(IMAGE_KEY, str((doc.get("config") or {}).get(config_key(IMAGE_KEY))
                                        or ""))
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return ""
    if kept is None or image_reason(kept, plan.session.image) is not None:
        return ""
    return kept.pinned


def as_command_error(exc: ClusterSessionsError) -> CommandError:
    return CommandError(str(exc), Exit(exc.code))
