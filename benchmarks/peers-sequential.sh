#!/usr/bin/env bash
# Sequential 64 KiB appends (one connection, one request in flight, octet-stream)
# on PicoMQ and Electric's server (lib.sh install_electric), driven by `picomq bench`
# so that PicoMQ's own histograms split its acknowledgement latency (engine append,
# WAL commit, store PUT); ROUNDS (2) rounds, each PicoMQ then Electric, fresh servers.
# Output: results/peers-sequential.txt, JSON in results/json/peers-sequential/.
#
#   benchmarks/peers-sequential.sh        # ~1 minute per round
source "$(dirname "$0")/lib.sh"
ROUNDS=${ROUNDS:-2}
FLAGS="--record-bytes 65536 --streams 1 --in-flight 1 --content-type application/octet-stream --duration 10s --warmup 2s"
build_picomq
install_electric
JSON="$RESULTS/json/peers-sequential"
OUT="$RESULTS/peers-sequential.txt"
mkdir -p "$JSON"
rm -f "$JSON"/*.json
{
  echo "# Sequential 64 KiB appends: PicoMQ vs Electric's durable-streams-server $ELECTRIC_VERSION, both on defaults"
  machine_note
  echo "picomq bench URL $FLAGS"
  echo
} | tee "$OUT"
for ((k = 1; k <= ROUNDS; k++)); do
  for server in picomq electric; do
    port=$(free_port)
    if [ "$server" = picomq ]; then start_picomq "$port"; else start_electric "$port"; fi
    # shellcheck disable=SC2086
    bench "$JSON/$server-$k.json" "$port" "$server r$k" $FLAGS --quiet
    stop_server
  done
  {
    echo "## round $k"
    "$PICOMQ" bench compare "$JSON/picomq-$k.json" "$JSON/electric-$k.json"
    echo
  } | tee -a "$OUT"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"
