#!/usr/bin/env bash
# Ensure a private PostgreSQL cluster under .mango/pg is running and print its URL.
# Installs PostgreSQL from the OS packages when no server binaries exist.
# Used by `make run`, `make test` and .ci/run.
#   MANGO_PG_PORT  the port, exactly (failing if something else holds it).
#   MANGO_PG_STATE the folder the cluster lives in (default: .mango of this
#                  checkout), so a suite can own a cluster it restarts.
# `scripts/pg.sh stop|restart [fast|immediate|smart]` stops or restarts the
# running cluster with that shutdown mode (default fast), then prints its URL
# (restart) or nothing (stop).
# Without it the cluster keeps the port it last ran on, 54329 at first; when
# something other than this checkout's cluster holds that port (another
# checkout's cluster, say), a free port is picked, said on stderr, and kept
# for this checkout, so every later call prints the same URL.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATE="${MANGO_PG_STATE:-$ROOT/.mango}"
ACTION="${1:-start}"
MODE="${2:-fast}"
case "$ACTION" in start | stop | restart) ;; *) echo "pg.sh: unknown action $ACTION (start, stop or restart)" >&2; exit 2 ;; esac
case "$MODE" in fast | immediate | smart) ;; *) echo "pg.sh: unknown shutdown mode $MODE (fast, immediate or smart)" >&2; exit 2 ;; esac
DATA="$STATE/pg/data"
SOCK="$STATE/pg/run"
DEFAULT_PORT=54329
log() { echo "pg.sh: $*" >&2; }
if [ -n "${MANGO_PG_PORT:-}" ] && ! [[ "$MANGO_PG_PORT" =~ ^[0-9]+$ && "$MANGO_PG_PORT" -ge 1 && "$MANGO_PG_PORT" -le 65535 ]]; then
  log "MANGO_PG_PORT=$MANGO_PG_PORT is not a port (1-65535)"
  exit 2
fi

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
    OWNER="$ROOT"; [ -n "${MANGO_PG_STATE:-}" ] && OWNER="$STATE"
    ALT="/var/lib/mango-dev/$(echo -n "$OWNER" | sha256sum | cut -c1-12)"
    log "$STATE is not reachable by the postgres user; using $ALT"
    mkdir -p "$ALT/data" "$ALT/run"
    chown -R postgres: "$ALT"
    DATA="$ALT/data"; SOCK="$ALT/run"; LOGFILE="$ALT/server.log"
  fi
fi
chmod 700 "$DATA"
PORT_FILE="$(dirname "$DATA")/port"

# Whether something listens on 127.0.0.1:$1.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# The port this checkout's cluster runs on; fails when it does not run.
running_port() {
  "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" status >/dev/null 2>&1 || return 1
  sed -n 4p "$DATA/postmaster.pid"
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

RUNNING="$(running_port || true)"
if [ "$ACTION" = stop ] || [ "$ACTION" = restart ]; then
  if [ -n "$RUNNING" ]; then
    log "stopping PostgreSQL on 127.0.0.1:$RUNNING (mode $MODE)"
    "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" -m "$MODE" -w -t 60 stop >/dev/null
  fi
  [ "$ACTION" = stop ] && exit 0
  RUNNING=""
  [ -z "${MANGO_PG_PORT:-}" ] && [ -f "$PORT_FILE" ] && MANGO_PG_PORT="$(cat "$PORT_FILE")"
fi
if [ -n "${MANGO_PG_PORT:-}" ]; then
  PORT="$MANGO_PG_PORT"
  if [ -n "$RUNNING" ] && [ "$RUNNING" != "$PORT" ]; then
    log "this checkout's cluster runs on port $RUNNING, not MANGO_PG_PORT=$PORT: stop it first ($BINDIR/pg_ctl -D $DATA stop) or leave MANGO_PG_PORT unset"
    exit 1
  fi
  if [ -z "$RUNNING" ] && listening "$PORT"; then
    log "port $PORT (MANGO_PG_PORT) is taken by another process; choose another, or leave MANGO_PG_PORT unset to have one picked"
    exit 1
  fi
elif [ -n "$RUNNING" ]; then
  PORT="$RUNNING"
else
  PORT="$(cat "$PORT_FILE" 2>/dev/null || echo "$DEFAULT_PORT")"
  if listening "$PORT"; then
    TAKEN="$PORT"
    PORT="$(free_port)"
    log "port $TAKEN is taken by something other than this checkout's cluster; this checkout's cluster uses port $PORT from now on (kept in $PORT_FILE; MANGO_PG_PORT chooses one)"
  fi
fi

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

if [ -z "$RUNNING" ]; then
  log "starting PostgreSQL on 127.0.0.1:$PORT"
  # The port on the command line wins over the one postgresql.conf was made with.
  "${AS[@]}" "$BINDIR/pg_ctl" -D "$DATA" -o "-p $PORT" -l "${LOGFILE:-$STATE/pg/server.log}" -w -t 60 start >/dev/null
fi
echo "$PORT" >"$PORT_FILE"
"$BINDIR/psql" -h 127.0.0.1 -p "$PORT" -U mango -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='mango'" | grep -q 1 \
  || "$BINDIR/createdb" -h 127.0.0.1 -p "$PORT" -U mango mango
echo "postgres://mango@127.0.0.1:$PORT/mango"
