#!/usr/bin/env bash
# Proves the sandbox image works under the hardening the supervisor uses:
# builds it (scripts/sandbox-image.sh; arguments are passed on, e.g. --force
# or --release), then runs containers with those flags and checks that the
# runner starts, the healthcheck's kind of bash works in /workspace as uid
# 65534, the root filesystem is read-only, and a named volume at /workspace is
# writable by the runner user. Exits non-zero on any failure.
#   scripts/sandbox-image-check.sh [--image TAG | sandbox-image.sh's arguments]
#     --image TAG           check TAG as it is (e.g. one built from
#                           deployments/docker/Dockerfile) instead of building
#   MANGO_SANDBOX_IMAGE   the tag to build and check (default mango-sandbox:dev)
# The commands in single quotes run in the sandbox: their $ are its shell's.
# shellcheck disable=SC2016
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
say() { printf '==> %s\n' "$*" >&2; }

if [ "${1:-}" = --image ]; then
  TAG="${2:?--image needs a tag}"
  docker image inspect "$TAG" >/dev/null \
    || { printf 'sandbox-image-check: no image %s (or Docker is not available)\n' "$TAG" >&2; exit 1; }
else
  TAG="$("$ROOT/scripts/sandbox-image.sh" "$@" | tail -n 1)"
  [ -n "$TAG" ] || { printf 'sandbox-image-check: the build printed no image tag\n' >&2; exit 1; }
fi

# As the supervisor starts a sandbox (docs/supervisor.md), with a tmpfs
# workspace as for a healthcheck; no network, since nothing here needs one.
# shellcheck disable=SC2054 # commas inside mount options
HARDENING=(--rm --user 65534:65534 --cap-drop ALL --security-opt no-new-privileges
  --read-only --tmpfs /tmp:rw,size=64m --pids-limit 256 --memory 512m --network none)
# shellcheck disable=SC2054
TMPFS_WORKSPACE=(--tmpfs /workspace:rw,size=64m,uid=65534,gid=65534,mode=0700)

passed=0
failed=0
out=''
again=''

ok() { passed=$((passed + 1)); printf 'ok    %s\n' "$1"; }
fail() {
  failed=$((failed + 1))
  printf 'FAIL  %s\n' "$1"
  [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/      | /'
}
# sandbox OUTVAR DOCKER-RUN-ARGS... -- COMMAND...: runs one container,
# stdout and stderr together into OUTVAR; returns the container's status.
sandbox() {
  local -n _sandbox_out="$1"
  shift
  local args=()
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  _sandbox_out="$(docker run "${HARDENING[@]}" "${args[@]}" "$TAG" "$@" 2>&1)"
}

say "checking $TAG"

# (a) The runner starts.
if sandbox out "${TMPFS_WORKSPACE[@]}" -- mango-runner --version \
  && [[ "$out" == "mango-runner "* ]]; then
  ok "mango-runner --version: $out"
else
  fail "mango-runner --version" "$out"
fi

# (b) The healthcheck probe's kind of bash, in /workspace, as 65534.
probe='set -eu; printf x > /workspace/f; test "$(cat /workspace/f)" = x; ls /; id -u'
if sandbox out "${TMPFS_WORKSPACE[@]}" -- bash --noprofile --norc -c "$probe" \
  && [ "$(tail -n 1 <<<"$out")" = 65534 ]; then
  ok "bash writes and reads /workspace as uid $(tail -n 1 <<<"$out"); / holds: $(head -n -1 <<<"$out" | tr '\n' ' ')"
else
  fail "bash in /workspace as uid 65534" "$out"
fi

# The image's own defaults: user, working directory, environment, command,
# and what /bin/sh and /usr/bin/env resolve to (the CMD and scripts use them).
if sandbox out "${TMPFS_WORKSPACE[@]}" -- /usr/bin/env sh -c \
  'echo "$(id -u):$(id -g) $PWD $HOME $PATH"; test ! -e /usr/local/bin/mango-worker; test ! -e /usr/local/bin/mango' \
  && [ "$out" = "65534:65534 /workspace /workspace /usr/local/bin:/usr/bin:/bin" ] \
  && [ "$(docker image inspect --format '{{.Config.User}} {{.Config.WorkingDir}} {{json .Config.Cmd}}' "$TAG")" \
    = '65534:65534 /workspace ["/usr/local/bin/mango-runner"]' ]; then
  ok "defaults: user 65534:65534, /workspace, HOME=/workspace, PATH, CMD mango-runner; runner only"
else
  fail "image defaults (user, workdir, HOME, PATH, CMD; no supervisor or api)" "$out"
fi

# (c) The root filesystem is read-only, even where the runner user could write.
if sandbox out "${TMPFS_WORKSPACE[@]}" -- bash --noprofile --norc -c 'echo x > /probe'; then
  fail "writing to / must fail" "$out"
elif [[ "$out" == *"Read-only file system"* ]]; then
  ok "writing to / fails: $out"
else
  fail "writing to / failed, but not for a read-only root" "$out"
fi

# (d) A named volume at /workspace takes the image's owner and mode, the
# runner user writes into it, and what it wrote is there for the next sandbox.
VOLUME="mango-sandbox-check-$$"
docker volume create "$VOLUME" >/dev/null
trap 'docker volume rm -f "$VOLUME" >/dev/null 2>&1 || true' EXIT
if sandbox out -v "$VOLUME:/workspace" -- bash --noprofile --norc -c \
  'set -eu; stat -c "%u:%g %a" /workspace; printf y > /workspace/kept; test "$(cat /workspace/kept)" = y' \
  && [ "$out" = "65534:65534 700" ] \
  && sandbox again -v "$VOLUME:/workspace" -- cat /workspace/kept \
  && [ "$again" = y ]; then
  ok "named volume at /workspace: owner and mode $out, writable, kept across sandboxes"
else
  fail "named volume at /workspace writable by 65534" "$out${again:+
$again}"
fi
docker volume rm -f "$VOLUME" >/dev/null
trap - EXIT

printf 'sandbox image check: %d passed, %d failed\n' "$passed" "$failed"
[ "$failed" = 0 ] || { printf 'sandbox-image-check: %s does not work as a sandbox; see FAIL above\n' "$TAG" >&2; exit 1; }
