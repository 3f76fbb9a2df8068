#!/usr/bin/env bash
# The PicoMQ performance targets on this machine, default configuration
# (local-directory store with fsync, SQLite), then the same runs with 20 ms of
# injected latency on every object-store request (what S3 looks like).
# Output: results/targets.txt (+ JSON reports in results/json/targets/).
#
#   benchmarks/targets.sh
source "$(dirname "$0")/lib.sh"
build_picomq
OUT="$RESULTS/targets.txt"
JSON="$RESULTS/json/targets"
mkdir -p "$JSON"

fig() { # FILE JSON-PATH (dots) -> number or "-"
  node -e '
    let v = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))
    for (const k of process.argv[2].split(".")) v = v == null ? null : v[k]
    console.log(v == null ? "-" : (typeof v === "number" ? +v.toFixed(3) : v))
  ' "$1" "$2"
}

LONE="--record-bytes 100 --streams 1 --in-flight 1 --rate 5 --duration 20s --warmup 1s"
MANY="--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 15s --warmup 3s"
BATCHED="--record-bytes 100 --batch 10 --streams 4 --in-flight 256 --duration 15s --warmup 3s"

run_set() { # TAG [serve flags...]
  local tag=$1
  shift
  local port
  port=$(free_port)
  start_picomq "$port" "$@"
  # shellcheck disable=SC2086
  bench "$JSON/$tag-lone.json" "$port" "$tag lone" $LONE
  # shellcheck disable=SC2086
  bench "$JSON/$tag-many.json" "$port" "$tag 1KiB x1 x64 streams" $MANY
  # The same over HTTP/2 (h2c): the 512 requests in flight share 4 connections, so
  # the kernel's per-request socket work is shared too.
  # shellcheck disable=SC2086
  bench "$JSON/$tag-many-h2.json" "$port" "$tag 1KiB x1 x64 streams, HTTP/2" $MANY --http2 --connections 4
  # shellcheck disable=SC2086
  bench "$JSON/$tag-batched.json" "$port" "$tag 100B x10 x4 streams" $BATCHED
  # Live delivery at half the maximum measured above, same shape, one SSE reader
  # per stream. Two readings of "the maximum": the append maximum without readers
  # (`live`), and the maximum of this same workload with its 64 readers attached
  # (`live-max`, closed loop), whose half is `live-half`.
  local max half
  max=$(fig "$JSON/$tag-many.json" append.records_per_s)
  half=$(node -e "console.log(Math.max(1, Math.round($max / 2)))")
  # shellcheck disable=SC2086
  bench "$JSON/$tag-live.json" "$port" "$tag live at half max" $MANY --rate "$half" --live sse
  # shellcheck disable=SC2086
  bench "$JSON/$tag-live-max.json" "$port" "$tag live, max with readers" $MANY --live sse
  max=$(fig "$JSON/$tag-live-max.json" append.records_per_s)
  half=$(node -e "console.log(Math.max(1, Math.round($max / 2)))")
  # shellcheck disable=SC2086
  bench "$JSON/$tag-live-half.json" "$port" "$tag live at half its own max" $MANY --rate "$half" --live sse
  stop_server
  {
    echo "## $tag: picomq serve $*"
    for r in lone many many-h2 batched live live-max live-half; do
      echo "### $r: $(fig "$JSON/$tag-$r.json" label)"
      node -e '
        const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))
        const w = r.workload, a = r.append || {}, l = a.ack_latency_ms || {}, e = (r.end_to_end || {}).latency_ms, s = r.server
        const f = (v, d = 2) => v == null ? "-" : (+v).toFixed(d)
        console.log(`settings: ${w.record_bytes} B x ${w.records_per_request}/request, ${w.streams} streams, ${w.in_flight} in flight on ${w.connections} HTTP/${w.http ?? "1.1"} connections, rate ${w.target_records_per_s ?? "max"}, ${w.duration_s}s (+${w.warmup_s}s warm-up), live ${w.live}`)
        console.log(`append: ${f(a.records_per_s, 0)} records/s, ${f(a.mib_per_s, 1)} MiB/s, errors ${a.errors}`)
        console.log(`ack ms: p50 ${f(l.p50)} p90 ${f(l.p90)} p99 ${f(l.p99)} p99.9 ${f(l.p999)} max ${f(l.max)}`)
        const g = a.send_lag_ms, t = a.from_send_ms
        if (g && t) console.log(`  send lag ms (due -> sent): p50 ${f(g.p50)} p99 ${f(g.p99)} max ${f(g.max)}; from send ms: p50 ${f(t.p50)} p99 ${f(t.p99)} max ${f(t.max)}`)
        if (e) console.log(`e2e ms: p50 ${f(e.p50)} p90 ${f(e.p90)} p99 ${f(e.p99)} p99.9 ${f(e.p999)} max ${f(e.max)}`)
        console.log(`server: store PUT mean ${f(s.store_put_ms_mean, 3)} ms, PUTs/s ${f(s.store_puts_per_s, 1)}, PUTs per 1,000 records ${f(s.store_puts_per_1000_records, 3)}, CPU ${f(s.cpu_s)} s, RSS peak ${f(s.rss_mb_peak_sampled, 1)} MiB; client ${f(r.client.cpu_cores_busy)} cores busy`)
        if (s.append_ms_p50 != null) console.log(`server ms (from /metrics buckets): append p50 ${f(s.append_ms_p50)} p99 ${f(s.append_ms_p99)}, WAL commit p50 ${f(s.wal_commit_ms_p50)} p99 ${f(s.wal_commit_ms_p99)}, store PUT p99 ${f(s.store_put_ms_p99)}`)
        const m = r.machine, pct = (v) => v == null ? "-" : (v * 100).toFixed(1) + "%"
        console.log(`load (1 min): ${f(m.load_1m_before)} before, ${f(m.load_1m_after)} after; machine over the window: idle ${pct(m.cpu_idle_share)}, steal ${pct(m.cpu_steal_share)}`)
      ' "$JSON/$tag-$r.json"
      echo
    done
  } | tee -a "$OUT"
}

{
  echo "# PicoMQ targets"
  machine_note
  echo
  # The yardstick of the lone-append target, on the disk the servers use.
  python3 "$BENCH_DIR/store-write.py" "$(mktemp -d "$WORK/store-write.XXXXXX")" 100
  echo
} | tee "$OUT"
run_set default
run_set s3-like --store-latency 20ms
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
