#!/usr/bin/env bash
# Ensure a private PostgreSQL cluster under .mango/pg is running and print its URL.
# Installs PostgreSQL from the OS packages when no server binaries exist.
# Used by `make run`, `make test` and .ci/run; honours MANGO_PG_PORT (default 54329).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATE="$ROOT/.mango"
DATA="$STATE/pg/data"
SOCK="$STATE/pg/run"
PORT="${MANGO_PG_PORT:-54329}"
log() { echo "pg.sh: $*" >&2; }

find_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

BINDIR="$(find_bindir || true)"
if [ -z "$BINDIR" ]; then
  log "PostgreSQL server not found; installing it from the OS packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  BINDIR="$(find_bindir)"
fi

# PostgreSQL refuses to run as root; run it as the packaged `postgres` user.
AS=()
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql postgres
  AS=(runuser -u postgres --)
fi

mkdir -p "$DATA" "$SOCK"
if [ "$(id -u)" = 0 ]; then
  chown -R postgres: "$STATE/pg"
  # A checkout under a private home (e.g. /root) is not reachable by `postgres`;
  # keep the cluster in a system folder named after the checkout instead.
  if ! runuser -u postgres -- test -w "$DATA"; then
    ALT="/var/lib/mango-dev/$(echo -n "$ROOT" | sha256sum | cut -c1-12)"
    log "$STATE is not reachable by the postgres user; using $ALT"
    mkdir -p "$ALT/data" "$ALT/run"
    chown -R postgres: "$ALT"
    DATA="$ALT/data"; SOCK="$ALT/run"; LOGFILE="$ALT/server.log"
  fi
fi
chmod 700 "$DATA"

if [ ! -f "$DATA/PG_VERSION" ]; then
  log "initialising a private cluster in $DATA"
  "${AS[@]}" "$BINDIR/initdb" -D "$DATA" -U mango --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  cat >>"$DATA/postgresql.conf" <<CONF
# Mango development/test cluster. Production points MANGO_DATABASE_URL at its own server.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCK'
max_connections = 300
shared_buffers = 256MB
# A dev/test cluster trades the last few milliseconds of durability on a crash
# for commit throughput; every commit is still atomic and ordered.
synchronous_commit = off
fsync = on
CONF
fi

if ! "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  log "starting PostgreSQL on 127.0.0.1:$PORT"
  "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" -l "${LOGFILE:-$STATE/pg/server.log}" -w -t 60 start >/dev/null
fi
"$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U mango -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='mango'" | grep -q 1 \
  || "$BINDIR/createdb" -h 127.0.0.1 -p "$PORT" -U mango mango
echo "postgres://mango@127.0.0.1:$PORT/mango"
