"""SSH key material of a session: one user keypair, and one host key per container.

Backend.AI makes one RSA keypair per session and turns host-key checking off. We also give every
container its own host key, generated with the session, so that every ``known_hosts`` can pin
them all and ``StrictHostKeyChecking yes`` holds. ED25519 keys are small and fast to make.

Private keys are plain strings here; callers keep them out of logs (Pulumi marks them secret,
``render`` writes them 0600 and never prints them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    private_openssh: str = field(repr=False)
    public_openssh: str  # "ssh-ed25519 AAAA..." without a comment

    def __str__(self) -> str:
        return f"KeyPair({self.public_openssh})"


@dataclass(frozen=True)
class SessionKeys:
    user: KeyPair
    hosts: Mapping[str, KeyPair]


def new_keypair() -> KeyPair:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return KeyPair(private, public)


def generate_session_keys(hosts: Iterable[str]) -> SessionKeys:
    return SessionKeys(new_keypair(), {host: new_keypair() for host in hosts})


def with_hosts(keys: SessionKeys, hosts: Iterable[str]) -> SessionKeys:
    """Keep every key a host already has; make keys only for new hosts (a session that grows)."""
    hosts = list(hosts)
    kept = {h: keys.hosts[h] if h in keys.hosts else new_keypair() for h in hosts}
    return SessionKeys(keys.user, kept)


def to_dict(keys: SessionKeys) -> dict:
    """A plain form for Pulumi state; the private parts must be stored as secrets."""
    return {
        "user_private": keys.user.private_openssh,
        "user_public": keys.user.public_openssh,
        "host_private": {h: k.private_openssh for h, k in keys.hosts.items()},
        "host_public": {h: k.public_openssh for h, k in keys.hosts.items()},
    }


def from_dict(data: Mapping) -> SessionKeys:
    return SessionKeys(
        KeyPair(data["user_private"], data["user_public"]),
        {h: KeyPair(data["host_private"][h], pub) for h, pub in data["host_public"].items()},
    )
