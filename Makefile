# Thin wrapper over CMake presets. `make run` and `make test` work on a fresh Debian 12 machine.
.PHONY: deps build test run bench asan format clean e2e-real e2e-scenarios-local e2e-real-down

JOBS ?= $(shell nproc)

deps:
	@tools/install-deps.sh

build: deps
	@cmake --preset default >/dev/null
	@cmake --build --preset default -j $(JOBS)

test: build
	@ctest --preset default

run: build
	@tools/run-main.sh

bench: build
	@tools/run-bench.sh

asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan

# The scenario suite (tests/e2e-real/scenarios.py) on a real Kubernetes v1.20 built from Debian's source package
# (cached in /var/cache/dynmig-real-k8s), started on this machine with containerd and a kubelet (needs root).
e2e-real:
	@tools/install-deps.sh
	@cmake --preset default >/dev/null
	@cmake --build --preset default -j $(JOBS) --target dynmig
	@tools/real-k8s/e2e-real.sh

# The same scenario suite against the local mode (build/bin/dynmig local).
e2e-scenarios-local:
	@tools/install-deps.sh
	@cmake --preset default >/dev/null
	@cmake --build --preset default -j $(JOBS) --target dynmig
	@python3 tests/e2e-real/scenarios.py --backend local

# Stops a real-k8s cluster left running (tools/real-k8s/cluster.py up/deploy by hand) and wipes its state.
e2e-real-down:
	@/usr/bin/python3 tools/real-k8s/cluster.py down

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf build build-asan
