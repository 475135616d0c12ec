#!/usr/bin/env bash
# Print the session definitions a change can affect, one path per line (relative to the repo
# root, sorted): the files under stacks/sessions/ it adds, modifies or deletes; or, when it
# touches something sessions share (pools, stack configs, the program, templates, pinned
# dependencies), every session on either side of the change.
#
#   examples/ci/changed-sessions.sh BASE_COMMIT [HEAD_COMMIT]
set -euo pipefail
base=${1:?usage: changed-sessions.sh BASE_COMMIT [HEAD_COMMIT]}
head=${2:-HEAD}

changed=$(git diff --name-only --no-renames "$base" "$head")
shared='^(stacks/pools/|stacks/Pulumi\.|modules/|templates/|__main__\.py$|Pulumi\.yaml$|requirements\.txt$)'
sessions_at() { git ls-tree -r --name-only "$1" -- stacks/sessions | grep -E '\.ya?ml$' || true; }

if grep -qE "$shared" <<<"$changed"; then
    { sessions_at "$base"; sessions_at "$head"; } | sort -u
else
    grep -E '^stacks/sessions/.*\.ya?ml$' <<<"$changed" | sort -u || true
fi
