#!/usr/bin/env bash
# Two builds side by side on the same workloads, alternating fresh servers so both
# see the same hours of the VM: the 1 KiB x 64 streams x 512 in-flight maximum
# (appends/s, ack p99, server CPU, VmHWM) and a lone append at 5/s (ack p50), ROUNDS
# times each. Output: results/ab.txt, one table, and every run's JSON in
# results/json/ab/.
#
#   benchmarks/ab.sh OLD_BIN NEW_BIN [ROUNDS]        (NAME=ab-x: results/ab-x.txt)
#
# MANY replaces the main load's `picomq bench` flags, e.g. the batched shape of
# benchmarks/peers.sh: MANY="--record-bytes 100 --batch 10 --streams 4 --in-flight 64
# --duration 15s --warmup 3s" (its "appends/s" column then counts records).
#
# The load comes from NEW_BIN's `picomq bench` for both servers (the client is the
# same; only the server differs).
source "$(dirname "$0")/lib.sh"
A=${1:?usage: ab.sh OLD_BIN NEW_BIN [ROUNDS]}
B=${2:?usage: ab.sh OLD_BIN NEW_BIN [ROUNDS]}
ROUNDS=${3:-4}
NAME=${NAME:-ab}
OUT="$RESULTS/$NAME.txt"
JSON="$RESULTS/json/$NAME"
mkdir -p "$JSON"
cp "$A" "$WORK/picomq-a"
cp "$B" "$WORK/picomq-b"
PICOMQ="$WORK/picomq-b" # the client

MANY=${MANY:-"--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 15s --warmup 3s"}
LONE="--record-bytes 100 --streams 1 --in-flight 1 --rate 5 --duration 15s --warmup 1s"

one() { # SIDE ROUND
  local side=$1 round=$2 port
  port=$(free_port)
  local dir="$WORK/ab-$side-$round"
  mkdir -p "$dir"
  "$WORK/picomq-$side" serve --listen "127.0.0.1:$port" --data-dir "$dir" >"$dir.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_ready "http://127.0.0.1:$port/readyz"
  # shellcheck disable=SC2086
  bench "$JSON/$side-$round-many.json" "$port" "$side many $round" $MANY
  # shellcheck disable=SC2086
  bench "$JSON/$side-$round-lone.json" "$port" "$side lone $round" $LONE
  stop_server
  rm -rf "$dir"
}

for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then one a "$round"; one b "$round"; else one b "$round"; one a "$round"; fi
done

{
  echo "# A/B: $A against $B"
  machine_note
  echo "rounds:  $ROUNDS, alternating; many = $MANY; lone = $LONE"
  echo
  node -e '
    const fs = require("fs"), dir = process.argv[1], rounds = +process.argv[2]
    const rd = (f) => JSON.parse(fs.readFileSync(`${dir}/${f}`, "utf8"))
    const rows = [["round", "side", "appends/s", "ack p99 ms", "lone ack p50 ms", "server CPU us/append", "VmHWM MiB"]]
    const sum = { a: [], b: [] }
    for (let r = 1; r <= rounds; r++) for (const s of ["a", "b"]) {
      const m = rd(`${s}-${r}-many.json`), l = rd(`${s}-${r}-lone.json`)
      const n = m.append.records_per_s, p99 = m.append.ack_latency_ms.p99, p50 = l.append.ack_latency_ms.p50
      const cpu = m.server.cpu_s != null ? m.server.cpu_s / (m.append.records_per_s * m.workload.duration_s) * 1e6 : null
      const hwm = m.server.vm_hwm_mb
      const fmt = (x, d) => x == null ? "-" : x.toFixed(d)
      rows.push([r, s, n.toFixed(0), p99.toFixed(2), p50.toFixed(2), fmt(cpu, 2), fmt(hwm, 0)])
      sum[s].push([n, p99, p50, cpu, hwm])
    }
    const med = (xs) => { const v = xs.filter((x) => x != null).sort((x, y) => x - y); return v.length ? v[Math.floor(v.length / 2)] : null }
    for (const s of ["a", "b"]) {
      const col = (i) => med(sum[s].map((x) => x[i]))
      const fmt = (x, d) => x == null ? "-" : x.toFixed(d)
      rows.push(["median", s, col(0).toFixed(0), col(1).toFixed(2), col(2).toFixed(2), fmt(col(3), 2), fmt(col(4), 0)])
    }
    for (const r of rows) console.log(r.join("\t"))
  ' "$JSON" "$ROUNDS" | md_table
  echo
  echo "a = $A"
  echo "b = $B"
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
