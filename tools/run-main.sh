#!/usr/bin/env bash
# The main job of `make run`: the local mode when it exists, else the planner demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/dynmig
if "$bin" local --help >/dev/null 2>&1; then
  exec "$bin" local --demo
fi
exec "$bin" plan --demo
