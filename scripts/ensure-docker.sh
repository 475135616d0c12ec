#!/usr/bin/env bash
# Make sure a Docker Engine answers on the default socket, installing and starting one if needed.
#
# Idempotent; run as root. Installs Debian's docker.io (the engine the project is tested on) and
# debootstrap (which builds the test image, see cluster_sessions.lab.image) when missing, then
# starts dockerd in the background if nothing answers on /var/run/docker.sock and waits for it.
# A newer docker CLI elsewhere on PATH is fine: it negotiates the API version down.
set -euo pipefail

SOCKET=unix:///var/run/docker.sock
PIDFILE=/var/run/docker.pid
LOG=/var/log/cluster-sessions-dockerd.log
WAIT_SECONDS=60

say() { echo "ensure-docker: $*" >&2; }
die() {
    say "ERROR: $*"
    exit 1
}

engine_answers() { docker -H "$SOCKET" info >/dev/null 2>&1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts dockerd)"

missing=()
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    missing+=(docker.io)
fi
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)

if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2 || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
        || die "apt-get install ${missing[*]} failed"
    command -v dockerd >/dev/null 2>&1 || die "dockerd still missing after installing docker.io"
else
    say "docker.io and debootstrap are installed"
fi

if engine_answers; then
    say "engine answers on $SOCKET"
    exit 0
fi

running_pid=""
if [ -s "$PIDFILE" ]; then
    pid=$(cat "$PIDFILE")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        running_pid=$pid
    fi
fi

if [ -n "$running_pid" ]; then
    say "dockerd (pid $running_pid) is running but not answering yet; waiting"
else
    say "starting dockerd (log: $LOG)"
    setsid nohup dockerd -H "$SOCKET" --pidfile "$PIDFILE" >>"$LOG" 2>&1 </dev/null &
    running_pid=$!
fi

for ((i = 0; i < WAIT_SECONDS; i++)); do
    if engine_answers; then
        say "engine answers on $SOCKET after ${i}s"
        exit 0
    fi
    if ! kill -0 "$running_pid" 2>/dev/null; then
        say "dockerd exited; last lines of $LOG:"
        tail -n 20 "$LOG" >&2 || true
        die "dockerd did not stay up"
    fi
    sleep 1
done

say "last lines of $LOG:"
tail -n 20 "$LOG" >&2 || true
die "no engine answered on $SOCKET within ${WAIT_SECONDS}s"
