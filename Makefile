# Thin wrapper over CMake presets. `make run` and `make test` work on a fresh Debian 12 machine.
.PHONY: deps configure build build-all test run bench asan format clean

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

format:
	@git ls-files '*.cc' '*.h' | xargs clang-format -i

clean:
	@rm -rf build build-asan
