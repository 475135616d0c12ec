"""A PyTorch install in a plain directory, for mounting read-only into the test image.

The image stays small and torch-free; a container gets torch with ``-v DIR:/opt/torch:ro`` and
``PYTHONPATH=/opt/torch python3 -m torch.distributed.run ...``. Wheels are chosen for the
image's Python (Debian 12: CPython 3.11, glibc 2.36), not for whatever runs this module.
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
from pathlib import Path

from cluster_sessions.lab.image import Progress, cache_dir, locked, print_to_stderr

TORCH_VERSION = "2.13.0"
PYTHON_VERSION = "3.11"
REQUIREMENTS = (f"torch=={TORCH_VERSION}", "numpy")
MARKER = ".cluster-sessions-complete"
# Debian 12's glibc; a wheel needing a newer one would not load in the image.
IMAGE_GLIBC_MINOR = 36


class TorchInstallError(RuntimeError):
    """pip could not install torch; the message carries pip's last lines."""


def torch_dir_path() -> Path:
    abi = "cp" + PYTHON_VERSION.replace(".", "")
    return cache_dir() / f"torch-{TORCH_VERSION}-{abi}"


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


def _installed_version(target: Path) -> str:
    for info in target.glob("torch-*.dist-info"):
        return info.name.removeprefix("torch-").removesuffix(".dist-info")
    return "unknown"


def _size_mib(path: Path) -> float:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return total / 2**20


def ensure_torch_dir(progress: Progress = print_to_stderr) -> Path:
    """The directory holding torch and numpy, installed with pip on first use.

    The marker file is written only after pip succeeded, and the directory gets its final name
    only then, so an interrupted install is never mistaken for a finished one.
    """
    final = torch_dir_path()
    if (final / MARKER).is_file():
        progress(f"reusing torch {TORCH_VERSION} in {final}")
        return final
    with locked(final.name, progress):
        if (final / MARKER).is_file():
            progress(f"reusing torch {TORCH_VERSION} in {final}")
            return final
        for leftover in [final, *final.parent.glob(f"{final.name}.partial-*")]:
            if leftover.exists():
                progress(f"removing {leftover}, left by an interrupted install")
                shutil.rmtree(leftover)
        staging = Path(tempfile.mkdtemp(prefix=f"{final.name}.partial-", dir=final.parent))
        try:
            _pip_install(staging, progress)
            # Containers read it as an unprivileged user, whatever this process's umask was.
            subprocess.run(["chmod", "-R", "a+rX,go-w", str(staging)], check=True)
            (staging / MARKER).write_text(f"{' '.join(REQUIREMENTS)}\n")
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    progress(f"torch {_installed_version(final)} in {final} ({_size_mib(final):.0f} MiB)")
    return final


def _pip_install(target: Path, progress: Progress) -> None:
    command = [sys.executable, "-m", "pip", "install", "--no-input", "--target", str(target)]
    command += ["--no-warn-script-location", *_target_options(), *REQUIREMENTS]
    progress(f"pip install {' '.join(REQUIREMENTS)} into {target} (about 30 s, 1 GB)")
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).splitlines()[-20:]
        raise TorchInstallError(f"pip failed (exit {result.returncode}):\n" + "\n".join(tail))
    progress(f"pip install done in {time.monotonic() - started:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster_sessions.lab.torchdir",
        description="Install (or reuse) torch for the test image and print the directory.",
    )
    parser.parse_args(argv)
    try:
        print(ensure_torch_dir())
    except TorchInstallError as exc:
        print_to_stderr(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
