#!/usr/bin/env bash
# The thread-safety build (issue 28): every translation unit of src/ compiled by clang with -Wthread-safety
# -Werror and -fsyntax-only, with the flags of the optimized build (build/compile_commands.json, so configure
# and build the default preset first: generated gRPC headers must exist). Locks are absl::Mutex, and the state
# they guard is annotated ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED; a read or write of guarded state
# without its lock fails here. `make thread-safety`; CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CLANG=${CLANG:-$(command -v clang++-14 || command -v clang++)}
JOBS=${JOBS:-$(nproc)}
[[ -f $BUILD/compile_commands.json ]] || { echo "check-thread-safety: $BUILD/compile_commands.json missing; run 'make build-all' first" >&2; exit 2; }
python3 - "$BUILD/compile_commands.json" "$CLANG" "$JOBS" <<'PY'
import json, os, shlex, subprocess, sys, concurrent.futures as cf
db, clang, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
entries = []
for e in json.load(open(db)):
    args = shlex.split(e['command'])
    o = args[args.index('-o') + 1] if '-o' in args else ''
    # src/'s objects (its unity batches included), not the generated gRPC code.
    if not o.startswith('src/') or '.pb.' in e['file'] or '/proto/' in o:
        continue
    keep, skip = [], 0
    for i, a in enumerate(args[1:], 1):
        if skip:
            skip -= 1
            continue
        if a in ('-o', '-MT', '-MF'):
            skip = 1
            continue
        if a in ('-c', '-MD') or a.endswith('ccache'):
            continue
        keep.append(a)
    if keep and keep[0].endswith(('c++', 'g++', 'clang++')):
        keep = keep[1:]
    entries.append((e['file'], e['directory'], [clang, '-fsyntax-only', '-Wthread-safety', '-Werror'] + keep))
def run(x):
    f, d, cmd = x
    p = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    return f, p.returncode, p.stdout + p.stderr
bad = 0
with cf.ThreadPoolExecutor(jobs) as ex:
    for f, rc, text in ex.map(run, entries):
        if rc != 0:
            bad += 1
            sys.stdout.write(text)
print(f'check-thread-safety: {len(entries)} translation units, {bad} failed', file=sys.stderr)
sys.exit(1 if bad else 0)
PY
