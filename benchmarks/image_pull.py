"""An image onto several agents at once (issue 33: a 1 GB image onto 3 lab agents in parallel
in <= 1.3x one agent's pull of it alone, same run; with the image present the image step adds
<= 1 s), against Debian's docker-registry with basic auth on the lab bridge's address.

The image is built on agent1 from nothing (``docker import`` of a small tree, then layers of
random bytes put into a never-started container and committed: no shell needed), pushed, and
removed from agent1 again. Then, each through ``agents.images.pull_everywhere`` (what ``up``
and ``pool pull`` run): agent1 alone; removed; all agents at once; then again with the image
present everywhere (``up``'s image step for a kept digest), and ``resolve`` (one distribution
inspect through agent1: what a first ``up`` or ``--refresh-image`` adds).

The lab shares this machine's cores and disk, and the registry runs on it too: the agents'
pulls compete for them (gzip, writes), so on real hosts the ratio can only be lower.

    python3 benchmarks/image_pull.py [--agents 3] [--size-mb 1024] [--layers 4]   # as root
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "modules"))

import docker  # noqa: E402

from cluster_sessions.agents.images import pull_everywhere, resolve  # noqa: E402
from cluster_sessions.core.loader import load_file  # noqa: E402
from cluster_sessions.lab import netns  # noqa: E402

PREFIX, SUBNET = "csib", "10.251.122.0/24"
PORT = 5122
USER, PASSWORD = "bench", "bench-only-password"


def start_registry(directory: Path, host: str) -> subprocess.Popen:
    users = directory / "htpasswd"
    users.write_text(subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True,
                                    capture_output=True, text=True).stdout)
    config = directory / "config.yml"
    config.write_text(json.dumps({
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(directory / "data")}},
        "http": {"addr": f"{host}:{PORT}", "secret": "bench"},
        "auth": {"htpasswd": {"realm": "bench", "path": str(users)}}}))
    proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://{host}:{PORT}/v2/", timeout=1)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("docker-registry did not start")


def tar_of(name: str, size: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = size
        tar.addfile(info, io.BytesIO(os.urandom(size)))
    return buf.getvalue()


def build(client: docker.DockerClient, size_mb: int, layers: int) -> str:
    """An image of ``layers`` layers of random bytes, ``size_mb`` in all; its ID."""
    client.api.import_image_from_data(tar_of("base", 1024), repository="bench-base", tag="1")
    image = "bench-base:1"
    for k in range(layers):
        made = client.api.create_container(image, command=["none"])
        client.api.put_archive(made["Id"], "/", tar_of(f"blob{k}",
                                                       size_mb * 2**20 // layers))
        image = client.api.commit(made["Id"])["Id"]
        client.api.remove_container(made["Id"])
    return image


def remove(client: docker.DockerClient, refs: list[str]) -> None:
    for ref in refs:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_image(ref, force=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    if not shutil.which("docker-registry") or not shutil.which("htpasswd"):
        raise SystemExit("needs docker-registry and htpasswd (scripts/setup.sh --dev)")
    state = Path(tempfile.mkdtemp(prefix="image-bench-"))
    info = netns.lab_up(args.agents, state, state / "lab.yaml", prefix=PREFIX, subnet=SUBNET)
    reg_dir = state / "registry"
    reg_dir.mkdir()
    proc = start_registry(reg_dir, info.bridge_address)
    clients = [docker.DockerClient(base_url=f"unix://{a.socket}", timeout=1800)
               for a in info.agents]
    try:
        pool = load_file(info.pool_file, expect="AgentPool")
        names = [a.name for a in pool.agents]
        auth = {"username": USER, "password": PASSWORD}
        repo = f"{info.bridge_address}:{PORT}/bench/big"
        t0 = time.perf_counter()
        built = build(clients[0], args.size_mb, args.layers)
        clients[0].api.tag(built, repo, "v1")
        for event in clients[0].api.push(repo, "v1", stream=True, decode=True,
                                         auth_config=auth):
            if "error" in event:
                raise SystemExit(event["error"])
        print(f"built and pushed {args.size_mb} MB in {args.layers} layers in "
              f"{time.perf_counter() - t0:.1f}s")
        kept, how = resolve(pool, names, f"{repo}:v1", auth)
        remove(clients[0], [f"{repo}:v1", built])
        t0 = time.perf_counter()
        resolve(pool, names, f"{repo}:v1", auth)
        resolved = time.perf_counter() - t0
        print(f"resolved to {kept.pinned} ({how}) in {resolved:.2f}s")

        def timed(agents: list[str]) -> float:
            t0 = time.perf_counter()
            done = pull_everywhere(pool, agents, kept, auth, lambda p: None)
            took = time.perf_counter() - t0
            assert all(d.how == "pulled" for d in done), done
            return took

        def raw(clients_: list) -> float:
            """The same pulls straight through the lab's sockets, no sessionctl: the floor
            this machine gives three engines pulling at once."""
            repo_, _, digest = kept.pinned.partition("@")

            def one_pull(c) -> None:
                for event in c.api.pull(repo_, tag=digest, stream=True, decode=True,
                                        auth_config=auth):
                    assert "error" not in event, event

            t0 = time.perf_counter()
            threads = [threading.Thread(target=one_pull, args=(c,)) for c in clients_]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return time.perf_counter() - t0

        one = timed(names[:1])
        remove(clients[0], [kept.pinned])
        floor = raw(clients)
        for c in clients:
            remove(c, [kept.pinned])
        whole = timed(names)
        t0 = time.perf_counter()
        done = pull_everywhere(pool, names, kept, auth, lambda p: None)
        present = time.perf_counter() - t0
        assert all(d.how == "present" for d in done), done
        print(f"one agent alone: {one:.1f}s ({args.size_mb / one:.0f} MB/s)")
        print(f"all {len(names)} in parallel: {whole:.1f}s; ratio {whole / one:.2f} "
              f"(target <= 1.3: {'met' if whole / one <= 1.3 else 'missed'})")
        print(f"the same {len(names)} pulls straight to the engines (no sessionctl): "
              f"{floor:.1f}s; sessionctl's parallel pull / that floor: {whole / floor:.2f}")
        print(f"image present on all {len(names)}: {present:.2f}s (target <= 1 s: "
              f"{'met' if present <= 1 else 'missed'}); resolving once more adds "
              f"{resolved:.2f}s")
    finally:
        for c in clients:
            c.close()
        proc.terminate()
        proc.wait(10)
        netns.lab_down(state)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
