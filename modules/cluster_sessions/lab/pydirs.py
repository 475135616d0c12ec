"""Python packages installed in plain directories, for mounting read-only into the test image.

The image stays small: a container gets torch with ``-v DIR:/opt/torch:ro`` and
``PYTHONPATH=/opt/torch python3 -m torch.distributed.run ...`` (TensorFlow the same way). Wheels
are chosen for the image's Python (Debian 12: CPython 3.11, glibc 2.36), not for whatever runs
this module. Each directory is cached and installed once, under a lock.

    python -m cluster_sessions.lab.pydirs torch          # prints the directory
    python -m cluster_sessions.lab.pydirs tensorflow
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cluster_sessions.core.errors import EngineFailure
from cluster_sessions.lab.image import Progress, cache_dir, locked, print_to_stderr

PYTHON_VERSION = "3.11"
MARKER = ".cluster-sessions-complete"
# Debian 12's glibc; a wheel needing a newer one would not load in the image.
IMAGE_GLIBC_MINOR = 36


@dataclass(frozen=True)
class PackageDir:
    """What one cached directory holds: its main distribution, pinned, and the rest."""

    name: str  # the directory's and the CLI's name
    distribution: str  # whose version the directory is named after
    version: str
    extra: tuple[str, ...] = ()
    size_note: str = ""

    @property
    def requirements(self) -> tuple[str, ...]:
        return (f"{self.distribution}=={self.version}", *self.extra)

    def path(self) -> Path:
        abi = "cp" + PYTHON_VERSION.replace(".", "")
        return cache_dir() / f"{self.name}-{self.version}-{abi}"


TORCH = PackageDir("torch", "torch", "2.13.0", ("numpy",), "about 30 s, 1 GB")
TENSORFLOW = PackageDir("tensorflow", "tensorflow-cpu", "2.21.0", (), "about 1 min, 1.5 GB")
DIRS = {d.name: d for d in (TORCH, TENSORFLOW)}


class InstallError(EngineFailure, RuntimeError):
    """pip could not install the packages; the message carries pip's last lines."""


def _target_options() -> list[str]:
    abi = "cp" + PYTHON_VERSION.replace(".", "")
    arch = platform.machine()
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(IMAGE_GLIBC_MINOR, 16, -1)]
    platforms.append(f"manylinux2014_{arch}")
    options = ["--only-binary=:all:", "--implementation", "cp"]
    options += ["--python-version", PYTHON_VERSION, "--abi", abi]
    for name in platforms:
        options += ["--platform", name]
    return options


def _installed_version(spec: PackageDir, target: Path) -> str:
    stem = spec.distribution.replace("-", "_")
    for info in target.glob(f"{stem}-*.dist-info"):
        return info.name.removeprefix(f"{stem}-").removesuffix(".dist-info")
    return "unknown"


def _size_mib(path: Path) -> float:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return total / 2**20


def ensure_dir(spec: PackageDir, progress: Progress = print_to_stderr) -> Path:
    """The directory holding ``spec``'s packages, installed with pip on first use.

    The marker file is written only after pip succeeded, and the directory gets its final name
    only then, so an interrupted install is never mistaken for a finished one.
    """
    final = spec.path()
    if (final / MARKER).is_file():
        progress(f"reusing {spec.distribution} {spec.version} in {final}")
        return final
    with locked(final.name, progress):
        if (final / MARKER).is_file():
            progress(f"reusing {spec.distribution} {spec.version} in {final}")
            return final
        for leftover in [final, *final.parent.glob(f"{final.name}.partial-*")]:
            if leftover.exists():
                progress(f"removing {leftover}, left by an interrupted install")
                shutil.rmtree(leftover)
        staging = Path(tempfile.mkdtemp(prefix=f"{final.name}.partial-", dir=final.parent))
        try:
            _pip_install(spec, staging, progress)
            # Containers read it as an unprivileged user, whatever this process's umask was.
            subprocess.run(["chmod", "-R", "a+rX,go-w", str(staging)], check=True)
            (staging / MARKER).write_text(f"{' '.join(spec.requirements)}\n")
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    progress(f"{spec.distribution} {_installed_version(spec, final)} in {final} "
             f"({_size_mib(final):.0f} MiB)")
    return final


def ensure_torch_dir(progress: Progress = print_to_stderr) -> Path:
    return ensure_dir(TORCH, progress)


def ensure_tensorflow_dir(progress: Progress = print_to_stderr) -> Path:
    return ensure_dir(TENSORFLOW, progress)


DEEPSPEED_VERSION = "0.19.8"


def deepspeed_runner_source(progress: Progress = print_to_stderr) -> str:
    """The text of DeepSpeed's launcher (``deepspeed/launcher/runner.py``), from its source
    archive (cached): the tests run its own hostfile parser on the session's hostfile. DeepSpeed
    itself needs torch and compiled ops, more than a hostfile check is worth."""
    import tarfile

    directory = cache_dir() / f"deepspeed-{DEEPSPEED_VERSION}-sdist"
    archive = directory / f"deepspeed-{DEEPSPEED_VERSION}.tar.gz"
    if not archive.is_file():
        with locked(directory.name, progress):
            if not archive.is_file():
                directory.mkdir(parents=True, exist_ok=True)
                command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                           ":all:", "-d", str(directory), f"deepspeed=={DEEPSPEED_VERSION}"]
                result = subprocess.run(command, capture_output=True, text=True, check=False)
                if result.returncode != 0 or not archive.is_file():
                    tail = (result.stdout + result.stderr).splitlines()[-10:]
                    raise InstallError("pip download deepspeed failed:\n" + "\n".join(tail))
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"deepspeed-{DEEPSPEED_VERSION}/deepspeed/launcher/runner.py")
        assert member is not None
        return member.read().decode()


def _pip_install(spec: PackageDir, target: Path, progress: Progress) -> None:
    command = [sys.executable, "-m", "pip", "install", "--no-input", "--target", str(target)]
    command += ["--no-warn-script-location", *_target_options(), *spec.requirements]
    progress(f"pip install {' '.join(spec.requirements)} into {target} ({spec.size_note})")
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).splitlines()[-20:]
        raise InstallError(f"pip failed (exit {result.returncode}):\n" + "\n".join(tail))
    progress(f"pip install done in {time.monotonic() - started:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster_sessions.lab.pydirs",
        description="Install (or reuse) a package directory for the test image and print it.",
    )
    parser.add_argument("name", choices=sorted(DIRS), help="torch or tensorflow")
    args = parser.parse_args(argv)
    try:
        print(ensure_dir(DIRS[args.name]))
    except InstallError as exc:
        print_to_stderr(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
