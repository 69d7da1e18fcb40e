#!/usr/bin/env bash
# The full test suite (`make test`, and what CI runs). Starts what the tests need:
# a private PostgreSQL cluster and a venv with the pinned official SDK.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }

step "PostgreSQL"
DATABASE_URL="$(scripts/pg.sh)"
export DATABASE_URL
step "Python venv with anthropic==2.14.0"
scripts/venv.sh

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -q -- -D warnings
step "Layout rules (docs/architecture.md)"
python3 scripts/structure-check.py

step "Rust unit and PostgreSQL integration tests"
cargo test --workspace

step "Official Python SDK compatibility tests"
cargo build -q -p mango-api --bin mango
MANGO_BIN="$PWD/target/debug/mango" .venv/bin/pytest compat/python -q -p no:cacheprovider
