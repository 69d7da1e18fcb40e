#!/usr/bin/env bash
# `make run`: the API server on its embedded default database, a supervisor
# (Docker when an engine answers, local subprocesses otherwise), and a
# healthcheck that ends `succeeded`; then both keep serving until Ctrl-C.
#   MANGO_DATABASE_URL  use this PostgreSQL instead of the private cluster in .mango/
#   MANGO_LISTEN_ADDR   default 127.0.0.1:8080 (operators)
#   MANGO_SANDBOX_PORT  Docker: the port of the sandbox listener on the bridge's gateway (default 8081)
#   MANGO_OBJECT_STORE  where Skill archives go (default .mango/objects; s3://bucket/prefix for S3)
#   MANGO_LAUNCHER      docker | local (default: docker when an engine answers)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
say() { printf '%s\n' "$*" >&2; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

LISTEN="${MANGO_LISTEN_ADDR:-127.0.0.1:8080}"
BASE="http://$LISTEN"

if [ -z "${MANGO_LAUNCHER:-}" ]; then
  if command -v docker >/dev/null 2>&1 && docker version >/dev/null 2>&1; then
    MANGO_LAUNCHER=docker
  else
    MANGO_LAUNCHER=local
    say "==> no Docker engine answers: items will run as local subprocesses (NOT a security boundary)"
  fi
fi
case "$MANGO_LAUNCHER" in docker | local) ;; *) say "MANGO_LAUNCHER must be docker or local"; exit 2 ;; esac

say "==> building mango, mango-worker and mango-runner (release; the first build takes a few minutes)"
cargo build --release -q -p mango-api -p mango-controller -p mango-runner --bin mango --bin mango-worker --bin mango-runner
MANGO="$ROOT/target/release/mango"
WORKER="$ROOT/target/release/mango-worker"

if [ "$MANGO_LAUNCHER" = docker ]; then
  say "==> the sandbox image"
  MANGO_RUNNER_BIN="$ROOT/target/release/mango-runner" scripts/sandbox-image.sh
  IMAGE="${MANGO_SANDBOX_IMAGE:-mango-sandbox:dev}"
  # Sandboxes join the fenced network (docs/supervisor.md, "What a sandbox
  # can reach") and reach the host only as host.docker.internal, its
  # gateway, at one port: the api's sandbox listener, which has only the
  # routes a runner uses and its own per-peer connection cap
  # (docs/protocol.md, "Connections"), so a flooding sandbox cannot lock
  # operators out. The network is
  # made here as the supervisor would make it (it refuses one without the
  # fence), so its gateway is known before the api starts; one from before
  # the fence is made again when nothing uses it.
  NETWORK="${MANGO_DOCKER_NETWORK:-mango-sandboxes}"
  FENCED='{{.Internal}} {{index .Options "com.docker.network.bridge.enable_icc"}}'
  if [ "$(docker network inspect -f "$FENCED" "$NETWORK" 2>/dev/null || true)" != "true false" ]; then
    docker network rm "$NETWORK" >/dev/null 2>&1 || true
    docker network create --internal -o com.docker.network.bridge.enable_icc=false \
      --label app.kubernetes.io/managed-by=mango-worker "$NETWORK" >/dev/null \
      || { say "could not make the fenced network $NETWORK (containers still use an old one? docker network inspect $NETWORK)"; exit 1; }
  fi
  GATEWAY="$(docker network inspect -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' "$NETWORK" | awk '{ print $1 }')"
  [ -n "$GATEWAY" ] || { say "the network $NETWORK has no gateway address"; exit 1; }
  SANDBOX_PORT="${MANGO_SANDBOX_PORT:-8081}"
  export MANGO_LISTEN_ADDR="$LISTEN"
  export MANGO_SANDBOX_LISTEN_ADDR="$GATEWAY:$SANDBOX_PORT"
  # Bounded workspaces are filesystems the supervisor mounts, and the host
  # fence is iptables rules: both need root on the engine's host.
  if [ "$(id -u)" != 0 ]; then
    say "==> not root: Session workspaces are unbounded and the host's ports are open to sandboxes"
    say "    (MANGO_WORKSPACE_SIZE, MANGO_DOCKER_HOST_FENCE; docs/supervisor.md, \"What a sandbox can reach\")"
    export MANGO_WORKSPACE_SIZE="${MANGO_WORKSPACE_SIZE:-unbounded}" MANGO_DOCKER_HOST_FENCE="${MANGO_DOCKER_HOST_FENCE:-false}"
  fi
else
  export MANGO_LISTEN_ADDR="$LISTEN"
  # Local runners share the host's filesystem: Sessions mount their Memory
  # Stores under .mango/ rather than /mnt/memory (docs/memory.md).
  export MANGO_MEMORY_MOUNT_ROOT="${MANGO_MEMORY_MOUNT_ROOT:-$ROOT/.mango/memory}"
fi

if [ -z "${MANGO_DATABASE_URL:-}" ]; then
  say "==> starting the private PostgreSQL cluster in .mango/"
  MANGO_DATABASE_URL="$(scripts/pg.sh)"
fi
export MANGO_DATABASE_URL
mkdir -p "$ROOT/.mango"
# Skill archives (docs/skills.md): a folder under .mango/ unless told otherwise.
export MANGO_OBJECT_STORE="${MANGO_OBJECT_STORE:-$ROOT/.mango/objects}"

"$MANGO" migrate >/dev/null
"$MANGO" serve --no-migrate 2>>"$ROOT/.mango/api.log" &
SERVER=$!
WORKER_PID=
# The supervisor runs with --drain: a plain SIGTERM would leave its running
# sandboxes for a next supervisor to adopt, and `make run` may not be run
# again. Drained, running items get its shutdown grace
# (MANGO_SHUTDOWN_GRACE_SECONDS, 30 s), then their sandboxes are removed, so
# Ctrl-C leaves nothing behind.
stop_all() {
  trap - EXIT INT TERM
  if [ -n "$WORKER_PID" ]; then
    say "==> stopping the supervisor (running items get its shutdown grace, then their sandboxes are removed)"
    kill -TERM "$WORKER_PID" 2>/dev/null || true
    wait "$WORKER_PID" 2>/dev/null || true
  fi
  kill -TERM "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
}
trap stop_all EXIT INT TERM
for _ in $(seq 1 100); do
  curl -fsS "$BASE/readyz" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { say "mango serve exited; see .mango/api.log"; tail -5 "$ROOT/.mango/api.log" >&2; exit 1; }
  sleep 0.1
done
curl -fsS "$BASE/readyz" >/dev/null || { say "mango serve did not become ready; see .mango/api.log"; exit 1; }
say "==> mango serving on $MANGO_LISTEN_ADDR${MANGO_SANDBOX_LISTEN_ADDR:+ (sandboxes: $MANGO_SANDBOX_LISTEN_ADDR)} (log: .mango/api.log)"

# Keys and the Environment are made once and kept in .mango/dev.env (mode 600).
STATE="$ROOT/.mango/dev.env"
if [ -f "$STATE" ]; then
  # shellcheck disable=SC1090
  . "$STATE"
  if [ "${MANGO_DEV_DATABASE_URL:-}" != "$MANGO_DATABASE_URL" ] || [ "${MANGO_BASE_URL:-}" != "$BASE" ] || \
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
  scripts/dev-env.sh "$STATE" "$MANGO_DATABASE_URL" "$BASE" "$MANGO_API_KEY" "$MANGO_ENVIRONMENT_ID" "$MANGO_ENVIRONMENT_KEY"
  say "    credentials written to .mango/dev.env (shown nowhere else)"
else
  say "==> reusing the Environment and keys in .mango/dev.env"
  # Written again so a file from before it exported its variables does now.
  scripts/dev-env.sh "$STATE" "$MANGO_DATABASE_URL" "$BASE" "$MANGO_API_KEY" "$MANGO_ENVIRONMENT_ID" "$MANGO_ENVIRONMENT_KEY"
fi

say "==> starting the supervisor"
(
  export MANGO_ENVIRONMENT_KEY MANGO_ENVIRONMENT_ID MANGO_BASE_URL="$BASE"
  if [ "$MANGO_LAUNCHER" = docker ]; then
    export MANGO_DOCKER_BASE_URL="http://host.docker.internal:$SANDBOX_PORT"
    exec "$WORKER" docker --drain
  else
    exec "$WORKER" local --drain --root "$ROOT/.mango/local"
  fi
) 2>>"$ROOT/.mango/worker.log" &
WORKER_PID=$!
say "    mango-worker $MANGO_LAUNCHER (log: .mango/worker.log)"

say "==> creating a healthcheck"
CHECK_ID="$(curl -fsS -X POST "$BASE/v1/environments/$MANGO_ENVIRONMENT_ID/work" -H "Authorization: Bearer $MANGO_API_KEY" \
    -H 'Content-Type: application/json' -d '{"data":{"type":"healthcheck"}}' | json '["id"]')"
printf '    %s ' "$CHECK_ID" >&2
STATE_NOW=
for _ in $(seq 1 1300); do
  WORK="$(curl -fsS "$BASE/v1/environments/$MANGO_ENVIRONMENT_ID/work/$CHECK_ID" -H "Authorization: Bearer $MANGO_API_KEY")"
  NEXT="$(echo "$WORK" | json '["state"]')"
  [ "$NEXT" != "$STATE_NOW" ] && { printf '%s ' "$NEXT" >&2; STATE_NOW="$NEXT"; }
  [ "$NEXT" = stopped ] && break
  kill -0 "$WORKER_PID" 2>/dev/null || { say; say "mango-worker exited; see .mango/worker.log:"; tail -5 "$ROOT/.mango/worker.log" >&2; exit 1; }
  sleep 0.1
done
say
echo "$WORK" | python3 -m json.tool
STATUS="$(echo "$WORK" | python3 -c 'import json,sys; r=json.load(sys.stdin).get("result") or {}; print(r.get("status",""))')"
if [ "$STATUS" != succeeded ]; then
  say "the healthcheck did not succeed (${STATUS:-no result}); the supervisor's last lines (.mango/worker.log):"
  tail -10 "$ROOT/.mango/worker.log" >&2
  exit 1
fi
# Where this run's supervisor serves its metrics (127.0.0.1:9464 unless
# another process holds that port): its latest such log line.
METRICS="$(grep -F '"serving /metrics and /healthz"' "$ROOT/.mango/worker.log" | tail -1 | json '["fields"]["addr"]' 2>/dev/null || true)"
if [ -n "${MANGO_MODEL_BASE_URL:-}" ]; then
  MODEL_NOTE="  The agent loop's model: $MANGO_MODEL_BASE_URL (MANGO_MODEL_BASE_URL)."
elif [ -n "${ANTHROPIC_API_KEY:-}" ]; then
  MODEL_NOTE="  The agent loop's model: the Anthropic API, with ANTHROPIC_API_KEY."
else
  MODEL_NOTE="  No model is configured, so each Session's input gets a session.error saying so: restart
  make run with ANTHROPIC_API_KEY set (or MANGO_MODEL_BASE_URL and MANGO_MODEL_API_KEY for
  another Messages-API endpoint). .venv comes from scripts/venv.sh."
fi
# And the api's (127.0.0.1:9465 unless taken), which sandboxes cannot reach.
API_METRICS="$(grep -F '"serving /metrics"' "$ROOT/.mango/api.log" | tail -1 | json '["fields"]["addr"]' 2>/dev/null || true)"
cat >&2 <<EOF_HELP

healthcheck $CHECK_ID: succeeded

Mango is serving on $BASE  (Environment $MANGO_ENVIRONMENT_ID), with mango-worker $MANGO_LAUNCHER polling it.
  source .mango/dev.env     # MANGO_BASE_URL, MANGO_API_KEY, MANGO_ENVIRONMENT_ID, MANGO_ENVIRONMENT_KEY
  curl -s -X POST \$MANGO_BASE_URL/v1/environments/\$MANGO_ENVIRONMENT_ID/work -H "Authorization: Bearer \$MANGO_API_KEY" \\
       -H 'Content-Type: application/json' -d '{"data":{"type":"healthcheck"}}'
  docker ps --filter label=app.kubernetes.io/managed-by=mango-worker     # the live sandboxes (Docker)
  curl -s http://${METRICS:-127.0.0.1:9464}/metrics | grep mango_supervisor_             # the supervisor's metrics
  curl -s http://${API_METRICS:-127.0.0.1:9465}/metrics | grep mango_http_connections_   # the api's metrics
Logs: .mango/api.log, .mango/worker.log.  Press Ctrl-C to stop.

A first Session, with the official SDK (in another shell):
  source .mango/dev.env && .venv/bin/python examples/quickstart.py "run ls"
$MODEL_NOTE
EOF_HELP
wait "$SERVER"
