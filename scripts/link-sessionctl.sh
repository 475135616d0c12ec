#!/usr/bin/env bash
# Link a checkout's sessionctl as LINK (scripts/setup.sh: $CLUSTER_SESSIONS_BIN_DIR/sessionctl,
# default /usr/local/bin/sessionctl) without silently taking over another checkout's command:
#   scripts/link-sessionctl.sh [--check] [--force] [--keep-other] SOURCE LINK
# - LINK missing, or already SOURCE: link (nothing to say but where it points);
# - LINK a link whose target is gone (that checkout was removed): replaced, saying so;
# - LINK anything else (a link into another checkout, a file): refused (exit 1, saying where
#   it points and what to do) unless --force (replaced, saying what it pointed to), or with
#   --keep-other (set-up's --dev, and CI=true): kept as it is, with a warning, exit 0.
# --check decides and says only a refusal, changing nothing (set-up asks before it installs).
set -euo pipefail

check=0 force=0 keep=0
while [ "$#" -gt 2 ]; do
    case "$1" in
        --check) check=1 ;;
        --force) force=1 ;;
        --keep-other) keep=1 ;;
        *) echo "link-sessionctl: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
[ "$#" -eq 2 ] || { echo "usage: $0 [--check] [--force] [--keep-other] SOURCE LINK" >&2; exit 2; }
source=$1 link=$2
say() { echo "setup: $*" >&2; }

action=new
if [ -d "$link" ] && [ ! -L "$link" ]; then
    say "$link is a directory: not replacing it (set CLUSTER_SESSIONS_BIN_DIR=DIR)"; exit 1
elif [ -L "$link" ]; then
    current=$(readlink "$link")
    if [ "$current" = "$source" ]; then
        action=same
    elif [ ! -e "$link" ]; then
        action=replace-gone
    else
        action=other
        what="a link to $current"
    fi
elif [ -e "$link" ]; then
    action=other
    what="a file that is not a link (another installation's sessionctl?)"
fi

if [ "$action" = other ]; then
    if [ "$force" -eq 1 ]; then
        action=replace-forced
    elif [ "$keep" -eq 1 ]; then
        action=keep
    else
        say "$link is $what, not this checkout's $source: not replacing it," \
            "so that checkout keeps its command. Run set-up again with --force to point it" \
            "here, or set CLUSTER_SESSIONS_BIN_DIR=DIR to link this checkout's sessionctl" \
            "into DIR instead (or run $source directly)."
        exit 1
    fi
fi
[ "$check" -eq 0 ] || exit 0

case "$action" in
    keep)
        say "warning: $link is $what, not this checkout's; kept as it is (--dev or CI):" \
            "run $source here, or set-up with --force to take the link over" ;;
    replace-gone)
        say "$link pointed to $current, which is gone: replacing it" ;;
    replace-forced)
        say "--force: $link was $what: replacing it" ;;
esac
if [ "$action" != keep ]; then
    mkdir -p "$(dirname "$link")"
    ln -sfn "$source" "$link"
    say "sessionctl: $link -> $source"
fi
