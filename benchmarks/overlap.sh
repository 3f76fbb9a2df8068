#!/usr/bin/env bash
# --wal-overlap-after on S3-like latency (20 ms injected per store request): the
# same live workload (64 streams, one SSE reader each, 1 KiB records) at a fixed
# rate and closed loop, on fresh servers without and with the flag, alternating.
# Output: results/overlap.txt (+ JSON reports in results/json/overlap/).
#
#   benchmarks/overlap.sh
#   OVERLAP=5ms RATE=5700 REPEAT=2 benchmarks/overlap.sh
source "$(dirname "$0")/lib.sh"
build_picomq
OUT="$RESULTS/overlap.txt"
JSON="$RESULTS/json/overlap"
mkdir -p "$JSON"
OVERLAP=${OVERLAP:-10ms}
RATE=${RATE:-5700}
REPEAT=${REPEAT:-2}
SHAPE="--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 15s --warmup 3s --live sse"

{
  echo "# --wal-overlap-after $OVERLAP with 20 ms per store request"
  machine_note
  echo "settings: picomq bench $SHAPE; at --rate $RATE and closed loop ('max'); $REPEAT alternating pairs"
  echo
} | tee "$OUT"

files=()
for i in $(seq 1 "$REPEAT"); do
  for mode in off on; do
    flags=(--store-latency 20ms)
    [ "$mode" = on ] && flags+=(--wal-overlap-after "$OVERLAP")
    for rate in "$RATE" max; do
      port=$(free_port)
      start_picomq "$port" "${flags[@]}"
      f="$JSON/$mode-$rate-$i.json"
      if [ "$rate" = max ]; then
        # shellcheck disable=SC2086
        bench "$f" "$port" "overlap $mode, max, run $i" $SHAPE
      else
        # shellcheck disable=SC2086
        bench "$f" "$port" "overlap $mode, $rate/s, run $i" $SHAPE --rate "$rate"
      fi
      stop_server
      files+=("$f")
    done
  done
done

node -e '
  const rows = process.argv.slice(1).map(p => JSON.parse(require("fs").readFileSync(p, "utf8")))
  const f = (v, d = 1) => v == null ? "-" : (+v).toFixed(d)
  const head = ["run", "rec/s", "ack p50", "ack p99", "e2e p99", "PUTs/s", "PUTs/1k rec", "server us/rec"]
  console.log(head.join("\t"))
  for (const r of rows) {
    const a = r.append, e = (r.end_to_end || {}).latency_ms || {}, s = r.server || {}
    console.log([r.label, f(a.records_per_s, 0), f(a.ack_latency_ms.p50), f(a.ack_latency_ms.p99), f(e.p99),
      f(s.store_puts_per_s), f(s.store_puts_per_1000_records, 2), f(s.cpu_s_per_million_records)].join("\t"))
  }
' "${files[@]}" | md_table | tee -a "$OUT"
printf '\n(milliseconds; PUTs/s counts every object-store PUT)\n' | tee -a "$OUT"
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
