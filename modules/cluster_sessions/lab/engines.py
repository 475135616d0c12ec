"""The agents' Docker Engines: one containerd and one dockerd per agent, each in its agent's
namespaces, with its own data, socket and ID; asking an engine for its ID, stopping its
containers, stopping and starting one dockerd again (a fault to test against), and waiting for
the agents' daemons with their logs' last lines when they do not come."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from ..agents.polling import poll_until
from .layout import (
    DOCKER_GROUP,
    NETNS_DIR,
    Layout,
    find_record,
    layout_from_record,
    write_private,
    write_records,
)
from .processes import LabError, spawn, terminate

ENGINE_TIMEOUT = 60.0
DOCKERD_GRACE = 3.0  # seconds between SIGTERM and SIGKILL in lab_down


def in_agent(lay: Layout, k: int) -> list[str]:
    """Command prefix: run in agent k's network namespace, in a UTS namespace of its own whose
    hostname is the agent's name (so swarm node names and ``ssh agentK hostname`` tell the
    agents apart). Every step execs, so the pid stays the daemon's."""
    return [
        shutil.which("nsenter") or "nsenter", f"--net={NETNS_DIR / lay.netns(k)}", "--",
        shutil.which("unshare") or "unshare", "--uts", "--",
        "/bin/sh", "-c", 'hostname "$0" && exec "$@"', f"agent{k}",
    ]



def containerd_config(lay: Layout, k: int) -> str:
    root = lay.agent_dir(k) / "containerd"
    return "\n".join([
        "version = 2",
        f'root = "{root}"',
        f'state = "{lay.containerd_state(k)}"',
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]',
        "[grpc]",
        f'  address = "{lay.containerd_socket(k)}"',
        "[debug]",
        '  level = "warn"',
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{root}/opt"',
        "",
    ])



def spawn_containerd(lay: Layout, k: int) -> int:
    """Start agent ``k``'s own containerd (dockerd would otherwise use a system containerd at
    /run/containerd/containerd.sock when one exists, shared by every agent); its pid."""
    d = lay.agent_dir(k)
    d.mkdir(parents=True, exist_ok=True)
    lay.containerd_state(k).mkdir(parents=True, exist_ok=True)
    cfg = d / "containerd.toml"
    write_private(cfg, containerd_config(lay, k))
    cmd = [shutil.which("nsenter") or "nsenter", f"--net={NETNS_DIR / lay.netns(k)}", "--",
           shutil.which("containerd") or "containerd", "--config", str(cfg)]
    return spawn(cmd, d / "containerd.log")


def spawn_dockerd(lay: Layout, k: int) -> int:
    d = lay.agent_dir(k)
    dcfg = d / "daemon.json"
    # without its own key file every engine would share /etc/docker/key.json, hence its ID;
    # a registry on the lab's own subnet (the tests' docker-registry, on the bridge's address)
    # is spoken to over plain HTTP, as engines do with one on loopback
    write_private(dcfg, json.dumps({"deprecated-key-path": str(d / "key.json"),
                                    "insecure-registries": [str(lay.subnet)]}) + "\n")
    # the directory sshd's namespace binds, open to the docker group's members
    lay.engine_dir(k).mkdir(parents=True, exist_ok=True)
    lay.engine_dir(k).chmod(0o755)
    lay.socket(k).unlink(missing_ok=True)
    cmd = [
        *in_agent(lay, k),
        shutil.which("dockerd") or "dockerd",
        "--config-file", str(dcfg),
        "--data-root", str(d / "docker"),
        "--exec-root", str(lay.exec_root(k)),
        "--pidfile", str(d / "docker.pid"),
        "-H", f"unix://{lay.socket(k)}",
        "--group", DOCKER_GROUP,  # the socket: root:docker 0660
        "--containerd", str(lay.containerd_socket(k)),
        "--bip", lay.bip(k),
        # cgroupfs whatever the host uses, so that the parent is a plain path (with the
        # systemd driver it would have to be a slice) and lab_down finds the containers
        "--exec-opt", "native.cgroupdriver=cgroupfs",
        "--cgroup-parent", f"/{lay.netns(k)}",
        "--dns", lay.bridge_address,
        "--swarm-default-advertise-addr", lay.address(k),
    ]
    return spawn(cmd, d / "dockerd.log")


def stop_dockerd(state_dir: Path, agent: str, timeout: float = 30) -> None:
    """Stop one agent's Docker Engine (a fault to test against; ``start_dockerd`` undoes it)."""
    rec = find_record(state_dir)
    if rec is None:
        raise LabError(f"no lab recorded for {state_dir}")
    terminate([rec["pids"][agent]["dockerd"]], timeout)


def start_dockerd(state_dir: Path, agent: str, timeout: float = 60) -> None:
    """Start a stopped agent's Docker Engine again, as ``lab up`` did, and wait for it."""
    rec = find_record(state_dir)
    if rec is None:
        raise LabError(f"no lab recorded for {state_dir}")
    lay = layout_from_record(rec)
    k = int(agent.removeprefix("agent"))
    rec["pids"][agent]["dockerd"] = spawn_dockerd(lay, k)
    write_records(lay, rec)
    wait_for(lambda: bool(engine_id(lay.socket(k), timeout=2)), timeout,
             f"{agent}'s dockerd", lay, k)


def wait_for(cond: Callable[[], bool], timeout: float, what: str, lay: Layout,
             agents: int) -> None:
    if not poll_until(cond, bool, timeout, interval=0.1):
        raise LabError(f"timed out after {timeout:.0f}s waiting for {what}; "
                       f"logs: {lay.state_dir}/agent*/" + log_tails(lay, agents))


def log_tails(lay: Layout, agents: int) -> str:
    out = []
    for k in range(1, agents + 1):
        for name in ("containerd.log", "dockerd.log", "sshd.log"):
            with contextlib.suppress(OSError):
                tail = (lay.agent_dir(k) / name).read_text(errors="replace").splitlines()[-3:]
                if tail:
                    out.append(f"\n--- agent{k}/{name}\n" + "\n".join(tail))
    return "".join(out)


def docker_client(sock: Path, timeout: float):
    """A Docker SDK client on the engine's local socket (the lab's own steps use these)."""
    import docker

    return docker.DockerClient(base_url=f"unix://{sock}", timeout=timeout)


def engine_id(sock: Path, timeout: float = 5.0) -> str:
    """The engine's ID (``docker info`` ID), or "" when it does not answer."""
    if not sock.exists():
        return ""
    try:
        client = docker_client(sock, timeout)
        try:
            return str(client.info().get("ID", "") or "")
        finally:
            client.close()
    except Exception:  # any failure to ask it: it does not answer
        return ""


def has_tag(sock: Path, tag: str, timeout: float = 5.0) -> bool | None:
    """Whether the engine has the image ``tag``; None when it does not answer."""
    import docker.errors

    try:
        client = docker_client(sock, timeout)
        try:
            client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False
        finally:
            client.close()
    except Exception:  # any other failure to ask it: unknown
        return None


def stop_containers(sock: Path) -> None:
    """Stop every running container of one engine at once (no 10 s grace per container)."""
    try:
        client = docker_client(sock, 10)
        running = client.containers.list()
    except Exception:  # the engine is gone already: nothing to stop
        return
    try:
        def stop(container) -> None:
            with contextlib.suppress(Exception):
                container.stop(timeout=0)

        threads = [threading.Thread(target=stop, args=(c,), daemon=True) for c in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
    finally:
        client.close()
