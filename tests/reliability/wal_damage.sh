#!/usr/bin/env bash
# A lost or damaged write-ahead log must never turn into a silent new market.
# For each kind of damage: start the server on a fresh SQLite database, create a
# tenant and make acknowledged deposits, kill the server with SIGKILL (so the
# WAL still holds the commits), damage the WAL, restart, and check that the
# server refuses to start with a clear error and leaves the admin-token file as
# it was. An undamaged restart is checked too, so the test cannot pass by
# refusing everything. With --store journal the same for the journal file
# (docs/SERVER.md, "The journal file"): the file deleted, its header zeroed,
# random bytes over its first frames.
#
# Usage: tests/reliability/wal_damage.sh [--build DIR] [--store sqlite|journal]
# Ends with "wal-damage: store=S cases=N refused=R"; exits non-zero on any failure.
set -euo pipefail

build=build
store=sqlite
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --store) store="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "wal_damage.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
root="$(cd "$(dirname "$0")/../.." && pwd)"
laissez="$build/laissez"
[ -x "$laissez" ] || laissez="$root/$build/laissez"
[ -x "$laissez" ] || { echo "wal_damage.sh: no laissez binary in $build" >&2; exit 2; }
case "$store" in
  sqlite) damages="none delete zero-header tail" ;;
  journal) damages="none delete zero-header frames" ;;
  *) echo "wal_damage.sh: --store: must be sqlite or journal (got '$store')" >&2; exit 2 ;;
esac

work="$(mktemp -d "${TMPDIR:-/tmp}/laissez-wal.XXXXXX")"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill -9 "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "wal_damage.sh: $*" >&2; [ -f "$log" ] && sed 's/^/  server: /' "$log" >&2; exit 1; }

# Starts the server in the background; sets $addr once it listens, or returns
# 1 if it exited (refused to start).
start_server() {
  : > "$log"
  "$laissez" serve --db "$db" --store "$store" --listen 127.0.0.1:0 --rate-limit 0 "$@" 2>>"$log" &
  server_pid=$!
  for _ in $(seq 1 400); do
    port=$(sed -n 's/.*(gRPC port \([0-9]*\)).*/\1/p' "$log" | head -1)
    if [ -n "$port" ]; then addr="127.0.0.1:$port"; return 0; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      wait "$server_pid" 2>/dev/null && rc=0 || rc=$?
      server_pid=""
      return 1
    fi
    sleep 0.05
  done
  fail "the server neither listened nor exited within 20 s"
}

kill_server() {
  kill -9 "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

cases=0
refused=0
for damage in $damages; do
  cases=$((cases + 1))
  dir="$work/$damage"
  mkdir -p "$dir"
  db="$dir/market.db"
  log="$dir/server.log"
  start_server --cluster "$root/scenarios/clusters/small.yaml" || fail "$damage: first start failed"
  "$laissez" tenant create acme --balance 100 --token-out "$dir/acme.token" \
    --server "$addr" --token-file "$db.admin-token" >/dev/null
  for i in 1 2 3; do
    "$laissez" tenant deposit acme --amount "$i" --server "$addr" --token-file "$db.admin-token" >/dev/null
  done
  cp "$db.admin-token" "$dir/admin-token.before"
  kill_server
  if [ "$store" = sqlite ]; then
    [ -s "$db-wal" ] || fail "$damage: no WAL after the kill; nothing to damage"
  else
    # The first frame's length, after the 4 KiB header: not zero once anything was committed.
    od -An -tx1 -j4096 -N4 "$db" | grep -q '[1-9a-f]' || fail "$damage: no frames after the kill; nothing to damage"
  fi
  case "$store/$damage" in
    */none) ;;
    sqlite/delete) rm -f "$db-wal" "$db-shm" ;;
    sqlite/zero-header) dd if=/dev/zero of="$db-wal" bs=32 count=1 conv=notrunc status=none ;;
    journal/delete) rm -f "$db" ;;
    journal/zero-header) dd if=/dev/zero of="$db" bs=4096 count=1 conv=notrunc status=none ;;
    journal/frames) dd if=/dev/urandom of="$db" bs=1 seek=4096 count=256 conv=notrunc status=none ;;
    sqlite/tail)
      size=$(stat -c %s "$db-wal")
      dd if=/dev/urandom of="$db-wal" bs=1 seek=$((size - 4096)) count=4096 conv=notrunc status=none
      ;;
  esac
  if start_server; then
    if [ "$damage" != none ]; then
      kill_server
      fail "$damage: the server started on a damaged database"
    fi
    # Undamaged: every acknowledged deposit is there (100 + 1 + 2 + 3 units).
    balance=$("$laissez" balance --json --server "$addr" --token-file "$dir/acme.token")
    grep -q '"balance": *106000000' <<<"$balance" || fail "none: lost deposits after a clean restart: $balance"
    kill_server
  else
    [ "$damage" != none ] || fail "none: the server refused an undamaged database"
    grep -q "write-ahead log\|was lost\|truncated, replaced or damaged\|not a laissez journal file" "$log" ||
      fail "$damage: the refusal does not say what was lost"
    refused=$((refused + 1))
    echo "wal-damage: $damage: refused: $(grep -o '\(DATA_LOSS\|FAILED_PRECONDITION\).*' "$log" | head -c 160)" >&2
  fi
  cmp -s "$db.admin-token" "$dir/admin-token.before" || fail "$damage: the admin-token file changed"
done
echo "wal-damage: store=$store cases=$cases refused=$refused"
[ "$refused" -eq $((cases - 1)) ]
