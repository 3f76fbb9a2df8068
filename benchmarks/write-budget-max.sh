#!/usr/bin/env bash
# The write budget at the maximum append rate: closed-loop runs (20 ms injected
# store latency) alternating a fresh server without a budget and one with
# --max-writes-per-sec 20, REPEAT pairs at each in-flight count. At 512 in flight
# the client is bound by latency (throughput ~ in-flight / ack latency), so the
# batching wait the budget adds shows up as throughput. Where the server's CPU is
# the limit the figure is the server's maximum: 2,048 in flight on a slow host,
# 8,192 on a faster one (2,048 was still latency-bound on the host of 2026-12-01).
# Output: results/write-budget-max.txt
#
#   benchmarks/write-budget-max.sh        # REPEAT=3 IN_FLIGHT="512 2048 8192"
source "$(dirname "$0")/lib.sh"
build_picomq
OUT="$RESULTS/write-budget-max.txt"
JSON="$RESULTS/json/write-budget-max"
mkdir -p "$JSON"
REPEAT=${REPEAT:-3}
IN_FLIGHT=${IN_FLIGHT:-"512 2048 8192"}
SHAPE="--record-bytes 1024 --streams 64 --duration 10s --warmup 3s"

{
  echo "# Write budget: maximum append rate with and without --max-writes-per-sec 20 (20 ms per store request)"
  machine_note
  echo "shape: picomq bench $SHAPE, closed loop, a fresh server per run, configurations alternating"
  echo "PUTs/s counts every object-store PUT (WAL objects and metadata checkpoints)"
  echo
} | tee "$OUT"

for inflight in $IN_FLIGHT; do
  files=()
  for i in $(seq "$REPEAT"); do
    for budget in none 20; do
      flags=(--store-latency 20ms)
      [ "$budget" != none ] && flags+=(--max-writes-per-sec "$budget")
      port=$(free_port)
      start_picomq "$port" "${flags[@]}"
      f="$JSON/in-flight-$inflight-budget-$budget-run-$i.json"
      # shellcheck disable=SC2086
      bench "$f" "$port" "budget $budget, run $i" $SHAPE --in-flight "$inflight"
      stop_server
      files+=("$f")
    done
  done
  {
    echo "## $inflight in flight"
    "$PICOMQ" bench curve "${files[@]}"
    echo
  } | tee -a "$OUT"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
