#!/usr/bin/env bash
# The write budget: with 20 ms injected store latency, sweep the offered append
# rate from 1/s up to the maximum and record achieved rate, object-store PUTs/s and
# ack latency, once without a budget and once with --max-writes-per-sec 20.
# Output: results/write-budget.txt
#
#   benchmarks/write-budget.sh
source "$(dirname "$0")/lib.sh"
build_picomq
OUT="$RESULTS/write-budget.txt"
JSON="$RESULTS/json/write-budget"
mkdir -p "$JSON"
RATES=${RATES:-"1 10 100 1000 10000 30000"}
SHAPE="--record-bytes 1024 --streams 64 --in-flight 512"

{
  echo "# Write budget: append rate vs object-store PUTs/s vs ack latency (20 ms per store request)"
  machine_note
  echo "shape: picomq bench $SHAPE, each point 10 s after 2 s warm-up (30 s for rates below 10/s); 'max' = closed loop"
  echo "PUTs/s counts every object-store PUT (WAL objects and metadata checkpoints)"
  echo
} | tee "$OUT"

for budget in none 20; do
  flags=(--store-latency 20ms)
  [ "$budget" != none ] && flags+=(--max-writes-per-sec "$budget")
  port=$(free_port)
  start_picomq "$port" "${flags[@]}"
  files=()
  for rate in $RATES max; do
    f="$JSON/budget-$budget-rate-$rate.json"
    dur=10s
    case $rate in 1 | 2 | 5) dur=30s ;; esac
    if [ "$rate" = max ]; then
      # shellcheck disable=SC2086
      bench "$f" "$port" "budget $budget, max" $SHAPE --duration $dur --warmup 2s
    else
      # shellcheck disable=SC2086
      bench "$f" "$port" "budget $budget, $rate/s" $SHAPE --rate "$rate" --duration $dur --warmup 2s
    fi
    files+=("$f")
  done
  stop_server
  {
    echo "## picomq serve ${flags[*]}"
    "$PICOMQ" bench curve "${files[@]}"
    echo
  } | tee -a "$OUT"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
