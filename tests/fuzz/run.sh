#!/usr/bin/env bash
# Builds tests/fuzz/request_fuzz.cc with clang++ and libFuzzer (the server's
# sources instrumented, with ASan and UBSan; the engine and gRPC from the
# regular build) and runs it for a bounded time.
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -euo pipefail
build="${1:-build}"
seconds="${2:-60}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$build/fuzz"
mkdir -p "$out/corpus"
gen="$build/src/server/gen"
[ -f "$gen/laissez/v1/market.pb.h" ] || { echo "fuzz: build $build first (make build)" >&2; exit 2; }
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
       -I"$root/src" -I"$root" -I"$gen" $(pkg-config --cflags grpc++ protobuf cpp-httplib sqlite3))
srcs=(store auth metrics http market_core server)
objs=()
for s in "${srcs[@]}"; do
  o="$out/$s.o"
  if [ ! -f "$o" ] || [ "$root/src/server/$s.cc" -nt "$o" ]; then
    echo "fuzz: compiling $s.cc" >&2
    clang++ "${flags[@]}" -c "$root/src/server/$s.cc" -o "$o"
  fi
  objs+=("$o")
done
clang++ "${flags[@]}" -c "$root/tests/fuzz/request_fuzz.cc" -o "$out/request_fuzz.o"
libs=("$build/src/server/liblaissez_proto.a" "$build/src/oplog/liblaissez_oplog.a"
      "$build/src/market/liblaissez_market.a" "$build/src/topology/liblaissez_topology.a"
      "$build/src/common/liblaissez_common.a")
clang++ -fsanitize=fuzzer,address,undefined "$out/request_fuzz.o" "${objs[@]}" "${libs[@]}" \
  -o "$out/request_fuzz" \
  $(pkg-config --libs grpc++ protobuf cpp-httplib sqlite3 yaml-cpp simdjson) -lcrypto -lpthread
echo "fuzz: running for $seconds s" >&2
"$out/request_fuzz" -max_total_time="$seconds" -max_len=4096 -timeout=30 "$out/corpus"
