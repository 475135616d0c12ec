"""Which accounts a session user may be: a user account, never one an image already reserves.

The set-up appends or adopts the session user's account and a group of the same name as root
(``usermod``-like edits of ``/etc/passwd`` and ``/etc/group``, ``chown`` of its home). Taking
over a system account or group would hand the definition what that account owns: ``dialout``
owns serial devices, ``shadow`` reads ``/etc/shadow``, ``nobody`` (65534) is the overflow id
NFS and user namespaces map unknown owners to. So the rule is an allowlist of ids and a
blocklist of names built from the base images' own account files, not from examples.

Ids (Debian policy 9.2.2, which Ubuntu, and for 0-999 RHEL and Alpine, follow):
0-99 and 100-999 are system ids, 60000-64999 are reserved for packages, 65534 is ``nobody``
and 65535 is ``(uid_t) -1`` in 16-bit interfaces; 65536-4294967293 are free. A user account
is 1000-59999, or 65536 up to 2^31-2 (the largest id every tool stores as a signed int).

Names: :data:`RESERVED_NAMES` is generated, not typed in as examples. It is the union of the
user and group names of Debian's ``base-passwd`` (``/usr/share/base-passwd/passwd.master``
and ``group.master``; a test checks the constant still covers the machine's copies), Alpine's
``alpine-baselayout`` (``/etc/passwd``, ``/etc/group``), RHEL/UBI's ``setup`` package (its
``passwd``, ``group`` and ``uidgid`` lists), and the accounts Ubuntu's and Debian's base images
add (``ubuntu``, ``systemd-*``, ``messagebus``, ``_apt``). The check reads no file at run time.
"""

from __future__ import annotations

MIN_USER_ID = 1000
MAX_USER_ID = 2**31 - 2
USER_ID_RANGES = ((MIN_USER_ID, 59_999), (65_536, MAX_USER_ID))
"""The ids a session user or group may have (both ends included)."""

DEBIAN_BASE_PASSWD = frozenset({
    # passwd.master (base-passwd 3.6), with gnats (41) of earlier releases
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
    "proxy", "www-data", "backup", "list", "irc", "gnats", "_apt", "nobody",
    # group.master
    "adm", "tty", "disk", "kmem", "dialout", "fax", "voice", "cdrom", "floppy", "tape", "sudo",
    "audio", "dip", "operator", "src", "shadow", "utmp", "video", "sasl", "plugdev", "staff",
    "users", "nogroup",
})
ALPINE_BASELAYOUT = frozenset({
    # /etc/passwd
    "root", "bin", "daemon", "adm", "lp", "sync", "shutdown", "halt", "mail", "news", "uucp",
    "operator", "postmaster", "cron", "ftp", "sshd", "at", "squid", "xfs", "games", "cyrus",
    "vpopmail", "ntp", "smmsp", "guest", "nobody",
    # /etc/group
    "sys", "tty", "disk", "mem", "kmem", "wheel", "floppy", "console", "audio", "cdrom",
    "dialout", "input", "tape", "video", "netdev", "kvm", "shadow", "cdrw", "www-data", "usb",
    "users", "nofiles", "locate", "abuild", "utmp", "ping", "nogroup", "readproc",
})
RHEL_SETUP = frozenset({
    # passwd and group of the setup package (RHEL/UBI, Fedora), and its uidgid reservations
    # that UBI images create
    "root", "bin", "daemon", "adm", "lp", "sync", "shutdown", "halt", "mail", "uucp",
    "operator", "games", "gopher", "ftp", "nobody", "nfsnobody", "sys", "tty", "disk", "mem",
    "kmem", "wheel", "cdrom", "man", "dialout", "floppy", "tape", "video", "dip", "lock",
    "audio", "users", "utmp", "utempter", "input", "kvm", "render", "sgx", "ssh_keys",
    "systemd-journal", "systemd-coredump", "dbus", "tss", "printadmin", "sshd", "rpc",
    "rpcuser", "polkitd", "chrony", "unbound",
})
BASE_IMAGE_EXTRAS = frozenset({
    # Ubuntu's images (24.04 adds the 1000:1000 account "ubuntu"); Debian's and Ubuntu's
    # systemd and dbus accounts; the docker group of images with a Docker client
    "ubuntu", "systemd-network", "systemd-resolve", "systemd-timesync", "systemd-oom",
    "systemd-journal", "messagebus", "syslog", "uuidd", "tcpdump", "docker", "crontab",
    "netdev", "lxd", "ssl-cert", "sshd",
    # the service accounts of Docker's official images built on those bases
    "postgres", "mysql", "redis", "nginx", "apache", "http", "memcache", "mongodb", "rabbitmq",
    "elasticsearch", "www", "postfix", "dnsmasq", "statd", "avahi", "ntp", "sssd",
})
RESERVED_NAMES = DEBIAN_BASE_PASSWD | ALPINE_BASELAYOUT | RHEL_SETUP | BASE_IMAGE_EXTRAS
"""User and group names some base image already has: never the session user's name (nor,
since the set-up makes a group of the same name, its group's)."""
RESERVED_PREFIXES = ("_", "systemd-")
"""Debian's convention for new system accounts (``_apt``, ``_chrony``), and systemd's."""


def user_id_problem(value: int) -> str | None:
    """Why ``value`` is not a user account's id, or None."""
    if any(low <= value <= high for low, high in USER_ID_RANGES):
        return None
    return ("must be a user account's id, 1000-59999 or 65536-2147483646: 0-999 are system "
            "accounts, 60000-65535 are reserved (Debian policy), 65534 is nobody")


def user_name_problem(name: str) -> str | None:
    """Why ``name`` is not a name the session user may take, or None."""
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
        return (f"{name!r} is an account or group a base image already has: the set-up would "
                "take it over (its id, its home, its group); choose another name (default: "
                "work)")
    return None
