#!/usr/bin/env bash
# A throw-away PostgreSQL server on loopback for the shared-storage tests of `yt8m tune`.
#
#   .ci/postgres.sh start      installs Debian's postgresql if its server binaries are missing, starts a fresh
#                              cluster on 127.0.0.1 (free port, temp dir), creates database yt8m_test, and prints
#                              shell lines to eval: YT8M_TEST_POSTGRES_URL and YT8M_POSTGRES_DIR.
#   .ci/postgres.sh stop DIR   stops that server and deletes DIR.
#
# Logs go to stderr, so that `env=$(.ci/postgres.sh start) && eval "$env"` sees only the exports.
set -euo pipefail

DATABASE=yt8m_test

log() { echo "postgres.sh: $*" >&2; }

find_bin_dir() {
    # The newest installed major version; Debian installs server binaries outside PATH.
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | while read -r dir; do
        [ -x "$dir/pg_ctl" ] && echo "$dir"
    done | tail -n 1
}

install_server() {
    log "no PostgreSQL server binaries under /usr/lib/postgresql; installing Debian's postgresql package"
    if [ "$(id -u)" -ne 0 ]; then
        log "installing needs root; run as root or install postgresql first"
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends postgresql >&2
}

# Runs a server command as the cluster's owner: PostgreSQL refuses to run as root.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    local bin_dir dir port
    bin_dir=$(find_bin_dir)
    if [ -z "$bin_dir" ]; then
        install_server
        bin_dir=$(find_bin_dir)
        [ -n "$bin_dir" ] || { log "postgresql installed but no pg_ctl found"; exit 1; }
    fi
    if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin postgres
    fi
    dir=$(mktemp -d /tmp/yt8m-postgres.XXXXXX)
    chmod 755 "$dir"
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres: "$dir"
    fi
    port=$(free_port)
    log "initializing a cluster in $dir with $bin_dir"
    as_owner "$bin_dir/initdb" --pgdata "$dir/data" --username postgres --auth trust --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    # Loopback only, socket in the temp dir, no fsync: a disposable test server.
    as_owner "$bin_dir/pg_ctl" --pgdata "$dir/data" --log "$dir/server.log" --wait \
        --options "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off" \
        start >&2 || { cat "$dir/server.log" >&2; exit 1; }
    as_owner "$bin_dir/createdb" --host 127.0.0.1 --port "$port" --username postgres "$DATABASE"
    log "PostgreSQL $("$bin_dir/pg_ctl" --version | awk '{print $3}') on 127.0.0.1:$port, database $DATABASE"
    echo "export YT8M_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:$port/$DATABASE"
    echo "export YT8M_POSTGRES_DIR=$dir"
}

stop() {
    local dir=${1:?usage: postgres.sh stop DIR}
    local bin_dir
    bin_dir=$(find_bin_dir)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bin_dir/pg_ctl" --pgdata "$dir/data" --mode fast --wait stop >&2 || true
    fi
    case "$dir" in
        /tmp/yt8m-postgres.*) rm -rf "$dir" ;;
        *) log "not deleting $dir: not a directory this script made" ;;
    esac
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    *) echo "usage: $0 start | stop DIR" >&2; exit 2 ;;
esac
