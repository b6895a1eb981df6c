# Thin wrapper over CMake presets. `make run` and `make test` work on a fresh Debian 12 machine.
.PHONY: deps configure build build-all test run bench asan fuzz tsan thread-safety soak format clean e2e-real e2e-real-burst e2e-scenarios-local e2e-real-down browser-test

JOBS ?= $(shell nproc)

deps:
	@tools/install-deps.sh

# `make build` and `make run` build only the dynmig binary (what they run); `make test` and
# `make bench` build everything.
configure: deps
	@cmake --preset default >/dev/null

build: configure
	@cmake --build --preset default -j $(JOBS) --target dynmig

build-all: configure
	@cmake --build --preset default -j $(JOBS)

test: build-all
	@ctest --preset default

run: build
	@tools/run-main.sh

bench: build-all
	@tools/run-bench.sh

asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan

# libFuzzer targets (clang, ASan + UBSan), each run FUZZ_SECONDS (default 60) from fuzz/corpus/,
# FUZZ_JOBS at a time (default 1).
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
fuzz:
	@tools/install-deps.sh clang-14 libclang-rt-14-dev
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) tools/run-fuzz.sh

# ThreadSanitizer build of the concurrent tests (informers, scheduler, device plugin, local mode,
# end to end with the 60-second chaos seed); TSAN_TESTS="kube_test ..." limits them.
TSAN_TESTS ?= protocol_test kube_test scheduler_test deviceplugin_test local_test e2e_test
tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS) --target $(TSAN_TESTS)
	@TSAN_TESTS="$(TSAN_TESTS)" tools/run-tsan.sh

# The thread-safety build: src/ compiled by clang with -Wthread-safety -Werror (syntax only, the optimized build's
# flags); every lock is an annotated absl::Mutex (tools/check-thread-safety.sh).
thread-safety: build-all
	@tools/install-deps.sh clang-14
	@tools/check-thread-safety.sh

# The long chaos soak: SOAK_DURATION of random work and faults (default 30m), seed SOAK_SEED.
SOAK_DURATION ?= 30m
SOAK_SEED ?= 1
soak: build
	@build/bin/dynmig chaos --seed $(SOAK_SEED) --duration $(SOAK_DURATION)

# The scenario suite (tests/e2e-real/scenarios.py) on a real Kubernetes v1.20 built from Debian's source package
# (cached in /var/cache/dynmig-real-k8s), started on this machine with containerd and a kubelet (needs root).
e2e-real: build
	@tools/real-k8s/e2e-real.sh

# Issue 15's burst on the same cluster, its node with 8 simulated A100-SXM4-40GB (RK_SIM_GPUS to change) for this
# run only: BURST_PODS (56) plain pods, then as many 1g pods, applied at once; figures, checks, logs in BURST_OUT.
BURST_PODS ?= 56
BURST_ARGS ?=
BURST_OUT ?= /tmp/dynmig-real-burst
e2e-real-burst: build
	@RK_SIM_GPUS=$${RK_SIM_GPUS:-A100-SXM4-40GBx8} tools/real-k8s/e2e-real.sh burst --pods $(BURST_PODS) \
	  --artifacts $(BURST_OUT) $(BURST_ARGS)

# The same scenario suite against the local mode (build/bin/dynmig local).
e2e-scenarios-local: build
	@python3 tests/e2e-real/scenarios.py --backend local

# The scheduler's live page (GET /live) in headless chromium driven over WebDriver, against the local mode
# (tests/browser/live_page_test.py); installs Debian's chromium and chromium-driver first. make test runs the same
# test when they are installed. Screenshots and logs in BROWSER_OUT.
BROWSER_OUT ?= /tmp/dynmig-live-page
browser-test: build
	@tools/install-deps.sh chromium chromium-driver
	@python3 tests/browser/live_page_test.py --artifacts $(BROWSER_OUT)

# Stops a real-k8s cluster left running (tools/real-k8s/cluster.py up/deploy by hand) and wipes its state.
e2e-real-down:
	@/usr/bin/python3 tools/real-k8s/cluster.py down

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf build build-asan build-fuzz build-tsan
