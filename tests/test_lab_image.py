"""The test image: found from the machine's apt sources, built once, reused, and complete."""

from __future__ import annotations

import re

import pytest

from cluster_sessions.lab import image

TOOLS = (
    "sshd",
    "ssh",
    "ssh-keyscan",
    "useradd",
    "usermod",
    "setpriv",
    "getent",
    "busybox",
    "python3",
)


def test_tag_is_the_repository_and_twelve_hex_of_the_recipe():
    assert re.fullmatch(r"cluster-sessions/debian-sshd:[0-9a-f]{12}", image.default_tag())
    assert image.default_tag() == image.default_tag()


def test_tag_changes_with_the_package_list(monkeypatch):
    before = image.default_tag()
    monkeypatch.setattr(image, "PACKAGES", (*image.PACKAGES, "less"))
    assert image.default_tag() != before


def test_mirror_comes_from_a_deb822_source_with_its_keyring(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTER_SESSIONS_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n"
        "URIs: http://mirror.invalid/debian-security\n"
        "Suites: bookworm-security\n"
        "Components: main\n"
        "\n"
        "# disabled\n"
        "Types: deb\n"
        "URIs: http://disabled.invalid/debian\n"
        "Suites: bookworm\n"
        "Components: main\n"
        "Enabled: no\n"
        "\n"
        "Types: deb deb-src\n"
        "URIs: http://mirror.invalid/debian/\n"
        "Suites: bookworm bookworm-updates\n"
        "Components: main contrib\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    source = image.debian_mirror("bookworm", etc_apt=tmp_path)
    assert source.uri == "http://mirror.invalid/debian"
    assert source.keyring == "/usr/share/keyrings/debian-archive-keyring.gpg"


def test_mirror_comes_from_a_one_line_source(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTER_SESSIONS_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list").write_text(
        "deb-src http://src.invalid/debian bookworm main\n"
        "# deb http://commented.invalid/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/etc/k.gpg] http://mirror.invalid/debian bookworm main\n"
    )
    source = image.debian_mirror("bookworm", etc_apt=tmp_path)
    assert source == image.AptSource("http://mirror.invalid/debian", "/etc/k.gpg")


def test_missing_mirror_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("CLUSTER_SESSIONS_DEBIAN_MIRROR", raising=False)
    with pytest.raises(image.ImageBuildError, match="CLUSTER_SESSIONS_DEBIAN_MIRROR"):
        image.debian_mirror("bookworm", etc_apt=tmp_path)


@pytest.fixture(scope="module")
def built_image(docker_client):
    messages: list[str] = []
    tag = image.ensure_image(docker_client, progress=messages.append)
    return tag, messages


def _run(docker_client, tag: str, script: str) -> str:
    output = docker_client.containers.run(tag, ["sh", "-c", script], remove=True)
    return output.decode()


@pytest.mark.docker
def test_second_ensure_image_reuses_the_tag_without_building(docker_client, built_image):
    tag, _ = built_image
    messages: list[str] = []
    assert image.ensure_image(docker_client, progress=messages.append) == tag
    assert messages == [f"reusing image {tag} already on the engine"]
    labels = docker_client.images.get(tag).labels
    assert labels[image.LABEL] == tag.rsplit(":", 1)[1]


@pytest.mark.docker
def test_image_has_the_tools_sessions_rely_on(docker_client, built_image):
    tag, _ = built_image
    script = "for t in " + " ".join(TOOLS) + '; do command -v "$t" || echo "missing $t"; done'
    output = _run(docker_client, tag, script)
    assert "missing" not in output, output
    assert "Python 3.11" in _run(docker_client, tag, "python3 --version")


@pytest.mark.docker
def test_image_carries_no_host_keys_and_sshd_serves_with_its_own(docker_client, built_image):
    tag, _ = built_image
    script = (
        "ls /etc/ssh/ssh_host_* 2>/dev/null && echo 'baked-in host key'; "
        "ssh-keygen -q -t ed25519 -N '' -f /tmp/host_key && "
        "/usr/sbin/sshd -p 2200 -h /tmp/host_key && "
        "for i in 1 2 3 4 5 6 7 8 9 10; do "
        "ssh-keyscan -p 2200 127.0.0.1 2>/dev/null && break; sleep 0.2; done"
    )
    output = _run(docker_client, tag, script)
    assert "baked-in host key" not in output
    assert "[127.0.0.1]:2200 ssh-ed25519 " in output, output


def test_the_image_is_imported_once_and_loaded_into_the_other_engines_and_ctrl_c_stops_at_once(
        monkeypatch):
    """One import (two imports of one tarball are two image IDs: ``docker import`` stamps the
    time), then the saved image loaded into the other engines in parallel, so every lab agent
    holds one image ID (issue 33). Ctrl-C while they load: `lab up` stops within a moment, not
    when the slowest load ends; each engine's lines say which engine."""
    import contextlib
    import signal
    import threading
    import time

    release = threading.Event()
    said: list[str] = []

    class Engine:
        def __init__(self, name: str):
            self.name, self.api = name, self

        def __repr__(self) -> str:
            return self.name

        def get_image(self, tag):
            said.append(f"save from {self.name}")
            return [b"image tar"]

        def load_image(self, data):
            said.append(f"load into {self.name}: {data.read()!r}")
            release.wait(10)

    def quick_import(client, tarball, tag, progress):
        progress(f"docker import into {client}")

    monkeypatch.setattr(image, "_has_image", lambda client, tag: False)
    monkeypatch.setattr(image, "locked", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(image, "ensure_tarball", lambda *a, **k: "rootfs.tar")
    monkeypatch.setattr(image, "_import", quick_import)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            image.ensure_images([Engine("a"), Engine("b"), Engine("c")],
                                progress=lambda line: said.append(line)
                                if "saved" not in line else None)
        elapsed = time.monotonic() - started
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        release.set()
    assert elapsed < 3, elapsed
    assert said[:2] == ["engine 1: docker import into a", "save from a"]
    assert sorted(said[2:]) == ["load into b: b'image tar'", "load into c: b'image tar'"]
