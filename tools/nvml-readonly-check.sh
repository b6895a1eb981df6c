#!/usr/bin/env bash
# Read-only check of the real NVML backend on a machine with an NVIDIA driver.
#
# Runs the ReadOnly* subset of the NVML conformance suite against DlopenNvml and prints
# `dynmig nvml list`, `profiles` and `instances`. It never enables or disables MIG, never creates,
# destroys or resets anything: the mutating conformance tests only run with
# DYNMIG_NVML_ALLOW_MUTATION=1, which this script clears.
#
# Usage: tools/nvml-readonly-check.sh [BUILD_DIR]   (default build/; run `make build` first)
# Env:   DYNMIG_NVML_LIBRARY  NVML library to load (default libnvidia-ml.so.1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
unset DYNMIG_NVML_ALLOW_MUTATION
dynmig="$build/bin/dynmig"
test_bin="$build/bin/nvml_test"
for f in "$dynmig" "$test_bin"; do
  if [ ! -x "$f" ]; then
    echo "nvml-readonly-check: $f is missing; run 'make build' first" >&2
    exit 2
  fi
done
lib_args=()
if [ -n "${DYNMIG_NVML_LIBRARY:-}" ]; then lib_args=(--library "$DYNMIG_NVML_LIBRARY"); fi

echo "== dynmig nvml list"
if ! "$dynmig" nvml "${lib_args[@]}" list; then
  echo "nvml-readonly-check: no usable NVIDIA driver here; nothing was checked" >&2
  exit 1
fi
echo
echo "== conformance suite, read-only subset, real driver"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
set +e
"$test_bin" --gtest_filter='Real/NvmlConformanceTest.ReadOnly*' --gtest_color=no | tee "$report"
rc=${PIPESTATUS[0]}
set -e
# One line per skipped test ends with its time, "(N ms)"; gtest's summary lists the same tests again without it.
skipped=$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$report" || true)
if [ "$skipped" -gt 0 ]; then
  echo "nvml-readonly-check: $skipped read-only test(s) skipped; the reasons are printed above" >&2
fi
echo
echo "== dynmig nvml profiles"
"$dynmig" nvml "${lib_args[@]}" profiles || rc=1
echo
echo "== dynmig nvml profiles -o json"
"$dynmig" nvml "${lib_args[@]}" profiles -o json || rc=1
echo
echo "== dynmig nvml instances"
"$dynmig" nvml "${lib_args[@]}" instances || rc=1
exit "$rc"
