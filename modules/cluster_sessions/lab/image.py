"""The Debian image that tests and demos run sessions on, built from packages and cached.

No registry can be reached, so the image is made from Debian packages: ``debootstrap`` a minimal
bookworm root filesystem with sshd and python3, trim it, and ``docker import`` it. The tag is a
hash of the recipe, so an engine that already has it is reused at once; the rootfs tarball is
kept in the cache so another engine (the lab runs several) only needs the import, a few seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import EngineFailure
from ..core.names import DEMO_IMAGE_REPOSITORY
from ..core.terminal import progress as print_to_stderr

Progress = Callable[[str], None]

REPOSITORY = DEMO_IMAGE_REPOSITORY
# Image flavours: the packages each adds to PACKAGES, and its repository. "mpi" carries Open MPI
# and mpi4py for the launcher tests (tests/test_workloads.py).
FLAVOURS: dict[str, tuple[str, ...]] = {
    "sshd": (),
    "mpi": ("openmpi-bin", "python3-mpi4py"),
}
SUITE = "bookworm"
VARIANT = "minbase"
# Beyond minbase: sshd and ssh/ssh-keyscan for the cluster wiring, python3 for torchrun, useradd
# (passwd) for the container user, ip/ps for debugging, busybox for nc and friends.
PACKAGES = (
    "busybox",
    "iproute2",
    "openssh-client",
    "openssh-server",
    "passwd",
    "procps",
    "python3",
)
# Removed from the rootfs: nothing at run time reads them, and they are most of the size.
TRIM = (
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    "usr/share/lintian/*",
    "var/lib/apt/lists/*",
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/cache/debconf/*-old",
    "var/log/*.log",
    "var/log/apt/*",
    # Every session brings its own host keys; a baked-in key would be shared by all images.
    "etc/ssh/ssh_host_*",
)
CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
)
# Bump when the recipe changes in a way the fields above do not show (e.g. the build steps).
RECIPE_VERSION = 1

LABEL = "org.cluster-sessions.recipe"


class ImageBuildError(EngineFailure, RuntimeError):
    """The image could not be built or imported; the message says why and what to do."""


def cache_dir() -> Path:
    """``$CLUSTER_SESSIONS_CACHE``, else ``~/.cache/cluster-sessions``; created on demand."""
    configured = os.environ.get("CLUSTER_SESSIONS_CACHE")
    path = Path(configured) if configured else Path.home() / ".cache" / "cluster-sessions"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def locked(name: str, progress: Progress = print_to_stderr) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``<cache>/locks/<name>.lock``.

    The kernel drops the lock when its holder dies, so a killed build never wedges the next.
    """
    lock_dir = cache_dir() / "locks"
    lock_dir.mkdir(exist_ok=True)
    with open(lock_dir / f"{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another process that holds the {name} lock")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def packages(flavour: str = "sshd") -> tuple[str, ...]:
    return (*PACKAGES, *FLAVOURS[flavour])


def repository(flavour: str = "sshd") -> str:
    return REPOSITORY if flavour == "sshd" else f"cluster-sessions/debian-{flavour}"


def recipe_digest(flavour: str = "sshd") -> str:
    """12 hex digits of sha256 over the recipe; the mirror is left out, it changes no content."""
    recipe = {
        "suite": SUITE,
        "variant": VARIANT,
        "packages": sorted(packages(flavour)),
        "trim": list(TRIM),
        "changes": list(CHANGES),
        "version": RECIPE_VERSION,
    }
    encoded = json.dumps(recipe, sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()[:12]


def default_tag(flavour: str = "sshd") -> str:
    """The tag :func:`ensure_image` produces for the current recipe, without building anything."""
    return f"{repository(flavour)}:{recipe_digest(flavour)}"


@dataclass(frozen=True)
class AptSource:
    uri: str
    keyring: str | None


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    stanza: dict[str, str] = {}
    key = None
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if stanza:
                yield stanza
            stanza, key = {}, None
        elif line[0] in " \t" and key:
            stanza[key] += "\n" + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            stanza[key] = value.strip()


_ONE_LINE = re.compile(r"^(?P<type>deb|deb-src)\s+(?:\[(?P<options>[^\]]*)\]\s+)?(?P<rest>.+)$")


def _one_line_sources(text: str) -> Iterator[dict[str, str]]:
    for raw in text.splitlines():
        match = _ONE_LINE.match(raw.split("#", 1)[0].strip())
        if not match:
            continue
        options = dict(
            word.split("=", 1) for word in (match["options"] or "").split() if "=" in word
        )
        uri, suite, *components = match["rest"].split() + [""]
        yield {
            "types": match["type"],
            "uris": uri,
            "suites": suite,
            "components": " ".join(components),
            "signed-by": options.get("signed-by", ""),
        }


def debian_mirror(suite: str = SUITE, etc_apt: Path = Path("/etc/apt")) -> AptSource:
    """The Debian mirror this machine's apt uses for ``suite`` main, read at run time.

    ``$CLUSTER_SESSIONS_DEBIAN_MIRROR`` overrides it. The machine's own configuration is the
    one source that knows which mirror is reachable, so nothing is hard-coded here.
    """
    override = os.environ.get("CLUSTER_SESSIONS_DEBIAN_MIRROR")
    if override:
        return AptSource(override, None)
    stanzas: list[dict[str, str]] = []
    for path in sorted((etc_apt / "sources.list.d").glob("*.sources")):
        stanzas += _deb822_stanzas(path.read_text())
    for path in [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list"))]:
        if path.is_file():
            stanzas += _one_line_sources(path.read_text())
    for stanza in stanzas:
        if stanza.get("enabled", "yes").lower() == "no":
            continue
        if "deb" not in stanza.get("types", "").split():
            continue
        if suite not in stanza.get("suites", "").split():
            continue
        if "main" not in stanza.get("components", "").split():
            continue
        signed_by = stanza.get("signed-by", "")
        keyring = signed_by if signed_by.startswith("/") and "\n" not in signed_by else None
        for uri in stanza.get("uris", "").split():
            if uri.startswith(("http://", "https://", "file:/")):
                return AptSource(uri.rstrip("/"), keyring)
    raise ImageBuildError(
        f"no apt source for Debian {suite} main found under {etc_apt}; "
        "set CLUSTER_SESSIONS_DEBIAN_MIRROR to a Debian mirror URL"
    )


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    found = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            target = line.split()[1].encode().decode("unicode_escape")
            if target.startswith(prefix):
                found.append(target)
    return found


def _remove_build_dir(build: Path) -> None:
    """Remove a build directory, first unmounting what a failed debootstrap left mounted.

    Deleting through a still-mounted /proc or /sys of the chroot would reach the host's.
    """
    for target in sorted(_mounts_under(build), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False)
    if _mounts_under(build):
        raise ImageBuildError(f"{build} still has mounts under it; not deleting it")
    shutil.rmtree(build, ignore_errors=True)


def _debootstrap(rootfs: Path, log: Path, progress: Progress,
                 included: tuple[str, ...] = PACKAGES) -> None:
    if os.geteuid() != 0:
        raise ImageBuildError("building the image needs root (debootstrap)")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed; run scripts/ensure-docker.sh as root")
    source = debian_mirror()
    command = ["debootstrap", f"--variant={VARIANT}", f"--include={','.join(included)}"]
    if source.keyring and Path(source.keyring).is_file():
        command.append(f"--keyring={source.keyring}")
    command += [SUITE, str(rootfs), source.uri]
    progress(f"debootstrap {SUITE} with {', '.join(included)} (about a minute; log: {log})")
    started = time.monotonic()
    with open(log, "wb") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        inner = rootfs / "debootstrap" / "debootstrap.log"
        if inner.is_file():
            tail += inner.read_text(errors="replace").splitlines()[-15:]
        raise ImageBuildError(f"debootstrap failed (exit {result.returncode}):\n" + "\n".join(tail))
    progress(f"debootstrap done in {time.monotonic() - started:.0f}s")


def _trim(rootfs: Path) -> None:
    for pattern in TRIM:
        for match in glob.glob(str(rootfs / pattern)):
            path = Path(match)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    # Docker bind-mounts these per container; the build host's copies must not leak in.
    for name in ("etc/hostname", "etc/resolv.conf"):
        (rootfs / name).unlink(missing_ok=True)
        (rootfs / name).write_text("")
    # sshd's privilege separation directory; no init system creates it in a container.
    (rootfs / "run" / "sshd").mkdir(mode=0o755, exist_ok=True)


def _check_rootfs(rootfs: Path) -> None:
    wanted = [
        "usr/sbin/sshd",
        "usr/bin/ssh",
        "usr/bin/ssh-keyscan",
        "usr/sbin/useradd",
        "usr/sbin/usermod",
        "usr/bin/setpriv",
        "usr/bin/getent",
        "usr/bin/busybox",
        "usr/bin/python3",
    ]
    missing = [name for name in wanted if not (rootfs / name).exists()]
    if missing:
        raise ImageBuildError(f"the built rootfs lacks {', '.join(missing)}")


def tarball_path(flavour: str = "sshd") -> Path:
    return cache_dir() / "images" / f"debian-{flavour}-{recipe_digest(flavour)}.tar"


def ensure_tarball(progress: Progress = print_to_stderr, flavour: str = "sshd") -> Path:
    """The rootfs tarball for the current recipe, built with debootstrap if not yet cached.

    Callers hold the image lock, so any ``build-*`` directory found is an interrupted build's.
    The tarball appears under its final name only when complete.
    """
    tarball = tarball_path(flavour)
    if tarball.is_file():
        progress(f"reusing cached rootfs {tarball}")
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    for stale in tarball.parent.glob("build-*"):
        progress(f"removing {stale}, left by an interrupted build")
        _remove_build_dir(stale)
    build = Path(tempfile.mkdtemp(prefix="build-", dir=tarball.parent))
    try:
        rootfs = build / "rootfs"
        _debootstrap(rootfs, build / "debootstrap.out", progress, packages(flavour))
        _trim(rootfs)
        _check_rootfs(rootfs)
        partial = build / "rootfs.tar"
        subprocess.run(
            ["tar", "--numeric-owner", "--exclude=./dev/*", "-C", str(rootfs)]
            + ["-cf", str(partial), "."],
            check=True,
        )
        os.replace(partial, tarball)
    except subprocess.CalledProcessError as exc:
        raise ImageBuildError(f"packing the rootfs failed: {exc}") from exc
    finally:
        _remove_build_dir(build)
    progress(f"rootfs tarball {tarball} ({tarball.stat().st_size / 2**20:.0f} MiB)")
    return tarball


def _has_image(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _import(client, tarball: Path, tag: str, progress: Progress) -> None:
    repository, _, version = tag.partition(":")
    progress(f"docker import {tarball.name} as {tag}")
    started = time.monotonic()
    output = client.api.import_image_from_file(
        str(tarball),
        repository=repository,
        tag=version,
        changes=[*CHANGES, f"LABEL {LABEL}={version}"],
    )
    for line in str(output).splitlines():
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict) and message.get("error"):
                raise ImageBuildError(f"docker import failed: {message['error']}")
    if not _has_image(client, tag):
        raise ImageBuildError(f"docker import reported success but {tag} is missing: {output}")
    progress(f"imported {tag} in {time.monotonic() - started:.1f}s")


def ensure_image(client=None, progress: Progress = print_to_stderr, flavour: str = "sshd") -> str:
    """Make sure the engine behind ``client`` (default: from the environment) has the image.

    Returns its tag. Reuses the tag if the engine has it, else the cached tarball, else builds.
    """
    import docker

    tag = default_tag(flavour)
    own_client = client is None
    if own_client:
        client = docker.from_env(timeout=600)
    try:
        if _has_image(client, tag):
            progress(f"reusing image {tag} already on the engine")
            return tag
        with locked(f"image-{recipe_digest(flavour)}", progress):
            if _has_image(client, tag):
                progress(f"reusing image {tag} already on the engine")
                return tag
            _import(client, ensure_tarball(progress, flavour), tag, progress)
        return tag
    finally:
        if own_client:
            client.close()


def ensure_images(clients, progress: Progress = print_to_stderr, flavour: str = "sshd") -> str:
    """:func:`ensure_image` for several engines (the lab's agents): the rootfs is built or
    found once, under the image lock, imported into one engine (unless one holds the tag
    already), then saved from it and loaded into every other engine that lacks the tag, in
    parallel. One image ID on every agent: ``docker import`` stamps the time into the image's
    config, so two imports of one tarball are two images, and ``up`` pins an image only the
    agents hold by its ID, the same on every agent of a session (issue 33). Returns the tag."""
    import tempfile

    tag = default_tag(flavour)
    missing = [c for c in clients if not _has_image(c, tag)]
    if not missing:
        progress(f"reusing image {tag} already on {len(clients)} engine(s)")
        return tag
    source = next((c for c in clients if c not in missing), None)
    if source is None:
        with locked(f"image-{recipe_digest(flavour)}", progress):
            tarball = ensure_tarball(progress, flavour)
        source = missing.pop(0)
        _import(source, tarball, tag, functools.partial(_engine_progress, progress,
                                                        "engine 1: "))
    if not missing:
        return tag
    failed: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="lab-image-") as tmp:
        saved = Path(tmp) / "image.tar"
        started = time.monotonic()
        with saved.open("wb") as out:
            for chunk in source.api.get_image(tag):
                out.write(chunk)
        progress(f"saved {tag} in {time.monotonic() - started:.1f}s")

        def work(n: int, client) -> None:
            try:
                begun = time.monotonic()
                with saved.open("rb") as data:
                    client.api.load_image(data)
                if not _has_image(client, tag):
                    raise ImageBuildError(f"docker load reported success but {tag} is missing")
                progress(f"engine {n}/{len(missing)}: loaded {tag} in "
                         f"{time.monotonic() - begun:.1f}s")
            except BaseException as exc:  # reported by the caller's thread
                failed.append(exc)

        # Daemon threads, joined in short waits: Ctrl-C stops `lab up` at once (a load cut
        # short tags nothing, and `lab status` then says the image is missing), instead of
        # waiting for every load as an executor's shutdown would.
        threads = [threading.Thread(target=work, args=(n, c), daemon=True)
                   for n, c in enumerate(missing, 1)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    if failed:
        raise failed[0]
    return tag


def _engine_progress(progress: Progress, prefix: str, message: str) -> None:
    progress(prefix + message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster_sessions.lab.image",
        description="Build (or reuse) the Debian sshd test image and print its tag.",
    )
    parser.add_argument(
        "--tag-only", action="store_true", help="print the tag the recipe gives; build nothing"
    )
    parser.add_argument("--flavour", choices=sorted(FLAVOURS), default="sshd",
                        help="sshd: the demo image (default); mpi: with Open MPI and mpi4py")
    args = parser.parse_args(argv)
    if args.tag_only:
        print(default_tag(args.flavour))
        return 0
    import docker.errors

    try:
        print(ensure_image(flavour=args.flavour))
    except (ImageBuildError, docker.errors.DockerException) as exc:
        print_to_stderr(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
