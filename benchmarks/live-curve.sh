#!/usr/bin/env bash
# Live delivery against the offered rate, default configuration (local-directory
# store with fsync): the maximum with 64 SSE readers attached (closed loop), then
# open-loop runs at fractions of it. Per run: end-to-end and acknowledgement
# latency, the acknowledgement split into the client's send lag and the time from the
# send, and what each record cost the server in CPU. Shows how far "half the
# maximum" is from half the load (docs/performance.md).
# A control run follows: the same server with `--store memory://` (no disk, no WAL
# threads, in-memory SQLite) at CONTROL_FRACTION (0.5) of the local store's maximum,
# to show how much of the live tail at that rate the storage path accounts for
# (CONTROL_FRACTION= to skip it).
# Output: results/live-curve.txt (+ JSON reports in results/json/live-curve/).
#
#   benchmarks/live-curve.sh
#   FRACTIONS="0.1 0.5" benchmarks/live-curve.sh
source "$(dirname "$0")/lib.sh"
build_picomq
OUT="$RESULTS/live-curve.txt"
JSON="$RESULTS/json/live-curve"
mkdir -p "$JSON"
FRACTIONS=${FRACTIONS:-"0.25 0.5 0.75"}
CONTROL_FRACTION=${CONTROL_FRACTION-0.5}
SHAPE="--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 15s --warmup 3s --live sse"

{
  echo "# Live delivery vs offered rate (64 streams, one SSE reader each, 1 KiB records)"
  machine_note
  echo
  # The yardstick of the live target (2 store writes + 5 ms), on the servers' disk.
  python3 "$BENCH_DIR/store-write.py" "$(mktemp -d "$WORK/store-write.XXXXXX")" 100
  echo "settings: picomq bench $SHAPE; 'max' is closed loop, the others --rate"
  echo
} | tee "$OUT"

port=$(free_port)
start_picomq "$port"
files=("$JSON/max.json")
# shellcheck disable=SC2086
bench "$JSON/max.json" "$port" "live, max" $SHAPE
max=$(node -e 'console.log(Math.round(JSON.parse(require("fs").readFileSync(process.argv[1])).append.records_per_s))' "$JSON/max.json")
for f in $FRACTIONS; do
  rate=$(node -e 'console.log(Math.round(process.argv[1] * process.argv[2]))' "$max" "$f")
  # shellcheck disable=SC2086
  bench "$JSON/at-$f.json" "$port" "live, $f x max" $SHAPE --rate "$rate"
  files+=("$JSON/at-$f.json")
done
stop_server
if [ -n "$CONTROL_FRACTION" ]; then
  rate=$(node -e 'console.log(Math.round(process.argv[1] * process.argv[2]))' "$max" "$CONTROL_FRACTION")
  port=$(free_port)
  start_picomq "$port" --store memory://
  # shellcheck disable=SC2086
  bench "$JSON/memory-at-$CONTROL_FRACTION.json" "$port" "memory store, $CONTROL_FRACTION x max" $SHAPE --rate "$rate"
  files+=("$JSON/memory-at-$CONTROL_FRACTION.json")
  stop_server
fi

node -e '
  const rows = process.argv.slice(1).map(p => JSON.parse(require("fs").readFileSync(p, "utf8")))
  const f = (v, d = 1) => v == null ? "-" : (+v).toFixed(d)
  const head = ["run", "rec/s", "e2e p50", "e2e p99", "ack p99", "send lag p99", "from send p99",
    "server us/rec", "server cores", "PUTs/s", "PUT mean ms", "WAL commit p99", "client cores",
    "machine idle"]
  console.log(head.join("\t"))
  for (const r of rows) {
    const a = r.append, e = (r.end_to_end || {}).latency_ms || {}, s = r.server || {}
    const cores = s.cpu_s == null ? null : s.cpu_s / r.workload.duration_s
    console.log([r.label, f(a.records_per_s, 0), f(e.p50), f(e.p99), f(a.ack_latency_ms.p99),
      f((a.send_lag_ms || {}).p99), f((a.from_send_ms || {}).p99),
      f(s.cpu_s_per_million_records), f(cores, 2), f(s.store_puts_per_s, 0),
      f(s.store_put_ms_mean, 2), f(s.wal_commit_ms_p99), f(r.client.cpu_cores_busy, 2),
      r.machine.cpu_idle_share == null ? "-" : f(r.machine.cpu_idle_share * 100, 0) + "%"].join("\t"))
  }
' "${files[@]}" | md_table | tee -a "$OUT"
{
  echo
  echo "(milliseconds; server cores = server CPU seconds / measured seconds, warm-up excluded;"
  echo " WAL commit p99 from the server metrics buckets: an op entering the buffer until durable;"
  echo " machine idle: the whole machine's idle share over the measured window, /proc/stat;"
  echo " 'memory store': --store memory://, no disk writes, at that fraction of the local store's max)"
} | tee -a "$OUT"
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
