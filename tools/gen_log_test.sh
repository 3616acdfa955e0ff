#!/usr/bin/env bash
# `laissez gen-log`: the same options give the same bytes, the log replays with no invalid
# line, a different seed gives another log, and bad options are refused naming the option.
# Usage: gen_log_test.sh PATH_TO_LAISSEZ
set -euo pipefail
laissez=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

opts=(--seed 7 --operations 3000 --nodes 40 --tenants 8 --operator-permille 50 --bad-permille 20)
"$laissez" gen-log "${opts[@]}" --out "$dir/a.oplog"
"$laissez" gen-log "${opts[@]}" > "$dir/b.oplog"
cmp -s "$dir/a.oplog" "$dir/b.oplog" || fail "the same options gave different logs (--out vs stdout)"
lines=$(wc -l < "$dir/a.oplog")
[ "$lines" -gt 3000 ] || fail "expected more than 3000 lines (setup + calls), got $lines"

"$laissez" replay "$dir/a.oplog" --events-out "$dir/a.events" --json > "$dir/summary.json"
python3 - "$dir/summary.json" "$lines" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
lines = int(sys.argv[2])
assert s["lines"] == lines, (s["lines"], lines)
assert s["invalid_skipped"] == 0, s
assert s["operations"] == lines, s
assert s["rejected"] > 0, "the log was asked for 2% bad calls: " + str(s)
PY
[ -s "$dir/a.events" ] || fail "the replay wrote no events"
# The events file is written in 1 MiB blocks, each line formatted in place: this one
# is larger than a block, so every line must still be whole JSON, one per event.
python3 - "$dir/summary.json" "$dir/a.events" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
data = open(sys.argv[2], "rb").read()
assert len(data) > (1 << 20), "the events file fits one block: %d bytes" % len(data)
assert data.endswith(b"\n"), "the events file does not end with a newline"
lines = data.split(b"\n")[:-1]
assert len(lines) == s["events"], (len(lines), s["events"])
for i, line in enumerate(lines):
    e = json.loads(line)
    assert e["v"] == 1 and "event" in e and "t" in e, (i, line)
PY

"$laissez" gen-log --seed 8 --operations 3000 --nodes 40 --tenants 8 --out "$dir/c.oplog"
cmp -s "$dir/a.oplog" "$dir/c.oplog" && fail "another seed gave the same log"

for bad in "--nodes 0" "--tenants 0" "--operator-permille 1001" "--bad-permille -1" "--operations x"; do
  opt=${bad%% *}
  if "$laissez" gen-log $bad --out "$dir/bad.oplog" 2> "$dir/err"; then fail "gen-log $bad was accepted"; fi
  grep -q -- "$opt" "$dir/err" || fail "gen-log $bad: the error does not name $opt: $(cat "$dir/err")"
done
if "$laissez" gen-log --out "$dir/no/such/dir/x.oplog" 2> "$dir/err"; then fail "an unwritable --out was accepted"; fi
grep -q -- "--out" "$dir/err" || fail "unwritable --out: the error does not name --out"
# The output is opened before the log is generated: with the largest log (minutes of CPU
# to generate) and a CPU limit of 10 s, a bad --out is still refused naming --out.
if (ulimit -t 10; "$laissez" gen-log --operations 10000000 --out "$dir/no/such/dir/x.oplog") 2> "$dir/err"; then
  fail "an unwritable --out was accepted (largest log)"
fi
grep -q -- "--out" "$dir/err" || fail "unwritable --out (largest log): refused late, not naming --out: $(cat "$dir/err")"
echo "gen-log: all checks passed"
