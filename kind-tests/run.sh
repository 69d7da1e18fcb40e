#!/usr/bin/env bash
# The end-to-end test on a real cluster (issue 17, docs/kubernetes.md):
#
#   1. a kind cluster of two nodes (kind-config.yaml: sandboxes on the
#      worker, so the API server is another node), made or reused, or the
#      current kubectl context;
#   2. the three images built from this checkout (deployments/docker/) and
#      loaded into it (`docker save` and `kind load image-archive`, which
#      works with the containerd image store where `kind load docker-image`
#      does not; or pushed to MANGO_E2E_REGISTRY);
#   3. `helm install` of charts/mango into a fresh namespace that enforces
#      the Pod Security Standard `restricted`;
#   4. the bootstrap of docs/kubernetes.md: a Workspace key and an
#      Environment key with `kubectl exec deploy/<release>-api -- mango
#      api-key create …`, an Environment over HTTP, the pool's Secret with
#      `kubectl create secret generic`, a WorkerPool;
#   5. a healthcheck to `succeeded`;
#   6. a Session activated twice, its turns played by a scripted model
#      (kind-tests/model/model.py, run from a ConfigMap; the api's model
#      settings are the chart's api.model values, its key from a Secret),
#      which asks for one bash call per turn: the call's result reaches the
#      model and each turn ends; a file written into /workspace in the
#      first activation's Pod is read back in the second's, from the same
#      PVC; inside a sandbox (on the worker), the api answers, and neither
#      PostgreSQL nor the Kubernetes API on the control-plane node does (the
#      NetworkPolicy; it never governs a Pod's own node);
#   6b. claim → first heartbeat (the Work's acknowledged_at → started_at) of
#      healthchecks started cold (the pool's warm.replicas 0) and warm (its
#      warm Pods ready), printed as p50/p99; on kind the warm p99 must be at
#      most MANGO_E2E_WARM_P99_MS; the Session's first activation binds a warm
#      Pod, and its second, ended by the runner's idle end, leaves its Pod
#      kept (spec.keepIdle) for the third, which runs in it;
#   7. no key, Work secret or sessions token in `kubectl get pod -o yaml`,
#      in any Secret but the pool's own, in Events or in the controller's log.
#
# Exit status: 0 passed, 1 failed, 77 skipped (no kind and no cluster, or no
# way to bring this checkout's images into the cluster); with
# MANGO_REQUIRE_KIND=1 a skip is a failure. kind-tests/tests/it/kind.rs runs
# it under `cargo test`; .github/workflows/kind.yml runs that.
#
# Needs docker, kubectl, curl and python3, and either helm or the venv's
# helm-python-sdk (scripts/venv.sh). Settings:
#   MANGO_REQUIRE_KIND=1          fail instead of skipping
#   MANGO_KIND_CLUSTER            the kind cluster (default mango-e2e; made from
#                                 kind-config.yaml if missing; a reused one needs a
#                                 worker labelled mango.dev/sandboxes=true)
#   MANGO_E2E_USE_CONTEXT=1       use the current kubectl context even where kind exists
#   MANGO_E2E_REGISTRY            push the images there (for a cluster that is not kind)
#   MANGO_E2E_SKIP_BUILD=1        use mango-{api,controller,sandbox}:e2e as they are
#   MANGO_E2E_NAMESPACE           the namespace (default mango-e2e-<random>)
#   MANGO_E2E_KEEP=1              keep the namespace (and a cluster this run made)
#   MANGO_E2E_MODEL_IMAGE         the scripted model's image (default python:3.12-slim:
#                                 any image with python3 on its PATH)
#   MANGO_E2E_CHECK_NETWORK=0     skip the in-sandbox reachability checks (a CNI
#                                 that does not enforce NetworkPolicy; kind ≥ 0.24 does)
#   MANGO_E2E_WARM_REPLICAS       the pool's warm Pods (default 2; spec.warm.replicas,
#                                 the chart's pool.warm.replicas)
#   MANGO_E2E_KEEP_IDLE           seconds a Session's sandbox is kept after its idle end
#                                 (default 120; spec.keepIdle, the chart's pool.keepIdle)
#   MANGO_E2E_SAMPLES             healthchecks timed per kind of start (default 10)
#   MANGO_E2E_WARM_P99_MS         the most a warm start's claim → first heartbeat may
#                                 take at the 99th percentile (default 300; kind only)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RELEASE=mango
FULLNAME=mango # the chart's fullname for a release named mango: deploy/mango-api
POOL=e2e
SKIP=77
CLUSTER="${MANGO_KIND_CLUSTER:-mango-e2e}"
NS="${MANGO_E2E_NAMESPACE:-mango-e2e-$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
API_LOCAL_PORT="${MANGO_E2E_API_PORT:-18080}"
WARM_REPLICAS="${MANGO_E2E_WARM_REPLICAS:-2}"
KEEP_IDLE="${MANGO_E2E_KEEP_IDLE:-120}"
SAMPLES="${MANGO_E2E_SAMPLES:-10}"
WARM_P99_MS="${MANGO_E2E_WARM_P99_MS:-300}"

say() { printf '==> %s\n' "$*" >&2; }
fail() { printf 'kind-tests: FAILED: %s\n' "$*" >&2; exit 1; }
skip() {
  if [ "${MANGO_REQUIRE_KIND:-}" = 1 ]; then
    fail "$* (and MANGO_REQUIRE_KIND=1)"
  fi
  printf 'kind-tests: SKIPPED: %s\n' "$*" >&2
  exit "$SKIP"
}
have() { command -v "$1" >/dev/null 2>&1; }
# A field of the JSON on stdin, by a Python expression over `d`.
json() { python3 -c "import json, sys; d = json.load(sys.stdin); v = $1; print('' if v is None else v)"; }

# --- Where to run -------------------------------------------------------------
have kubectl || skip "kubectl is not installed"
have python3 || skip "python3 is not installed"
have curl || skip "curl is not installed"
docker_ok=0
if have docker && docker version >/dev/null 2>&1; then docker_ok=1; fi

MODE=""
MADE_CLUSTER=0
if [ "${MANGO_E2E_USE_CONTEXT:-}" != 1 ] && have kind; then
  [ "$docker_ok" = 1 ] || skip "kind is installed but no Docker Engine answers (kind's nodes are containers)"
  MODE=kind
elif kubectl version --request-timeout=5s >/dev/null 2>&1; then
  MODE=context
  if [ -z "${MANGO_E2E_REGISTRY:-}" ] && [ "${MANGO_E2E_SKIP_BUILD:-}" != 1 ]; then
    skip "a cluster answers ($(kubectl config current-context 2>/dev/null || echo '?')) but nothing brings this checkout's images into it: set MANGO_E2E_REGISTRY to a registry it pulls from, or install kind"
  fi
else
  skip "neither kind nor a reachable cluster (kubectl version fails): install kind and Docker, or point kubectl at a cluster"
fi
[ "${MANGO_E2E_SKIP_BUILD:-}" = 1 ] || [ "$docker_ok" = 1 ] || skip "no Docker Engine answers, so the images cannot be built"

HELM=""
if have helm; then
  HELM=helm
elif [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -c 'import helm_python' 2>/dev/null; then
  HELM=venv
else
  skip "neither helm nor the venv's helm-python-sdk (scripts/venv.sh) is there to install the chart"
fi

# --- The chart's pool values ------------------------------------------------------
# The chart's own WorkerPool (pool.enabled) must carry the warm and kept
# settings this test gives its pool; helm template shows whether it does.
chart_pool() {
  local values=(--set pool.enabled=true --set pool.environmentId=env_e2e
    --set pool.environmentKeySecret.name=e2e-pool-key
    --set "pool.warm.replicas=$WARM_REPLICAS" --set "pool.keepIdle=$KEEP_IDLE")
  if [ "$HELM" = helm ]; then
    helm template e2e "$ROOT/charts/mango" "${values[@]}" --show-only templates/workerpool.yaml
  fi
}
if [ "$HELM" = helm ]; then
  RENDERED="$(chart_pool)" || fail "helm template of the chart's pool failed"
  # This test's pool is applied with kubectl (its Environment is made
  # below), so a chart short of these values is reported, not fatal.
  grep -q "replicas: $WARM_REPLICAS" <<<"$RENDERED" \
    || say "WARNING: the chart's WorkerPool does not carry pool.warm.replicas"
  grep -q "keepIdle: $KEEP_IDLE" <<<"$RENDERED" \
    || say "WARNING: the chart's WorkerPool does not carry pool.keepIdle"
fi

# --- Clean-up and diagnostics -------------------------------------------------
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mango-kind.XXXXXX")"
PF_PID=""
cleanup() {
  status=$?
  if [ -n "$PF_PID" ]; then kill "$PF_PID" 2>/dev/null || true; fi
  if [ "$status" != 0 ] && [ "$status" != "$SKIP" ] && [ -n "${NS_MADE:-}" ]; then
    say "diagnostics for namespace $NS"
    kubectl -n "$NS" get all,pvc,workerpools,leases -o wide >&2 || true
    kubectl -n "$NS" get events --sort-by=.lastTimestamp >&2 || true
    kubectl -n "$NS" describe pods >&2 || true
    kubectl -n "$NS" logs "deploy/$FULLNAME-controller" --all-containers --tail=200 >&2 || true
    kubectl -n "$NS" logs "deploy/$FULLNAME-api" --all-containers --tail=100 >&2 || true
    kubectl -n "$NS" get workerpools -o yaml >&2 || true
  fi
  if [ "${MANGO_E2E_KEEP:-}" = 1 ]; then
    say "kept namespace $NS (context $(kubectl config current-context 2>/dev/null || echo '?'))"
  else
    if [ "$MADE_CLUSTER" = 1 ]; then
      kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    elif [ -n "${NS_MADE:-}" ]; then
      kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    fi
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT

# --- Images -------------------------------------------------------------------
TAG=e2e
IMG_API=mango-api:$TAG
IMG_CONTROLLER=mango-controller:$TAG
IMG_SANDBOX=mango-sandbox:$TAG
PULL=Never
if [ -n "${MANGO_E2E_REGISTRY:-}" ]; then
  IMG_API="$MANGO_E2E_REGISTRY/$IMG_API"
  IMG_CONTROLLER="$MANGO_E2E_REGISTRY/$IMG_CONTROLLER"
  IMG_SANDBOX="$MANGO_E2E_REGISTRY/$IMG_SANDBOX"
  PULL=Always
fi
if [ "${MANGO_E2E_SKIP_BUILD:-}" != 1 ]; then
  # The api and controller Dockerfiles share their build stage: the
  # workspace is compiled once.
  say "building $IMG_API, $IMG_CONTROLLER and $IMG_SANDBOX (release builds; some minutes)"
  (cd "$ROOT" && docker build -q -f deployments/docker/api.Dockerfile -t "$IMG_API" . >/dev/null)
  (cd "$ROOT" && docker build -q -f deployments/docker/controller.Dockerfile -t "$IMG_CONTROLLER" . >/dev/null)
  (cd "$ROOT" && docker build -q -f deployments/docker/Dockerfile -t "$IMG_SANDBOX" . >/dev/null)
  if [ -n "${MANGO_E2E_REGISTRY:-}" ]; then
    for image in "$IMG_API" "$IMG_CONTROLLER" "$IMG_SANDBOX"; do docker push -q "$image" >/dev/null; done
  fi
fi

# --- The cluster --------------------------------------------------------------
if [ "$MODE" = kind ]; then
  if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    say "creating kind cluster $CLUSTER (a control plane and a worker for the sandboxes)"
    MADE_CLUSTER=1
    kind create cluster --name "$CLUSTER" --config "$ROOT/kind-tests/kind-config.yaml" --wait 120s >&2
  fi
  kubectl config use-context "kind-$CLUSTER" >/dev/null
  [ -n "$(kubectl get nodes -l mango.dev/sandboxes=true -o name)" ] \
    || fail "kind cluster $CLUSTER has no node labelled mango.dev/sandboxes=true: delete it (kind delete cluster --name $CLUSTER) to have it made from kind-tests/kind-config.yaml"
  say "loading the images into $CLUSTER (docker save, kind load image-archive)"
  docker save -o "$WORK/images.tar" "$IMG_API" "$IMG_CONTROLLER" "$IMG_SANDBOX"
  kind load image-archive --name "$CLUSTER" "$WORK/images.tar" >&2
  rm -f "$WORK/images.tar"
fi
say "cluster: $(kubectl config current-context), Kubernetes $(kubectl version -o json | json "d['serverVersion']['gitVersion']")"

# A namespace of its own that refuses any Pod short of `restricted`: the
# chart's Pods and every sandbox Pod must pass it.
kubectl create namespace "$NS" >/dev/null
NS_MADE=1
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/enforce-version=latest >/dev/null

# --- The scripted model ---------------------------------------------------------
# The api's model endpoint, as a Deployment of its own: the api answers a
# model-less Session's input with session.error, so the Sessions below need one.
MODEL_IMAGE="${MANGO_E2E_MODEL_IMAGE:-python:3.12-slim}"
MODEL_KEY="e2e-model-key-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
say "the scripted model ($MODEL_IMAGE, kind-tests/model/model.py)"
printf '%s' "$MODEL_KEY" | kubectl -n "$NS" create secret generic e2e-model --from-file=api-key=/dev/stdin >/dev/null
kubectl -n "$NS" create configmap e2e-model --from-file=model.py="$ROOT/kind-tests/model/model.py" >/dev/null
kubectl -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: e2e-model
spec:
  replicas: 1
  selector:
    matchLabels: {app.kubernetes.io/name: e2e-model}
  template:
    metadata:
      labels: {app.kubernetes.io/name: e2e-model}
    spec:
      automountServiceAccountToken: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        runAsGroup: 65534
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: model
          image: $MODEL_IMAGE
          imagePullPolicy: IfNotPresent
          command: ["python3", "-B", "/model/model.py"]
          env:
            - name: MODEL_API_KEY
              valueFrom:
                secretKeyRef: {name: e2e-model, key: api-key}
          ports:
            - {name: http, containerPort: 8080, protocol: TCP}
          readinessProbe:
            httpGet: {path: /, port: http}
            periodSeconds: 2
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          resources:
            requests: {cpu: 10m, memory: 32Mi}
            limits: {cpu: 200m, memory: 64Mi}
          volumeMounts:
            - {name: script, mountPath: /model, readOnly: true}
      volumes:
        - name: script
          configMap: {name: e2e-model}
---
apiVersion: v1
kind: Service
metadata:
  name: e2e-model
spec:
  selector: {app.kubernetes.io/name: e2e-model}
  ports:
    - {name: http, port: 8080, targetPort: http, protocol: TCP}
EOF

# --- helm install -------------------------------------------------------------
cat >"$WORK/values.yaml" <<EOF
api:
  image: {repository: "${IMG_API%:*}", tag: "$TAG", pullPolicy: $PULL}
  model: {baseUrl: "http://e2e-model.$NS.svc:8080", existingSecret: e2e-model, existingSecretKey: api-key}
controller:
  image: {repository: "${IMG_CONTROLLER%:*}", tag: "$TAG", pullPolicy: $PULL}
  logLevel: "info,mango_controller=debug"
sandbox:
  image: {repository: "${IMG_SANDBOX%:*}", tag: "$TAG"}
postgresql:
  storage: {size: 1Gi}
EOF
say "helm install $RELEASE charts/mango -n $NS ($HELM)"
if [ "$HELM" = helm ]; then
  helm install "$RELEASE" "$ROOT/charts/mango" -n "$NS" -f "$WORK/values.yaml" --wait --timeout 10m >&2
else
  "$ROOT/.venv/bin/python" - "$ROOT/charts/mango" "$RELEASE" "$NS" "$WORK/values.yaml" <<'EOF'
import sys, helm_python
chart, release, namespace, values = sys.argv[1:]
with helm_python.Config(namespace=namespace) as config:
    config.install(chart, release, helm_python.values_from_yaml(open(values).read()),
                   namespace=namespace, wait="watcher", timeout=600)
EOF
fi
kubectl -n "$NS" rollout status "deploy/$FULLNAME-api" --timeout=5m >&2
kubectl -n "$NS" rollout status "deploy/$FULLNAME-controller" --timeout=5m >&2
kubectl -n "$NS" rollout status deploy/e2e-model --timeout=5m >&2

# The api from here, through the Service.
kubectl -n "$NS" port-forward "svc/$FULLNAME-api" "$API_LOCAL_PORT:8080" >"$WORK/port-forward.log" 2>&1 &
PF_PID=$!
API="http://127.0.0.1:$API_LOCAL_PORT"
for _ in $(seq 1 60); do curl -fsS "$API/readyz" >/dev/null 2>&1 && break; sleep 1; done
curl -fsS "$API/readyz" >/dev/null || fail "the api is not ready through the port-forward: $(cat "$WORK/port-forward.log")"

# --- Bootstrap (docs/kubernetes.md) --------------------------------------------
mango_cli() { kubectl -n "$NS" exec "deploy/$FULLNAME-api" -c api -- mango "$@"; }
say "a Workspace key (mango api-key create in the api Pod)"
WSK="$(mango_cli api-key create -workspace wrkspc_default -label e2e-ops --json | json "d['api_key']")"
case "$WSK" in mango_wsk_*) ;; *) fail "no Workspace key was printed" ;; esac
call() { # METHOD PATH [BODY]: the api with the Workspace key; prints the body
  curl -fsS -X "$1" "$API$2" -H "Authorization: Bearer $WSK" -H 'content-type: application/json' ${3:+-d "$3"}
}
ENV_ID="$(call POST /v1/environments "{\"name\":\"e2e-$NS\"}" | json "d['id']")"
say "Environment $ENV_ID, and its Environment key"
ENVK="$(mango_cli api-key create -workspace wrkspc_default -environment "$ENV_ID" -label e2e-pool --json | json "d['api_key']")"
case "$ENVK" in mango_envk_*) ;; *) fail "no Environment key was printed" ;; esac
# From stdin, without a trailing newline: the key is in no file and no argument.
printf '%s' "$ENVK" | kubectl -n "$NS" create secret generic e2e-pool-key --from-file=environment-key=/dev/stdin >/dev/null

say "WorkerPool $POOL (apiUrl and image left to the controller's defaults)"
kubectl -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: mango.dev/v1alpha1
kind: WorkerPool
metadata:
  name: $POOL
spec:
  environmentId: $ENV_ID
  environmentKeySecret:
    name: e2e-pool-key
  imagePullPolicy: $( [ "$PULL" = Never ] && echo IfNotPresent || echo Always )
  maxConcurrency: 2
  warm:
    replicas: 0
  keepIdle: $KEEP_IDLE
$(if [ "$MODE" = kind ]; then printf '  nodeSelector:\n    mango.dev/sandboxes: "true"\n'; fi)
  workspace:
    size: 64Mi
EOF
kubectl -n "$NS" wait --for=condition=Ready "workerpool/$POOL" --timeout=120s >&2 \
  || fail "WorkerPool $POOL did not become Ready"
kubectl -n "$NS" get workerpools >&2

# --- Checks ---------------------------------------------------------------------
# The Work secret's start: base64 of {"sessions_token":"mango_st_…
SECRET_MARKS=(mango_st_ mango_wsk_ mango_envk_ eyJzZXNzaW9uc190b2tlbiI "$WSK" "$ENVK" "$MODEL_KEY")
no_secret_in() { # WHAT, text on stdin
  local text
  text="$(cat)"
  for mark in "${SECRET_MARKS[@]}"; do
    if grep -qF -- "$mark" <<<"$text"; then
      fail "$1 holds a credential (${mark:0:12}…)"
    fi
  done
}
work_state() { call GET "/v1/environments/$ENV_ID/work/$1" | json "d['state']"; }
until_stopped() { # WORK_ID SECONDS
  local deadline=$((SECONDS + $2))
  while [ "$(work_state "$1")" != stopped ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "work $1 did not stop within $2 s (state $(work_state "$1"))"
    sleep 1
  done
}
pod_of() { # WORK_ID: its sandbox Pod's name, once one exists
  local deadline=$((SECONDS + 120)) name=""
  while [ -z "$name" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "no sandbox Pod for $1 within 120 s"
    name="$(kubectl -n "$NS" get pods -l "mango.dev/work-id=$1" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)"
    [ -n "$name" ] || sleep 1
  done
  printf '%s\n' "$name"
}
until_active() { # WORK_ID
  local deadline=$((SECONDS + 120))
  while [ "$(work_state "$1")" != active ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "work $1 did not become active within 120 s (state $(work_state "$1"))"
    sleep 1
  done
}
until_gone() { # POD SECONDS WHAT: the Pod is deleted within SECONDS
  local deadline=$((SECONDS + $2))
  while kubectl -n "$NS" get pod "$1" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$3: Pod $1 is still there $2 s after its end"
    sleep 1
  done
}
check_pod() { # POD WORK_ID [SESSION_ID]: identity, hardening, no secret
  local yaml
  yaml="$(kubectl -n "$NS" get pod "$1" -o yaml)"
  no_secret_in "kubectl get pod $1 -o yaml" <<<"$yaml"
  kubectl -n "$NS" get pod "$1" -o json | python3 -c '
import json, sys
pod, work, session, pool, env = json.load(sys.stdin), *sys.argv[1:]
labels = pod["metadata"]["labels"]
want = {"mango.dev/work-id": work, "mango.dev/pool": pool, "mango.dev/environment-id": env,
        "mango.dev/work-type": "session" if session else "healthcheck",
        "app.kubernetes.io/managed-by": "mango-worker"}
if session:
    want["mango.dev/session-id"] = session
bad = {k: (labels.get(k), v) for k, v in want.items() if labels.get(k) != v}
assert not bad, f"labels: {bad}"
owner = pod["metadata"]["ownerReferences"][0]
assert (owner["kind"], owner["name"]) == ("WorkerPool", pool), owner
spec = pod["spec"]
c = spec["containers"][0]
# A warm or kept Pod takes one envelope per activation (stdinOnce false).
assert spec["restartPolicy"] == "Never" and c["stdin"], "stdin, never restarted"
assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
assert c["securityContext"]["readOnlyRootFilesystem"] is True
assert not any("secret" in v for v in spec.get("volumes", [])), "no Secret volume"
assert not any("valueFrom" in e for e in c.get("env", [])), "no env from a Secret"
' "$2" "${3:-}" "$POOL" "$ENV_ID" || fail "sandbox Pod $1 is not as docs/kubernetes.md says"
}

say "a healthcheck"
CHECK="$(call POST "/v1/environments/$ENV_ID/work" '{"data":{"type":"healthcheck"}}' | json "d['id']")"
until_stopped "$CHECK" 150
RESULT="$(call GET "/v1/environments/$ENV_ID/work/$CHECK" | json "d['result']['status'] + ': ' + d['result']['message']")"
case "$RESULT" in succeeded:*) say "healthcheck $RESULT" ;; *) fail "healthcheck $CHECK: $RESULT" ;; esac
deadline=$((SECONDS + 60))
while [ -n "$(kubectl -n "$NS" get pods -l "mango.dev/work-id=$CHECK" -o name)" ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the healthcheck's Pod is still there a minute after its end"
  sleep 1
done

# --- Claim → first heartbeat, cold and warm ---------------------------------------
heartbeat_ms() { # WORK_ID: from its Ack to its runner's first heartbeat, in ms
  call GET "/v1/environments/$ENV_ID/work/$1" | python3 -c '
import datetime, json, sys
w = json.load(sys.stdin)
at = lambda t: datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))
print(round((at(w["started_at"]) - at(w["acknowledged_at"])).total_seconds() * 1000))
'
}
warm_ready() { # how many warm Pods run, unbound
  kubectl -n "$NS" get pods -l "mango.dev/pool=$POOL,mango.dev/warm=true" \
    --field-selector=status.phase=Running -o name | wc -l
}
until_warm() { # N: until N warm Pods run
  local deadline=$((SECONDS + 180))
  while [ "$(warm_ready)" -lt "$1" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "fewer than $1 warm Pods Running after 180 s ($(warm_ready))"
    sleep 1
  done
}
timed_checks() { # KIND: SAMPLES healthchecks, one at a time; prints their ms, one a line
  local check
  for _ in $(seq 1 "$SAMPLES"); do
    if [ "$1" = warm ]; then until_warm "$WARM_REPLICAS"; fi
    check="$(call POST "/v1/environments/$ENV_ID/work" '{"data":{"type":"healthcheck"}}' | json "d['id']")"
    until_stopped "$check" 150
    [ "$(call GET "/v1/environments/$ENV_ID/work/$check" | json "d['result']['status']")" = succeeded ] \
      || fail "a $1 healthcheck ($check) did not succeed"
    heartbeat_ms "$check"
  done
}
percentiles() { # prints "p50 P99" of the numbers on stdin (nearest rank)
  python3 -c '
import math, sys
v = sorted(int(x) for x in sys.stdin.read().split())
rank = lambda p: v[max(0, math.ceil(p / 100 * len(v)) - 1)]
print(rank(50), rank(99))
'
}
say "claim → first heartbeat, cold: $SAMPLES healthchecks with no warm Pods"
COLD="$(timed_checks cold | percentiles)"
kubectl -n "$NS" patch workerpool "$POOL" --type merge \
  -p "{\"spec\":{\"warm\":{\"replicas\":$WARM_REPLICAS}}}" >/dev/null
say "claim → first heartbeat, warm: $SAMPLES healthchecks, each with $WARM_REPLICAS warm Pods ready"
WARM="$(timed_checks warm | percentiles)"
echo "kind-tests: claim -> first heartbeat (ms): cold p50 ${COLD% *} p99 ${COLD#* }; warm p50 ${WARM% *} p99 ${WARM#* }"
if [ "$MODE" = kind ] && [ "${WARM#* }" -gt "$WARM_P99_MS" ]; then
  fail "a warm start's claim → first heartbeat p99 is ${WARM#* } ms, over $WARM_P99_MS ms"
fi
until_warm "$WARM_REPLICAS"

say "a Session, first activation"
AGENT="$(call POST /v1/agents '{"name":"e2e","model":"e2e-model","tools":[{"type":"agent_toolset_20260401"}]}' | json "d['id']")"
SESSION="$(call POST /v1/sessions "{\"agent\":\"$AGENT\",\"environment_id\":\"$ENV_ID\"}" | json "d['id']")"
say_to_session() {
  call POST "/v1/sessions/$SESSION/events" \
    "{\"events\":[{\"type\":\"user.message\",\"content\":[{\"type\":\"text\",\"text\":\"$1\"}]}]}" >/dev/null
}
live_work() { # the Session's Work that is not stopped (one at most)
  local deadline=$((SECONDS + 30)) id=""
  while [ -z "$id" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the Session's Work was not created"
    id="$(call GET "/v1/environments/$ENV_ID/work?limit=100" | python3 -c '
import json, sys
page, session = json.load(sys.stdin), sys.argv[1]
live = [w["id"] for w in page["data"] if w["data"].get("id") == session and w["state"] != "stopped"]
assert len(live) <= 1, live
print(live[0] if live else "")
' "$SESSION")"
    [ -n "$id" ] || sleep 1
  done
  printf '%s\n' "$id"
}
turns_done() { # N: wait until N turns ended (end_turn), each after the model's bash call came back
  local deadline=$((SECONDS + 90)) got=""
  while :; do
    got="$(call GET "/v1/sessions/$SESSION/events?limit=1000" | python3 -c '
import json, sys
events = json.load(sys.stdin)["data"]
errors = [e for e in events if e["type"] == "session.error"]
assert not errors, f"session.error: {errors}"
ended = [e for e in events if e["type"] == "session.status_idle" and e["stop_reason"]["type"] == "end_turn"]
results = [e for e in events if e["type"] == "user.tool_result" and "e2e-model-bash-ok" in json.dumps(e["content"])]
print(min(len(ended), len(results)))
' 2>&1)" || fail "the Session's turn failed: $got"
    [ "$got" -ge "$1" ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || fail "turn $1 did not end with the model's bash result within 90 s ($got ended)"
    sleep 1
  done
}
stop_work() { # WORK_ID: a forced Stop, unless the runner ended it already (60 s after its turn)
  call POST "/v1/environments/$ENV_ID/work/$1/stop" '{"force":true}' >/dev/null 2>&1 \
    || [ "$(work_state "$1")" = stopped ] || fail "could not stop work $1"
}
pvc_uid() { kubectl -n "$NS" get pvc -l "mango.dev/session-id=$SESSION" -o jsonpath='{range .items[*]}{.metadata.uid}{"\n"}{end}'; }
in_sandbox() { local pod="$1"; shift; kubectl -n "$NS" exec "$pod" -c runner -- "$@"; }

say_to_session "first"
WORK1="$(live_work)"
POD1="$(pod_of "$WORK1")"
case "$POD1" in mango-warm-*) ;; *) fail "the Session's first activation started cold ($POD1) with warm Pods ready" ;; esac
until_active "$WORK1"
check_pod "$POD1" "$WORK1" "$SESSION"
MARK="persisted-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
in_sandbox "$POD1" bash -c "printf '%s' '$MARK' > /workspace/e2e.txt"
PVC1="$(pvc_uid)"
if [ -z "$PVC1" ] || [ "$(wc -l <<<"$PVC1")" != 1 ]; then fail "one PVC for the Session, got: '$PVC1'"; fi

if [ "${MANGO_E2E_CHECK_NETWORK:-1}" = 1 ]; then
  say "inside a sandbox: the api's sandbox port answers; its other ports, PostgreSQL and the Kubernetes API do not"
  if [ "$MODE" = kind ]; then
    NODE="$(kubectl -n "$NS" get pod "$POD1" -o jsonpath='{.spec.nodeName}')"
    API_NODE="$(kubectl get nodes -l node-role.kubernetes.io/control-plane -o jsonpath='{.items[0].metadata.name}')"
    [ "$NODE" != "$API_NODE" ] \
      || fail "the sandbox runs on the control-plane node $NODE, where NetworkPolicy cannot keep it from the API server"
  fi
  in_sandbox "$POD1" timeout 10 bash -c "exec 3<>/dev/tcp/$FULLNAME-api/8081" \
    || fail "a sandbox cannot reach the api's sandbox port (DNS or the NetworkPolicy's api rule)"
  if in_sandbox "$POD1" timeout 5 bash -c "exec 3<>/dev/tcp/$FULLNAME-api/8080" 2>/dev/null; then
    fail "a sandbox reached the api's operators' port: the NetworkPolicy admits only the sandbox port"
  fi
  if in_sandbox "$POD1" timeout 5 bash -c "exec 3<>/dev/tcp/$FULLNAME-api/9465" 2>/dev/null; then
    fail "a sandbox reached the api's /metrics port"
  fi
  if in_sandbox "$POD1" timeout 5 bash -c "exec 3<>/dev/tcp/$FULLNAME-postgresql/5432" 2>/dev/null; then
    fail "a sandbox reached PostgreSQL: the NetworkPolicy is not enforced (kind ≥ 0.24 enforces it; MANGO_E2E_CHECK_NETWORK=0 skips this)"
  fi
  if in_sandbox "$POD1" timeout 5 bash -c 'exec 3<>/dev/tcp/kubernetes.default.svc/443' 2>/dev/null; then
    fail "a sandbox reached the Kubernetes API"
  fi
fi

say "the first turn: the model's bash call ran in the sandbox and its result ended the turn"
turns_done 1
say "ending the first activation (forced Stop)"
stop_work "$WORK1"
until_stopped "$WORK1" 30
until_gone "$POD1" 60 "the first activation's Stop"
[ "$(pvc_uid)" = "$PVC1" ] || fail "the Session's PVC did not outlive its activation"

say "second activation: the same PVC, the same file"
say_to_session "second"
WORK2="$(live_work)"
[ "$WORK2" != "$WORK1" ] || fail "no new activation"
POD2="$(pod_of "$WORK2")"
[ "$POD2" != "$POD1" ] || fail "the second activation reused the first's Pod"
until_active "$WORK2"
check_pod "$POD2" "$WORK2" "$SESSION"
GOT="$(in_sandbox "$POD2" cat /workspace/e2e.txt)"
[ "$GOT" = "$MARK" ] || fail "the second activation read '$GOT' from /workspace, not the first's '$MARK'"
[ "$(pvc_uid)" = "$PVC1" ] || fail "the second activation got another PVC"
turns_done 2
say "the second activation ends by its runner's idle end; its Pod is kept (keepIdle $KEEP_IDLE s)"
until_stopped "$WORK2" 150
kubectl -n "$NS" get pod "$POD2" >/dev/null 2>&1 || fail "the idle Session's Pod $POD2 was not kept"
say_to_session "third"
WORK3="$(live_work)"
[ "$WORK3" != "$WORK2" ] || fail "no third activation"
POD3="$(pod_of "$WORK3")"
[ "$POD3" = "$POD2" ] || fail "the third activation ran in $POD3, not in the kept $POD2"
until_active "$WORK3"
check_pod "$POD3" "$WORK3" "$SESSION"
GOT="$(in_sandbox "$POD3" cat /workspace/e2e.txt)"
[ "$GOT" = "$MARK" ] || fail "the kept Pod read '$GOT' from /workspace, not '$MARK'"
turns_done 3
stop_work "$WORK3"
until_stopped "$WORK3" 30
until_gone "$POD3" 60 "the third activation's Stop (a kept Pod never outlives a Stop)"
[ "$(pvc_uid)" = "$PVC1" ] || fail "the Session's PVC went with its activations"

say "no secret anywhere it must not be"
kubectl -n "$NS" get secrets -o json | python3 -c '
import json, sys
for s in json.load(sys.stdin)["items"]:
    if s["metadata"]["name"] != "e2e-pool-key":
        print(json.dumps(s))
' | no_secret_in "a Secret other than the pool's"
kubectl -n "$NS" get events -o yaml | no_secret_in "the namespace's Events"
kubectl -n "$NS" get workerpools -o yaml | no_secret_in "the WorkerPool"
kubectl -n "$NS" logs "deploy/$FULLNAME-controller" --all-containers --tail=-1 | no_secret_in "the controller's log"
READY="$(kubectl -n "$NS" get workerpool "$POOL" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')"
[ "$READY" = True ] || fail "WorkerPool $POOL is not Ready at the end ($READY)"
kubectl -n "$NS" get workerpools,pvc >&2

echo "kind-tests: PASSED (healthchecks cold and warm, three Session activations on one PVC with a model's bash call each, the first on a warm Pod and the third in the second's kept Pod, no secret in the Pod spec, Secrets, Events or logs)"
