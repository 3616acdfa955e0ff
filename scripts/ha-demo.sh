#!/usr/bin/env bash
# A local replicated market to try (docs/HA.md): three etcd members and three
# `laissez serve --etcd` replicas on loopback, the example cluster, until
# Ctrl-C, which stops them all. State lives in a temporary directory (kept
# when HA_DEMO_DIR is given, so a second run continues the same market).
#
# Usage: scripts/ha-demo.sh [BUILD_DIR]      (make ha-demo)
# HA_DEMO_FLAGS: more `laissez serve` flags for every replica (e.g. --rate-limit 0).
# Ports: etcd clients 23791-23793, peers 23801-23803; replicas gRPC
# 50061-50063, HTTP 8091-8093.
set -euo pipefail
build="${1:-build}"
root="$(cd "$(dirname "$0")/.." && pwd)"
laissez="$build/laissez"
[ -x "$laissez" ] || laissez="$root/$build/laissez"
[ -x "$laissez" ] || { echo "ha-demo: no laissez binary in $build (make build)" >&2; exit 2; }
command -v etcd >/dev/null || { echo "ha-demo: etcd not found (scripts/install-deps.sh installs etcd-server)" >&2; exit 2; }
dir="${HA_DEMO_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/laissez-ha-demo.XXXXXX")}"
mkdir -p "$dir"
pids=()
cleanup() {
  # SIGTERM to all; an etcd member left without quorum may not exit
  # on SIGTERM, so whatever is left after 5 s gets SIGKILL.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${HA_DEMO_DIR:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT INT TERM

cluster="m1=http://127.0.0.1:23801,m2=http://127.0.0.1:23802,m3=http://127.0.0.1:23803"
for i in 1 2 3; do
  etcd --name "m$i" --data-dir "$dir/etcd$i" \
    --listen-client-urls "http://127.0.0.1:2379$i" --advertise-client-urls "http://127.0.0.1:2379$i" \
    --listen-peer-urls "http://127.0.0.1:2380$i" --initial-advertise-peer-urls "http://127.0.0.1:2380$i" \
    --initial-cluster "$cluster" --initial-cluster-token laissez-ha-demo >"$dir/etcd$i.log" 2>&1 &
  pids+=($!)
done
endpoints="127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793"
for i in 1 2 3; do
  "$laissez" serve --etcd "$endpoints" --listen "127.0.0.1:5006$i" --http "127.0.0.1:809$i" \
    --admin-token-file "$dir/admin-token" --cluster "$root/scenarios/clusters/small.yaml" ${HA_DEMO_FLAGS:-} \
    >"$dir/replica$i.log" 2>&1 &
  pids+=($!)
  [ "$i" = 1 ] && for _ in $(seq 1 100); do [ -s "$dir/admin-token" ] && break; sleep 0.1; done
done
for _ in $(seq 1 100); do [ -s "$dir/admin-token" ] && break; sleep 0.1; done
[ -s "$dir/admin-token" ] || { echo "ha-demo: no leader came up; logs in $dir" >&2; cat "$dir"/replica1.log >&2; exit 1; }
servers="127.0.0.1:50061,127.0.0.1:50062,127.0.0.1:50063"
cat <<MSG
ha-demo: three etcd members and three replicas are up (logs and data in $dir).
  Who leads:      curl -s 127.0.0.1:8091/healthz 127.0.0.1:8092/healthz 127.0.0.1:8093/healthz
  Try it:         $laissez tenant create acme --balance 100 --server $servers --token-file $dir/admin-token
                  $laissez nodes list --server $servers --token-file $dir/admin-token
  Kill the leader (kill -9 its pid from \`pgrep -af "laissez serve"\`) and call again: the CLI moves to
  the new leader. Ctrl-C stops everything.
MSG
wait
