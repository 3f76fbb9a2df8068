#!/usr/bin/env bash
# Anatomy of the live tail: live appends at RATE with 64 SSE readers (the live
# target's shape), every request traced (`picomq bench --trace`) while perf times the
# server's fdatasync calls on the same clock. For each run, stalls.py prints the runs
# of requests slower than the p99 and the slowest fdatasync under way during each
# (or in the 100 ms before it), and the machine's steal and idle shares over it
# (benchmarks/cpu-sample.py). Default configuration, a fresh server per run.
# Needs perf (Debian: linux-perf) and the right to trace (root, or
# kernel.perf_event_paranoid <= 1 with access to tracefs).
# Output: results/stalls.txt (+ JSON reports in results/json/stalls/).
#
#   benchmarks/stalls.sh
#   RATE=18000 RUNS=5 benchmarks/stalls.sh
source "$(dirname "$0")/lib.sh"
command -v perf >/dev/null || { echo "stalls.sh needs perf (Debian: apt install linux-perf)" >&2; exit 1; }
build_picomq
OUT="$RESULTS/stalls.txt"
JSON="$RESULTS/json/stalls"
mkdir -p "$JSON"
RATE=${RATE:-15000}
RUNS=${RUNS:-3}
SHAPE="--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 15s --warmup 3s --live sse --rate $RATE"

{
  echo "# Where the live tail comes from: slow requests by time, against the WAL's fdatasyncs"
  machine_note
  echo
  python3 "$BENCH_DIR/store-write.py" "$(mktemp -d "$WORK/store-write.XXXXXX")" 100
  echo "settings: picomq bench $SHAPE --trace; perf record -k CLOCK_MONOTONIC -e syscalls:sys_{enter,exit}_fdatasync -p SERVER"
} | tee "$OUT"

for i in $(seq "$RUNS"); do
  port=$(free_port)
  start_picomq "$port"
  perf record -q -k CLOCK_MONOTONIC -e syscalls:sys_enter_fdatasync \
    -e syscalls:sys_exit_fdatasync -p "$SERVER_PID" -o "$WORK/stalls-$i.perf" 2>/dev/null &
  perf_pid=$!
  PIDS+=("$perf_pid")
  python3 "$BENCH_DIR/cpu-sample.py" "$WORK/stalls-$i.cpu" 25 &
  sampler_pid=$!
  PIDS+=("$sampler_pid")
  sleep 1 # perf attached before the first request
  # shellcheck disable=SC2086
  bench "$JSON/run-$i.json" "$port" "stalls $i" $SHAPE --trace "$WORK/stalls-$i.trace"
  kill -INT "$perf_pid"
  wait "$perf_pid" 2>/dev/null || true
  kill "$sampler_pid" 2>/dev/null || true
  wait "$sampler_pid" 2>/dev/null || true
  stop_server
  perf script -i "$WORK/stalls-$i.perf" -F tid,time,event >"$WORK/stalls-$i.syncs" 2>/dev/null
  {
    echo
    echo "## run $i"
    python3 "$BENCH_DIR/stalls.py" "$WORK/stalls-$i.trace" 20 --syncs "$WORK/stalls-$i.syncs" \
      --cpu "$WORK/stalls-$i.cpu"
  } | tee -a "$OUT"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
