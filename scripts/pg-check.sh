#!/usr/bin/env bash
# Checks scripts/pg.sh's choice of port in a throw-away checkout (a copy of
# the script in a temporary folder, so its cluster is not this checkout's):
# with the default port 54329 held by another process (another checkout's
# cluster, or a listener this check starts), it picks a free port, says so,
# and keeps it across calls and restarts; MANGO_PG_PORT is honoured exactly,
# and refused with a message when it cannot be.
# Ends with `pg.sh check: N passed, N failed`; exits non-zero on any failure.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
mkdir -p "$WORK/scripts"
cp "$ROOT/scripts/pg.sh" "$WORK/scripts/pg.sh"
PASSED=0
FAILED=0
HOLDER=

BINDIR="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1 || true)"
AS=()
[ "$(id -u)" = 0 ] && AS=(runuser -u postgres --)
# Where pg.sh keeps the copy's cluster (see pg.sh: a folder named after the
# checkout when the postgres user cannot reach it).
data_dir() {
  if [ -f "$WORK/.mango/pg/data/PG_VERSION" ]; then
    echo "$WORK/.mango/pg/data"
  else
    echo "/var/lib/mango-dev/$(echo -n "$WORK" | sha256sum | cut -c1-12)/data"
  fi
}
stop_cluster() {
  local data
  data="$(data_dir)"
  [ -f "$data/PG_VERSION" ] && "${AS[@]}" "$BINDIR/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
}
cleanup() {
  local data
  data="$(data_dir)"
  stop_cluster
  [ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null || true
  case "$data" in /var/lib/mango-dev/*) rm -rf "$(dirname "$data")" ;; esac
  rm -rf "$WORK"
}
trap cleanup EXIT

check() { # check NAME CONDITION...
  local name="$1"
  shift
  if "$@"; then
    PASSED=$((PASSED + 1))
    echo "ok: $name"
  else
    FAILED=$((FAILED + 1))
    echo "FAILED: $name"
  fi
}
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pg() { # pg [VAR=VALUE...]: the copy's pg.sh; its URL in $URL, stderr in $SAID, status in $STATUS
  STATUS=0
  URL="$(env -u MANGO_PG_PORT "$@" "$WORK/scripts/pg.sh" 2>"$WORK/said")" || STATUS=$?
  SAID="$(cat "$WORK/said")"
}
port_of() { local p="${1##*:}"; echo "${p%%/*}"; }

# 54329 is held, by whatever holds it already or by this check.
if ! listening 54329; then
  python3 -c 'import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 54329)); s.listen(); time.sleep(600)' &
  HOLDER=$!
  for _ in $(seq 1 50); do listening 54329 && break; sleep 0.1; done
fi
check "the default port is held by another process" listening 54329

pg
FIRST="$URL"
PICKED="$(port_of "$URL")"
check "a first call succeeds" test "$STATUS" = 0
check "it picks a port other than the taken default ($URL)" test "$PICKED" != 54329 -a -n "$PICKED"
check "it says which port it picked" grep -q "port 54329 is taken.*uses port $PICKED" <<<"$SAID"
check "the cluster answers on that port" "$BINDIR/psql" "$URL" -tAc 'SELECT 1' -o /dev/null

pg
check "a second call prints the same URL" test "$URL" = "$FIRST"
check "and says nothing of a taken port" test -z "$(grep taken <<<"$SAID" || true)"

pg MANGO_PG_PORT=54329
check "MANGO_PG_PORT other than the running cluster's is refused" test "$STATUS" != 0 -a -z "$URL"
check "saying on which port the cluster runs" grep -q "runs on port $PICKED, not MANGO_PG_PORT=54329" <<<"$SAID"

stop_cluster
pg
check "after a restart the cluster keeps its port" test "$STATUS" = 0 -a "$URL" = "$FIRST"

stop_cluster
pg MANGO_PG_PORT=54329
check "MANGO_PG_PORT that another process holds is refused, not moved" test "$STATUS" != 0 -a -z "$URL"
check "saying the port is taken" grep -q "port 54329 (MANGO_PG_PORT) is taken" <<<"$SAID"

CHOSEN="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
pg MANGO_PG_PORT="$CHOSEN"
check "MANGO_PG_PORT=$CHOSEN is honoured exactly" test "$STATUS" = 0 -a "$(port_of "$URL")" = "$CHOSEN"
check "the cluster answers there" "$BINDIR/psql" "$URL" -tAc 'SELECT 1' -o /dev/null
pg
check "and keeps it for later calls" test "$URL" = "postgres://mango@127.0.0.1:$CHOSEN/mango"

pg MANGO_PG_PORT=99999
check "a MANGO_PG_PORT that is not a port is refused" test "$STATUS" = 2 -a -z "$URL"

echo "pg.sh check: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
