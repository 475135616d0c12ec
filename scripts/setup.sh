#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for cluster-sessions (run as root):
#   1. Debian packages: the Docker engine, debootstrap, OpenSSH, busybox/dash, shellcheck and
#      docker-registry with htpasswd (tests, --dev), iproute2, rsync (the README's copies into a session), python3-venv
#      (the project's own virtual environment: Debian's Python has no pip and refuses
#      system-wide installs, PEP 668)
#   2. Python packages in .venv/: requirements.txt (requirements-dev.txt with --dev) and the
#      project itself; sessionctl linked into $CLUSTER_SESSIONS_BIN_DIR (default
#      /usr/local/bin). A sessionctl there that is another checkout's is not replaced: set-up
#      stops before installing anything (exit 1, saying where it points), or with --dev (and
#      CI=true) keeps it with a warning; --force replaces it. A link to a removed checkout is
#      replaced (scripts/link-sessionctl.sh).
#   3. a running Docker engine (scripts/ensure-docker.sh)
#   4. the demo image cluster-sessions/debian-sshd:latest, built from Debian packages, and the
#      local pool's scratch root /var/lib/cluster-sessions (0700, where up delivers bundles)
#   5. the Pulumi CLI, from Pulumi's release archive with its checksum verified, or, where that
#      cannot be downloaded and go is present, built from Pulumi's Go modules with its Python
#      language host and a docker provider plugin (scripts/install-pulumi.sh,
#      scripts/pulumi-build/), into ~/.pulumi/bin (the plugin into ~/.pulumi/plugins) and
#      linked into the same place; with --dev too (the tests' real engine). If it cannot be
#      installed, set-up says what to install and exits 1 (--no-pulumi skips it;
#      --install-pulumi, the default, asks for it).
# Idempotent: a second run only checks. --no-engine skips 3 and 4 (e.g. in a chroot).
# CLUSTER_SESSIONS_BIN_DIR: where sessionctl (and pulumi) are linked (default /usr/local/bin).
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
force=0
engine=1
bin_dir=${CLUSTER_SESSIONS_BIN_DIR:-/usr/local/bin}  # where sessionctl and pulumi are linked
pulumi=${CLUSTER_SESSIONS_INSTALL_PULUMI:-1}  # the main job and the tests' real engine need it
for arg in "$@"; do
    case "$arg" in
        --dev) dev=1 ;;
        --install-pulumi) pulumi=1 ;;
        --no-pulumi) pulumi=0 ;;
        --no-engine) engine=0 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"
                   echo "usage: scripts/setup.sh [--dev] [--install-pulumi|--no-pulumi] [--no-engine] [--force]"
                   exit 0 ;;
        *) echo "setup: unknown option $arg" >&2; exit 2 ;;
    esac
done
say() { echo "setup: $*" >&2; }

# Whose command $bin_dir/sessionctl is, decided before anything is installed.
link_opts=()
[ "$force" -eq 0 ] || link_opts+=(--force)
[ "$dev" -eq 0 ] && [ "${CI:-}" != true ] || link_opts+=(--keep-other)
bash scripts/link-sessionctl.sh --check "${link_opts[@]}" "$PWD/.venv/bin/sessionctl" \
    "$bin_dir/sessionctl" || { say "nothing was installed"; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
    say "must run as root (installs Debian packages, starts dockerd)"; exit 1
fi

packages=(python3 python3-venv ca-certificates curl rsync)
if [ "$engine" -eq 1 ]; then
    packages+=(docker.io debootstrap openssh-client openssh-server busybox dash iproute2 iptables
               kmod)
fi
if [ "$dev" -eq 1 ]; then
    packages+=(shellcheck)  # the tests check every rendered shell file with it
    packages+=(systemd)  # systemd-analyze verify: the reaper's units (tests/test_reap_units.py)
    # the image tests' real registry (distribution, basic auth): tests/registry_support.py
    packages+=(docker-registry apache2-utils)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The project's own virtual environment: works on Debian's Python (no pip, PEP 668) and on any
# other python3 alike. Python 3.11 or newer.
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { say "Python 3.11 or newer is needed (found $(python3 --version 2>&1))"; exit 1; }
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    say "creating the virtual environment .venv/"
    rm -rf .venv
    python3 -m venv .venv
fi
reqs=requirements.txt
[ "$dev" -eq 1 ] && reqs=requirements-dev.txt
say "installing Python packages from $reqs and the project (sessionctl) into .venv/"
.venv/bin/python -m pip install -q --disable-pip-version-check -r "$reqs" -e .
bash scripts/link-sessionctl.sh "${link_opts[@]}" "$PWD/.venv/bin/sessionctl" \
    "$bin_dir/sessionctl"

if [ "$engine" -eq 1 ]; then
    bash scripts/ensure-docker.sh
    say "building or reusing the demo image (first build: about a minute)"
    tag=$(.venv/bin/python -m cluster_sessions.lab.image)
    docker tag "$tag" cluster-sessions/debian-sshd:latest
    say "image $tag, tagged cluster-sessions/debian-sshd:latest"
    # the embedded local pool's scratch root, where up delivers each container's bundle
    # (issue 45; what `sessionctl pool check local --fix` makes): this user's, 0700
    .venv/bin/python -c 'from cluster_sessions.agents.bundles import make_root
from cluster_sessions.agents.connectors import LocalConnector
from cluster_sessions.core.spec import DEFAULT_SCRATCH
make_root(LocalConnector("local"), DEFAULT_SCRATCH)
print(f"setup: scratch root {DEFAULT_SCRATCH} ready")' >&2
fi

version=$(.venv/bin/python -c 'from importlib.metadata import version; print(version("pulumi"))')
docker_version=$(.venv/bin/python -c 'from importlib.metadata import version; print(version("pulumi-docker"))')
installed=$(command -v pulumi 2>/dev/null || true)
[ -n "$installed" ] || [ ! -x "$HOME/.pulumi/bin/pulumi" ] || installed=$HOME/.pulumi/bin/pulumi
if [ -n "$installed" ]; then
    say "pulumi CLI: $installed ($("$installed" version 2>/dev/null || echo 'does not run'))"
elif [ "$pulumi" = 1 ]; then
    if bash scripts/install-pulumi.sh "$version" "$docker_version"; then
        mkdir -p "$bin_dir"
        ln -sf "${PULUMI_HOME:-$HOME/.pulumi}/bin/pulumi" "$bin_dir/pulumi"
        say "pulumi CLI: $bin_dir/pulumi -> ${PULUMI_HOME:-$HOME/.pulumi}/bin/pulumi"
    else
        .venv/bin/python -c 'from cluster_sessions.driver.stacks import how_to_install
print(how_to_install())' >&2
        say "the pulumi CLI could not be installed (see above); the offline verbs work, the" \
            "engine verbs exit 4 until it is. Re-run with --no-pulumi to finish without it."
        exit 1
    fi
else
    say "not installing the pulumi CLI (--no-pulumi); 'sessionctl up' and the real-engine" \
        "tests say how to"
fi
say "done"
