#!/usr/bin/env bash
# Installs the Debian packages dynmig needs (and those named as arguments), only those missing.
# Quick and silent when all are present.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libyaml-cpp-dev nlohmann-json3-dev libcpp-httplib-dev libcurl4-openssl-dev libssl-dev
  libspdlog-dev libfmt-dev libcli11-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev yamllint python3 python3-yaml curl kubectl
  prometheus)
# prometheus: promtool for the monitoring.rules test (`promtool test rules`) and the prometheus binary that the
# real-cluster scenarios run (make e2e-real). On a host with systemd the package also starts its own service on
# :9090; dynmig's uses never touch that one.
# Extra packages a target needs beyond `make test` (make fuzz: clang-14 libclang-rt-14-dev; make browser-test:
# chromium chromium-driver, the headless browser and its WebDriver for the live page's test).
pkgs+=("$@")
missing=()
# One dpkg-query for all; a package dpkg has never heard of is absent from its output.
# dpkg-query exits 1 when it knows none of some names: that is an answer, not a failure.
installed=$( (dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${pkgs[@]}" 2>/dev/null || true) |
  awk '$2=="installed"{print $1}')
for p in "${pkgs[@]}"; do
  grep -qx "$p" <<<"$installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# kubectl is optional (only the kubectl conformance test needs it): install it on its own so that a
# mirror without it does not block the rest.
required=()
for p in "${missing[@]}"; do [ "$p" = kubectl ] || required+=("$p"); done
if [ ${#required[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${required[@]}" >/dev/null
fi
if printf '%s\n' "${missing[@]}" | grep -qx kubectl; then
  $SUDO apt-get install -y -qq --no-install-recommends kubectl >/dev/null 2>&1 ||
    echo "install-deps: kubectl is not available from apt; the kubectl test will say it was skipped" >&2
fi
