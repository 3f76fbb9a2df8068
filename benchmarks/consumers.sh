#!/usr/bin/env bash
# Consumers: a consumer group's acknowledged messages/s with 16 consumers and its
# append-to-claim latency (p50/p99), side by side with Redis Streams consumer groups
# (XREADGROUP + XACK, appendonly yes + appendfsync always); and webhook deliveries
# per second of Durable Streams subscriptions. PicoMQ on its defaults (local
# directory store), everything on loopback. Installs redis-server from Debian if
# missing. Output: results/consumers.txt
#
#   benchmarks/consumers.sh            (CONSUMERS=16 MESSAGES=50000 RATE=500 DURATION=10s)
source "$(dirname "$0")/lib.sh"
if ! command -v redis-server >/dev/null; then
  log "installing redis-server (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
fi
build_picomq
OUT="$RESULTS/consumers.txt"
port=$(free_port)
start_picomq "$port"
wait_ready "http://127.0.0.1:$port/readyz"
rport=$(free_port)
rdir="$WORK/redis"
mkdir -p "$rdir"
redis-server --bind 127.0.0.1 --port "$rport" --dir "$rdir" --appendonly yes \
  --appendfsync always --save "" --daemonize no --logfile "$rdir/redis.log" &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done

{
  echo "# consumers: picomq $(git -C "$REPO" rev-parse --short HEAD) vs $(redis-server --version | cut -d' ' -f1-3) (appendonly yes, appendfsync always)"
  machine_note
  "$PICOMQ" bench groups --url "http://127.0.0.1:$port" --redis "127.0.0.1:$rport" \
    --consumers "${CONSUMERS:-16}" --messages "${MESSAGES:-50000}" --rate "${RATE:-500}" \
    --duration "${DURATION:-10s}"
  echo
  "$PICOMQ" bench webhooks --url "http://127.0.0.1:$port" --subscriptions "${SUBSCRIPTIONS:-64}" \
    --duration "${DURATION:-10s}"
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$OUT"
