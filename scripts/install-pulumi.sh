#!/usr/bin/env bash
# Install the pulumi CLI for the Python SDK VERSION into ${PULUMI_HOME:-~/.pulumi}/bin (where
# Pulumi's own installer puts it and where sessionctl looks). Idempotent: a matching CLI there is
# kept.
#
#   scripts/install-pulumi.sh VERSION [DOCKER_VERSION]
#
# 1. Pulumi's release archive of VERSION, verified against the release's published SHA-256
#    checksums.
# 2. Where that cannot be downloaded and `go` is present: built from Pulumi's Go modules, in our
#    own wrapper modules under scripts/pulumi-build/ (README.md there says which versions and
#    why), the version stamped with -ldflags as Pulumi's release does:
#      cli/              pulumi                    (github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
#      language-python/  pulumi-language-python    (the Python language host, installed as
#                        pulumi-language-python-VERSION behind our script of that name)
#    and beside them, from the sdk/v3 module of the CLI's version, the language host's exec
#    script pulumi-language-python-exec and the dynamic-provider host
#    pulumi-resource-pulumi-python. With DOCKER_VERSION (the pinned pulumi-docker SDK's), also
#      docker-provider/  pulumi-resource-docker    (NOT pulumi-docker's own provider, which the
#                        proxy does not serve: the Terraform docker provider through Pulumi's
#                        Terraform bridge with our mapping; docs/provider-fidelity.md)
#    installed as the resource plugin docker DOCKER_VERSION (`pulumi plugin ls` lists it).
#    The Go module and build caches are reused (a second build on the same machine takes
#    seconds); the build runs under `nice -n 19`.
#    CLUSTER_SESSIONS_PULUMI_BUILD=0 skips this path, =1 takes it without trying the download.
#
# Exit 0 when `pulumi version` answers afterwards; 1 with the reason otherwise (no network and
# no go, a checksum mismatch, a broken archive, a failed build: the module and the step are
# named). Nothing is left half-installed: everything is made in a temporary directory and moved
# into place only once it runs.
set -euo pipefail

version=${1:?usage: scripts/install-pulumi.sh VERSION [DOCKER_VERSION]}
docker_version=${2:-}
base=https://get.pulumi.com/releases/sdk
home=${PULUMI_HOME:-$HOME/.pulumi}
here=$(cd "$(dirname "$0")" && pwd)
builds=$here/pulumi-build
build_mode=${CLUSTER_SESSIONS_PULUMI_BUILD:-auto}
say() { echo "install-pulumi: $*" >&2; }
die() { say "$*"; exit 1; }

# The version of MODULE that a wrapper module's go.mod requires.
required() {  # GO.MOD MODULE
    awk -v m="$2" '$1 == "require" && $2 == m { print $3; exit } $1 == m { print $2; exit }' "$1"
}
# The CLI version the wrapper module builds (the pkg/v3 it requires).
built_version() { required "$builds/cli/go.mod" github.com/pulumi/pulumi/pkg/v3; }
# The sdk/v3 the language host is built from (its go.mod).
langhost_version() { required "$builds/language-python/go.mod" github.com/pulumi/pulumi/sdk/v3; }

installed=$("$home/bin/pulumi" version 2>/dev/null || true)
cli_built() {  # the CLI in place is the one built here
    [ -x "$home/bin/pulumi" ] && [ "$build_mode" != 0 ] && [ "$installed" = "$(built_version)" ] \
        && [ -x "$home/bin/pulumi-language-python" ] \
        && [ -x "$home/bin/pulumi-language-python-$(langhost_version)" ]
}
docker_plugin=$home/plugins/resource-docker-v$docker_version/pulumi-resource-docker
docker_wanted() {  # a docker provider is to be built: asked for, missing, the CLI built here
    [ -n "$docker_version" ] && [ ! -x "$docker_plugin" ] && cli_built
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Move a finished bin directory into place (nothing half-installed).
put_in_place() {  # DIR
    mkdir -p "$home"
    rm -rf "$home/bin.new"
    mv "$1" "$home/bin.new"
    rm -rf "${home:?}/bin"
    mv "$home/bin.new" "$home/bin"
}

download() {  # -> 0 installed; 1 with the reason in $work/why
    case $(uname -m) in
    x86_64) arch=x64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) echo "no pulumi release for $(uname -m)" >"$work/why"; return 1 ;;
    esac
    archive=pulumi-v$version-linux-$arch.tar.gz
    command -v curl >/dev/null 2>&1 \
        || { echo "curl is missing (apt-get install curl)" >"$work/why"; return 1; }
    fetch() {  # URL FILE
        curl -fsSL --max-time 300 --retry 2 -o "$2" "$1" 2>"$work/curl.err" \
            || { echo "cannot download $1: $(tail -n 1 "$work/curl.err")" >"$work/why"; return 1; }
    }
    say "downloading $archive and its checksums"
    fetch "$base/$archive" "$work/$archive" || return 1
    fetch "$base/pulumi-$version-checksums.txt" "$work/checksums.txt" || return 1
    expected=$(awk -v f="$archive" '$2 == f || $2 == "*" f { print $1 }' "$work/checksums.txt")
    [ -n "$expected" ] || die "the published checksums do not list $archive"
    actual=$(sha256sum "$work/$archive" | cut -d' ' -f1)
    [ "$actual" = "$expected" ] || die "checksum mismatch for $archive: expected $expected, got $actual"
    mkdir "$work/unpacked"
    tar -xzf "$work/$archive" -C "$work/unpacked" || die "$archive is not a readable archive"
    [ -x "$work/unpacked/pulumi/pulumi" ] || die "$archive holds no pulumi/pulumi"
    put_in_place "$work/unpacked/pulumi"
    got=$("$home/bin/pulumi" version 2>/dev/null) || die "the installed pulumi does not run"
    [ "$got" = "v$version" ] || die "the installed pulumi says $got, not v$version"
    say "installed pulumi $got into $home/bin (sha256 verified)"
}

# One step of the build, niced, its output in a log; a line every 30 s while it runs. A failure
# names the module and the step, shows the log's end, and exits 1 (the temporary directory goes).
step() {  # MODULE-DIR WHAT COMMAND...
    local dir=$1 what=$2 started=$SECONDS log
    shift 2
    log=$work/$(basename "$dir")-$(echo "$what" | tr -c 'a-zA-Z0-9\n' -).log
    say "$(basename "$dir"): $what"
    (cd "$dir" && exec nice -n 19 "$@") >"$log" 2>&1 &
    local pid=$!
    while ! wait_for "$pid" 30; do
        say "  ... $what: $((SECONDS - started)) s"
    done
    if ! wait "$pid"; then
        tail -n 25 "$log" >&2
        die "building failed: module $(module_of "$dir"), step '$what' (scripts/pulumi-build/$(basename "$dir"))"
    fi
    say "  done in $((SECONDS - started)) s"
}
wait_for() {  # PID SECONDS -> 0 once PID has ended
    local i
    for ((i = 0; i < $2; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 1
    done
    ! kill -0 "$1" 2>/dev/null
}
module_of() {  # DIR -> the pulumi module (and version) it builds
    case $(basename "$1") in
    cli) echo "github.com/pulumi/pulumi/pkg/v3@$(built_version)" ;;
    docker-provider)
        echo "$(upstream_module) through github.com/pulumi/pulumi-terraform-bridge/v3@$(required \
            "$builds/docker-provider/go.mod" github.com/pulumi/pulumi-terraform-bridge/v3)" ;;
    *) echo "github.com/pulumi/pulumi/sdk/v3@$(required "$1/go.mod" github.com/pulumi/pulumi/sdk/v3)" ;;
    esac
}

build() {
    local cli=$builds/cli langhost=$builds/language-python cli_version langhost_version sdk out
    cli_version=$(built_version)
    langhost_version=$(langhost_version)
    if [ -z "$cli_version" ] || [ -z "$langhost_version" ]; then
        die "scripts/pulumi-build: cannot read the versions from the wrapper modules' go.mod"
    fi
    say "building pulumi $cli_version (CLI) and the Python language host ($langhost_version)" \
        "from Pulumi's Go modules ($(go version | cut -d' ' -f3); the first build takes" \
        "minutes, a cached one seconds)"
    export GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false -mod=readonly"
    out=$work/bin
    mkdir -p "$out"
    local ldflags=(-w -s -X)
    step "$cli" "download modules" go mod download
    step "$cli" "go build pulumi" go build -trimpath \
        -ldflags "${ldflags[*]} github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$cli_version" \
        -o "$out/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
    step "$langhost" "download modules" go mod download
    step "$langhost" "go build pulumi-language-python" go build -trimpath \
        -ldflags "${ldflags[*]} github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$langhost_version" \
        -o "$out/pulumi-language-python-$langhost_version" \
        github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python
    # The CLI runs `pulumi-language-python`: our script, which hands that old host the project's
    # `virtualenv:` as the flag it reads (the script's comment says why).
    sed "s/@HOST_VERSION@/$langhost_version/g" "$langhost/pulumi-language-python" \
        >"$out/pulumi-language-python"
    chmod 0755 "$out/pulumi-language-python"
    # The exec script and the dynamic-provider host ship in the sdk/v3 module of the CLI's version
    # (python/cmd/, python/dist/), as in Pulumi's release archive.
    sdk=$(cd "$cli" && go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3) \
        || die "building failed: module github.com/pulumi/pulumi/sdk/v3, step 'go list -m' (scripts/pulumi-build/cli)"
    for f in python/cmd/pulumi-language-python-exec python/dist/pulumi-resource-pulumi-python; do
        [ -f "$sdk/$f" ] || die "building failed: module github.com/pulumi/pulumi/sdk/v3@$cli_version has no $f"
        install -m 0755 "$sdk/$f" "$out/"
    done
    got=$("$out/pulumi" version 2>/dev/null) || die "the built pulumi does not run"
    [ "$got" = "$cli_version" ] || die "the built pulumi says $got, not $cli_version"
    put_in_place "$out"
    say "installed pulumi $got (built from Go modules) and pulumi-language-python" \
        "$langhost_version into $home/bin"
}

# The Terraform provider's module@version that docker-provider/go.mod replaces it by.
upstream_module() {
    awk '$1 == "github.com/terraform-providers/terraform-provider-docker" && $2 == "=>" {
        print $3 "@" $4; exit }' "$builds/docker-provider/go.mod"
}
# The docker provider plugin: the Terraform provider's module copied out of the module cache
# with our one file laid into it (shim/), built against it in a copy of our wrapper module.
build_docker() {
    local dp=$builds/docker-provider src=$work/src upstream got
    step "$dp" "download modules" go mod download
    upstream=$(cd "$dp" && go mod download -json "$(upstream_module)" \
        | awk -F'"' '$2 == "Dir" { print $4 }') || upstream=
    if [ ! -d "$upstream" ]; then
        die "building failed: module $(module_of "$dp"), step 'go mod download' (scripts/pulumi-build/docker-provider)"
    fi
    mkdir -p "$src/docker-provider"
    cp -R "$upstream" "$src/kreuzwerker"
    chmod -R u+w "$src/kreuzwerker"
    mkdir "$src/kreuzwerker/clustersessionsshim"
    cp "$dp/shim/shim.go" "$src/kreuzwerker/clustersessionsshim/"
    cp "$dp/go.mod" "$dp/go.sum" "$dp/main.go" "$src/docker-provider/"
    (cd "$src/docker-provider" && go mod edit \
        -replace=github.com/terraform-providers/terraform-provider-docker=../kreuzwerker)
    step "$src/docker-provider" "go build pulumi-resource-docker" go build -mod=mod -trimpath \
        -ldflags "-w -s -X main.Version=$docker_version" -o "$work/pulumi-resource-docker" .
    got=$("$work/pulumi-resource-docker" -version 2>/dev/null) \
        || die "the built pulumi-resource-docker does not run"
    [ "$got" = "$docker_version" ] || die "the built pulumi-resource-docker says $got, not $docker_version"
    PULUMI_HOME=$home "$home/bin/pulumi" plugin install resource docker "$docker_version" \
        -f "$work/pulumi-resource-docker" >"$work/plugin.log" 2>&1 \
        || { cat "$work/plugin.log" >&2; die "pulumi plugin install resource docker $docker_version failed"; }
    say "installed the resource plugin docker $docker_version (the Terraform docker provider" \
        "through Pulumi's bridge, not pulumi-docker's own build: docs/provider-fidelity.md)"
}

if [ -x "$home/bin/pulumi" ] && { [ "$installed" = "v$version" ] || cli_built; }; then
    say "pulumi $installed is already in $home/bin"
else
    case $build_mode in
    1) command -v go >/dev/null 2>&1 || die "CLUSTER_SESSIONS_PULUMI_BUILD=1 but go is not installed"
       build ;;
    *) if ! download; then
           why=$(cat "$work/why")
           if [ "$build_mode" != 0 ] && command -v go >/dev/null 2>&1; then
               say "$why"
               build
           else
               die "$why"
           fi
       fi ;;
    esac
    installed=$("$home/bin/pulumi" version 2>/dev/null || true)
fi
if docker_wanted; then
    build_docker
elif [ -n "$docker_version" ] && [ -x "$docker_plugin" ]; then
    say "the resource plugin docker $docker_version is already in $home/plugins"
fi
