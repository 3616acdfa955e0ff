#!/usr/bin/env bash
# `laissez bench server` for half a second per transport against a fresh
# server: one JSON document with the documented fields, acknowledged
# updates, no errors and an empty first_error. Not a speed test (nor a
# durability test: crash_recovery is).
set -euo pipefail
build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    *) echo "bench_server_smoke.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$build" ] || { echo "bench_server_smoke.sh: --build DIR is required" >&2; exit 2; }
laissez="$build/laissez"
work=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$laissez" serve --db "$work/m.db" --listen 127.0.0.1:0 --rate-limit 0 --init 2>"$work/server.log" &
server_pid=$!
addr=""
for _ in $(seq 1 200); do
  port=$(sed -n 's/.*(gRPC port \([0-9]*\)).*/\1/p' "$work/server.log" | head -1)
  if [ -n "$port" ] && [ -s "$work/m.db.admin-token" ]; then addr="127.0.0.1:$port"; break; fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.05
done
[ -n "$addr" ] || { echo "bench_server_smoke.sh: server did not start:" >&2; cat "$work/server.log" >&2; exit 1; }

check() {  # FILE MODE [RATE]: the JSON of one run
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
want = sys.argv[2]
for k in ("updates_per_sec", "p50_ms", "p99_ms", "p999_ms", "durable", "mode", "window", "batch", "tenants",
          "seconds", "acknowledged", "errors", "first_error", "loadgen_cpu_cores", "loadgen_cpu_share", "machine_cores"):
    assert k in d, f"missing field {k}: {d}"
assert d["mode"] == want, d["mode"]
rate = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
assert d["offered_per_sec"] == rate, d
assert d["latency_from"] == ("scheduled send time" if rate > 0 else "send"), d
if rate > 0:
    # Open loop: the schedule sets how many are sent, every message due within the run however
    # late (all acknowledged: errors are 0 below), so rate x seconds to within a message a tenant.
    expected = rate * 0.5
    assert abs(d["acknowledged"] - expected) <= d["batch"] * d["tenants"], (expected, d)
    # How late the messages left: never before their time, and no later than the run lasted.
    assert 0 <= d["send_late_p50_ms"] <= d["send_late_p99_ms"] <= 1000 * d["seconds"], d
else:
    assert "send_late_p99_ms" not in d, d
assert d["acknowledged"] > 0 and d["updates_per_sec"] > 0, d
assert d["errors"] == 0 and d["first_error"] == "", d
assert 0 < d["p50_ms"] <= d["p99_ms"] <= d["p999_ms"], d
print(f"{want}: {d['acknowledged']} acknowledged, no errors")
PY
}
"$laissez" bench server --server "$addr" --token-file "$work/m.db.admin-token" --tenants 2 --seconds 0.5 \
  --window 4 --batch 2 --json > "$work/stream.json"
check "$work/stream.json" "bidirectional StreamUpdates"
"$laissez" bench server --server "$addr" --token-file "$work/m.db.admin-token" --tenants 2 --seconds 0.5 \
  --mode unary --json > "$work/unary.json"
check "$work/unary.json" "unary UpdateOrder"
"$laissez" bench server --server "$addr" --token-file "$work/m.db.admin-token" --tenants 2 --seconds 0.5 \
  --window 16 --batch 4 --rate 2000 --json > "$work/open.json"
check "$work/open.json" "bidirectional StreamUpdates" 2000

# An open-loop schedule is refused where it cannot be kept, naming the flag.
refused() {  # WANT_FLAG ARGS...: exit 2, and the error names the flag
  want="$1"; shift
  set +e
  "$laissez" bench server --server "$addr" --token-file "$work/m.db.admin-token" --seconds 0.5 "$@" --json \
    > "$work/refused.json" 2>/dev/null
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || { echo "bench server $*: exit $rc, want 2" >&2; exit 1; }
  grep -q "\"message\":\"$want" "$work/refused.json" || { echo "bench server $*: error does not name $want:" >&2; cat "$work/refused.json" >&2; exit 1; }
}
refused --rate --mode unary --rate 100
refused --batch --window 4 --batch 8 --rate 100
refused --rate --rate 0.5
echo "open loop refused where it cannot be kept"
