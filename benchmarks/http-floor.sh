#!/usr/bin/env bash
# The HTTP floor: what one request costs a server when it does nothing else. wrk
# (1 thread, 512 keep-alive connections) asks each server's health check for 10 s
# after 3 s of warm-up: PicoMQ on its own HTTP/1.1 loop, PicoMQ on hyper
# (--http1-server hyper), and Electric's durable-streams-server 0.1.5; ROUNDS rounds,
# each server fresh. Server CPU per request is utime+stime from /proc/PID/stat over
# the measured 10 s, divided by the requests wrk counted.
# Output: results/http-floor.txt.
#
#   benchmarks/http-floor.sh            (ROUNDS=3; needs wrk: apt-get install wrk)
source "$(dirname "$0")/lib.sh"
build_picomq
install_electric
command -v wrk >/dev/null || { echo "wrk not found (apt-get install wrk)" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
OUT="$RESULTS/http-floor.txt"
TCK=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

floor() { # LABEL URL
  local label=$1 url=$2 t0 t1 out rps reqs
  wrk -t1 -c512 -d3s "$url" >/dev/null 2>&1
  t0=$(cpu_ticks "$SERVER_PID")
  out=$(wrk -t1 -c512 -d10s "$url" 2>&1)
  t1=$(cpu_ticks "$SERVER_PID")
  rps=$(echo "$out" | awk '/Requests\/sec/ {printf "%.0f", $2}')
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  echo "| $label | $rps | $(python3 -c "print(round(($t1 - $t0) / $TCK / $reqs * 1e6, 1))") |"
}

{
  echo "# The HTTP floor: wrk -t1 -c512 -d10s (after 3 s) on each server's health check"
  machine_note
  echo
  echo "| server | requests/s | server CPU us/request |"
  echo "| --- | ---: | ---: |"
} | tee "$OUT"
for _ in $(seq "$ROUNDS"); do
  for mode in picomq hyper; do
    port=$(free_port)
    start_picomq "$port" --log warn --http1-server "$mode"
    floor "PicoMQ, HTTP/1.1 loop: $mode" "http://127.0.0.1:$port/healthz" | tee -a "$OUT"
    stop_server
  done
  port=$(free_port)
  start_electric "$port"
  floor "Electric $ELECTRIC_VERSION" "http://127.0.0.1:$port/health" | tee -a "$OUT"
  stop_server
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
