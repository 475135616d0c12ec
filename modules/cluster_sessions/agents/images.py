"""A session's image on the agents' engines (issue 33): what each agent holds under a
reference, the registry's digest for it (the engine's distribution inspect, ``GET
/distribution/{name}/json``: no pull), the resolution to one content everywhere, and pulls onto
every agent at once with their progress.

Credentials come from the operator's docker config (``$DOCKER_CONFIG/config.json``, else
``~/.docker/config.json``, credential helpers included) or the pool's ``registry_auth:
{config_file: PATH}``; they are handed to the engine per request (``X-Registry-Auth``) and
never kept or printed. The decisions themselves are plain data (core.images,
core.decisions.KeptImage).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.decisions import KeptImage
from ..core.errors import EngineFailure, InvalidInput, MissingPrerequisite
from ..core.images import AUTH, PullProgress, cause_of, registry_of, split_reference
from ..core.spec import Pool
from .engine import close_client, open_client

CONNECT_TIMEOUT = 30.0
PULL_TIMEOUT = 3600.0  # the engine's answer to one read of a pull's stream


class ImageError(EngineFailure):
    """The image cannot be made the same on every agent; nothing was created."""

    def __init__(self, message: str, cause: str = "", agents: Sequence[str] = ()):
        super().__init__(message)
        self.cause = cause
        self.agents = tuple(agents)


class ImageAuthError(ImageError, MissingPrerequisite):
    """The registry refused the credentials, or wants some and none were found (exit 4)."""

    code = MissingPrerequisite.code


class RegistryAuthInvalid(InvalidInput):
    """The pool's ``registry_auth.config_file`` cannot be read (exit 2)."""


def _error(message: str, cause: str, agents: Sequence[str] = ()) -> ImageError:
    return (ImageAuthError if cause == AUTH else ImageError)(message, cause, agents)


# --- credentials ---------------------------------------------------------------------------------


def registry_auth(ref: str, config_file: str | Path | None = None, *, source: str = ""
                  ) -> dict[str, str] | None:
    """The credentials for ``ref``'s registry in a docker config file (``config_file``, else
    the operator's), or None when it holds none. ``source`` names where ``config_file`` was
    given (``POOLFILE: registry_auth.config_file``) for a file that cannot be read."""
    import docker.auth
    from docker.credentials.errors import StoreError

    path: str | None = None
    if config_file is not None:
        p = Path(config_file).expanduser()
        where = source or str(config_file)
        try:
            import json

            json.loads(p.read_text())
        except OSError as exc:
            raise RegistryAuthInvalid(f"{where}: cannot read {p}: {exc.strerror}") from None
        except ValueError:
            raise RegistryAuthInvalid(f"{where}: {p} is not a docker config file (JSON)"
                                      ) from None
        path = str(p)
    try:
        config = docker.auth.load_config(path)
        found = config.resolve_authconfig(registry_of(ref))
    except StoreError as exc:
        raise ImageAuthError(f"the credential helper for {registry_of(ref)} failed: "
                             f"{str(exc).splitlines()[0][:200]}", AUTH) from None
    if not found:
        return None
    return {k: v for k, v in found.items() if v and k in (
        "username", "password", "serveraddress", "email", "identitytoken", "auth")}


# --- what the agents hold ------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """What one agent holds under a reference: its image ID and the registry digests it was
    pulled as (none for an image built or imported there); ``image_id`` "" when absent."""

    agent: str
    image_id: str = ""
    repo_digests: tuple[str, ...] = ()


def held_of(agent: str, attrs: Mapping[str, Any] | None) -> Held:
    """An ``inspect_image`` answer (None: no such image) as what the agent holds."""
    if not attrs:
        return Held(agent)
    return Held(agent, str(attrs.get("Id") or ""), tuple(attrs.get("RepoDigests") or ()))


def inspect_held(client: Any, agent: str, ref: str) -> Held:
    import docker.errors

    try:
        return held_of(agent, client.api.inspect_image(ref))
    except docker.errors.ImageNotFound:
        return Held(agent)


def each_agent(pool: Pool, agents: Sequence[str],
               work: Callable[[Any, str], Any]) -> dict[str, Any]:
    """``work(client, agent)`` on every agent at once; each result, or the exception."""

    def one(agent: str) -> Any:
        client = open_client(pool.agent(agent), CONNECT_TIMEOUT)
        try:
            return work(client, agent)
        finally:
            close_client(client)

    with ThreadPoolExecutor(max_workers=max(1, len(agents))) as ex:
        futures = {a: ex.submit(one, a) for a in agents}
    out: dict[str, Any] = {}
    for agent, fut in futures.items():
        try:
            out[agent] = fut.result()
        except Exception as exc:  # noqa: BLE001 - reported per agent by the caller
            out[agent] = exc
    return out


def _unanswered(results: Mapping[str, Any]) -> None:
    failed = {a: r for a, r in results.items() if isinstance(r, Exception)}
    if failed:
        raise ImageError("; ".join(f"agent {a}: {str(e).splitlines()[0][:300]}"
                                   for a, e in failed.items()) + "; nothing was created",
                         "unreachable", list(failed))


def registry_digest(client: Any, ref: str, auth: Mapping[str, str] | None) -> str:
    """The registry's manifest digest for ``ref``, asked through the agent's engine."""
    attrs = client.api.inspect_distribution(ref, auth_config=dict(auth) if auth else None)
    return str(attrs["Descriptor"]["digest"])


def same_local(held: Sequence[Held]) -> str | None:
    """The image ID every agent holds under the reference, or None when one lacks it or two
    differ."""
    ids = {h.image_id for h in held}
    return ids.pop() if len(ids) == 1 and "" not in ids else None


def differing(held: Sequence[Held]) -> str:
    """Each agent's holding, for a refusal: ``agent1 sha256:ab12… , agent2 none``."""
    return ", ".join(f"{h.agent} {h.image_id[:19] + '…' if h.image_id else 'none'}"
                     for h in held)


def resolve(pool: Pool, agents: Sequence[str], ref: str,
            auth: Mapping[str, str] | None) -> tuple[KeptImage, str]:
    """``ref`` resolved to one content for ``agents``, and how (for the operator):

    - a reference with a digest is that digest;
    - an image every agent holds with one ID and none pulled from a registry (built or
      imported there) is pinned by that ID, no registry asked;
    - else the registry's digest, asked through the first agent's engine;
    - a registry that does not answer leaves an image every agent holds with one ID pinned
      by it; otherwise ImageError (ImageAuthError for credentials: exit 4) naming the agents
      and what each holds."""
    repo, _tag, digest = split_reference(ref)
    if digest:
        return KeptImage(ref, digest), "the definition names a digest"
    results = each_agent(pool, agents, lambda client, agent: inspect_held(client, agent, ref))
    _unanswered(results)
    held = [results[a] for a in agents]
    local_id = same_local(held)
    if local_id and not any(h.repo_digests for h in held):
        return (KeptImage(ref, local_id, local=True),
                f"held by every agent as image {local_id[:19]}…, from no registry")
    first = agents[0]
    try:
        client = open_client(pool.agent(first), CONNECT_TIMEOUT)
    except Exception as exc:  # noqa: BLE001
        raise ImageError(f"agent {first}: {exc}; nothing was created", "unreachable",
                         [first]) from None
    try:
        return KeptImage(ref, registry_digest(client, ref, auth)), \
            f"the registry's {registry_of(ref)} digest"
    except Exception as exc:  # noqa: BLE001 - docker.errors.APIError and the transport's
        text = str(getattr(exc, "explanation", None) or exc)
        cause = cause_of(text)
    finally:
        close_client(client)
    if local_id:
        return (KeptImage(ref, local_id, local=True),
                f"registry {registry_of(ref)} did not answer ({cause}); every agent holds "
                f"image {local_id[:19]}…")
    held_any = [h for h in held if h.image_id]
    if held_any and cause != AUTH:
        raise _error(f"image {ref} differs between the agents ({differing(held)}) and "
                     f"registry {registry_of(ref)} did not say which is current ({cause}: "
                     f"{text[:200]}); nothing was created", cause,
                     [h.agent for h in held])
    raise _error(f"image {ref}: registry {registry_of(ref)} asked through agent {first}: "
                 f"{cause}: {text[:300]}; nothing was created", cause, [first])


# --- pulling -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pulled:
    agent: str
    how: str  # present | pulled
    image_id: str


def pull_one(client: Any, agent: str, kept: KeptImage, auth: Mapping[str, str] | None,
             progress: PullProgress, on_update: Callable[[PullProgress], None],
             stop: threading.Event) -> Pulled:
    """The pinned image onto one agent, unless it holds it already. Raises ImageError."""
    import docker.errors

    try:
        attrs = client.api.inspect_image(kept.pinned)
        progress.status = "present"
        on_update(progress)
        return Pulled(agent, "present", str(attrs["Id"]))
    except docker.errors.ImageNotFound:
        pass
    if kept.local:
        raise ImageError(f"agent {agent} does not hold image {kept.digest[:19]}… ({kept.ref}, "
                         "built or imported on the agents, in no registry): load it there or "
                         "name a registry image; nothing was created", "not found", [agent])
    repo, _tag, _ = split_reference(kept.ref)
    progress.status = "pulling"
    on_update(progress)
    try:
        stream = client.api.pull(repo, tag=kept.digest, stream=True, decode=True,
                                 auth_config=dict(auth) if auth else None)
        for event in stream:
            if stop.is_set():
                raise ImageError(f"agent {agent}: pull stopped", "interrupted", [agent])
            progress.feed(event)
            on_update(progress)
            if progress.error:
                break
    except docker.errors.APIError as exc:
        progress.error = str(exc.explanation or exc)
        progress.status = "failed"
    if progress.error:
        on_update(progress)
        cause = cause_of(progress.error)
        raise _error(f"agent {agent}: pull of {kept.pinned} failed: {cause}: "
                     f"{progress.error[:300]}", cause, [agent])
    try:
        attrs = client.api.inspect_image(kept.pinned)
    except docker.errors.ImageNotFound:
        raise ImageError(f"agent {agent}: the pull of {kept.pinned} ended without the image",
                         "engine failure", [agent]) from None
    progress.status = "done"
    on_update(progress)
    return Pulled(agent, "pulled", str(attrs["Id"]))


def pull_everywhere(pool: Pool, agents: Sequence[str], kept: KeptImage,
                    auth: Mapping[str, str] | None,
                    on_update: Callable[[PullProgress], None]) -> list[Pulled]:
    """``kept`` onto every agent of ``agents`` that lacks it, all at once (a thread each).
    Raises ImageError naming every agent that failed (the first's cause chooses the class);
    Ctrl-C stops the pulls that are still running."""
    stop = threading.Event()
    lock = threading.Lock()

    def update(p: PullProgress) -> None:
        with lock:
            on_update(p)

    progresses = {a: PullProgress(a) for a in agents}
    results: dict[str, Any] = {}

    def one(agent: str) -> None:
        try:
            client = open_client(pool.agent(agent), CONNECT_TIMEOUT)
        except Exception as exc:  # noqa: BLE001
            results[agent] = ImageError(f"agent {agent}: {exc}", "unreachable", [agent])
            return
        try:
            results[agent] = pull_one(client, agent, kept, auth, progresses[agent], update,
                                      stop)
        except Exception as exc:  # noqa: BLE001
            results[agent] = exc
        finally:
            close_client(client)

    threads = [threading.Thread(target=one, args=(a,), daemon=True, name=f"pull-{a}")
               for a in agents]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        raise
    failed = [(a, results[a]) for a in agents if isinstance(results.get(a), Exception)]
    if failed:
        first = next((e for _, e in failed if isinstance(e, ImageError)), None)
        cause = first.cause if first is not None else "engine failure"
        message = "\n".join(str(e) for _, e in failed)
        raise _error(f"{message}\nnothing was created", cause, [a for a, _ in failed])
    return [results[a] for a in agents]
