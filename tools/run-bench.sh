#!/usr/bin/env bash
# Runs every benchmark program under build/bin/bench_* and prints its figures.
set -euo pipefail
cd "$(dirname "$0")/.."
shopt -s nullglob
for b in build/bin/bench_*; do
  echo "== $b"
  "$b"
done
