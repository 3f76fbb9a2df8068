#!/usr/bin/env bash
# Where the server's CPU goes at a target: `perf record` (DWARF call stacks) of
# `picomq serve` while `picomq bench` drives it, folded with inferno (installed from
# crates.io at first run into ~/.cache/picomq-bench/inferno) and drawn as a flame
# graph. Also writes the heaviest frames (inclusive share of samples) as text.
# Output: results/profile-$NAME.svg and results/profile-$NAME.txt.
#
#   benchmarks/profile.sh                     # the 1 KiB x 64 streams x 512 in flight target
#   NAME=batched WORKLOAD="--record-bytes 100 --batch 10 --streams 4 --in-flight 256" benchmarks/profile.sh
source "$(dirname "$0")/lib.sh"
NAME=${NAME:-many}
WORKLOAD=${WORKLOAD:-"--record-bytes 1024 --batch 1 --streams 64 --in-flight 512"}
SECONDS_PROFILED=${SECONDS_PROFILED:-8}
FREQ=${FREQ:-499}
INFERNO=${INFERNO_DIR:-$HOME/.cache/picomq-bench/inferno}

command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }
build_picomq
if [ ! -x "$INFERNO/bin/inferno-flamegraph" ]; then
  log "installing inferno into $INFERNO"
  cargo install --quiet --locked --root "$INFERNO" inferno >&2
fi

port=$(free_port)
start_picomq "$port"
# The bench runs past the profiled window on both sides: warm-up before, slack after.
total=$((SECONDS_PROFILED + 8))
# shellcheck disable=SC2086
bench "$WORK/bench.json" "$port" "profile $NAME" $WORKLOAD --duration "${total}s" --warmup 1s --quiet &
bench_pid=$!
sleep 4
log "perf record -F $FREQ --call-graph dwarf for ${SECONDS_PROFILED}s (pid $SERVER_PID)"
perf record -q -F "$FREQ" --call-graph dwarf,32768 -p "$SERVER_PID" -o "$WORK/perf.data" \
  -- sleep "$SECONDS_PROFILED" 2>/dev/null
wait "$bench_pid"
stop_server
log "folding stacks (perf script; this takes a minute)"
perf script -i "$WORK/perf.data" 2>/dev/null | "$INFERNO/bin/inferno-collapse-perf" > "$WORK/folded.txt"
# Frames narrower than 0.5 px are left out: ~300 KB instead of 2 MB.
"$INFERNO/bin/inferno-flamegraph" --minwidth 0.5 --title "picomq serve: $NAME ($WORKLOAD)" \
  < "$WORK/folded.txt" > "$RESULTS/profile-$NAME.svg"
{
  echo "# picomq serve under picomq bench $WORKLOAD"
  machine_note
  echo "perf: cpu-clock samples at ${FREQ} Hz for ${SECONDS_PROFILED}s, DWARF stacks; flame graph: profile-$NAME.svg"
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))
    const s = r.server || {}
    console.log(`bench: ${Math.round(r.append.records_per_s)} records/s over the whole run, ack p99 ${r.append.ack_latency_ms.p99.toFixed(1)} ms; server CPU ${(s.cpu_s ?? 0).toFixed(1)} s`)
  ' "$WORK/bench.json"
  echo
  python3 - "$WORK/folded.txt" <<'PY'
import sys, collections
total = 0
incl, leaf = collections.Counter(), collections.Counter()
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    stack, _, n = line.rstrip("\n").rpartition(" ")
    if not n.isdigit():
        continue
    n = int(n)
    total += n
    frames = stack.split(";")
    leaf[frames[-1]] += n
    for frame in set(frames):
        incl[frame] += n
print("Self share (the frame on CPU), top 30:")
for frame, n in leaf.most_common(30):
    print(f"{100 * n / total:6.2f}%  {frame[:160]}")
print("\nInclusive share (frame anywhere in the stack), top 60 below 70% (above it: thread")
print("starts and the runtime's task harness):")
shown = [(f, n) for f, n in incl.most_common() if n < 0.7 * total][:60]
for frame, n in shown:
    print(f"{100 * n / total:6.2f}%  {frame[:160]}")
PY
} | tee "$RESULTS/profile-$NAME.txt"
