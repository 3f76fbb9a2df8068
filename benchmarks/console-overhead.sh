#!/usr/bin/env bash
# What the web console costs a loaded node: PicoMQ on its defaults under 10,000
# appends/s (1 KiB records over 100 streams, open loop, `picomq bench --rate`), and a
# headless Chromium opening one console page at a time at its default 1 s refresh.
# For each page, ROUNDS pairs of windows (no console, then the page open) compare the
# server process's CPU time (benchmarks/console-overhead.mjs); then, with the load
# off, each page's requests replayed 1,000 times each for the server CPU time they
# cost at the page's refresh (the windows above are noisy on 2 cores). Installs
# chromium and playwright-core as tests-browser/ does.
# About 10 minutes. Output: results/console-overhead.txt
#
#   benchmarks/console-overhead.sh    (RATE=10000 STREAMS=100 ROUNDS=4 WINDOW=15
#                                      PAGES="overview streams stream consumers")
source "$(dirname "$0")/lib.sh"
build_picomq
cache=$(bash "$REPO/tests-browser/setup.sh")
cp "$BENCH_DIR/console-overhead.mjs" "$cache/console-overhead.mjs"
OUT="$RESULTS/console-overhead.txt"
port=$(free_port)
start_picomq "$port"
api="http://127.0.0.1:$port"
RATE=${RATE:-10000} ROUNDS=${ROUNDS:-4} WINDOW=${WINDOW:-15}
PAGES=${PAGES:-overview streams stream consumers}
n_pages=$(wc -w <<<"$PAGES")
load_seconds=$(( (ROUNDS * 2 * (WINDOW + 3) + 10) * n_pages + 20 ))

# A consumer group on one of the loaded streams, so the consumers page has work.
{
  echo "# web console overhead: picomq $(git -C "$REPO" rev-parse --short HEAD), ${RATE} appends/s of 1 KiB over ${STREAMS:-100} streams"
  machine_note
  "$PICOMQ" bench "$api/load" --stream-prefix s --streams "${STREAMS:-100}" --rate "$RATE" \
    --record-bytes 1024 --in-flight 256 --duration "${load_seconds}s" --warmup 5s --quiet \
    >"$WORK/load.txt" 2>&1 &
  load_pid=$!
  PIDS+=("$load_pid")
  sleep 8
  curl -fsS -X PUT -H 'content-type: application/json' \
    --data '{"stream": "load/s-0", "from": "-1"}' "$api/__picomq/groups/console-bench" >/dev/null
  for p in $PAGES; do
    [ "$p" = stream ] && p="stream/load/s-0"
    node "$cache/console-overhead.mjs" "$api" "$SERVER_PID" "$p" "$ROUNDS" "$WINDOW"
  done
  kill "$load_pid" 2>/dev/null || true
  wait "$load_pid" 2>/dev/null || true
  sleep 2
  python3 - "$api" "$SERVER_PID" <<'PY'
import sys, time, urllib.request
api, pid = sys.argv[1], sys.argv[2]
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100
def call(method, path):
    req = urllib.request.Request(api + path, method=method)
    with urllib.request.urlopen(req) as r:
        return len(r.read())
rec = "/__picomq/streams/load/s-0"
# What each page asks for per second at its default refresh (app.js): the overview
# /metrics and /readyz every second; the stream page's live tail one page per 250 ms
# when records arrive (25 records of 1 KiB at 100 appends/s) and its metadata every
# 2 s; the consumers page each group every 2 s and subscriptions every 5 s.
pages = [
    ("overview", [("GET", "/metrics", 1), ("GET", "/readyz", 1)]),
    ("stream page", [("GET", rec + "/records?tail=25&count=200", 4),
                     ("HEAD", "/load/s-0", 0.5), ("GET", rec + "/info", 0.5)]),
    ("consumers", [("GET", "/__picomq/groups", 0.5), ("GET", "/__picomq/groups/console-bench", 0.5),
                   ("GET", "/__picomq/subscriptions", 0.2)]),
]
n = 1000
for name, requests in pages:
    cost = 0.0
    parts = []
    for method, path, per_second in requests:
        c0 = cpu()
        for _ in range(n):
            size = call(method, path)
        each = (cpu() - c0) / n
        cost += each * per_second
        parts.append(f"{method} {path.split('?')[0]} {each * 1000:.3f} ms ({size} B) x {per_second}/s")
    print(f"{name}, replayed with the load off: {cost * 100:.3f}% of one core "
          f"({'; '.join(parts)})")
PY
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$OUT"
