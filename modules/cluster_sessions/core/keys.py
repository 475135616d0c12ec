"""SSH key material of a session: one user keypair, one host key per container, and a session
certificate authority (CA) that signed every host key.

Backend.AI makes one RSA keypair per session and turns host-key checking off. We give every
container its own host key, generated with the session, and an OpenSSH host certificate for it
signed by the session's CA (principals: the container's host name and its aliases), so every
``known_hosts`` is one ``@cert-authority`` line, whatever the size, and ``StrictHostKeyChecking
yes`` holds. The same CA signs short-lived user certificates for people who reach the session
with their own key (``sessionctl ssh``). ED25519 keys are small and fast to make.

Certificates carry a random nonce, so they are made once and kept with the keys (as the keys
are): signing again on every ``up`` would change every container's files.

Private keys are plain strings here; callers keep them out of logs (Pulumi marks them secret,
``render`` writes them 0600 and never prints them).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

#: A host certificate is valid for as long as the session exists (OpenSSH's "forever").
FOREVER = 2**64 - 1
#: What a user certificate lets its holder do: a terminal, and port forwarding (``ProxyJump``
#: through main1 to a sub is a forwarded TCP connection).
USER_EXTENSIONS = ("permit-port-forwarding", "permit-pty")
#: How long ``sessionctl ssh`` certificates are valid by default (seconds), and how far back
#: they start (clock skew between the operator's machine and the agents).
USER_CERT_SECONDS = 3600
USER_CERT_SKEW = 60


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
    # The session CA, and each host's certificate ("ssh-ed25519-cert-v01@openssh.com AAAA...");
    # None / empty only for key material made before the CA existed (keystore adds them).
    ca: KeyPair | None = None
    host_certs: Mapping[str, str] = field(default_factory=dict)


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


Principals = Mapping[str, Sequence[str]]


def principals_of(hosts: Iterable[str], principals: Principals | None = None
                  ) -> dict[str, list[str]]:
    """Each host's certificate principals: ``principals[host]`` if given, else the host name."""
    given = principals or {}
    return {h: list(given.get(h) or [h]) for h in hosts}


def generate_session_keys(hosts: Iterable[str],
                          principals: Principals | None = None) -> SessionKeys:
    hosts = list(hosts)
    return with_hosts(SessionKeys(new_keypair(), {}), hosts, principals)


def with_hosts(keys: SessionKeys, hosts: Iterable[str],
               principals: Principals | None = None) -> SessionKeys:
    """Keep every key a host already has; make keys only for new hosts (a session that grows).

    Also keeps the CA (makes one for key material from before it existed) and every host
    certificate that still says what it should (this CA, this host key, these principals);
    only the others are signed anew."""
    hosts = list(hosts)
    wanted = principals_of(hosts, principals)
    kept = {h: keys.hosts[h] if h in keys.hosts else new_keypair() for h in hosts}
    ca = keys.ca or new_keypair()
    certs = {}
    signer = None  # the CA's private key, read once (reading it costs as much as a signature)
    for h in hosts:
        old = keys.host_certs.get(h)
        if old and cert_matches(old, ca.public_openssh, kept[h].public_openssh, wanted[h]):
            certs[h] = old
        else:
            signer = signer or _ca_private(ca)
            certs[h] = host_certificate(ca, kept[h].public_openssh, wanted[h], key_id=h,
                                        signer=signer)
    return SessionKeys(keys.user, kept, ca, certs)


def _ca_private(ca: KeyPair) -> Ed25519PrivateKey:
    key = serialization.load_ssh_private_key(ca.private_openssh.encode(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the session CA must be an ED25519 key")
    return key


def _openssh(cert) -> str:
    return cert.public_bytes().decode()


def host_certificate(ca: KeyPair, host_public: str, principals: Sequence[str],
                     key_id: str, signer: Ed25519PrivateKey | None = None) -> str:
    """An OpenSSH host certificate of ``host_public`` for ``principals``, valid forever;
    ``signer``: ``ca``'s private key, already read (it is read from ``ca`` otherwise)."""
    builder = (serialization.SSHCertificateBuilder()
               .public_key(serialization.load_ssh_public_key(host_public.encode()))
               .type(serialization.SSHCertificateType.HOST)
               .key_id(key_id.encode())
               .serial(secrets.randbits(64))
               .valid_principals([p.encode() for p in principals])
               .valid_after(0)
               .valid_before(FOREVER))
    return _openssh(builder.sign(signer or _ca_private(ca)))


def user_certificate(ca: KeyPair, user_public: str, principal: str, key_id: str,
                     seconds: int = USER_CERT_SECONDS, now: float | None = None) -> str:
    """An OpenSSH user certificate of ``user_public`` (ed25519, ECDSA or RSA) for the session
    user ``principal``, valid for ``seconds`` from ``now`` (and a minute before, for clocks a
    little behind), allowing a terminal and port forwarding (ProxyJump)."""
    start = int(time.time() if now is None else now)
    builder = (serialization.SSHCertificateBuilder()
               .public_key(serialization.load_ssh_public_key(user_public.strip().encode()))
               .type(serialization.SSHCertificateType.USER)
               .key_id(key_id.encode())
               .serial(secrets.randbits(64))
               .valid_principals([principal.encode()])
               .valid_after(max(0, start - USER_CERT_SKEW))
               .valid_before(start + seconds))
    for name in USER_EXTENSIONS:
        builder = builder.add_extension(name.encode(), b"")
    return _openssh(builder.sign(_ca_private(ca)))


def cert_matches(cert: str, ca_public: str, key_public: str, principals: Sequence[str]) -> bool:
    """The certificate is this CA's, for this key and exactly these principals."""
    try:
        parsed = serialization.load_ssh_public_identity(cert.encode())
    except (ValueError, TypeError):
        return False
    if not isinstance(parsed, serialization.SSHCertificate):
        return False
    try:
        parsed.verify_cert_signature()
    except Exception:  # InvalidSignature: a damaged or forged certificate
        return False
    signer = _public_openssh(parsed.signature_key())
    subject = _public_openssh(parsed.public_key())
    return (signer == _plain(ca_public) and subject == _plain(key_public)
            and [p.decode() for p in parsed.valid_principals] == list(principals))


def _public_openssh(key) -> str:
    return key.public_bytes(serialization.Encoding.OpenSSH,
                            serialization.PublicFormat.OpenSSH).decode()


def _plain(public: str) -> str:
    return " ".join(public.split()[:2])


def to_dict(keys: SessionKeys) -> dict:
    """A plain form for Pulumi state; the private parts must be stored as secrets."""
    out = {
        "user_private": keys.user.private_openssh,
        "user_public": keys.user.public_openssh,
        "host_private": {h: k.private_openssh for h, k in keys.hosts.items()},
        "host_public": {h: k.public_openssh for h, k in keys.hosts.items()},
    }
    if keys.ca is not None:
        out.update(ca_private=keys.ca.private_openssh, ca_public=keys.ca.public_openssh,
                   host_cert=dict(keys.host_certs))
    return out


def from_dict(data: Mapping) -> SessionKeys:
    """Key material as stored; material from before the CA has no ``ca`` (``with_hosts`` adds
    one)."""
    ca = (KeyPair(data["ca_private"], data["ca_public"])
          if data.get("ca_private") and data.get("ca_public") else None)
    return SessionKeys(
        KeyPair(data["user_private"], data["user_public"]),
        {h: KeyPair(data["host_private"][h], pub) for h, pub in data["host_public"].items()},
        ca,
        dict(data.get("host_cert") or {}) if ca is not None else {},
    )
