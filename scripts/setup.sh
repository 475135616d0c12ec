#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for cluster-sessions (run as root):
#   1. Debian packages: the Docker engine, debootstrap, OpenSSH, busybox/dash (tests), iproute2
#   2. Python packages: requirements.txt (and requirements-dev.txt with --dev), sessionctl on PATH
#   3. a running Docker engine (scripts/ensure-docker.sh)
#   4. the demo image cluster-sessions/debian-sshd:latest, built from Debian packages
#   5. the Pulumi CLI: checked; with --install-pulumi (or CLUSTER_SESSIONS_INSTALL_PULUMI=1)
#      installed with Pulumi's official installer where the network allows it. It is opt-in
#      because that installer downloads from Pulumi's own servers, not a package registry.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
install_pulumi=${CLUSTER_SESSIONS_INSTALL_PULUMI:-0}
for arg in "$@"; do
    case "$arg" in
        --dev) dev=1 ;;
        --install-pulumi) install_pulumi=1 ;;
        -h|--help) sed -n '2,10p' "$0"
                   echo "usage: scripts/setup.sh [--dev] [--install-pulumi]"; exit 0 ;;
        *) echo "setup: unknown option $arg" >&2; exit 2 ;;
    esac
done
say() { echo "setup: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    say "must run as root (installs Debian packages, starts dockerd)"; exit 1
fi

packages=(docker.io debootstrap openssh-client openssh-server busybox dash iproute2 iptables kmod)
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

reqs=requirements.txt
[ "$dev" -eq 1 ] && reqs=requirements-dev.txt
say "installing Python packages from $reqs and the project (sessionctl)"
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -r "$reqs" -e .

bash scripts/ensure-docker.sh

say "building or reusing the demo image (first build: about a minute)"
tag=$(python3 -m cluster_sessions.lab.image)
docker tag "$tag" cluster-sessions/debian-sshd:latest
say "image $tag, tagged cluster-sessions/debian-sshd:latest"

version=$(python3 -c 'from importlib.metadata import version; print(version("pulumi"))')
if ! command -v pulumi >/dev/null 2>&1 && [ "$install_pulumi" = 1 ]; then
    say "installing the pulumi CLI $version with the official installer"
    if command -v curl >/dev/null 2>&1 &&
        curl -fsSL --max-time 60 https://get.pulumi.com | sh -s -- --version "$version" >&2; then
        export PATH="$HOME/.pulumi/bin:$PATH"
        say "installed into ~/.pulumi/bin (add it to PATH)"
    else
        say "could not download the pulumi CLI (no network to get.pulumi.com?)"
    fi
fi
if command -v pulumi >/dev/null 2>&1; then
    say "pulumi CLI: $(pulumi version)"
else
    say "the pulumi CLI is not installed; 'sessionctl up' will exit 4 until it is."
    python3 -c 'from cluster_sessions.driver.engine import how_to_install; print(how_to_install())' >&2 || true
fi
say "done"
