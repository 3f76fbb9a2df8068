#!/usr/bin/env bash
# The durable-append baseline users would otherwise pick: Redis Streams (XADD) with
# appendonly yes + appendfsync always (fsync before every reply batch), driven by
# redis-benchmark on loopback with the shapes of the PicoMQ targets.
# Installs redis-server/redis-tools from Debian if missing. Output: results/redis.txt
#
#   benchmarks/redis.sh
source "$(dirname "$0")/lib.sh"
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  log "installing redis-server and redis-tools (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >&2
fi
OUT="$RESULTS/redis.txt"
port=$(free_port)
dir="$WORK/redis"
mkdir -p "$dir"
redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --appendonly yes \
  --appendfsync always --save "" --daemonize no --logfile "$dir/redis.log" &
SERVER_PID=$!
PIDS+=("$SERVER_PID")
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

val1k=$(head -c 1024 /dev/zero | tr '\0' x)
val100=$(head -c 100 /dev/zero | tr '\0' x)
rb() { redis-benchmark -h 127.0.0.1 -p "$port" "$@"; }
cpu() { awk '{print ($14 + $15) / 100}' "/proc/$SERVER_PID/stat"; }
rss() { awk '/VmRSS/ {printf "%.1f MiB", $2/1024}' "/proc/$SERVER_PID/status"; }

{
  echo "# Redis Streams baseline: $(redis-server --version | cut -d' ' -f1-3), appendonly yes, appendfsync always"
  machine_note
  echo "driver: redis-benchmark on the same machine; one XADD = one record"
  echo
  echo "## lone append: 1 client, one XADD at a time, 100 B (latency = one fsync round trip)"
  c0=$(cpu)
  rb -c 1 -n 2000 -r 1 XADD "lone:__rand_int__" '*' f "$val100" | tail -n 6
  echo "server CPU s: $(echo "$(cpu) - $c0" | bc)"
  echo
  echo "## 1 KiB records, 1 per request, 64 streams, 512 clients"
  c0=$(cpu)
  rb -c 512 -n 600000 -r 64 XADD "many:__rand_int__" '*' f "$val1k" | tail -n 6
  echo "server CPU s: $(echo "$(cpu) - $c0" | bc); RSS $(rss)"
  echo
  echo "## 100 B records, 10 per round trip (pipeline -P 10), 4 streams, 64 clients"
  c0=$(cpu)
  rb -c 64 -P 10 -n 3000000 -r 4 XADD "batched:__rand_int__" '*' f "$val100" | tail -n 6
  echo "server CPU s: $(echo "$(cpu) - $c0" | bc); RSS $(rss)"
  echo
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$OUT"
