#!/usr/bin/env bash
# Writes the make run credentials file (mode 600) as `export` lines, so that
# `source .mango/dev.env` hands them to every program the shell starts (the
# SDK quickstart, curl, mango's CLI), not to the shell alone.
#   scripts/dev-env.sh FILE DATABASE_URL BASE_URL API_KEY ENVIRONMENT_ID ENVIRONMENT_KEY
set -euo pipefail
[ "$#" -eq 6 ] || { echo "usage: $0 FILE DATABASE_URL BASE_URL API_KEY ENVIRONMENT_ID ENVIRONMENT_KEY" >&2; exit 2; }
file="$1"
umask 077
{
  printf 'export MANGO_DEV_DATABASE_URL=%q\n' "$2"
  printf 'export MANGO_BASE_URL=%q\n' "$3"
  printf 'export MANGO_API_KEY=%q\n' "$4"
  printf 'export MANGO_ENVIRONMENT_ID=%q\n' "$5"
  printf 'export MANGO_ENVIRONMENT_KEY=%q\n' "$6"
} >"$file.tmp"
mv "$file.tmp" "$file"
