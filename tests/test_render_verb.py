"""``sessionctl render FILE [--pool POOLFILE] --out DIR`` (contract 3), through the CLI's main."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cluster_sessions.core.render import RenderedFile
from cluster_sessions.driver.cli import main
from cluster_sessions.driver.render_verb import MARK, write_bundle

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
    left = [p.name for p in (out / "main1").rglob(".*") if p.is_file()]
    assert left == [MARK]  # no temporary left


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


@pytest.mark.parametrize("planted", ["main1/ssh", "main1/ssh/id_cluster",
                                     "main1/ssh/authorized_keys", "main1/entrypoint.sh"])
def test_render_never_writes_through_a_link_planted_in_the_output(tmp_path, planted):
    """Links planted inside a folder an earlier render wrote: the folder is replaced, its
    links removed, never followed."""
    target, before = victim(tmp_path)
    out = tmp_path / "out"
    assert render_into(tmp_path, out) == 0
    link = out / planted
    _remove_planted(link)
    link.symlink_to(target if planted == "main1/ssh" else target / "authorized_keys")
    assert render_into(tmp_path, out) == 0
    assert snapshot(tmp_path / "victim") == before
    bundle = out / "main1"
    assert not bundle.is_symlink() and not (bundle / "ssh").is_symlink()
    assert mode(bundle / "ssh") == 0o700 and mode(bundle / "ssh" / "id_cluster") == 0o600
    assert not [p for p in bundle.rglob("*") if p.is_symlink()]


def _remove_planted(path: Path) -> None:
    if path.is_dir():
        for p in sorted(path.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        path.rmdir()
    else:
        path.unlink()


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_in_place_of_a_host_folder_is_refused_not_followed(tmp_path, capsys, dangling):
    """A link is nothing render wrote, even one to a folder carrying render's mark: it is
    neither followed nor removed."""
    target, before = victim(tmp_path)
    elsewhere = tmp_path / "rendered-elsewhere"
    assert render_into(tmp_path, elsewhere) == 0
    out = tmp_path / "out"
    out.mkdir()
    pointed = tmp_path / "made-by-render" if dangling else elsewhere / "main1"
    (out / "main1").symlink_to(pointed)
    marked = snapshot(elsewhere)
    capsys.readouterr()
    assert render_into(tmp_path, out) == 2
    err = capsys.readouterr().err
    assert f"{out / 'main1'}: is a symbolic link that `sessionctl render` did not write" in err
    assert len(err.splitlines()) == 1
    assert (out / "main1").is_symlink() and os.readlink(out / "main1") == str(pointed)
    assert snapshot(elsewhere) == marked and snapshot(tmp_path / "victim") == before
    assert not (tmp_path / "made-by-render").exists()
    assert sorted(p.name for p in out.iterdir()) == ["main1"]  # nothing else written


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


# --- never delete what render did not write (issue 21, class 8) ----------------------------------


def users_files(root: Path) -> list:
    return snapshot(root) if root.exists() else []


@pytest.mark.parametrize("kind", ["dir", "file", "empty-dir", "forged-mark-link"])
def test_render_never_replaces_what_it_did_not_write(tmp_path, monkeypatch, capsys, kind):
    """``render --out .`` in a directory holding a ``sub1`` of the user's: exit 2 naming it,
    and nothing in the directory changes (no host folder is written either)."""
    work = tmp_path / "work"
    work.mkdir()
    theirs = work / "sub1"
    if kind == "dir":
        theirs.mkdir()
        (theirs / "thesis.tex").write_text("years of work\n")
    elif kind == "file":
        theirs.write_text("notes\n")
    elif kind == "empty-dir":
        theirs.mkdir()
    else:  # a real folder whose mark is a link to a real mark: not ours either
        elsewhere = tmp_path / "elsewhere"
        assert render_into(tmp_path, elsewhere) == 0
        theirs.mkdir()
        (theirs / "data.csv").write_text("1,2\n")
        (theirs / MARK).symlink_to(elsewhere / "sub1" / MARK)
    before = snapshot(work)
    monkeypatch.chdir(work)
    session, pool = definition(tmp_path)
    capsys.readouterr()
    assert main(["render", str(session), "--pool", str(pool), "--out", "."]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "sub1" in err and "did not write" in err
    assert snapshot(work) == before


def test_left_over_host_folders_are_removed_only_when_render_wrote_them(tmp_path, capsys):
    out = tmp_path / "out"
    assert render_into(tmp_path, out, size=4) == 0
    mine = out / "sub7"
    mine.mkdir()
    (mine / "results.txt").write_text("keep me\n")
    (out / "sub8").write_text("a file named like a host\n")
    (out / "sub9").symlink_to(out / "sub3")  # a link to a folder render wrote
    kept = snapshot(mine)
    assert render_into(tmp_path, out, size=2) == 0
    assert sorted(p.name for p in out.iterdir()) == ["main1", "sub1", "sub7", "sub8", "sub9"]
    assert snapshot(mine) == kept
    assert "removed the folders of hosts this session no longer has: sub2, sub3" in (
        capsys.readouterr().out)


def test_a_count_session_refuses_a_folder_of_the_users_in_any_of_its_sessions(tmp_path, capsys):
    """``count: K`` writes DIR/<name>-<i>/<host>/: the check covers every session before the
    first is written."""
    session, pool = definition(tmp_path)
    session.write_text(session.read_text() + "count: 3\n")
    out = tmp_path / "out"
    theirs = out / "render-verb-3" / "main1"
    theirs.mkdir(parents=True)
    (theirs / "keep").write_text("x\n")
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 2
    assert f"{theirs}: is a directory" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["render-verb-3"]
    assert (theirs / "keep").read_text() == "x\n"
    theirs.joinpath("keep").unlink()
    theirs.rmdir()
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 0
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 0
    assert (out / "render-verb-2" / "sub2" / MARK).is_file()


def test_a_count_session_refuses_an_out_that_is_a_link(tmp_path, capsys):
    """``count: K`` with ``--out`` a symbolic link: refused before anything is written through
    it (issue 25)."""
    target, before = victim(tmp_path)
    session, pool = definition(tmp_path)
    session.write_text(session.read_text() + "count: 2\n")
    out = tmp_path / "out"
    out.symlink_to(target)
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert snapshot(tmp_path / "victim") == before and out.is_symlink()


def test_a_count_session_refuses_a_session_folder_that_is_a_link(tmp_path, capsys):
    """DIR/<name>-<i> as a link to the user's folder: refused for every session, the first
    one's folder not written either."""
    target, before = victim(tmp_path)
    session, pool = definition(tmp_path)
    session.write_text(session.read_text() + "count: 2\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "render-verb-2").symlink_to(target)
    assert main(["render", str(session), "--pool", str(pool), "--out", str(out)]) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert snapshot(tmp_path / "victim") == before
    assert sorted(p.name for p in out.iterdir()) == ["render-verb-2"]
