#!/usr/bin/env bash
# Crash recovery: start the server on a fresh database (SQLite, or the journal
# file with --store journal), drive concurrent load (tenants re-pricing
# orders, the admin depositing, holders being charged), kill the server with
# SIGKILL at N random points, restart it each time and check that every
# acknowledged mutation is present and money is conserved.
#
# Usage: tests/reliability/crash_recovery.sh [--points N] [--build DIR] [--seed S] [--store sqlite|journal]
# Ends with "crash-recovery: points=N acked=A lost=L"; exits non-zero if L > 0
# or money is not conserved after any restart.
set -euo pipefail

points=5
build=build
seed=$$
store=sqlite
while [ $# -gt 0 ]; do
  case "$1" in
    --points) points="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --store) store="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "crash_recovery.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
root="$(cd "$(dirname "$0")/../.." && pwd)"
laissez="$build/laissez"
[ -x "$laissez" ] || laissez="$root/$build/laissez"
[ -x "$laissez" ] || { echo "crash_recovery.sh: no laissez binary in $build" >&2; exit 2; }
py=/usr/bin/python3
RANDOM=$seed

work="$(mktemp -d "${TMPDIR:-/tmp}/laissez-crash.XXXXXX")"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -9 "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Python stubs from proto/, with Debian's grpc_tools.
mkdir -p "$work/gen"
$py -m grpc_tools.protoc -I"$root/proto" --python_out="$work/gen" --grpc_python_out="$work/gen" \
  "$root/proto/laissez/v1/market.proto"
touch "$work/gen/laissez/__init__.py" "$work/gen/laissez/v1/__init__.py"

db="$work/market.db"
start_server() {
  : > "$work/server.log"
  "$laissez" serve --db "$db" --store "$store" --listen 127.0.0.1:0 --rate-limit 0 --tick-ms 200 \
    ${cluster_flag:-} 2>>"$work/server.log" &
  server_pid=$!
  for _ in $(seq 1 200); do
    port=$(sed -n 's/.*(gRPC port \([0-9]*\)).*/\1/p' "$work/server.log" | head -1)
    [ -n "$port" ] && { addr="127.0.0.1:$port"; return 0; }
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "crash_recovery.sh: server did not start:" >&2
  cat "$work/server.log" >&2
  exit 1
}
driver() { $py "$root/tests/reliability/crash_driver.py" "$@" --gen "$work/gen" --state "$work/state.json"; }

cluster_flag="--cluster $root/scenarios/clusters/small.yaml"
start_server
cluster_flag=""
driver setup --server "$addr" --admin-token-file "$db.admin-token" --tenants 4

acked=0
lost=0
failed=0
for p in $(seq 1 "$points"); do
  # Load runs 4 s; the kill lands at a random instant 0-1 s after the
  # driver's first acknowledged update.
  rm -f "$work/state.json.running"
  driver load --server "$addr" --seconds 4 &
  load_pid=$!
  for _ in $(seq 1 300); do
    [ -e "$work/state.json.running" ] && break
    sleep 0.05
  done
  sleep "0.$(( RANDOM % 10 ))$(( RANDOM % 10 ))"
  kill -9 "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
  wait "$load_pid"
  if [ -n "${CRASH_DEBUG:-}" ]; then cat "$work/state.json" >&2; echo >&2; fi
  start_server
  if out=$(driver check --server "$addr"); then :; else failed=1; fi
  echo "crash-recovery: point $p: $out" >&2
  a=$(sed -n 's/.*acked=\([0-9]*\).*/\1/p' <<<"$out")
  l=$(sed -n 's/.*lost=\([0-9]*\).*/\1/p' <<<"$out")
  acked=${a:-0}
  lost=$(( lost + ${l:-1} ))
done
kill "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
server_pid=""
echo "crash-recovery: points=$points acked=$acked lost=$lost"
[ "$lost" -eq 0 ] && [ "$failed" -eq 0 ]
