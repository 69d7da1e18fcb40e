#!/usr/bin/env bash
# The full test suite (`make test`, and what CI runs). Starts what the tests need:
# a private PostgreSQL cluster, a venv with the pinned official SDK, and the
# sandbox image (with this checkout's runner) for the Docker launcher's tests.
# Those tests skip with a message where no Docker engine answers, and fail
# instead when CI is set.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }

step "PostgreSQL"
DATABASE_URL="$(scripts/pg.sh)"
export DATABASE_URL
step "scripts/pg.sh's port when another cluster holds the default (scripts/pg-check.sh)"
scripts/pg-check.sh
step "Python venv with anthropic==2.14.0"
scripts/venv.sh

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -q -- -D warnings
step "Layout rules (docs/architecture.md)"
python3 scripts/structure-check.py

if docker version >/dev/null 2>&1; then
  step "The sandbox image mango-sandbox:test (scripts/sandbox-image.sh, this checkout's debug runner)"
  MANGO_SANDBOX_IMAGE=mango-sandbox:test scripts/sandbox-image.sh
  export MANGO_TEST_SANDBOX_IMAGE=mango-sandbox:test
elif [ -n "${CI:-}" ]; then
  echo "CI is set and no Docker engine answers: the Docker launcher's tests cannot run" >&2
  exit 1
else
  step "No Docker engine answers: the Docker launcher's tests will skip"
fi

step "Rust unit and PostgreSQL integration tests"
cargo test --workspace

step "Official Python SDK compatibility tests"
cargo build -q -p mango-api --bin mango -p mango-controller --bin mango-worker -p mango-runner --bin mango-runner
MANGO_BIN="$PWD/target/debug/mango" .venv/bin/pytest compat/python -q -p no:cacheprovider

if [ -n "${MANGO_FAULTS:-}" ]; then
  step "The fault suite (MANGO_FAULTS is set; make faults, docs/reliability.md)"
  make -s faults
fi
