#!/usr/bin/env bash
# PicoMQ against two other Durable Streams servers on loopback, one server at a
# time, each with a fresh data directory and its defaults (every one fdatasyncs
# before it acknowledges an append):
#   reference  @durable-streams/server (npm, file store), identical `picomq bench`
#              runs; one table per scenario with the ratio PicoMQ/peer for every
#              figure -> results/peers.txt, JSON in results/json/peers/
#   electric   Electric's Rust server, crates.io `durable-streams` (installed with
#              cargo into ~/.cache/picomq-bench/electric at first use); ROUNDS rounds
#              (2), each running every scenario on PicoMQ, then on Electric; one
#              table with every round and the ratio Electric/PicoMQ per round ->
#              results/peers-electric.txt, JSON in results/json/peers-electric/
#
#   benchmarks/peers.sh                          # both peers (~5 + ~5 minutes)
#   PEERS=electric benchmarks/peers.sh           # Electric only
#   PEERS=reference SCENARIOS="lone many" benchmarks/peers.sh
#
# SCENARIOS picks by name; each peer runs those it has. Reference: lone many batched
# live. Electric: many (1 KiB appends, then the lone append on the same server),
# batched, bytes (sequential 64 KiB appends filling one 256 MiB stream over one
# connection, then warm catch-up reads of it: one reader, then 16 at once;
# benchmarks/bytes.py). Server CPU (utime+stime, /proc/PID/stat) and peak RSS
# (VmHWM, /proc/PID/status) come from `picomq bench --server-pid` and bytes.py.
source "$(dirname "$0")/lib.sh"
PEERS=${PEERS:-"reference electric"}
ROUNDS=${ROUNDS:-2}
build_picomq

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
# Against Electric: 15 s measured after 3 s of warm-up, as in the issue's figures.
declare -A EFLAGS=(
  [many]="--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 15s --warmup 3s"
  [lone]="--record-bytes 100 --streams 1 --in-flight 1 --rate 5 --duration 10s --warmup 1s"
  [batched]="--record-bytes 100 --batch 10 --streams 4 --in-flight 64 --duration 15s --warmup 3s"
)
BYTES_FLAGS="--mib 256 --append-kib 64 --readers 16 --passes 3"
SCENARIOS=${SCENARIOS:-"lone many batched live bytes"}

wanted() { # SCENARIO: is it in $SCENARIOS?
  case " $SCENARIOS " in *" $1 "*) return 0 ;; esac
  return 1
}

reference() {
  install_peer
  local out="$RESULTS/peers.txt" json="$RESULTS/json/peers" s flags port
  mkdir -p "$json"
  {
    echo "# PicoMQ vs @durable-streams/server@$PEER_VERSION (file-backed store), same picomq bench settings"
    machine_note
    echo "servers: picomq serve (defaults: local-directory store with fsync, SQLite); peer: DurableStreamTestServer({dataDir}) on Node $(node -v)"
    echo "one server at a time, bench client on the same machine; HTTP/1.1"
    echo
  } | tee "$out"
  for s in $SCENARIOS; do
    [ -n "${FLAGS[$s]:-}" ] || continue
    flags=${FLAGS[$s]}
    port=$(free_port)
    start_picomq "$port"
    # shellcheck disable=SC2086
    bench "$json/$s-picomq.json" "$port" picomq $flags
    stop_server
    port=$(free_port)
    start_peer "$port"
    # shellcheck disable=SC2086
    bench "$json/$s-peer.json" "$port" peer $flags
    stop_server
    {
      echo "## $s: ${WHAT[$s]}"
      echo "picomq bench URL $flags"
      echo
      "$PICOMQ" bench compare "$json/$s-picomq.json" "$json/$s-peer.json"
      echo
    } | tee -a "$out"
  done
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
}

# electric_run SERVER ROUND SCENARIO: one fresh server, one scenario.
electric_run() {
  local server=$1 k=$2 s=$3 json=$RESULTS/json/peers-electric port
  port=$(free_port)
  if [ "$server" = picomq ]; then start_picomq "$port"; else start_electric "$port"; fi
  log "round $k: $s on $server"
  case $s in
    many | batched)
      # shellcheck disable=SC2086
      bench "$json/$s-$server-$k.json" "$port" "$server" ${EFLAGS[$s]} --quiet
      if [ "$s" = many ] && wanted lone; then
        # shellcheck disable=SC2086
        bench "$json/lone-$server-$k.json" "$port" "$server" ${EFLAGS[lone]} --quiet
      fi
      ;;
    bytes)
      # shellcheck disable=SC2086
      python3 "$BENCH_DIR/bytes.py" "http://127.0.0.1:$port/v1/stream" --server-pid "$SERVER_PID" \
        --label "$server" $BYTES_FLAGS >"$json/$s-$server-$k.json"
      ;;
  esac
  stop_server
}

electric() {
  install_electric
  local out="$RESULTS/peers-electric.txt" json="$RESULTS/json/peers-electric" k s server
  mkdir -p "$json"
  rm -f "$json"/*.json
  {
    echo "# PicoMQ vs Electric's durable-streams-server $ELECTRIC_VERSION (crates.io), both on their defaults"
    machine_note
    echo "servers: picomq serve (local-directory store with fsync, SQLite); durable-streams-server --host 127.0.0.1 --port P --data-dir D (WAL, group-commit fdatasync)"
    echo "one server at a time, fresh data dir per run, client on the same machine; HTTP/1.1, one connection per request in flight"
    echo "rounds: $ROUNDS, each: every scenario on PicoMQ, then on Electric (rK = round K)"
    for s in many lone batched; do
      if wanted "$s"; then echo "$s: picomq bench URL ${EFLAGS[$s]}"; fi
    done
    if wanted bytes; then echo "bytes: python3 benchmarks/bytes.py URL $BYTES_FLAGS (octet-stream)"; fi
    echo "lone runs on the server that just ran many; catch-up 1 reader: the best of 3 passes"
    echo
  } | tee "$out"
  for ((k = 1; k <= ROUNDS; k++)); do
    for s in many batched bytes; do
      wanted "$s" || continue
      for server in picomq electric; do
        electric_run "$server" "$k" "$s"
      done
    done
  done
  python3 "$BENCH_DIR/peers-table.py" "$json" "$ROUNDS" | md_table | tee -a "$out"
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
}

for p in $PEERS; do
  case $p in
    reference) reference ;;
    electric) electric ;;
    *) echo "unknown peer $p (reference, electric)" >&2 && exit 2 ;;
  esac
done
