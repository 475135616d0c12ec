"""A session's image as plain data (issue 33): the reference a definition names, the one it is
pinned to (``repo@sha256:…`` for a registry image, the image ID for one only agents hold), why a
pull failed (by the engine's words), and a pull's progress from the engine's stream of events.

Nothing here reaches an engine (agents/images.py does); nothing here imports pulumi.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
DEFAULT_REGISTRY = "docker.io"
# The key Docker's own config file gives Docker Hub's credentials under (docker/cli
# registry.IndexServer)
DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"


def valid_digest(value: object) -> bool:
    return isinstance(value, str) and bool(_DIGEST.match(value))


def split_reference(ref: str) -> tuple[str, str | None, str | None]:
    """``(repository, tag, digest)`` of an image reference, as docker does: a ``:`` after the
    last ``/`` starts the tag (a registry's port comes before it), ``@`` the digest."""
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    tag = None
    head, _, last = ref.rpartition("/")
    if ":" in last:
        last, tag = last.split(":", 1)
        ref = f"{head}/{last}" if head else last
    return ref, tag, digest


def repository(ref: str) -> str:
    return split_reference(ref)[0]


def registry_of(ref: str) -> str:
    """The registry a reference is pulled from: its first component when that looks like a
    host (has a ``.`` or ``:``, or is ``localhost``), else Docker Hub."""
    repo = repository(ref)
    first, sep, _ = repo.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DEFAULT_REGISTRY


def auth_keys(registry: str) -> tuple[str, ...]:
    """The keys a docker config file may hold a registry's credentials under."""
    if registry in (DEFAULT_REGISTRY, "index.docker.io", "registry-1.docker.io"):
        return (DOCKER_HUB_AUTH_KEY, "index.docker.io", DEFAULT_REGISTRY)
    return (registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/",
            f"https://{registry}/v2/")


def pinned_reference(ref: str, digest: str) -> str:
    """What every container is created from: ``repo@digest`` (the tag dropped: a digest names
    the content, and docker refuses ``repo:tag@digest`` nowhere but prints it oddly)."""
    return f"{repository(ref)}@{digest}"


# --- why a pull or a registry question failed, by the engine's words ---------------------------

AUTH = "credentials refused or missing"
NOT_FOUND = "no such image"
NO_SPACE = "no space left"
UNREACHABLE = "registry unreachable"
ENGINE = "engine failure"

_CAUSES = (
    (AUTH, ("unauthorized", "authentication required", "no basic auth credentials",
            "denied", "incorrect username or password", "401")),
    (NO_SPACE, ("no space left",)),
    (NOT_FOUND, ("manifest unknown", "not found", "no such image", "does not exist",
                 "name unknown")),
    (UNREACHABLE, ("connection refused", "no such host", "i/o timeout", "timeout",
                   "network is unreachable", "server misbehaving", "dial tcp",
                   "http response to https client", "certificate")),
)


def cause_of(message: str) -> str:
    """One of the causes above for an engine's error text (auth first: a registry answers an
    unknown repository with 401 to a client without credentials)."""
    text = message.lower()
    for cause, words in _CAUSES:
        if any(w in text for w in words):
            return cause
    return ENGINE


# --- a pull's progress ---------------------------------------------------------------------------


@dataclass
class PullProgress:
    """One agent's pull, from the engine's JSON events (``docker pull``'s own): per layer the
    bytes downloaded of its size; a layer that exists already, or is complete, counts whole."""

    agent: str
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (current, total)
    done_layers: set[str] = field(default_factory=set)
    status: str = "waiting"
    error: str = ""
    shown: int = 0  # the highest percent said so far: a bar never goes back


    def feed(self, event: Mapping[str, object]) -> None:
        if event.get("error"):
            detail = event.get("errorDetail")
            message = (detail.get("message") if isinstance(detail, Mapping) else None)
            self.error = str(message or event["error"])
            self.status = "failed"
            return
        layer = event.get("id")
        status = str(event.get("status") or "")
        detail = event.get("progressDetail") or {}
        if not isinstance(layer, str) or not layer or status.startswith(("Pulling from",
                                                                          "Digest:")):
            if status:
                self.status = status
            return
        if status in ("Already exists", "Pull complete"):
            self.done_layers.add(layer)
            _cur, total = self.layers.get(layer, (0, 0))
            self.layers[layer] = (total, total)
        elif status == "Downloading" and isinstance(detail, Mapping):
            total = int(detail.get("total") or 0)
            self.layers[layer] = (int(detail.get("current") or 0), total)
        elif layer not in self.layers:
            self.layers[layer] = (0, 0)
        self.status = "pulling"

    @property
    def current(self) -> int:
        return sum(c for c, _ in self.layers.values())

    @property
    def total(self) -> int:
        return sum(t for _, t in self.layers.values())

    def percent(self) -> int:
        """0-100: the bytes of the layers whose size is known, each layer whose size is not yet
        known counted as the mean of the others (the engine tells a layer's size once its
        download starts); 100 only once the engine holds the image; never less than before."""
        if self.status in ("done", "present"):
            return 100
        if not self.layers:
            return self.shown
        sized = [(c, t) for c, t in self.layers.values() if t]
        unsized = len(self.layers) - len(sized)
        if sized:
            mean = sum(t for _, t in sized) / len(sized)
            share = sum(c for c, _ in sized) / (sum(t for _, t in sized) + unsized * mean)
        else:
            share = len(self.done_layers) / len(self.layers)
        self.shown = max(self.shown, min(99, int(share * 100)))
        return self.shown

    def line(self) -> str:
        """``agent1  45%  120.3/267.0 MB  3/7 layers  pulling``, as one line."""
        mb = 1e6
        size = (f"{self.current / mb:.1f}/{self.total / mb:.1f} MB  " if self.total else "")
        state = self.error if self.status == "failed" else self.status
        return (f"{self.agent}: {self.percent():3d}%  {size}"
                f"{len(self.done_layers)}/{len(self.layers)} layers  {state}")


def tenths_crossed(before: int, after: int) -> list[int]:
    """The multiples of 10 percent reached going from ``before`` to ``after`` (CI lines)."""
    return [p for p in range(10, 101, 10) if before < p <= after]
