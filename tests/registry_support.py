"""A real image registry for tests (issue 33): Debian's ``docker-registry`` (the distribution
registry), started by the test on an address it chose (loopback, or a lab's bridge address),
with basic auth from an htpasswd file, stopped and its storage removed at the end.
``scripts/setup.sh --dev`` installs it (and ``htpasswd``, from apache2-utils)."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .conftest import skip_or_fail

USER, PASSWORD = "puller", "right-horse-battery"


@dataclass(frozen=True)
class Registry:
    address: str  # host:port, as image references name it
    user: str
    password: str
    directory: Path

    def auth(self, password: str | None = None) -> dict[str, str]:
        return {"username": self.user, "password": password or self.password}

    def docker_config(self, path: Path, password: str | None = None) -> Path:
        """A docker config file holding credentials for this registry (as `docker login`
        writes it)."""
        token = base64.b64encode(f"{self.user}:{password or self.password}".encode()).decode()
        path.write_text(json.dumps({"auths": {self.address: {"auth": token}}}))
        return path


@contextlib.contextmanager
def registry(directory: Path, host: str, port: int) -> Iterator[Registry]:
    exe, htpasswd = shutil.which("docker-registry"), shutil.which("htpasswd")
    if not exe or not htpasswd:
        skip_or_fail("docker-registry or htpasswd is not installed (apt-get install "
                     "docker-registry apache2-utils; scripts/setup.sh --dev does)")
    directory.mkdir(parents=True, exist_ok=True)
    users = directory / "htpasswd"
    users.write_text(subprocess.run([htpasswd, "-Bbn", USER, PASSWORD], check=True,
                                    capture_output=True, text=True).stdout)
    config = directory / "config.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(directory / "data")},
                    "delete": {"enabled": True}},
        "http": {"addr": f"{host}:{port}", "secret": "test-only"},
        "auth": {"htpasswd": {"realm": "test", "path": str(users)}},
    }))
    log = (directory / "registry.log").open("w")
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://{host}:{port}/v2/", timeout=1)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # up, and asking for credentials
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"docker-registry did not start: "
                                   f"{(directory / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield Registry(f"{host}:{port}", USER, PASSWORD, directory)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(directory / "data", ignore_errors=True)
