#!/usr/bin/env bash
# Builds the sandbox image offline, from this host: a root filesystem of the
# host's bash, coreutils and a few other basics, exactly the shared libraries
# they and the runner need (by ldd, with the dynamic loader), and the
# `mango-runner` binary at /usr/local/bin/mango-runner; then `docker import`.
# Nothing is pulled. The image holds the runner only: no supervisor, no api.
#
# Keep in step with deployments/docker/Dockerfile, the production build of an
# equivalent image (same user, paths, environment and CMD) for machines with a
# registry. docs/supervisor.md, "The sandbox image", describes both.
#
#   scripts/sandbox-image.sh [--release] [--force]
#     --release            use a release build of the runner (default: debug)
#     --force              rebuild even when an image with the same inputs exists
#   MANGO_RUNNER_BIN       use this runner binary instead of building one
#   MANGO_SANDBOX_IMAGE    the tag (default mango-sandbox:dev)
#   CARGO_TARGET_DIR       where cargo builds (default target/); the root
#                          filesystem is assembled in a sandbox-image.* there
#
# Skips the import when the image already carries labels with the same
# runner SHA-256, this script's SHA-256 and digest of the host files it copies.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SCRIPT="$ROOT/scripts/sandbox-image.sh"
TAG="${MANGO_SANDBOX_IMAGE:-mango-sandbox:dev}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
PROFILE=debug
FORCE=0

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'sandbox-image: %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --release) PROFILE=release ;;
    --force) FORCE=1 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$SCRIPT"; exit 0 ;;
    *) die "unknown argument '$arg' (usage: scripts/sandbox-image.sh [--release] [--force])" ;;
  esac
done

# The user and paths the supervisor relies on (docs/supervisor.md).
RUNNER_UID=65534
RUNNER_GID=65534
RUNNER_PATH=/usr/local/bin:/usr/bin:/bin

# What a model's bash calls use. Required ones must exist on the host;
# optional ones are copied when present.
REQUIRED_TOOLS="bash cat printf ls rm mkdir cp mv test head tail wc sort env
  sleep echo true false id pwd touch chmod tr cut sed grep"
OPTIONAL_TOOLS="find rg ln readlink realpath dirname basename uname date xargs
  tee uniq stat du mktemp seq sha256sum diff awk tar gzip"

# --- Docker -----------------------------------------------------------------
command -v docker >/dev/null 2>&1 \
  || die "docker is not installed (no 'docker' on PATH); the sandbox image needs a Docker Engine"
if ! server="$(docker version --format '{{.Server.Version}}' 2>&1)"; then
  die "the Docker Engine is not reachable (is dockerd running, and may $(id -un) use its socket?): $server"
fi
say "Docker Engine $server; image $TAG"

# --- The runner binary ------------------------------------------------------
if [ -n "${MANGO_RUNNER_BIN:-}" ]; then
  RUNNER_BIN="$MANGO_RUNNER_BIN"
  if [ ! -f "$RUNNER_BIN" ] || [ ! -x "$RUNNER_BIN" ]; then
    die "MANGO_RUNNER_BIN=$RUNNER_BIN is not an executable file"
  fi
  BUILD=given
  say "runner: $RUNNER_BIN (MANGO_RUNNER_BIN)"
else
  command -v cargo >/dev/null 2>&1 || die "cargo is not on PATH (or set MANGO_RUNNER_BIN)"
  say "building mango-runner ($PROFILE)"
  if [ "$PROFILE" = release ]; then
    (cd "$ROOT" && cargo build -q --release -p mango-runner)
  else
    (cd "$ROOT" && cargo build -q -p mango-runner)
  fi
  RUNNER_BIN="$TARGET_DIR/$PROFILE/mango-runner"
  BUILD="$PROFILE"
  [ -x "$RUNNER_BIN" ] || die "cargo did not produce $RUNNER_BIN"
fi

# --- What the runner supports -------------------------------------------------
# The supervisor keeps a Session's container for its next activation only when
# the image says its runner takes --keep-idle-seconds (an older one refuses it
# and would never start): asked of the runner itself, so an older binary given
# in MANGO_RUNNER_BIN is not labelled as one that does.
KEEP_LABEL=()
runner_help="$("$RUNNER_BIN" --help 2>&1 || true)"
if grep -q -- '--keep-idle-seconds' <<<"$runner_help"; then
  KEEP_LABEL=(--change "LABEL org.mango.sandbox.runner-keep-idle=1")
else
  say "this runner predates kept sandboxes (no --keep-idle-seconds): the image is not labelled to keep"
fi

# --- What goes in: host paths, resolved ---------------------------------------
# Each entry is a path as a program names it (a tool from PATH, a library as
# ldd shows it, the loader); copy_path recreates the symlinks on the way.
HOST_PATHS=()
BINARIES=("$RUNNER_BIN")
for tool in $REQUIRED_TOOLS; do
  path="$(type -P "$tool" || true)"
  [ -n "$path" ] || die "the host has no '$tool' on PATH; it is required in the image"
  HOST_PATHS+=("$path")
  BINARIES+=("$path")
done
for tool in $OPTIONAL_TOOLS; do
  path="$(type -P "$tool" || true)"
  if [ -n "$path" ]; then
    HOST_PATHS+=("$path")
    BINARIES+=("$path")
  else
    say "optional '$tool' not on this host; left out"
  fi
done

# Shared libraries and the loader of every binary (and of scripts' interpreters).
libraries_of() {
  local out
  if ! out="$(ldd "$1" 2>&1)"; then
    case "$out" in
      *"not a dynamic executable"* | *"statically linked"*) return 0 ;;
      *) die "ldd $1 failed: $out" ;;
    esac
  fi
  if grep -q 'not found' <<<"$out"; then
    die "ldd $1: missing libraries: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"
  fi
  awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out"
}
# (In a command substitution, so that a failure inside stops the script.)
libs="$(for bin in "${BINARIES[@]}"; do
  if [ "$(head -c 2 "$bin")" = '#!' ]; then continue; fi # a script: its interpreter is a tool here
  libraries_of "$bin"
done)"
mapfile -t LIBS < <(sort -u <<<"$libs")
[ "${#LIBS[@]}" -gt 0 ] || die "ldd found no libraries for the runner or the tools"
HOST_PATHS+=("${LIBS[@]}")
# The C.UTF-8 locale (LANG=C.UTF-8 in the image): glibc reads it from here.
[ -d /usr/lib/locale/C.utf8 ] && HOST_PATHS+=(/usr/lib/locale/C.utf8)

# --- Up to date? ----------------------------------------------------------------
say "hashing inputs"
runner_sha="$(sha256sum "$RUNNER_BIN" | cut -d' ' -f1)"
script_sha="$(sha256sum "$SCRIPT" | cut -d' ' -f1)"
host_sha="$(for p in "${HOST_PATHS[@]}"; do
  real="$(readlink -f "$p")"
  if [ -d "$real" ]; then
    find "$real" -type f -print0 | sort -z | xargs -0 sha256sum
  else
    printf '%s %s\n' "$p" "$(sha256sum "$real" | cut -d' ' -f1)"
  fi
done | sha256sum | cut -d' ' -f1)"
label() { docker image inspect --format "{{ index .Config.Labels \"$1\" }}" "$TAG" 2>/dev/null || true; }
if [ "$FORCE" = 0 ] \
  && [ "$(label org.mango.sandbox.runner-sha256)" = "$runner_sha" ] \
  && [ "$(label org.mango.sandbox.script-sha256)" = "$script_sha" ] \
  && [ "$(label org.mango.sandbox.host-sha256)" = "$host_sha" ]; then
  say "$TAG is up to date (runner sha256 ${runner_sha:0:12}); --force rebuilds"
  printf '%s\n' "$TAG"
  exit 0
fi

# --- Assemble the root filesystem ----------------------------------------------
# A directory of its own, so that two builds (say debug and release) at once
# do not share one.
mkdir -p "$TARGET_DIR"
WORK="$(mktemp -d "$TARGET_DIR/sandbox-image.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
FS="$WORK/rootfs"
say "assembling the root filesystem in $FS"
mkdir "$FS"

# The physical form of a link's target: relative to the link's real directory.
resolve_link() {
  local link="$1" target
  target="$(readlink "$link")"
  case "$target" in
    /*) realpath -m -s "$target" ;;
    *) realpath -m -s "$(readlink -f "$(dirname "$link")")/$target" ;;
  esac
}
# A directory as on the host: symlinked directories (merged /usr: /lib ->
# usr/lib) become the same symlinks, pointing at directories made here too.
ensure_dir() {
  local dir="$1"
  [ "$dir" = / ] && return 0
  [ -e "$FS$dir" ] || [ -L "$FS$dir" ] && return 0
  ensure_dir "$(dirname "$dir")"
  if [ -L "$dir" ]; then
    ln -s "$(readlink "$dir")" "$FS$dir"
    ensure_dir "$(resolve_link "$dir")"
  else
    mkdir "$FS$dir"
    chmod 0755 "$FS$dir"
  fi
}
# A file, symlink chain or directory tree at the same path as on the host.
copy_path() {
  local path="$1"
  ensure_dir "$(dirname "$path")"
  [ -e "$FS$path" ] || [ -L "$FS$path" ] && return 0
  if [ -L "$path" ]; then
    ln -s "$(readlink "$path")" "$FS$path"
    copy_path "$(resolve_link "$path")"
  elif [ -d "$path" ]; then
    cp -R --no-preserve=ownership "$path" "$FS$path"
  else
    cp --preserve=mode,timestamps "$path" "$FS$path"
  fi
}
for p in "${HOST_PATHS[@]}"; do copy_path "$p"; done
# Through the image's own symlinks, each tool must land on a real file.
for p in "${HOST_PATHS[@]}"; do
  [ -e "$FS$p" ] || die "assembling: $p does not resolve inside the image"
done

ensure_dir /usr/bin
# /bin/sh is bash; scripts and `env` find their interpreters in /usr/bin.
[ -e "$FS/usr/bin/sh" ] || ln -s bash "$FS/usr/bin/sh"
[ -e "$FS/bin" ] || ln -s usr/bin "$FS/bin"
[ -e "$FS/bin/sh" ] || die "assembling: /bin/sh does not resolve inside the image"
[ -e "$FS/usr/bin/env" ] || die "assembling: /usr/bin/env is missing"

mkdir -p "$FS/usr/local/bin"
cp "$RUNNER_BIN" "$FS/usr/local/bin/mango-runner"
chmod 0755 "$FS/usr/local/bin/mango-runner"

mkdir -p "$FS/etc" "$FS/root"
chmod 0700 "$FS/root"
# nobody's home is the workspace, the one writable place that lasts the item
# (the runner's own default for HOME); /etc/hosts, resolv.conf and hostname
# are Docker's to provide.
cat >"$FS/etc/passwd" <<EOF
root:x:0:0:root:/root:/bin/bash
nobody:x:$RUNNER_UID:$RUNNER_GID:nobody:/workspace:/bin/bash
EOF
cat >"$FS/etc/group" <<EOF
root:x:0:
tty:x:5:
nogroup:x:$RUNNER_GID:
EOF
cat >"$FS/etc/nsswitch.conf" <<'EOF'
passwd: files
group:  files
hosts:  files dns
EOF
chmod 0644 "$FS/etc/passwd" "$FS/etc/group" "$FS/etc/nsswitch.conf"

# Writable places under a read-only root are mounts: /tmp (tmpfs) and
# /workspace (a named volume, or tmpfs for healthchecks). Docker copies this
# directory's owner and mode into a new named volume mounted there.
mkdir -p "$FS/tmp" "$FS/workspace"
chmod 1777 "$FS/tmp"
chmod 0700 "$FS/workspace"
# Docker's mount points, so that nothing needs creating under a read-only root.
mkdir -p "$FS/proc" "$FS/sys" "$FS/dev"

# --- Pack and import --------------------------------------------------------------
# Owned by root throughout except /workspace, whatever user runs this; sorted
# and with fixed times, so the same inputs give the same layer.
say "packing $(find "$FS" \( -type f -o -type l \) | wc -l) files ($(du -sh "$FS" | cut -f1))"
TAR="$WORK/rootfs.tar"
TAR_OPTS=(--numeric-owner --sort=name --mtime=@0 --format=gnu)
tar -C "$FS" "${TAR_OPTS[@]}" --owner=0 --group=0 --exclude=./workspace -cf "$TAR" .
tar -C "$FS" "${TAR_OPTS[@]}" --owner="$RUNNER_UID" --group="$RUNNER_GID" --no-recursion -rf "$TAR" ./workspace

say "importing $TAG"
previous="$(docker image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)"
docker import \
  --change "USER $RUNNER_UID:$RUNNER_GID" \
  --change 'WORKDIR /workspace' \
  --change "ENV PATH=$RUNNER_PATH" \
  --change 'ENV HOME=/workspace' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/usr/local/bin/mango-runner"]' \
  --change "LABEL org.mango.sandbox.runner-sha256=$runner_sha" \
  --change "LABEL org.mango.sandbox.script-sha256=$script_sha" \
  --change "LABEL org.mango.sandbox.host-sha256=$host_sha" \
  --change "LABEL org.mango.sandbox.runner-build=$BUILD" \
  "${KEEP_LABEL[@]}" \
  --message "mango sandbox image (scripts/sandbox-image.sh)" \
  "$TAR" "$TAG" >/dev/null
rm -rf "$WORK"
# The image this one replaces, unless something else still uses or names it.
if [ -n "$previous" ] && [ "$previous" != "$(docker image inspect --format '{{.Id}}' "$TAG")" ]; then
  docker rmi "$previous" >/dev/null 2>&1 || true
fi
size="$(docker image inspect --format '{{.Size}}' "$TAG")"
say "built $TAG: $((size / 1024 / 1024)) MiB, runner sha256 ${runner_sha:0:12}"
printf '%s\n' "$TAG"
