#!/usr/bin/env bash
# Installs the Debian packages the build needs, only when some are missing.
# Idempotent; safe to run before every make target.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config ccache
  libgtest-dev libgmock-dev librapidcheck-dev libbenchmark-dev
  libyaml-cpp-dev libsimdjson-dev nlohmann-json3-dev libcli11-dev
  libgrpc++-dev libabsl-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libssl-dev
  libsqlite3-dev coinor-libclp-dev gnuplot-nox
  python3-grpcio python3-grpc-tools libcpp-httplib-dev
  pybind11-dev python3-dev python3-pip python3-setuptools
  chromium
  etcd-server etcd-client
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm (browser tests): only when the commands are missing. A
# machine may already have them from another packaging (npm bundled with
# nodejs), and asking apt for Debian's npm there would try to replace them.
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
