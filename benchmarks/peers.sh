#!/usr/bin/env bash
# PicoMQ vs the Durable Streams reference server (@durable-streams/server, file
# store, fsync per append), driven by identical `picomq bench` runs on loopback, one
# server at a time. Prints one table per scenario with the ratio PicoMQ/peer for
# every figure; the full text goes to results/peers.txt and JSON reports beside it.
#
#   benchmarks/peers.sh            # all scenarios (~5 minutes)
#   SCENARIOS="lone many" benchmarks/peers.sh
source "$(dirname "$0")/lib.sh"
build_picomq
install_peer
OUT="$RESULTS/peers.txt"
JSON="$RESULTS/json/peers"
mkdir -p "$JSON"

# name | bench flags (identical for both servers)
declare -A FLAGS=(
  [lone]="--record-bytes 100 --streams 1 --in-flight 1 --rate 5 --duration 10s --warmup 1s"
  [many]="--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 10s --warmup 2s --catch-up 30s"
  [batched]="--record-bytes 100 --batch 10 --streams 4 --in-flight 64 --duration 10s --warmup 2s"
  [live]="--record-bytes 256 --streams 16 --in-flight 64 --rate 100 --live sse --duration 10s --warmup 2s"
)
declare -A WHAT=(
  [lone]="a lone append on an idle server (5 appends/s, one at a time, 100 B)"
  [many]="1 KiB records, 1 per request, 64 streams, 512 requests in flight; then catch-up reads"
  [batched]="100 B records, 10 per request (JSON array), 4 streams, 64 requests in flight"
  [live]="live delivery: 100 records/s (256 B) over 16 streams, one SSE reader per stream"
)
SCENARIOS=${SCENARIOS:-"lone many batched live"}

{
  echo "# PicoMQ vs @durable-streams/server@$PEER_VERSION (file-backed store), same picomq bench settings"
  machine_note
  echo "servers: picomq serve (defaults: local-directory store with fsync, SQLite); peer: DurableStreamTestServer({dataDir}) on Node $(node -v)"
  echo "one server at a time, bench client on the same machine; HTTP/1.1"
  echo
} | tee "$OUT"

for s in $SCENARIOS; do
  flags=${FLAGS[$s]}
  port=$(free_port)
  start_picomq "$port"
  # shellcheck disable=SC2086
  bench "$JSON/$s-picomq.json" "$port" picomq $flags
  stop_server
  port=$(free_port)
  start_peer "$port"
  # shellcheck disable=SC2086
  bench "$JSON/$s-peer.json" "$port" peer $flags
  stop_server
  {
    echo "## $s: ${WHAT[$s]}"
    echo "picomq bench URL $flags"
    echo
    "$PICOMQ" bench compare "$JSON/$s-picomq.json" "$JSON/$s-peer.json"
    echo
  } | tee -a "$OUT"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
