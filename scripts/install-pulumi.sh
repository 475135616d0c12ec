#!/usr/bin/env bash
# Install the pulumi CLI VERSION from Pulumi's release archive, verified against the release's
# published SHA-256 checksums, into ${PULUMI_HOME:-~/.pulumi}/bin (where Pulumi's own installer
# puts it and where sessionctl looks). Idempotent: a matching CLI there is kept.
#
#   scripts/install-pulumi.sh VERSION
#
# Exit 0 when `pulumi version` answers VERSION afterwards; 1 with the reason otherwise (no
# network, a checksum mismatch, a broken archive). Nothing is left half-installed: the archive
# is unpacked in a temporary directory and moved into place only once verified.
set -euo pipefail

version=${1:?usage: scripts/install-pulumi.sh VERSION}
base=https://get.pulumi.com/releases/sdk
home=${PULUMI_HOME:-$HOME/.pulumi}
say() { echo "install-pulumi: $*" >&2; }
die() { say "$*"; exit 1; }

case $(uname -m) in
x86_64) arch=x64 ;;
aarch64 | arm64) arch=arm64 ;;
*) die "no pulumi release for $(uname -m)" ;;
esac
archive=pulumi-v$version-linux-$arch.tar.gz

if [ -x "$home/bin/pulumi" ] && [ "$("$home/bin/pulumi" version 2>/dev/null)" = "v$version" ]; then
    say "pulumi v$version is already in $home/bin"
    exit 0
fi
command -v curl >/dev/null 2>&1 || die "curl is missing (apt-get install curl)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fetch() {  # URL FILE
    curl -fsSL --max-time 300 --retry 2 -o "$2" "$1" 2>"$work/curl.err" \
        || die "cannot download $1: $(tail -n 1 "$work/curl.err")"
}
say "downloading $archive and its checksums"
fetch "$base/$archive" "$work/$archive"
fetch "$base/pulumi-$version-checksums.txt" "$work/checksums.txt"
expected=$(awk -v f="$archive" '$2 == f || $2 == "*" f { print $1 }' "$work/checksums.txt")
[ -n "$expected" ] || die "the published checksums do not list $archive"
actual=$(sha256sum "$work/$archive" | cut -d' ' -f1)
[ "$actual" = "$expected" ] || die "checksum mismatch for $archive: expected $expected, got $actual"
mkdir "$work/unpacked"
tar -xzf "$work/$archive" -C "$work/unpacked" || die "$archive is not a readable archive"
[ -x "$work/unpacked/pulumi/pulumi" ] || die "$archive holds no pulumi/pulumi"
mkdir -p "$home"
rm -rf "$home/bin.new"
mv "$work/unpacked/pulumi" "$home/bin.new"
rm -rf "$home/bin"
mv "$home/bin.new" "$home/bin"
got=$("$home/bin/pulumi" version 2>/dev/null) || die "the installed pulumi does not run"
[ "$got" = "v$version" ] || die "the installed pulumi says $got, not v$version"
say "installed pulumi $got into $home/bin (sha256 verified)"
