"""``sessionctl render FILE [--pool POOLFILE] --out DIR`` (contract 3), through the CLI's main."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from cluster_sessions.core.render import RenderedFile
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.render_verb import write_bundle

POOL = """\
kind: AgentPool
name: one
agents:
  - name: agent1
    docker_host: unix:///var/run/docker.sock
    capacity: {cpu: %(cpu)s, mem: 64g}
"""
SESSION = """\
kind: ClusterSession
name: render-verb
pool: %(pool)s
image: img:1
cluster: {mode: single-node, size: %(size)s}
resources: {cpu: 1, mem: 1g, shmem: 64m}
env: {GREETING: "it's $(here)"}
"""


def definition(tmp_path: Path, size: int = 3, cpu: int = 16) -> tuple[Path, Path]:
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL % {"cpu": cpu})
    session = tmp_path / "session.yaml"
    session.write_text(SESSION % {"pool": pool, "size": size})
    return session, pool


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_one_directory_per_host_with_modes(tmp_path, capsys):
    session, pool = definition(tmp_path)
    out = tmp_path / "out"
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["main1", "sub1", "sub2"]
    for host in ("main1", "sub1", "sub2"):
        bundle = out / host
        assert (bundle / "entrypoint.sh").is_file() and (bundle / "cluster-env.sh").is_file()
        assert mode(bundle / "entrypoint.sh") == 0o755
        assert mode(bundle / "cluster-env.sh") == 0o644
        assert mode(bundle / "ssh") == 0o700
        assert mode(bundle / "ssh" / "id_cluster") == 0o600
        assert mode(bundle / "ssh" / "ssh_host_ed25519_key") == 0o600
        assert mode(bundle / "ssh" / "known_hosts") == 0o644
        assert "BACKENDAI_CLUSTER_HOST=" + host in (bundle / "static-env.sh").read_text()
    printed = capsys.readouterr()
    assert "main1" in printed.out and "fresh session keys" in printed.out


def test_never_prints_key_material(tmp_path, capsys):
    session, pool = definition(tmp_path)
    out = tmp_path / "out"
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "PRIVATE KEY" not in text and "ssh-ed25519" not in text
    body = (out / "main1" / "ssh" / "id_cluster").read_text().splitlines()[1]
    assert body not in text


def test_each_run_generates_fresh_keys(tmp_path):
    session, pool = definition(tmp_path)
    for out in ("a", "b"):
        assert main(["render", str(session), "--pool", str(pool), "--out",
                     str(tmp_path / out)]) == 0
    one, two = ((tmp_path / out / "sub1" / "ssh" / "id_cluster.pub").read_text()
                for out in ("a", "b"))
    assert one != two


def test_rendering_again_into_the_same_directory_replaces_the_files(tmp_path):
    session, pool = definition(tmp_path)
    out = tmp_path / "out"
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 0
    key = out / "main1" / "ssh" / "id_cluster"
    key.chmod(0o644)
    before = key.read_text()
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 0
    assert key.read_text() != before and mode(key) == 0o600
    assert not [p for p in (out / "main1").rglob(".*") if p.is_file()]  # no temporary left


def test_a_pending_session_exits_3_and_writes_nothing(tmp_path, capsys):
    session, pool = definition(tmp_path, size=4, cpu=2)
    out = tmp_path / "out"
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 3
    assert "pending" in capsys.readouterr().err
    assert not out.exists()


def test_an_invalid_definition_exits_2_with_the_problem(tmp_path, capsys):
    session, pool = definition(tmp_path)
    session.write_text(session.read_text().replace("size: 3", "size: 0"))
    assert main(["render", str(session), "--pool", str(pool), "--out", str(tmp_path / "o")]) == 2
    assert "cluster.size" in capsys.readouterr().err


def test_out_is_required(tmp_path, capsys):
    session, pool = definition(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["render", str(session), "--pool", str(pool)])
    assert exc.value.code == 2


def test_an_unwritable_out_directory_is_an_error_not_a_traceback(tmp_path, capsys):
    session, pool = definition(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["render", str(session), "--pool", str(pool), "--out", str(blocker)]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_write_bundle_refuses_paths_outside_the_directory(tmp_path):
    with pytest.raises(ValueError):
        write_bundle([RenderedFile("../escape", "x", 0o644)], tmp_path / "b")


# --- links planted in the output directory (issue 9) -----------------------------------------

def victim(tmp_path: Path) -> tuple[Path, list]:
    """A directory someone else owns, with a file in it, and a snapshot of both."""
    home = tmp_path / "victim" / ".ssh"
    home.mkdir(parents=True)
    (home / "authorized_keys").write_text("ssh-ed25519 AAAA victim\n")
    home.chmod(0o755)
    return home, snapshot(tmp_path / "victim")


def snapshot(directory: Path) -> list:
    return [(str(p.relative_to(directory)), stat.S_IMODE(p.lstat().st_mode),
             p.read_bytes() if p.is_file() else b"")
            for p in sorted([directory, *directory.rglob("*")])]


def render_into(tmp_path: Path, out: Path, size: int = 3) -> int:
    session, pool = definition(tmp_path, size=size)
    return main(["render", str(session), "--pool", str(pool), "--out", str(out)])


@pytest.mark.parametrize("planted", ["main1/ssh", "main1", "main1/ssh/id_cluster",
                                     "main1/ssh/authorized_keys"])
def test_render_never_writes_through_a_link_planted_in_the_output(tmp_path, planted):
    target, before = victim(tmp_path)
    out = tmp_path / "out"
    link = out / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    pointed = target if planted in ("main1/ssh", "main1") else target / "authorized_keys"
    link.symlink_to(pointed)
    assert render_into(tmp_path, out) == 0
    assert snapshot(tmp_path / "victim") == before
    bundle = out / "main1"
    assert not bundle.is_symlink() and not (bundle / "ssh").is_symlink()
    assert mode(bundle / "ssh") == 0o700 and mode(bundle / "ssh" / "id_cluster") == 0o600
    assert not [p for p in bundle.rglob("*") if p.is_symlink()]


def test_a_dangling_link_in_the_output_is_replaced_not_followed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub1").symlink_to(tmp_path / "made-by-render")
    assert render_into(tmp_path, out) == 0
    assert not (tmp_path / "made-by-render").exists()
    assert (out / "sub1" / "entrypoint.sh").is_file() and not (out / "sub1").is_symlink()


def test_an_output_directory_that_is_a_link_is_refused(tmp_path, capsys):
    target, before = victim(tmp_path)
    out = tmp_path / "out"
    out.symlink_to(target)
    assert render_into(tmp_path, out) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert snapshot(tmp_path / "victim") == before


def test_an_empty_output_directory_name_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session, pool = definition(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as exc:  # argparse or the verb: exit 2 either way
        raise SystemExit(main(["render", str(session), "--pool", str(pool), "--out", ""]))
    assert exc.value.code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_hosts_of_an_earlier_bigger_render_are_removed_and_nothing_else(tmp_path, capsys):
    out = tmp_path / "out"
    assert render_into(tmp_path, out, size=4) == 0
    (out / "notes").mkdir()
    assert render_into(tmp_path, out, size=2) == 0
    assert sorted(p.name for p in out.iterdir()) == ["main1", "notes", "sub1"]
    assert "sub2, sub3" in capsys.readouterr().out
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no build folder left
