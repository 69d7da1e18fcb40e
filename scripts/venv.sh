#!/usr/bin/env bash
# Ensure .venv has the pinned official SDK and test tools (compat/python/requirements.txt).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REQ="$ROOT/compat/python/requirements.txt"
VENV="$ROOT/.venv"
STAMP="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "venv.sh: installing the pinned Python SDK into .venv" >&2
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ" >&2
echo "$want" >"$STAMP"
