#!/usr/bin/env bash
# `make run`: the API server on its embedded default database, with an
# Environment, a Workspace key, an Environment key and a fresh healthcheck.
#   MANGO_DATABASE_URL  use this PostgreSQL instead of the private cluster in .mango/
#   MANGO_LISTEN_ADDR   default 127.0.0.1:8080
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
say() { printf '%s\n' "$*" >&2; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

say "==> building mango (release)"
cargo build --release -q -p mango-api --bin mango
MANGO="$ROOT/target/release/mango"

if [ -z "${MANGO_DATABASE_URL:-}" ]; then
  say "==> starting the private PostgreSQL cluster in .mango/"
  MANGO_DATABASE_URL="$(scripts/pg.sh)"
fi
export MANGO_DATABASE_URL
export MANGO_LISTEN_ADDR="${MANGO_LISTEN_ADDR:-127.0.0.1:8080}"
BASE="http://$MANGO_LISTEN_ADDR"

"$MANGO" migrate >/dev/null
"$MANGO" serve --no-migrate &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do
  curl -fsS "$BASE/readyz" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { say "mango serve exited; see its log above"; exit 1; }
  sleep 0.1
done
curl -fsS "$BASE/readyz" >/dev/null || { say "mango serve did not become ready"; exit 1; }

# Keys and the Environment are made once and kept in .mango/dev.env (mode 600).
STATE="$ROOT/.mango/dev.env"
mkdir -p "$ROOT/.mango"
if [ -f "$STATE" ]; then
  # shellcheck disable=SC1090
  . "$STATE"
  if [ "${MANGO_DEV_DATABASE_URL:-}" != "$MANGO_DATABASE_URL" ] || \
     ! curl -fsS "$BASE/v1/environments/${MANGO_ENVIRONMENT_ID:-none}" -H "Authorization: Bearer ${MANGO_API_KEY:-none}" >/dev/null 2>&1; then
    rm -f "$STATE"
  fi
fi
if [ ! -f "$STATE" ]; then
  say "==> creating a Workspace key, an Environment and an Environment key"
  MANGO_API_KEY="$("$MANGO" api-key create -workspace wrkspc_default -label "make run operator" --json | json '["api_key"]')"
  MANGO_ENVIRONMENT_ID="$(curl -fsS -X POST "$BASE/v1/environments" -H "Authorization: Bearer $MANGO_API_KEY" \
      -H 'Content-Type: application/json' -d '{"name":"local","config":{"type":"self_hosted"}}' | json '["id"]')"
  MANGO_ENVIRONMENT_KEY="$("$MANGO" api-key create -workspace wrkspc_default -environment "$MANGO_ENVIRONMENT_ID" \
      -label "make run supervisor" --json | json '["api_key"]')"
  umask 077
  cat >"$STATE" <<STATE_EOF
MANGO_DEV_DATABASE_URL='$MANGO_DATABASE_URL'
MANGO_BASE_URL='$BASE'
MANGO_API_KEY='$MANGO_API_KEY'
MANGO_ENVIRONMENT_ID='$MANGO_ENVIRONMENT_ID'
MANGO_ENVIRONMENT_KEY='$MANGO_ENVIRONMENT_KEY'
STATE_EOF
  say "    credentials written to .mango/dev.env (shown nowhere else)"
else
  say "==> reusing the Environment and keys in .mango/dev.env"
fi

say "==> creating a healthcheck"
CHECK="$(curl -fsS -X POST "$BASE/v1/environments/$MANGO_ENVIRONMENT_ID/work" -H "Authorization: Bearer $MANGO_API_KEY" \
    -H 'Content-Type: application/json' -d '{"data":{"type":"healthcheck"}}')"
echo "$CHECK" | python3 -m json.tool
CHECK_ID="$(echo "$CHECK" | json '["id"]')"
cat >&2 <<EOF_HELP

Mango is serving on $BASE  (Environment $MANGO_ENVIRONMENT_ID)
  source .mango/dev.env     # MANGO_BASE_URL, MANGO_API_KEY, MANGO_ENVIRONMENT_ID, MANGO_ENVIRONMENT_KEY
  curl -s \$MANGO_BASE_URL/v1/environments/\$MANGO_ENVIRONMENT_ID/work/$CHECK_ID -H "Authorization: Bearer \$MANGO_API_KEY"
The healthcheck stays queued until a supervisor polls it (its deadline is 120 s).
Press Ctrl-C to stop.
EOF_HELP
wait $SERVER
