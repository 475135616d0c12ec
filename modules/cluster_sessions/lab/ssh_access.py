"""How the lab's agents are reached over SSH, as real agents are: the non-root account the pool
logs in as (``csl-ops``, in the docker group), the lab key and the agents' host keys, and each
agent's own sshd in its namespace, where the pool's engine path is that agent's engine."""

from __future__ import annotations

import grp
import pwd
import shutil
import socket
from pathlib import Path

from .layout import DOCKER_GROUP, LAB_USER, NETNS_DIR, RUN_BASE, Layout, write_private
from .processes import LabError, run, spawn
from .requirements import SSHD

SSHD_TIMEOUT = 20.0


def account_locked(user: str) -> bool:
    # With `UsePAM no` OpenSSH refuses any login to an account whose password is locked ('!')
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            if line.startswith(f"{user}:"):
                return line.split(":")[1].startswith("!")
    except OSError:
        pass
    return False


def ensure_lab_user() -> None:
    """The non-root account the pool logs in as, in the docker group (the group dockerd gives
    its socket), as users reach real agents; created once per machine, kept by lab_down since
    every lab shares it. Another lab coming up at the same time may create it first."""
    if group_missing(DOCKER_GROUP):
        run(["groupadd", "--system", DOCKER_GROUP], check=False)
        if group_missing(DOCKER_GROUP):
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
    if account_locked(LAB_USER):  # key logins only: '*' is no password, not a locked account
        run(["usermod", "--password", "*", LAB_USER])


def group_missing(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return True
    return False


def sshd_answers(address: str, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def ensure_keys(lay: Layout, agents: int) -> None:
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


def sshd_config(lay: Layout, k: int) -> str:
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


def sshd_in_agent(lay: Layout, k: int) -> list[str]:
    """Command prefix: run in agent k's network namespace, in a UTS namespace of its own whose
    hostname is the agent's name (as ``engines.in_agent``), and in a mount namespace of its own
    in which the agent-side engine directory is this agent's engine directory: over SSH the
    pool's socket path is this agent's engine, and nowhere else. Slave, not private,
    propagation: the bind mount still stays inside, but where the host's mounts are shared,
    unmounts there (other engines' containers, other labs' namespaces) reach this copy instead
    of being pinned by it. The namespace goes when sshd and its sessions have ended."""
    return [
        shutil.which("nsenter") or "nsenter", f"--net={NETNS_DIR / lay.netns(k)}", "--",
        shutil.which("unshare") or "unshare", "--uts", "--mount", "--propagation", "slave",
        "--",
        "/bin/sh", "-c", 'hostname "$0" && mount --bind "$1" "$2" && shift 2 && exec "$@"',
        f"agent{k}", str(lay.engine_dir(k)), str(lay.agent_engine_dir),
    ]


def spawn_sshd(lay: Layout, k: int) -> int:
    """Start agent ``k``'s sshd on its address (its config checked first); its pid."""
    d = lay.agent_dir(k)
    cfg = d / "sshd_config"
    write_private(cfg, sshd_config(lay, k))
    run([SSHD, "-t", "-f", str(cfg)])
    cmd = [*sshd_in_agent(lay, k), SSHD, "-D", "-f", str(cfg), "-E", str(d / "sshd.log")]
    return spawn(cmd, d / "sshd.out")
