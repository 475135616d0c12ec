"""The set-up's pulumi step (scripts/install-pulumi.sh) and the install instructions (issue 12).

The real download cannot happen here, so ``curl`` is replaced on PATH by a stand-in that serves
files from a local directory the way the release server would, or fails like a machine with no
route to it. Everything else is the real script: checksum check, unpacking, the version check.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SCRIPT = PROJECT / "scripts" / "install-pulumi.sh"
VERSION = "3.272.0"
ARCHIVE = f"pulumi-v{VERSION}-linux-x64.tar.gz"

FAKE_CURL = """#!/bin/sh
# curl -fsSL ... -o FILE URL: copy $SERVE/<last path part of URL> to FILE, or fail like curl
out= url=
while [ "$#" -gt 0 ]; do
    case $1 in (-o) out=$2; shift ;; (-*) ;; (*) url=$1 ;; esac
    shift
done
[ -n "$SERVE" ] || { echo "curl: (6) Could not resolve host: get.pulumi.com" >&2; exit 6; }
[ -f "$SERVE/${url##*/}" ] || { echo "curl: (22) 404" >&2; exit 22; }
cp "$SERVE/${url##*/}" "$out"
"""


def archive_bytes(version: str = VERSION) -> bytes:
    """A release archive: pulumi/pulumi that answers ``pulumi version``."""
    script = f"#!/bin/sh\n[ \"$1\" = version ] && echo v{version}\n".encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("pulumi/pulumi")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    return buffer.getvalue()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    if os.uname().machine != "x86_64":
        pytest.skip("the stand-in serves the x64 archive")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text(FAKE_CURL)
    (bin_dir / "curl").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
            "PULUMI_HOME": str(tmp_path / "home" / ".pulumi")}


def serve(tmp_path: Path, archive: bytes, listed: bytes | None = None) -> Path:
    served = tmp_path / "served"
    served.mkdir()
    (served / ARCHIVE).write_bytes(archive)
    digest = hashlib.sha256(archive if listed is None else listed).hexdigest()
    (served / f"pulumi-{VERSION}-checksums.txt").write_text(
        f"{'0' * 64}  pulumi-v{VERSION}-darwin-x64.tar.gz\n{digest}  {ARCHIVE}\n")
    return served


def copy_project(destination: Path) -> Path:
    """The files git tracks (a fresh clone's content, without .venv or caches)."""
    files = subprocess.run(["git", "-C", str(PROJECT), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (PROJECT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            (destination / name).write_bytes((PROJECT / name).read_bytes())
    return destination


def install(env: dict[str, str], served: Path | None) -> subprocess.CompletedProcess:
    """The real script (a build through the stand-in ``go`` where ``env`` has one)."""
    return subprocess.run(["bash", str(SCRIPT), VERSION],
                          env={**env, "SERVE": str(served) if served else ""},
                          capture_output=True, text=True, timeout=60)


def test_a_verified_archive_is_installed_where_sessionctl_looks(tmp_path, env):
    from cluster_sessions.driver.stacks import find_pulumi

    result = install(env, serve(tmp_path, archive_bytes()))
    assert result.returncode == 0, result.stderr
    assert "sha256 verified" in result.stderr
    found = find_pulumi({"PATH": "/nonexistent", "HOME": env["HOME"]})
    assert found == Path(env["PULUMI_HOME"]) / "bin" / "pulumi"
    assert subprocess.run([found, "version"], capture_output=True, text=True).stdout.strip() \
        == f"v{VERSION}"


def test_a_checksum_mismatch_installs_nothing_and_fails(tmp_path, env):
    result = install(env, serve(tmp_path, archive_bytes(), listed=b"something else"))
    assert result.returncode == 1
    assert "checksum mismatch" in result.stderr
    assert not (Path(env["PULUMI_HOME"]) / "bin").exists()


def test_no_network_fails_with_the_reason(env):
    result = install(env, None)
    assert result.returncode == 1
    assert "cannot download" in result.stderr and "Could not resolve host" in result.stderr
    assert not (Path(env["PULUMI_HOME"]) / "bin").exists()


# A stand-in for `go` (issue 42): `mod download` succeeds, `build ... -o OUT PKG` writes an OUT
# that answers `version` with what -ldflags stamped (or fails for the package in $GO_FAIL),
# `list -m -f {{.Dir}} MODULE` names a module directory holding the sdk's two Python scripts.
FAKE_GO = """#!/bin/sh
case $1 in
version) echo "go version go1.99 linux/amd64" ;;
mod) [ "$2 $3" = "download -json" ] && printf '{\n\t"Dir": "%s"\n}\n' "$UPSTREAM_DIR"; exit 0 ;;
list) echo "$SDK_DIR" ;;
build)
    out= pkg= stamp=
    while [ "$#" -gt 0 ]; do
        case $1 in
        (-o) out=$2; shift ;;
        (-ldflags) stamp=${2##*Version=}; shift ;;
        (-*) ;;
        (*) pkg=$1 ;;
        esac
        shift
    done
    [ "$pkg" != "$GO_FAIL" ] || { echo "compile: something broke in $pkg" >&2; exit 1; }
    # the built program: answers (-)version; as pulumi, installs a plugin where pulumi does
    {
        echo '#!/bin/sh'
        echo "case \\$1 in (version|-version) echo $stamp ;;"
        echo '(plugin) d=$PULUMI_HOME/plugins/resource-$4-v$5'
        echo '    mkdir -p "$d" && cp "$7" "$d/pulumi-resource-$4" ;;'
        echo 'esac'
    } >"$out"
    chmod 755 "$out" ;;
esac
"""


@pytest.fixture
def go_env(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` with the stand-in ``go`` on PATH and the sdk module's directory it names."""
    bin_dir = Path(env["PATH"].split(":")[0])
    (bin_dir / "go").write_text(FAKE_GO)
    (bin_dir / "go").chmod(0o755)
    sdk = tmp_path / "sdk"
    for script in ("python/cmd/pulumi-language-python-exec",
                   "python/dist/pulumi-resource-pulumi-python"):
        (sdk / script).parent.mkdir(parents=True, exist_ok=True)
        (sdk / script).write_text("#!/bin/sh\n")
    upstream = tmp_path / "upstream"  # the Terraform provider's module directory
    (upstream / "internal" / "provider").mkdir(parents=True)
    return {**env, "SDK_DIR": str(sdk), "UPSTREAM_DIR": str(upstream), "GO_FAIL": ""}


def wrapper_version(module: str, required: str) -> str:
    text = (PROJECT / "scripts" / "pulumi-build" / module / "go.mod").read_text()
    return next(line.split()[1] for line in text.splitlines()
                if line.split()[:1] == [required])


def test_without_the_download_the_cli_and_language_host_are_built_from_go_modules(go_env):
    result = install(go_env, None)
    assert result.returncode == 0, result.stderr
    assert "Could not resolve host" in result.stderr  # the download was tried first
    cli = wrapper_version("cli", "github.com/pulumi/pulumi/pkg/v3")
    langhost = wrapper_version("language-python", "github.com/pulumi/pulumi/sdk/v3")
    for step in ("cli: download modules", "cli: go build pulumi",
                 "language-python: go build pulumi-language-python"):
        assert f"install-pulumi: {step}" in result.stderr
    bin_dir = Path(go_env["PULUMI_HOME"]) / "bin"
    assert sorted(p.name for p in bin_dir.iterdir()) == sorted([
        "pulumi", "pulumi-language-python", f"pulumi-language-python-{langhost}",
        "pulumi-language-python-exec", "pulumi-resource-pulumi-python"])
    assert all(os.access(p, os.X_OK) for p in bin_dir.iterdir())
    answers = {name: subprocess.run([bin_dir / name, "version"], capture_output=True,
                                    text=True, cwd=bin_dir).stdout.strip()
               for name in ("pulumi", "pulumi-language-python")}
    assert answers == {"pulumi": cli, "pulumi-language-python": langhost}
    again = install(go_env, None)  # what it built is kept: no second build
    assert again.returncode == 0 and f"pulumi {cli} is already in" in again.stderr
    assert "go build" not in again.stderr


LANGHOST_SCRIPT = PROJECT / "scripts/pulumi-build/language-python/pulumi-language-python"


@pytest.mark.parametrize(("pulumi_yaml", "python_cmd", "added"), [
    ("runtime:\n  name: python\n  options:\n    virtualenv: .venv  # made by setup\n", None,
     ["-virtualenv=.venv"]),
    ("runtime:\n  name: python\n  options:\n    virtualenv: 'my env'\n", None,
     ["-virtualenv=my env"]),
    ("runtime:\n  name: python\n  options:\n    virtualenv: .venv\n", "/usr/bin/python3", []),
    ("runtime: python\n", None, []),
    (None, None, []),
])
def test_the_language_host_script_passes_the_projects_virtualenv_as_the_old_host_reads_it(
        tmp_path, pulumi_yaml, python_cmd, added):
    """Our ``pulumi-language-python`` in front of the v3.79.0 host: the ``virtualenv:`` of the
    Pulumi.yaml where the CLI starts it, as ``-virtualenv`` (the flag the newer CLI no longer
    passes); PULUMI_PYTHON_CMD wins; no option, no flag. The CLI's own arguments follow."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "pulumi-language-python"
    script.write_text(LANGHOST_SCRIPT.read_text().replace("@HOST_VERSION@", "v3.79.0"))
    host = bin_dir / "pulumi-language-python-v3.79.0"  # records what it was given
    host.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    for f in (script, host):
        f.chmod(0o755)
    project = tmp_path / "project"
    project.mkdir()
    if pulumi_yaml is not None:
        (project / "Pulumi.yaml").write_text(f"name: p\n{pulumi_yaml}")
    env = {k: v for k, v in os.environ.items() if k != "PULUMI_PYTHON_CMD"}
    if python_cmd:
        env["PULUMI_PYTHON_CMD"] = python_cmd
    done = subprocess.run([script, "127.0.0.1:4000"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    root = [f"-root={project}"] if added else []
    assert done.stdout.splitlines() == [*added, *root, "127.0.0.1:4000"]


def test_with_a_docker_version_the_provider_plugin_is_built_and_installed(go_env):
    result = subprocess.run(["bash", str(SCRIPT), VERSION, "5.2.0"], env=go_env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "install-pulumi: docker-provider: go build pulumi-resource-docker" in result.stderr
    assert "not pulumi-docker's own build" in result.stderr  # said plainly
    plugin = Path(go_env["PULUMI_HOME"]) / "plugins" / "resource-docker-v5.2.0"
    assert subprocess.run([plugin / "pulumi-resource-docker", "-version"], capture_output=True,
                          text=True).stdout.strip() == "5.2.0"
    again = subprocess.run(["bash", str(SCRIPT), VERSION, "5.2.0"], env=go_env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "go build" not in again.stderr
    assert "the resource plugin docker 5.2.0 is already in" in again.stderr


def test_a_failed_build_names_the_module_and_step_and_installs_nothing(go_env):
    result = install({**go_env, "GO_FAIL": "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"}, None)
    assert result.returncode == 1
    cli = wrapper_version("cli", "github.com/pulumi/pulumi/pkg/v3")
    assert (f"building failed: module github.com/pulumi/pulumi/pkg/v3@{cli}, step 'go build "
            "pulumi'") in result.stderr
    assert "compile: something broke" in result.stderr  # the log's end is shown
    assert not (Path(go_env["PULUMI_HOME"]) / "bin").exists()


def test_the_build_can_be_turned_off(go_env):
    result = install({**go_env, "CLUSTER_SESSIONS_PULUMI_BUILD": "0"}, None)
    assert result.returncode == 1 and "cannot download" in result.stderr
    assert "go build" not in result.stderr
    assert not (Path(go_env["PULUMI_HOME"]) / "bin").exists()


def test_the_install_instructions_are_said_once_and_plainly():
    from cluster_sessions.driver.stacks import how_to_install

    text = how_to_install()
    assert "brew" not in text
    assert "sandbox" not in text and "built and tested" not in text
    assert "scripts/install-pulumi.sh" in text


@pytest.mark.slow
def test_setup_exits_1_when_the_cli_was_asked_for_and_cannot_be_downloaded(tmp_path, env):
    """The whole set-up (without the engine) in a copy of the project: the pulumi step fails
    as on a machine that cannot reach the download, and set-up says so and exits 1. With
    ``--dev`` as the README's test command runs it: the tests need the real engine, so the
    development set-up installs it too (it once did not, and they skipped or failed)."""
    if os.geteuid() != 0:
        pytest.skip("set-up runs as root")
    copy = copy_project(tmp_path / "project")
    result = subprocess.run(
        ["bash", "scripts/setup.sh", "--no-engine", "--dev"], cwd=copy,
        # not /usr/local/bin: set-up (CI's too) links an installed pulumi there
        env={**os.environ, **env, "PATH": f"{env['PATH']}:/usr/sbin:/sbin",
             "SERVE": "", "CLUSTER_SESSIONS_BIN_DIR": str(tmp_path / "linked"),
             "CLUSTER_SESSIONS_PULUMI_BUILD": "0"},  # no go build either
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "the pulumi CLI could not be installed" in result.stderr
    assert "setup: done" not in result.stderr
    assert result.stderr.count("the pulumi CLI is missing") == 1  # said once
    assert (tmp_path / "linked" / "sessionctl").resolve() == copy / ".venv" / "bin" / "sessionctl"


# --- the README's set-up on a plain Debian 12 (system Python, no pip) --------------------------

PLAIN_PACKAGES = ("python3",)  # what a plain Debian 12 has of Python: no pip, no venv


def plain_rootfs_tarball() -> Path:
    """A minimal Debian 12 root filesystem with only the system Python, cached by recipe."""
    from cluster_sessions.lab.image import SUITE, cache_dir, debian_mirror

    source = debian_mirror()
    recipe = f"{SUITE} minbase {','.join(PLAIN_PACKAGES)}"
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    tarball = cache_dir() / "rootfs" / f"plain-{digest}.tar"
    if tarball.is_file():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile_dir(tarball.parent))
    command = ["debootstrap", "--variant=minbase", f"--include={','.join(PLAIN_PACKAGES)}"]
    if source.keyring and Path(source.keyring).is_file():
        command.append(f"--keyring={source.keyring}")
    subprocess.run([*command, SUITE, str(build / "root"), source.uri], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    partial = tarball.with_suffix(".partial")
    subprocess.run(["tar", "-C", str(build / "root"), "-cf", str(partial), "."], check=True)
    partial.rename(tarball)
    subprocess.run(["rm", "-rf", str(build)], check=True)
    return tarball


def tempfile_dir(parent: Path) -> str:
    import tempfile

    return tempfile.mkdtemp(dir=parent, prefix="build-")


@pytest.mark.slow
def test_the_readme_set_up_works_on_a_plain_debian_12(tmp_path):
    """The README's set-up (without the engine, which a chroot cannot run) on a Debian 12 root
    filesystem with the system Python only, then `sessionctl validate` and `plan` there."""
    import shutil

    from .conftest import skip_or_fail

    if os.geteuid() != 0 or shutil.which("debootstrap") is None or shutil.which("chroot") is None:
        skip_or_fail("the plain-Debian set-up test needs root, debootstrap and chroot")
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(plain_rootfs_tarball())], check=True)
    assert subprocess.run(["chroot", str(root), "python3", "-m", "pip", "--version"],
                          capture_output=True).returncode != 0  # really no pip
    copy_project(root / "project")
    # the host's network settings: name resolution and the certificate bundle pip trusts here
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "host-ca.crt")
    mounts = []
    try:
        for fs, where in (("proc", "proc"), ("sysfs", "sys")):
            subprocess.run(["mount", "-t", fs, fs, str(root / where)], check=True)
            mounts.append(root / where)
        subprocess.run(["mount", "--bind", "/dev", str(root / "dev")], check=True)
        mounts.append(root / "dev")
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "PIP_CERT": "/host-ca.crt",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        setup = subprocess.run(
            ["chroot", str(root), "bash", "-c",
             "cd /project && bash scripts/setup.sh --no-engine --no-pulumi"],
            env=env, capture_output=True, text=True, timeout=1500)
        assert setup.returncode == 0, setup.stderr[-4000:]
        assert "setup: done" in setup.stderr
        validate = subprocess.run(
            ["chroot", str(root), "bash", "-c",
             "cd /project && sessionctl validate stacks/sessions/*.yaml stacks/pools/*.yaml"],
            env=env, capture_output=True, text=True, timeout=120)
        assert validate.returncode == 0, validate.stderr
        plan = subprocess.run(
            ["chroot", str(root), "bash", "-c",
             "cd /tmp && sessionctl plan /project/stacks/sessions/train-demo.yaml"],
            env=env, capture_output=True, text=True, timeout=120)
        assert plan.returncode == 0, plan.stderr
        assert "main1" in plan.stdout and "sub3" in plan.stdout
        print(f"\n{setup.stderr}\n{validate.stdout}\n{plan.stdout}")
    finally:
        for mount in reversed(mounts):
            subprocess.run(["umount", "-l", str(mount)], check=False)


# --- whose command /usr/local/bin/sessionctl is (issue 34) --------------------------------------

LINK_SCRIPT = PROJECT / "scripts" / "link-sessionctl.sh"


def checkout(root: Path) -> Path:
    """Another checkout's sessionctl (a file that exists)."""
    command = root / ".venv" / "bin" / "sessionctl"
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    return command


def link_sessionctl(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LINK_SCRIPT), *argv], capture_output=True, text=True,
                          timeout=30)


def test_a_link_into_another_checkout_is_refused_naming_where_it_points(tmp_path):
    other, mine = checkout(tmp_path / "other"), checkout(tmp_path / "mine")
    link = tmp_path / "bin" / "sessionctl"
    link.parent.mkdir()
    link.symlink_to(other)
    for check in ([], ["--check"]):
        result = link_sessionctl(*check, str(mine), str(link))
        assert result.returncode == 1, result.stderr
        assert f"{link} is a link to {other}, not this checkout's {mine}" in result.stderr
        assert "--force" in result.stderr and "CLUSTER_SESSIONS_BIN_DIR=DIR" in result.stderr
        assert os.readlink(link) == str(other)  # untouched


def test_force_replaces_it_and_keep_other_keeps_it_with_a_warning(tmp_path):
    other, mine = checkout(tmp_path / "other"), checkout(tmp_path / "mine")
    link = tmp_path / "bin" / "sessionctl"
    link.parent.mkdir()
    link.symlink_to(other)
    kept = link_sessionctl("--keep-other", str(mine), str(link))
    assert kept.returncode == 0 and "warning" in kept.stderr and str(other) in kept.stderr
    assert os.readlink(link) == str(other)
    forced = link_sessionctl("--force", "--keep-other", str(mine), str(link))
    assert forced.returncode == 0, forced.stderr
    assert f"--force: {link} was a link to {other}: replacing it" in forced.stderr
    assert os.readlink(link) == str(mine)
    again = link_sessionctl(str(mine), str(link))  # ours already: nothing to decide
    assert again.returncode == 0 and os.readlink(link) == str(mine)
    assert again.stderr == f"setup: sessionctl: {link} -> {mine}\n"


def test_a_link_to_a_removed_checkout_is_replaced_and_a_missing_one_made(tmp_path):
    mine = checkout(tmp_path / "mine")
    link = tmp_path / "bin" / "sessionctl"
    made = link_sessionctl(str(mine), str(link))
    assert made.returncode == 0 and os.readlink(link) == str(mine)
    link.unlink()
    link.symlink_to(tmp_path / "gone" / ".venv" / "bin" / "sessionctl")
    result = link_sessionctl(str(mine), str(link))
    assert result.returncode == 0, result.stderr
    assert "which is gone: replacing it" in result.stderr
    assert os.readlink(link) == str(mine)


def test_a_file_that_is_not_a_link_is_refused_too(tmp_path):
    mine = checkout(tmp_path / "mine")
    link = tmp_path / "sessionctl"
    link.write_text("#!/bin/sh\n# pip's console script\n")
    result = link_sessionctl(str(mine), str(link))
    assert result.returncode == 1 and "a file that is not a link" in result.stderr
    assert not link.is_symlink()


@pytest.mark.parametrize(("flags", "ci", "stops"), [
    ([], "", True), (["--dev"], "", False), ([], "true", False), (["--force"], "", False)])
def test_setup_decides_before_it_installs_anything(tmp_path, flags, ci, stops):
    """The whole set-up in a copy of the project, with CLUSTER_SESSIONS_BIN_DIR holding a link
    to another checkout: without --force, --dev or CI=true it stops at once (exit 1) saying
    where the link points; otherwise it goes on (here to a python3 that refuses, so nothing is
    installed either way)."""
    if os.geteuid() != 0:
        pytest.skip("set-up runs as root")
    copy = copy_project(tmp_path / "project")
    other = checkout(tmp_path / "other")
    bin_dir = tmp_path / "linked"
    bin_dir.mkdir()
    (bin_dir / "sessionctl").symlink_to(other)
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    for name, body in (("dpkg-query", "echo 'install ok installed'"),
                       ("python3", "echo 'Python 3.9.0'; exit 1")):
        (fakes / name).write_text(f"#!/bin/sh\n{body}\n")
        (fakes / name).chmod(0o755)
    result = subprocess.run(
        ["bash", "scripts/setup.sh", "--no-engine", "--no-pulumi", *flags], cwd=copy,
        env={"PATH": f"{fakes}:/usr/bin:/bin", "HOME": str(tmp_path), "CI": ci,
             "CLUSTER_SESSIONS_BIN_DIR": str(bin_dir)},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    refused = f"is a link to {other}, not this checkout's" in result.stderr
    assert refused == stops, result.stderr
    assert ("setup: nothing was installed" in result.stderr) == stops
    assert ("Python 3.11 or newer is needed" in result.stderr) != stops
    assert os.readlink(bin_dir / "sessionctl") == str(other)
    assert not (copy / ".venv").exists()


def test_setup_help_documents_the_bin_dir_and_force():
    result = subprocess.run(["bash", str(PROJECT / "scripts" / "setup.sh"), "--help"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert "CLUSTER_SESSIONS_BIN_DIR" in result.stdout and "--force" in result.stdout
    assert "set -euo" not in result.stdout  # the comment block only
