#!/usr/bin/env bash
# Runs every libFuzzer target (build-fuzz/bin/*_fuzz) for FUZZ_SECONDS each (default 60), starting
# from its checked-in seed corpus (fuzz/corpus/<name>/). New inputs go to build-fuzz/corpus/<name>/,
# crashes to build-fuzz/crashes/<name>-*. FUZZ_TARGETS="a b" limits the run to some targets;
# FUZZ_JOBS=N runs N targets at a time (default 1). Exits non-zero when a target crashed; prints
# one line per target.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-1}
targets=${FUZZ_TARGETS:-$(ls fuzz/corpus)}
failed=()

# The largest input libFuzzer generates for a target. The JSON targets get 1 MiB: without it
# libFuzzer stays near its seeds' size (4 KiB), too small for the nesting that overflows a stack
# (tens of thousands of brackets) or the bodies that hit the size limits.
max_len_of() {
  case $1 in
    admission_review | bounded_json | extender_args | held_slices | idle_instances | \
      mig_allocations | node_register | pod_request | runtime_info) echo 1048576 ;;
    *) echo 65536 ;;
  esac
}

# One target: runs it, prints its line, exits non-zero on a crash.
run_one() {
  local t=$1
  local bin=build-fuzz/bin/${t}_fuzz
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is missing (make fuzz builds it)" >&2
    return 1
  fi
  mkdir -p "build-fuzz/corpus/$t" build-fuzz/crashes
  log=build-fuzz/$t.log
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -max_len="$(max_len_of "$t")" \
    -artifact_prefix="build-fuzz/crashes/$t-" "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
  local rc=$?
  local runs cov
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [ $rc -eq 0 ]; then
    echo "fuzz: $t: ok, ${runs:-?} runs in ${seconds}s, ${cov:-cov ?}"
  else
    echo "fuzz: $t: CRASH (exit $rc), see $log and build-fuzz/crashes/$t-*"
    return 1
  fi
}

mkdir -p build-fuzz
for t in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  rm -f "build-fuzz/$t.failed"
  (run_one "$t" || touch "build-fuzz/$t.failed") &
done
wait
for t in $targets; do
  [ -e "build-fuzz/$t.failed" ] && failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
