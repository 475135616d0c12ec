"""What a machine needs before it can hold a lab: root (namespaces, a bridge, iptables, dockerd)
and the programs the lab runs. ``sessionctl lab`` and the test suite list the same programs."""

from __future__ import annotations

import os
import shutil

from .processes import LabError

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


def check_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (network namespaces, a bridge, iptables, dockerd); "
            "run it as root, e.g. with sudo"
        )


def check_tools() -> None:
    missing = [f"{tool} ({pkg})" for tool, pkg in REQUIRED_TOOLS.items() if not shutil.which(tool)]
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD} (openssh-server)")
    if missing:
        raise LabError(
            "missing programs: " + ", ".join(missing) + "; install with "
            "`apt-get install docker.io openssh-server iproute2 iptables`"
        )

