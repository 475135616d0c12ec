"""The session CA (issue 22): host certificates made once and kept, user certificates for
``sessionctl ssh``, a key store that gives old stacks a CA, and a bundle whose size does not
depend on the session's (the hostfiles and peers derived at start by cluster-hosts.sh)."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from cluster_sessions.core import keys
from cluster_sessions.core.plan import build_plan
from cluster_sessions.core.render import pack, render_container, render_session
from cluster_sessions.pulumi_layer.keystore import SessionKeysProvider, from_state

from .conftest import skip_or_fail
from .test_render import POOL, by_path, make_session

HOSTS = ["main1", "sub1", "sub2"]


def parsed(cert: str) -> serialization.SSHCertificate:
    return serialization.load_ssh_public_identity(cert.encode())


def openssh(key) -> str:
    return key.public_bytes(serialization.Encoding.OpenSSH,
                            serialization.PublicFormat.OpenSSH).decode()


# --- certificate material ------------------------------------------------------------------

def test_every_host_key_has_a_host_certificate_of_the_session_ca_for_its_names():
    material = keys.generate_session_keys(HOSTS, {"main1": ["main1", "demo-main1"]})
    assert material.ca is not None
    for host in HOSTS:
        cert = parsed(material.host_certs[host])
        cert.verify_cert_signature()  # raises when not signed by its signature key
        assert openssh(cert.signature_key()) == material.ca.public_openssh
        assert openssh(cert.public_key()) == material.hosts[host].public_openssh
        assert cert.type == serialization.SSHCertificateType.HOST
        want = ["main1", "demo-main1"] if host == "main1" else [host]
        assert [p.decode() for p in cert.valid_principals] == want
        assert (cert.valid_after, cert.valid_before) == (0, 2**64 - 1)


def test_a_user_certificate_is_for_the_session_user_for_an_hour_with_pty_and_forwarding():
    material = keys.generate_session_keys(HOSTS)
    mine = keys.new_keypair()
    now = time.time()
    cert = parsed(keys.user_certificate(material.ca, mine.public_openssh, "work", "me",
                                        now=now))
    cert.verify_cert_signature()
    assert openssh(cert.signature_key()) == material.ca.public_openssh
    assert openssh(cert.public_key()) == mine.public_openssh
    assert cert.type == serialization.SSHCertificateType.USER
    assert [p.decode() for p in cert.valid_principals] == ["work"]
    assert cert.valid_after == int(now) - 60 and cert.valid_before == int(now) + 3600
    assert sorted(cert.extensions) == [b"permit-port-forwarding", b"permit-pty"]
    assert cert.critical_options == {}


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_a_user_certificate_is_made_for_the_key_types_people_have(kind, tmp_path):
    if shutil.which("ssh-keygen") is None:
        skip_or_fail("no ssh-keygen here (apt-get install openssh-client)")
    key = tmp_path / f"id_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(key)], check=True)
    material = keys.generate_session_keys(HOSTS)
    cert = keys.user_certificate(material.ca, (tmp_path / f"id_{kind}.pub").read_text(),
                                 "work", "me")
    (tmp_path / f"id_{kind}-cert.pub").write_text(cert + "\n")
    shown = subprocess.run(["ssh-keygen", "-L", "-f", str(tmp_path / f"id_{kind}-cert.pub")],
                           capture_output=True, text=True, check=True).stdout
    assert "user certificate" in shown and "work" in shown


def test_certificates_and_the_ca_are_kept_when_the_session_grows_and_resigned_when_names_change():
    first = keys.generate_session_keys(["main1", "sub1"])
    grown = keys.with_hosts(keys.from_dict(keys.to_dict(first)), ["main1", "sub1", "sub2"])
    assert grown.ca == first.ca
    assert grown.host_certs["main1"] == first.host_certs["main1"]
    assert grown.host_certs["sub1"] == first.host_certs["sub1"]
    assert "sub2" in grown.host_certs
    renamed = keys.with_hosts(grown, grown.hosts, {"main1": ["main1", "x-main1"]})
    assert renamed.host_certs["main1"] != grown.host_certs["main1"]
    assert renamed.host_certs["sub1"] == grown.host_certs["sub1"]


def test_a_certificate_of_another_ca_or_key_does_not_match():
    one, two = keys.generate_session_keys(HOSTS), keys.generate_session_keys(HOSTS)
    cert = one.host_certs["sub1"]
    assert keys.cert_matches(cert, one.ca.public_openssh, one.hosts["sub1"].public_openssh,
                             ["sub1"])
    assert not keys.cert_matches(cert, two.ca.public_openssh,
                                 one.hosts["sub1"].public_openssh, ["sub1"])
    assert not keys.cert_matches(cert, one.ca.public_openssh,
                                 two.hosts["sub1"].public_openssh, ["sub1"])
    assert not keys.cert_matches("ssh-ed25519 AAAA", one.ca.public_openssh,
                                 one.hosts["sub1"].public_openssh, ["sub1"])


def test_a_user_certificate_starts_a_minute_before_now_but_never_before_the_epoch():
    material = keys.generate_session_keys(["main1"])
    mine = keys.new_keypair().public_openssh
    cert = parsed(keys.user_certificate(material.ca, mine, "work", "me", seconds=600,
                                        now=1_000_000.9))
    assert (cert.valid_after, cert.valid_before) == (999_940, 1_000_600)
    early = parsed(keys.user_certificate(material.ca, mine, "work", "me", now=30))
    assert (early.valid_after, early.valid_before) == (0, 3630)


def test_a_certificate_is_signed_only_by_an_ed25519_ca():
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = keys.KeyPair(
        rsa_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                              serialization.NoEncryption()).decode(),
        openssh(rsa_key.public_key()))
    host = keys.new_keypair().public_openssh
    with pytest.raises(ValueError) as refused:
        keys.host_certificate(ca, host, ["main1"], key_id="main1")
    assert str(refused.value) == "the session CA must be an ED25519 key"
    with pytest.raises(ValueError) as refused:
        keys.user_certificate(ca, host, "work", "me")
    assert str(refused.value) == "the session CA must be an ED25519 key"


def test_a_certificate_matches_with_or_without_comments_on_the_keys():
    material = keys.generate_session_keys(HOSTS)
    assert keys.cert_matches(material.host_certs["sub1"],
                             material.ca.public_openssh + " session-ca@demo\n",
                             material.hosts["sub1"].public_openssh + " root@sub1",
                             ["sub1"])


def test_a_plain_key_a_damaged_signature_or_other_principals_do_not_match():
    material = keys.generate_session_keys(HOSTS)
    ca, host = material.ca.public_openssh, material.hosts["sub1"].public_openssh
    cert = material.host_certs["sub1"]
    kind, blob = cert.split()
    raw = bytearray(base64.b64decode(blob))
    raw[-1] ^= 0x01  # the last byte of the CA's signature
    damaged = f"{kind} {base64.b64encode(bytes(raw)).decode()}"
    parsed(damaged)  # still a certificate, only its signature is wrong
    assert keys.cert_matches(cert, ca, host, ["sub1"])
    assert not keys.cert_matches(damaged, ca, host, ["sub1"])
    assert not keys.cert_matches(host, ca, host, ["sub1"])  # a key, not a certificate
    assert not keys.cert_matches(cert, ca, host, ["sub1", "demo-sub1"])
    assert not keys.cert_matches(cert, ca, host, [])


def test_stored_material_with_no_whole_ca_is_material_from_before_the_ca():
    stored = keys.to_dict(keys.generate_session_keys(["main1", "sub1"]))
    assert set(stored) == {"user_private", "user_public", "host_private", "host_public",
                           "ca_private", "ca_public", "host_cert"}
    again = keys.from_dict(stored)
    assert again.ca is not None and dict(again.host_certs) == stored["host_cert"]
    for missing in ("ca_public", "ca_private"):
        half = {k: v for k, v in stored.items() if k != missing}
        material = keys.from_dict(half)
        assert material.ca is None, missing
        # certificates without their CA are not kept: with_hosts signs them anew
        assert material.host_certs == {}, missing
    old = {k: v for k, v in stored.items() if not k.startswith("ca_")}
    assert set(keys.to_dict(keys.from_dict(old))) == {
        "user_private", "user_public", "host_private", "host_public"}


# --- the key store: made once, kept, and old stacks get a CA ---------------------------------

def test_a_key_store_made_before_the_ca_gets_one_on_the_next_up_keeping_every_key():
    provider = SessionKeysProvider()
    created = provider.create({"hosts": HOSTS})
    old = {k: v for k, v in created.outs.items()
           if k not in ("ca_private", "ca_public", "host_cert", "principals")}
    news = {"hosts": HOSTS}
    diff = provider.diff(created.id, old, news)
    assert diff.changes is True and diff.replaces == []
    outs = provider.update(created.id, old, news).outs
    assert outs["ca_private"] and outs["ca_public"].startswith("ssh-ed25519 ")
    assert outs["user_private"] == old["user_private"]
    assert outs["host_private"] == old["host_private"]
    material = from_state(outs)
    for host in HOSTS:
        assert keys.cert_matches(material.host_certs[host], material.ca.public_openssh,
                                 material.hosts[host].public_openssh, [host])
    # and from then on, nothing changes
    assert provider.diff(created.id, outs, news).changes is False
    again = provider.update(created.id, outs, news).outs
    assert again["ca_private"] == outs["ca_private"] and again["host_cert"] == outs["host_cert"]


def test_new_principals_are_an_in_place_update_that_keeps_the_ca():
    provider = SessionKeysProvider()
    created = provider.create({"hosts": HOSTS})
    news = {"hosts": HOSTS, "principals": {h: [h, f"demo-{h}"] for h in HOSTS}}
    assert provider.diff(created.id, created.outs, news).changes is True
    outs = provider.update(created.id, created.outs, news).outs
    assert outs["ca_private"] == created.outs["ca_private"]
    assert [p.decode() for p in parsed(outs["host_cert"]["sub2"]).valid_principals] == [
        "sub2", "demo-sub2"]


# --- a bundle of constant size -----------------------------------------------------------------

def uploaded(size: int) -> dict[str, int]:
    """Bytes of each container's upload (the pack of its whole bundle), by host."""
    plan = build_plan(make_session(size), POOL)
    material = keys.generate_session_keys(plan.hosts)
    return {c.host: len(pack(render_container(plan, c, material)).encode())
            for c in (plan.containers[0], plan.containers[1], plan.containers[-1])}


def test_the_bytes_uploaded_per_container_do_not_grow_with_the_session():
    small, large = uploaded(8), uploaded(512)
    assert max(large.values()) <= 32 * 1024, large
    # only numbers differ (the size, the host's own name): a few bytes, not a line per host
    assert abs(large["main1"] - small["main1"]) < 64, (small, large)
    assert abs(large["sub1"] - small["sub1"]) < 64, (small, large)
    assert abs(large["sub511"] - small["sub7"]) < 64, (small, large)


def test_no_uploaded_file_names_another_host():
    plan = build_plan(make_session(6), POOL)
    material = keys.generate_session_keys(plan.hosts)
    for f in render_container(plan, plan.containers[2], material):
        for other in ("sub1", "sub3", "sub4", "sub5"):
            assert other not in f.content, f"{f.path} names {other}"


# --- cluster-hosts.sh, run for real ------------------------------------------------------------

SHELLS = {"dash": ["dash"], "busybox": ["busybox", "sh"]}


def shell_argv(name: str) -> list[str]:
    found = shutil.which(SHELLS[name][0])
    if found is None:
        skip_or_fail(f"{name} is not installed (apt-get install {name})")
    return [found, *SHELLS[name][1:]]


def cluster_hosts(shell: list[str], tmp_path: Path, size: int, host_index: int,
                  hosts: str | None = None, slots: int | None = None):
    over = {"distributed": {"slots": slots}} if slots else {}
    plan = build_plan(make_session(size, **over), POOL)
    files = by_path(render_session(plan, keys.generate_session_keys(plan.hosts))[
        plan.hosts[host_index]])
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    script = bundle / "cluster-hosts.sh"
    script.write_text(files["cluster-hosts.sh"].content)
    given = ",".join(plan.hosts) if hosts is None else hosts
    result = subprocess.run([*shell, str(script), str(bundle), given], capture_output=True,
                            text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    return result, bundle, files


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_cluster_hosts_writes_the_hostfiles_the_renderer_would_and_prints_the_peers(
        shell, tmp_path):
    result, bundle, files = cluster_hosts(shell_argv(shell), tmp_path, 6, 2, slots=3)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["main1", "sub1", "sub3", "sub4", "sub5"]
    assert (bundle / "hostfile").read_text() == files["hostfile"].content
    assert (bundle / "hostfile.hydra").read_text() == files["hostfile.hydra"].content
    assert (bundle / "hostfile").read_text().splitlines()[0] == "main1 slots=3"
    assert (bundle / "hostfile").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in bundle.iterdir()) == [
        "cluster-hosts.sh", "hostfile", "hostfile.hydra"]


@pytest.mark.parametrize("bad", ["main1,sub 1", "main1,-oops", "main1,,sub2", "main1,$(x)",
                                 "main1,a/b", ""])
def test_cluster_hosts_refuses_a_list_that_is_not_host_names(bad, tmp_path):
    result, bundle, _ = cluster_hosts(shell_argv("dash"), tmp_path, 3, 0, hosts=bad)
    assert result.returncode == 70, result
    assert "cluster-session[main1]: error:" in result.stderr


def test_cluster_hosts_keeps_the_hostfiles_of_a_read_only_bundle(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    result, bundle, files = cluster_hosts(shell_argv("dash"), tmp_path, 3, 1)
    assert result.returncode == 0
    (bundle / "hostfile").write_text("kept\n")
    bundle.chmod(0o555)
    try:
        # as root, -w is false only on a read-only mount: make one in a private namespace
        script = (f"mount --bind {bundle} {bundle} && mount -o remount,bind,ro {bundle} && "
                  f"dash {bundle}/cluster-hosts.sh {bundle} main1,sub1,sub2")
        done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                              text=True, check=False)
        if "mount" in done.stderr and done.returncode != 0 and not done.stdout:
            pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()}")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["main1", "sub2"]
        assert (bundle / "hostfile").read_text() == "kept\n"
        (bundle / "hostfile").unlink()
        done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                              text=True, check=False)
        assert done.returncode == 70 and "read-only" in done.stderr
    finally:
        bundle.chmod(0o755)
