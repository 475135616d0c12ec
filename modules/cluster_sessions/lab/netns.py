"""A local multi-agent lab: several Docker Engines on one machine, each in its own netns.

Layout (defaults; ``prefix`` and ``subnet`` change the names and the /24):

* a Linux bridge ``csl-br0`` holding the host address ``10.251.0.1/24``;
* per agent K a network namespace ``csl-agentK`` joined to the bridge by a veth pair
  (host side ``csl-vK``, namespace side ``eth0`` with ``10.251.0.(10+K)/24``, default route via
  the bridge address);
* in each namespace its own ``containerd``, its own ``dockerd`` (started with
  ``nsenter --net=...``, not ``ip netns exec``, which remounts /sys and hides the cgroup mounts
  dockerd needs) listening on ``<state_dir>/agentK/engine/docker.sock`` (root:docker 0660), and
  its own ``sshd`` on ``10.251.0.(10+K):22`` (key-only logins with the lab key
  ``<state_dir>/id_lab`` for the non-root user ``csl-ops``, a member of the ``docker`` group,
  and for root, which the lab's own steps use);
* the lab is a *remote* pool, as real GPU hosts are: the pool file names each engine by its
  path on the agent, ``unix:///run/csl-lab/<prefix>/engine/docker.sock``, the same on every
  agent, and says to log in as ``csl-ops``. Each sshd runs in a private mount namespace where
  that directory is a bind mount of its agent's ``engine`` directory (the directory, not the
  socket, so a restarted dockerd's new socket appears there); on this machine the directory is
  empty, so a program that hands the path to a local Docker client fails, as it would against
  a remote host. ``SetEnv DOCKER_HOST=`` names that path. The lab's own steps (waiting for the
  engines, engine IDs, stopping containers, importing images) use the local sockets;
* iptables on the host: bridged traffic between lab ports is accepted (with br_netfilter
  active, bridged frames traverse the host's FORWARD chain, whose policy Docker sets to DROP),
  anything the lab would route off the bridge is rejected (the lab never reaches beyond this
  machine); each engine resolves external names via the bridge address, where nothing answers.

Only one lab per ``prefix`` exists on a machine: the names above are machine-wide. The lab is
recorded in ``<state_dir>/lab.json`` and in ``/run/csl-lab/<prefix>/lab.json`` (the latter also
holds the short runtime directories dockerd needs: its exec-root must stay short because
libnetwork puts a socket named after a 64-character id inside it; the copy of
``authorized_keys`` sshd reads as the user logging in; the agent-side engine directory). The
``csl-ops`` account (and the ``docker`` group, if the lab had to create it) is shared by every
lab on the machine and stays after ``lab_down``.

This module is a library (no argument parsing); ``sessionctl lab up/down/status`` wraps it.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ..agents.polling import poll_until
from .layout import (
    DEFAULT_PREFIX,
    DEFAULT_SUBNET,
    DOCKER_GROUP,
    LAB_USER,
    MAX_AGENTS,
    MAX_SOCKET_PATH,
    NETNS_DIR,
    RECORD_VERSION,
    RUN_BASE,
    SAFE_PATH,
    AgentStatus,
    LabInfo,
    LabStatus,
    Layout,
    find_record,
    layout_for,
    layout_from_record,
    read_json,
    write_private,
    write_records,
)
from .processes import (
    LabError,
    alive,
    kill,
    pid_matching,
    pids_in_cgroups,
    pids_in_netns,
    read_pid,
    remove_cgroups,
    run,
    spawn,
    terminate,
    unmount_under,
)

Progress = Callable[[str], None]
ENGINE_TIMEOUT = 60.0
SSHD_TIMEOUT = 20.0
DOCKERD_GRACE = 3.0  # seconds between SIGTERM and SIGKILL in lab_down


REQUIRED_TOOLS = {
    "ip": "iproute2",
    "iptables": "iptables",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "useradd": "passwd",
    "usermod": "passwd",
    "groupadd": "passwd",
    "dockerd": "docker.io",
    "containerd": "containerd (a dependency of docker.io)",
    "ssh-keygen": "openssh-client",
    "ssh": "openssh-client",
    "docker": "docker.io",
}
SSHD = "/usr/sbin/sshd"  # sshd must be started by absolute path (it re-executes itself)



# --------------------------------------------------------------------------- small helpers


def _noop(_msg: str) -> None:
    pass


def _iptables_has(rule: list[str]) -> bool:
    chain, spec = rule[0], rule[1:]
    return run(["iptables", "-w", "-C", chain, *spec], check=False).returncode == 0


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def _check_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (network namespaces, a bridge, iptables, dockerd); "
            "run it as root, e.g. with sudo"
        )


def _check_tools() -> None:
    missing = [f"{tool} ({pkg})" for tool, pkg in REQUIRED_TOOLS.items() if not shutil.which(tool)]
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD} (openssh-server)")
    if missing:
        raise LabError(
            "missing programs: " + ", ".join(missing) + "; install with "
            "`apt-get install docker.io openssh-server iproute2 iptables`"
        )


def _account_locked(user: str) -> bool:
    # With `UsePAM no` OpenSSH refuses any login to an account whose password is locked ('!')
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            if line.startswith(f"{user}:"):
                return line.split(":")[1].startswith("!")
    except OSError:
        pass
    return False


def _ensure_lab_user() -> None:
    """The non-root account the pool logs in as, in the docker group (the group dockerd gives
    its socket), as users reach real agents; created once per machine, kept by lab_down since
    every lab shares it. Another lab coming up at the same time may create it first."""
    if _group_missing(DOCKER_GROUP):
        run(["groupadd", "--system", DOCKER_GROUP], check=False)
        if _group_missing(DOCKER_GROUP):
            raise LabError(f"could not create the group {DOCKER_GROUP}")
    try:
        pwd.getpwnam(LAB_USER)
    except KeyError:
        run(["useradd", "--create-home", "--shell", "/bin/sh", "--groups", DOCKER_GROUP,
             "--password", "*", LAB_USER], check=False)
    try:
        account = pwd.getpwnam(LAB_USER)
    except KeyError:
        raise LabError(f"could not create the lab user {LAB_USER}") from None
    if account.pw_uid == 0:
        raise LabError(f"the lab user {LAB_USER} has uid 0; it must be an ordinary account")
    if LAB_USER not in grp.getgrnam(DOCKER_GROUP).gr_mem:
        run(["usermod", "--append", "--groups", DOCKER_GROUP, LAB_USER])
    if _account_locked(LAB_USER):  # key logins only: '*' is no password, not a locked account
        run(["usermod", "--password", "*", LAB_USER])


def _group_missing(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return True
    return False


def _client(sock: Path, timeout: float):
    import docker

    return docker.DockerClient(base_url=f"unix://{sock}", timeout=timeout)


def engine_id(sock: Path, timeout: float = 5.0) -> str:
    """The engine's ID (``docker info`` ID), or "" when it does not answer."""
    if not sock.exists():
        return ""
    try:
        client = _client(sock, timeout)
        try:
            return str(client.info().get("ID", "") or "")
        finally:
            client.close()
    except Exception:  # any failure to ask it: it does not answer
        return ""


def _sshd_answers(address: str, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


# --------------------------------------------------------------------------- bring-up steps


def _ensure_keys(lay: Layout, agents: int) -> None:
    if not lay.key_file.exists():
        lay.key_file.with_suffix(".pub").unlink(missing_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cluster-sessions-lab",
              "-f", str(lay.key_file)])
    for k in range(1, agents + 1):
        d = lay.agent_dir(k)
        d.mkdir(parents=True, exist_ok=True)
        hk = d / "ssh_host_ed25519_key"
        if not hk.exists():
            hk.with_suffix(".pub").unlink(missing_ok=True)
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"lab-agent{k}",
                  "-f", str(hk)])
    pub = lay.key_file.with_name("id_lab.pub").read_text().strip()
    write_private(lay.authorized_keys, pub + "\n")
    for d in (RUN_BASE, lay.run_dir, lay.agent_engine_dir):  # open to the lab user
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    write_private(lay.run_authorized_keys, pub + "\n")
    lines = []
    for k in range(1, agents + 1):
        hostpub = (lay.agent_dir(k) / "ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"{lay.address(k)} {hostpub[0]} {hostpub[1]}")
    write_private(lay.known_hosts, "\n".join(lines) + "\n")


def _create_network(lay: Layout, agents: int, progress: Progress) -> None:
    br = lay.bridge
    if not _link_exists(br):
        progress(f"bridge {br} {lay.bridge_address}/24")
        run(["ip", "link", "add", br, "type", "bridge"])
    addr = f"{lay.bridge_address}/{lay.subnet.prefixlen}"
    if addr not in run(["ip", "-o", "addr", "show", "dev", br]).stdout:
        run(["ip", "addr", "add", addr, "dev", br])
    run(["ip", "link", "set", br, "up"])
    for rule in lay.iptables_rules():
        if not _iptables_has(rule):
            run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]])
    for k in range(1, agents + 1):
        ns, veth = lay.netns(k), lay.veth(k)
        progress(f"namespace {ns} {lay.address(k)}")
        if not _netns_exists(ns):
            run(["ip", "netns", "add", ns])
        if not _link_exists(veth):
            run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                  "netns", ns])
        run(["ip", "link", "set", veth, "master", br, "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        a = f"{lay.address(k)}/{lay.subnet.prefixlen}"
        if a not in run(["ip", "-n", ns, "-o", "addr", "show", "dev", "eth0"]).stdout:
            run(["ip", "-n", ns, "addr", "add", a, "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run(["ip", "-n", ns, "route", "replace", "default", "via", lay.bridge_address])


def _containerd_config(lay: Layout, k: int) -> str:
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


def _sshd_config(lay: Layout, k: int) -> str:
    d = lay.agent_dir(k)
    return "\n".join([
        f"# lab sshd for agent{k}, written by cluster_sessions.lab.netns",
        f"ListenAddress {lay.address(k)}:22",
        f"HostKey {d / 'ssh_host_ed25519_key'}",
        f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {lay.run_authorized_keys}",
        f"AllowUsers root {LAB_USER}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # the state dir may sit below world-writable /tmp
        "StrictModes no",
        "PrintMotd no",
        "X11Forwarding no",
        f"SetEnv DOCKER_HOST=unix://{lay.agent_socket}",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _in_agent(lay: Layout, k: int) -> list[str]:
    """Command prefix: run in agent k's network namespace, in a UTS namespace of its own whose
    hostname is the agent's name (so swarm node names and ``ssh agentK hostname`` tell the
    agents apart). Every step execs, so the pid stays the daemon's."""
    return [
        shutil.which("nsenter") or "nsenter", f"--net={NETNS_DIR / lay.netns(k)}", "--",
        shutil.which("unshare") or "unshare", "--uts", "--",
        "/bin/sh", "-c", 'hostname "$0" && exec "$@"', f"agent{k}",
    ]


def _sshd_in_agent(lay: Layout, k: int) -> list[str]:
    """``_in_agent`` plus a mount namespace of its own in which the agent-side engine directory
    is this agent's engine directory: over SSH the pool's socket path is this agent's engine,
    and nowhere else. Slave, not private, propagation: the bind mount still stays inside, but
    where the host's mounts are shared, unmounts there (other engines' containers, other labs'
    namespaces) reach this copy instead of being pinned by it. The namespace goes when sshd
    and its sessions have ended."""
    return [
        shutil.which("nsenter") or "nsenter", f"--net={NETNS_DIR / lay.netns(k)}", "--",
        shutil.which("unshare") or "unshare", "--uts", "--mount", "--propagation", "slave",
        "--",
        "/bin/sh", "-c", 'hostname "$0" && mount --bind "$1" "$2" && shift 2 && exec "$@"',
        f"agent{k}", str(lay.engine_dir(k)), str(lay.agent_engine_dir),
    ]


def _start_agent_daemons(lay: Layout, agents: int, progress: Progress) -> dict:
    pids: dict[str, dict[str, int]] = {}
    nsenter = shutil.which("nsenter") or "nsenter"
    # 1) one containerd per agent (dockerd would otherwise use a system containerd at
    #    /run/containerd/containerd.sock when one exists, shared by every agent)
    for k in range(1, agents + 1):
        d = lay.agent_dir(k)
        d.mkdir(parents=True, exist_ok=True)
        lay.containerd_state(k).mkdir(parents=True, exist_ok=True)
        cfg = d / "containerd.toml"
        write_private(cfg, _containerd_config(lay, k))
        cmd = [nsenter, f"--net={NETNS_DIR / lay.netns(k)}", "--",
               shutil.which("containerd") or "containerd", "--config", str(cfg)]
        pids[f"agent{k}"] = {"containerd": spawn(cmd, d / "containerd.log")}
    progress(f"started {agents} containerd")
    _wait_for(
        lambda: all(lay.containerd_socket(k).exists() for k in range(1, agents + 1)),
        20, "containerd sockets", lay, agents,
    )
    # 2) dockerd
    for k in range(1, agents + 1):
        pids[f"agent{k}"]["dockerd"] = _spawn_dockerd(lay, k)
    progress(f"started {agents} dockerd")
    # 3) sshd
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # its privilege-separation directory
    for k in range(1, agents + 1):
        d = lay.agent_dir(k)
        cfg = d / "sshd_config"
        write_private(cfg, _sshd_config(lay, k))
        run([SSHD, "-t", "-f", str(cfg)])
        cmd = [*_sshd_in_agent(lay, k), SSHD, "-D", "-f", str(cfg), "-E", str(d / "sshd.log")]
        pids[f"agent{k}"]["sshd"] = spawn(cmd, d / "sshd.out")
    progress(f"started {agents} sshd")
    return pids


def _spawn_dockerd(lay: Layout, k: int) -> int:
    d = lay.agent_dir(k)
    dcfg = d / "daemon.json"
    # without its own key file every engine would share /etc/docker/key.json, hence its ID
    write_private(dcfg, json.dumps({"deprecated-key-path": str(d / "key.json")}) + "\n")
    # the directory sshd's namespace binds, open to the docker group's members
    lay.engine_dir(k).mkdir(parents=True, exist_ok=True)
    lay.engine_dir(k).chmod(0o755)
    lay.socket(k).unlink(missing_ok=True)
    cmd = [
        *_in_agent(lay, k),
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
    rec["pids"][agent]["dockerd"] = _spawn_dockerd(lay, k)
    write_records(lay, rec)
    _wait_for(lambda: bool(engine_id(lay.socket(k), timeout=2)), timeout,
              f"{agent}'s dockerd", lay, k)


def _wait_for(cond: Callable[[], bool], timeout: float, what: str, lay: Layout,
              agents: int) -> None:
    if not poll_until(cond, bool, timeout, interval=0.1):
        raise LabError(f"timed out after {timeout:.0f}s waiting for {what}; "
                       f"logs: {lay.state_dir}/agent*/" + _log_tails(lay, agents))


def _log_tails(lay: Layout, agents: int) -> str:
    out = []
    for k in range(1, agents + 1):
        for name in ("containerd.log", "dockerd.log", "sshd.log"):
            with contextlib.suppress(OSError):
                tail = (lay.agent_dir(k) / name).read_text(errors="replace").splitlines()[-3:]
                if tail:
                    out.append(f"\n--- agent{k}/{name}\n" + "\n".join(tail))
    return "".join(out)


def _machine_capacity() -> dict:
    cpu = len(os.sched_getaffinity(0))
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {"cpu": cpu, "mem": f"{mem_kb // 1024}m", "gpus": []}


def pool_document(info: LabInfo, name: str = "lab") -> dict:
    """The AgentPool (DESIGN contract 0) describing the lab's agents."""
    return {
        "kind": "AgentPool",
        "name": name,
        "agents": [
            {
                "name": a.name,
                "docker_host": a.docker_host,
                "address": a.address,
                "ssh": {
                    "host": a.address,
                    "port": 22,
                    "user": info.user,
                    "key_file": str(info.key_file),
                    "known_hosts": str(info.known_hosts),
                },
                "capacity": _machine_capacity(),
            }
            for a in info.agents
        ],
        "swarm": {"manager": info.agents[0].name},
        "network": {"mtu": 1450, "encrypted": False},
        # one host directory, seen by every agent's engine (they share this machine's
        # filesystem, as agents share an NFS mount): the data folders' root
        "storage": {"data": str(storage_root(info.state_dir))},
    }


def storage_root(state_dir: Path) -> Path:
    """The lab's storage root for data folders (core/folders.py): root's, 0755, so that only
    the engines (through the archive API) make folders in it, never a session user."""
    return Path(state_dir) / "storage"


POOL_FILE_HEADER = "# Written by `sessionctl lab up`"  # how lab_down knows the file is its own


def _write_pool(info: LabInfo) -> None:
    if info.pool_file is None:
        return
    storage_root(info.state_dir).mkdir(mode=0o755, exist_ok=True)
    doc = pool_document(info, info.pool_file.stem)
    text = (
        f"{POOL_FILE_HEADER} (cluster_sessions.lab.netns), rewritten on each up.\n"
        "# Every agent reports the whole machine as its capacity: they share it.\n"
        + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    )
    info.pool_file.parent.mkdir(parents=True, exist_ok=True)
    write_private(info.pool_file, text)


def _info(lay: Layout, agents: int, pool_file: Path | None, ids: dict[int, str]) -> LabInfo:
    return LabInfo(
        state_dir=lay.state_dir,
        pool_file=pool_file,
        bridge=lay.bridge,
        bridge_address=lay.bridge_address,
        key_file=lay.key_file,
        known_hosts=lay.known_hosts,
        agents=tuple(lay.agent(k, ids.get(k, "")) for k in range(1, agents + 1)),
    )


# --------------------------------------------------------------------------- public API


def lab_up(
    agents: int,
    state_dir: Path,
    pool_file: Path | None,
    progress: Progress | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    subnet: str = DEFAULT_SUBNET,
) -> LabInfo:
    """Bring up ``agents`` Docker Engines in network namespaces and write the pool file.

    Idempotent: when the same lab (same ``state_dir``, ``prefix`` and number of agents) is
    already up and healthy, it only rewrites the pool file. A lab with another number of agents
    is an error (``lab_down`` first); a half-working one is torn down and rebuilt. If bring-up
    fails, everything created so far is removed before the error is raised.
    """
    progress = progress or _noop
    _check_root()
    _check_tools()
    if not isinstance(agents, int) or not 1 <= agents <= MAX_AGENTS:
        raise LabError(f"agents must be between 1 and {MAX_AGENTS}, got {agents!r}")
    lay = layout_for(state_dir, prefix, subnet)
    if not SAFE_PATH.match(str(lay.state_dir)):
        raise LabError(f"state dir {lay.state_dir} may only contain letters, digits and _./+@-")
    if len(str(lay.socket(agents)).encode()) > MAX_SOCKET_PATH:
        raise LabError(f"state dir {lay.state_dir} is too long for a unix socket path "
                       f"({lay.socket(agents)}); choose a shorter one")
    if _account_locked("root"):
        raise LabError("root's password is locked ('!' in /etc/shadow): sshd (UsePAM no) then "
                       "refuses key logins; unlock it without a password: usermod -p '*' root")
    pool_file = Path(pool_file).absolute() if pool_file is not None else None

    own = read_json(lay.state_record)
    if own is not None and own.get("prefix") != prefix:
        other = read_json(RUN_BASE / str(own.get("prefix")) / "lab.json")
        if other is not None and other.get("state_dir") == str(lay.state_dir):
            raise LabError(f"{lay.state_dir} holds a running lab with prefix "
                           f"{own.get('prefix')!r}; take it down first or use another state dir")

    existing = read_json(lay.run_record)
    if existing is not None:
        if existing.get("state_dir") != str(lay.state_dir):
            raise LabError(
                f"a lab with prefix {prefix!r} is already up from state dir "
                f"{existing.get('state_dir')}; take it down first (lab_down on that dir)"
            )
        if (existing.get("agents"), existing.get("subnet")) != (agents, str(lay.subnet)):
            raise LabError(
                f"the lab in {lay.state_dir} is up with {existing.get('agents')} agents on "
                f"{existing.get('subnet')}, not {agents} on {lay.subnet}; take it down first "
                f"(sessionctl lab down)"
            )
        status = lab_status(lay.state_dir)
        current = existing.get("user") == LAB_USER  # an older lab took root logins only
        if status.state == "up" and current:
            ids = {i + 1: a.engine_id for i, a in enumerate(status.agents)}
            for rule in lay.iptables_rules():  # a restarted host dockerd may have flushed them
                if not _iptables_has(rule):
                    run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]])
            info = _info(lay, agents, pool_file, ids)
            _write_pool(info)
            existing["pool_file"] = str(pool_file) if pool_file else None
            write_records(lay, existing)
            progress(f"lab already up: {', '.join(info.names)}")
            return info
        state = status.state if current else "of an older kind (root logins only)"
        progress(f"lab in {lay.state_dir} is {state}; rebuilding it")
        lab_down(lay.state_dir, progress)
    else:
        clash = [n for n in [lay.bridge] if _link_exists(n)]
        clash += [lay.netns(k) for k in range(1, agents + 1) if _netns_exists(lay.netns(k))]
        if clash:
            raise LabError(
                f"{', '.join(clash)} exist(s) but no lab is recorded in {lay.run_record}; "
                f"remove them (ip link del / ip netns del) or choose another prefix"
            )

    t0 = time.monotonic()
    record = {
        "version": RECORD_VERSION,
        "prefix": prefix,
        "subnet": str(lay.subnet),
        "state_dir": str(lay.state_dir),
        "agents": agents,
        "pool_file": str(pool_file) if pool_file else None,
        "user": LAB_USER,
        "iptables": [],
        "pids": {},
        "state": "starting",
        "creator_pid": os.getpid(),
    }
    # recorded before anything is created, so lab_down always knows what to remove
    record["iptables"] = lay.iptables_rules()
    write_records(lay, record)
    try:
        _ensure_lab_user()
        _ensure_keys(lay, agents)
        _create_network(lay, agents, progress)
        record["pids"] = _start_agent_daemons(lay, agents, progress)
        write_records(lay, record)

        ids: dict[int, str] = {}

        def engines_ready() -> bool:
            for k in range(1, agents + 1):
                if k not in ids:
                    dpid = record["pids"][f"agent{k}"]["dockerd"]
                    if not alive(dpid):
                        raise LabError(f"dockerd of agent{k} exited; see "
                                       f"{lay.agent_dir(k) / 'dockerd.log'}"
                                       + _log_tails(lay, agents))
                    eid = engine_id(lay.socket(k), timeout=2)
                    if eid:
                        ids[k] = eid
            return len(ids) == agents

        _wait_for(engines_ready, ENGINE_TIMEOUT, "the engines", lay, agents)
        if len(set(ids.values())) != agents:
            raise LabError(f"engines report duplicate IDs: {ids}")
        progress(f"{agents} engines answer")
        _wait_for(lambda: all(_sshd_answers(lay.address(k)) for k in range(1, agents + 1)),
                  SSHD_TIMEOUT, "sshd", lay, agents)
        info = _info(lay, agents, pool_file, ids)
        _write_pool(info)
        record["state"] = "up"
        record["engine_ids"] = {f"agent{k}": v for k, v in ids.items()}
        write_records(lay, record)
    except BaseException:
        progress("bring-up failed; removing what was created")
        with contextlib.suppress(Exception):
            lab_down(lay.state_dir, progress)
        raise
    progress(f"lab up: {agents} agents in {time.monotonic() - t0:.1f}s"
             + (f", pool file {pool_file}" if pool_file else ""))
    return info


def lab_status(state_dir: Path) -> LabStatus:
    """What is running of the lab recorded in ``state_dir`` (never raises for a missing lab)."""
    state_dir = Path(state_dir).absolute()
    rec = find_record(state_dir)
    if rec is None:
        return LabStatus(state="down", state_dir=state_dir)
    lay = layout_from_record(rec)
    run_rec = read_json(lay.run_record)
    owned = run_rec is not None and run_rec.get("state_dir") == str(lay.state_dir)
    st = LabStatus(
        state="down",
        state_dir=lay.state_dir,
        prefix=lay.prefix,
        bridge=owned and _link_exists(lay.bridge),
        pool_file=Path(rec["pool_file"]) if rec.get("pool_file") else None,
    )
    pids = rec.get("pids", {})
    for k in range(1, int(rec.get("agents", 0)) + 1):
        a = AgentStatus(name=f"agent{k}", address=lay.address(k))
        if owned:
            p = pids.get(f"agent{k}", {})
            a.netns = _netns_exists(lay.netns(k))
            a.containerd = pid_matching(p.get("containerd"), str(lay.agent_dir(k))) is not None
            a.dockerd = pid_matching(p.get("dockerd"), str(lay.exec_root(k))) is not None
            a.engine_id = engine_id(lay.socket(k), timeout=2) if a.dockerd else ""
            a.sshd = pid_matching(p.get("sshd"), str(lay.agent_dir(k))) is not None and (
                _sshd_answers(lay.address(k))
            )
        else:
            a.error = "not running (another lab uses this prefix, or it was torn down)"
        st.agents.append(a)
    if st.agents and st.bridge and all(a.up for a in st.agents):
        st.state = "up"
    elif st.bridge or any(a.netns or a.dockerd or a.containerd or a.sshd for a in st.agents):
        st.state = "degraded"
    return st


def _stop_containers(sock: Path) -> None:
    """Stop every running container of one engine at once (no 10 s grace per container)."""
    try:
        client = _client(sock, 10)
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


def lab_down(state_dir: Path, progress: Progress | None = None, *,
             keep_keys: bool = False) -> None:
    """Tear the lab recorded in ``state_dir`` down completely. Idempotent.

    Stops containers, sshd, dockerd and containerd, kills whatever else still runs in the
    agents' namespaces or cgroups, unmounts and deletes the engines' data, removes namespaces,
    veths, the bridge and the iptables rules; then the lab's files: its SSH key, the agents'
    host keys, ``known_hosts``, the logs and the pool file ``lab_up`` wrote (``keep_keys``
    keeps the keys, ``known_hosts`` and logs, so that the next ``lab_up`` is known to the same
    clients). Raises ``LabError`` only if something is still there afterwards.
    """
    progress = progress or _noop
    _check_root()
    state_dir = Path(state_dir).absolute()
    rec = find_record(state_dir)
    if rec is None:
        progress(f"no lab recorded in {state_dir}; nothing to do")
        return
    lay = layout_from_record(rec)
    run_rec = read_json(lay.run_record)
    n = int(rec.get("agents", 0))
    if run_rec is None or run_rec.get("state_dir") != str(lay.state_dir):
        # the machine-wide names are not ours (or already gone): only forget our record
        progress("lab is not running; removing its record")
        _cleanup_files(lay, n, run_record=False)
        _forget(lay, n, rec.get("pool_file"), progress, keep_keys=keep_keys)
        return
    t0 = time.monotonic()
    n = int(run_rec.get("agents", n))
    pids = run_rec.get("pids", {}) or rec.get("pids", {})

    def recorded(kind: str, k: int) -> int | None:
        marker = str(lay.exec_root(k)) if kind == "dockerd" else str(lay.agent_dir(k))
        pid = pid_matching(pids.get(f"agent{k}", {}).get(kind), marker)
        if kind == "dockerd" and pid is None:
            pid = pid_matching(read_pid(lay.agent_dir(k) / "docker.pid"), marker)
        return pid

    agent_nums = range(1, n + 1)
    sshd = [p for k in agent_nums if (p := recorded("sshd", k))]
    dockerd = {k: p for k in agent_nums if (p := recorded("dockerd", k))}
    containerd = {k: p for k in agent_nums if (p := recorded("containerd", k))}
    # an engine whose containerd is gone hangs on every container operation and on shutdown
    healthy = [k for k in dockerd if k in containerd]
    broken = [dockerd[k] for k in dockerd if k not in containerd]

    # 1) containers (all at once, no grace period), then the daemons
    threads = [threading.Thread(target=_stop_containers, args=(lay.socket(k),), daemon=True)
               for k in healthy]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    progress(f"stopping {len(dockerd)} dockerd, {len(sshd)} sshd")
    for pid in broken:
        kill(pid, signal.SIGKILL)
    # a swarm member's graceful shutdown can wait 5 s on a gossip "leave" no peer will ever
    # receive (they all stop at once); the engines' data is deleted anyway, so be brief
    terminate(sshd + broken + [dockerd[k] for k in healthy], timeout=DOCKERD_GRACE)
    terminate(list(containerd.values()), timeout=10)

    # 2) anything left in the namespaces (shims, docker-proxy, ssh sessions) or in the agents'
    #    cgroups (container processes of a killed engine)
    for _ in range(3):
        rest: set[int] = set()
        for k in range(1, n + 1):
            rest |= pids_in_netns(NETNS_DIR / lay.netns(k))
            rest |= pids_in_cgroups(lay.netns(k))
        if not rest:
            break
        progress(f"killing {len(rest)} leftover processes")
        for pid in rest:
            kill(pid, signal.SIGKILL)
        terminate(rest, timeout=5)

    # 3) mounts, cgroups, namespaces, links, firewall
    roots = [lay.run_dir]
    for k in range(1, n + 1):
        roots += [lay.agent_dir(k) / "docker", lay.agent_dir(k) / "containerd"]
    unmount_under(roots)
    for k in range(1, n + 1):
        remove_cgroups(lay.netns(k))
        if _netns_exists(lay.netns(k)):
            run(["ip", "netns", "delete", lay.netns(k)], check=False)
        if _link_exists(lay.veth(k)):
            run(["ip", "link", "delete", lay.veth(k)], check=False)
    rules = run_rec.get("iptables") or lay.iptables_rules()
    for rule in rules:
        for _ in range(10):  # also duplicates
            if not _iptables_has(rule):
                break
            run(["iptables", "-w", "-D", rule[0], *rule[1:]], check=False)
    if _link_exists(lay.bridge):
        run(["ip", "link", "delete", lay.bridge], check=False)

    # 4) verify
    left = []
    if _link_exists(lay.bridge):
        left.append(f"bridge {lay.bridge}")
    for k in range(1, n + 1):
        if _netns_exists(lay.netns(k)):
            left.append(f"netns {lay.netns(k)}")
        if _link_exists(lay.veth(k)):
            left.append(f"veth {lay.veth(k)}")
    survivors = [p for p in [*sshd, *dockerd.values(), *containerd.values()] if alive(p)]
    if survivors:
        left.append(f"processes {survivors}")
    left += [f"iptables rule {' '.join(r)}" for r in rules if _iptables_has(r)]
    if left:
        raise LabError("lab_down could not remove: " + "; ".join(left))
    _cleanup_files(lay, n, run_record=True)
    _forget(lay, n, rec.get("pool_file"), progress, keep_keys=keep_keys)
    progress(f"lab down in {time.monotonic() - t0:.1f}s")


def _forget(lay: Layout, agents: int, pool_file: str | None, progress: Progress, *,
            keep_keys: bool) -> None:
    """Remove the files ``lab_up`` wrote outside the engines, and nothing else: the pool file
    if ``lab_up`` wrote it (it describes a lab that is gone); unless ``keep_keys``, the key
    pair, ``known_hosts``, ``authorized_keys``, each agent's folder (host keys, sshd config,
    logs) and the state directory once empty."""
    if pool_file:
        path = Path(pool_file)
        with contextlib.suppress(OSError):
            if path.read_text(errors="replace").startswith(POOL_FILE_HEADER):
                path.unlink()
                progress(f"removed the pool file {path}")
    if keep_keys:
        return
    for path in (lay.key_file, Path(f"{lay.key_file}.pub"), lay.known_hosts,
                 lay.authorized_keys):
        path.unlink(missing_ok=True)
    for k in range(1, agents + 1):
        shutil.rmtree(lay.agent_dir(k), ignore_errors=True)
    with contextlib.suppress(OSError):
        lay.state_dir.rmdir()
    if lay.state_dir.exists():
        progress(f"left {lay.state_dir} in place: it holds files the lab did not write")


def _cleanup_files(lay: Layout, agents: int, *, run_record: bool) -> None:
    """Delete the engines' data and runtime files; keep keys, known_hosts and logs."""
    for k in range(1, agents + 1):
        d = lay.agent_dir(k)
        for sub in ("docker", "containerd", "engine"):
            if (d / sub).exists():
                unmount_under([d / sub])
                shutil.rmtree(d / sub, ignore_errors=True)
        # docker.sock: where a lab before the engine directory had its socket
        for name in ("docker.sock", "docker.pid", "sshd.pid", "key.json"):
            (d / name).unlink(missing_ok=True)
    if run_record:
        shutil.rmtree(lay.run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            RUN_BASE.rmdir()
    lay.state_record.unlink(missing_ok=True)
