#!/usr/bin/env bash
# Cold reads at any age: 16 JSON streams written at once with 100 B records, one
# record per POST, one connection per stream (wrk, cold-read.lua) for 15 s; then
# AGE seconds of quiet, a restart on the same data, and one stream (stream 0, a
# sixteenth of what was written) read from offset=-1 with catch-up GETs until
# Stream-Up-To-Date, every record checked (cold-read.py). One fresh data dir per
# (target, restart, age). Targets:
#   local    picomq serve, defaults (local-directory store with fsync, SQLite)
#   s3-like  the same with --store-latency 20ms on every object-store request
#   s3-restart  written on the local store at full speed (as much as `local`), then
#            restarted with --store-latency 20ms: a large stream read cold over S3
#            latency (s3-like writes little: every flush waits out the latency)
#   peer     @durable-streams/server (file store, benchmarks/peer-server.mjs)
# Output: results/cold-read.txt (one Markdown table) + per run, in
# results/json/cold-read/: TAG.json (everything), TAG-requests.csv (one line per
# read request), TAG-wrk.txt / TAG-wrk.tsv (the writer's report and counts).
#
#   benchmarks/cold-read.sh                  # ages 1 60 900 s, all targets (~55 min)
#   QUICK=1 benchmarks/cold-read.sh          # ages 1 10 s (~3 min; more when reads are slow)
#   AGES="60" TARGETS="local peer" RESTART="kill term" benchmarks/cold-read.sh
#
# Settings (environment): AGES (s, "1 60 900"; QUICK=1: "1 10"), TARGETS ("local
# s3-like s3-restart peer"), RESTART (kill = SIGKILL, term = SIGTERM and wait for the exit;
# a list runs each; default kill), WRITE_SECS (15), READ_TIMEOUT (s per request,
# 120), READ_CAP (s per read, 600), NAME (output names, cold-read), PICOMQ_BIN
# (a binary to use instead of building; PICOMQ_BUILD describes it in the note).
# Needs wrk (installed with apt-get if missing), python3, node and npm (peer).
# wrk rather than `picomq bench`: bench's records carry a send timestamp (nothing a
# reader can check) and its requests go round robin over the streams, whereas here
# each of the 16 connections is one stream's only writer, one record in flight.
#
# Columns:
#   written MB        acknowledged appends x 100 B, all 16 streams (MB = 10^6 B)
#   read MB           response bodies of the read of stream 0 (JSON arrays)
#   read MB/s         read MB / wall time from the first GET to the up-to-date one
#   requests          catch-up GETs of the read; slowest ms: the slowest of them
#   restart s         from the signal to the restarted server answering ready
#   GETs/MiB read     object-store GETs during the read / MiB read (MiB = 2^20 B)
#   bg PUTs/MiB, bg GETs/MiB   object-store requests spent between the end of the
#       writing and the read, per MiB written: counters (all stores, all outcomes)
#       scraped from /metrics at the end of the writing (A), just before the
#       restart signal (B) and once the restarted node is ready (C; counters start
#       at zero with the process, so C is what recovery and start-up spent):
#       PUTs = (B.put - A.put) + C.put - ((B.wal - A.wal) + C.wal), where wal is
#       picomq_wal_objects_written_total (the WAL's own PUTs, retries included);
#       GETs = (B.get - A.get) + C.get. Requests between B and the signal (with
#       RESTART=term: the shutdown's own flush) are not seen.
#   records           ok (N) when stream 0 held N records, exactly those written
#       in order, N = appends acknowledged (+1 if the one in flight when wrk
#       stopped landed); else what went wrong.
# The reference server has no /metrics: its store columns read "-".
source "$(dirname "$0")/lib.sh"
build_picomq
NAME=${NAME:-cold-read}
OUT="$RESULTS/$NAME.txt"
JSON="$RESULTS/json/$NAME"
if [ "${QUICK:-0}" = 1 ]; then AGES=${AGES:-"1 10"}; else AGES=${AGES:-"1 60 900"}; fi
TARGETS=${TARGETS:-"local s3-like s3-restart peer"}
RESTART=${RESTART:-kill}
WRITE_SECS=${WRITE_SECS:-15}
READ_TIMEOUT=${READ_TIMEOUT:-120}
READ_CAP=${READ_CAP:-600}
STREAMS=16
RECORD_BYTES=100
PREFIX=/v1/stream/cold-
DRIVER="$BENCH_DIR/cold-read.py"
mkdir -p "$JSON"

if ! command -v wrk >/dev/null; then
  log "installing wrk"
  apt-get install -y wrk >&2 || { apt-get update >&2 && apt-get install -y wrk >&2; }
fi
case " $TARGETS " in *" peer "*) install_peer ;; esac

picomq_flags() { # TARGET [PHASE: write|read] -> serve flags
  case $1 in
    local) ;;
    s3-like) echo --store-latency 20ms ;;
    s3-restart) [ "${2:-read}" = write ] || echo --store-latency 20ms ;;
    *) echo "unknown target $1" >&2 && return 1 ;;
  esac
}

serve() { # TARGET DIR PORT PHASE: start (or restart) a server on DIR
  local target=$1 dir=$2 port=$3 phase=$4
  if [ "$target" = peer ]; then
    PORT=$port DATA_DIR="$dir" node "$PEER_DIR/peer-server.mjs" >>"$dir.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_http "http://127.0.0.1:$port/" 300
  else
    local flags
    flags=$(picomq_flags "$target" "$phase")
    # shellcheck disable=SC2086
    "$PICOMQ" serve --listen "127.0.0.1:$port" --data-dir "$dir" $flags >>"$dir.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_ready "http://127.0.0.1:$port/readyz" 300
  fi
}

stop() { # kill|term
  case $1 in
    kill) kill -9 "$SERVER_PID" 2>/dev/null || true ;;
    term) kill "$SERVER_PID" 2>/dev/null || true ;;
    *) echo "RESTART must be kill or term, not $1" >&2 && return 1 ;;
  esac
  wait "$SERVER_PID" 2>/dev/null || true
}

now() { date +%s.%N; }

run() { # TARGET RESTART AGE
  local target=$1 mode=$2 age=$3
  local tag="$target-$mode-${age}s"
  local dir="$WORK/$tag" port base s
  port=$(free_port)
  base="http://127.0.0.1:$port"
  mkdir -p "$dir"
  serve "$target" "$dir" "$port" write
  for ((s = 0; s < STREAMS; s++)); do
    curl -sf -o /dev/null -X PUT -H 'content-type: application/json' "$base$PREFIX$s"
  done
  log "$tag: writing $STREAMS streams for ${WRITE_SECS}s"
  COLD_READ_COUNTS="$JSON/$tag-wrk.tsv" wrk -t"$STREAMS" -c"$STREAMS" -d"${WRITE_SECS}s" --timeout 30s \
    --latency -s "$BENCH_DIR/cold-read.lua" "$base" -- "$PREFIX" "$RECORD_BYTES" >"$JSON/$tag-wrk.txt"
  local m1 m2 m3 m4 t0 t1 rd
  m1=$(python3 "$DRIVER" metrics "$base")
  log "$tag: waiting ${age}s"
  sleep "$age"
  m2=$(python3 "$DRIVER" metrics "$base")
  t0=$(now)
  stop "$mode"
  serve "$target" "$dir" "$port" read
  t1=$(now)
  m3=$(python3 "$DRIVER" metrics "$base")
  local lo hi
  lo=$(awk -F'\t' '$1 == 0 {print $3}' "$JSON/$tag-wrk.tsv")
  hi=$((lo + 1)) # the append in flight when wrk stopped may have landed
  log "$tag: restarted in $(python3 -c "print(round($t1 - $t0, 2))") s; reading stream 0 ($lo..$hi records)"
  rd=$(python3 "$DRIVER" read "$base" "${PREFIX}0" 0 "$lo" "$hi" "$JSON/$tag-requests.csv" "$READ_TIMEOUT" "$READ_CAP")
  m4=$(python3 "$DRIVER" metrics "$base")
  stop term
  local flags=""
  if [ "$target" != peer ]; then flags=$(picomq_flags "$target"); fi
  python3 - "$JSON/$tag.json" "$m1" "$m2" "$m3" "$m4" "$rd" <<EOF
import json, sys
m1, m2, m3, m4, rd = (json.loads(a) for a in sys.argv[2:7])
counts = [list(map(int, l.split())) for l in open("$JSON/$tag-wrk.tsv") if l.strip()]
run = {
    "target": "$target", "restart": "$mode", "age_s": $age,
    "server": "@durable-streams/server@$PEER_VERSION" if "$target" == "peer" else "picomq serve $flags".strip(),
    "write": {"streams": $STREAMS, "record_bytes": $RECORD_BYTES, "seconds": $WRITE_SECS,
              "per_stream": [{"stream": c[0], "request_calls": c[1], "acknowledged": c[2], "failed": c[3]} for c in counts]},
    "written_bytes": sum(c[2] for c in counts) * $RECORD_BYTES,
    "restart_s": round($t1 - $t0, 3),
    "metrics": {"end_of_write": m1, "before_stop": m2, "after_start": m3, "after_read": m4},
    "read": rd,
}
json.dump(run, open(sys.argv[1], "w"), indent=1)
EOF
  python3 "$DRIVER" row "$JSON/$tag.json" >>"$WORK/rows.tsv"
  log "$tag: $(tail -1 "$WORK/rows.tsv")"
  write_out
}

write_out() {
  {
    echo "# Cold reads at any age: $STREAMS JSON streams, ${RECORD_BYTES} B records one per POST, one connection per stream (wrk), ${WRITE_SECS} s; AGE s later a restart; stream 0 read from offset=-1 with catch-up GETs"
    echo "$NOTE"
    echo "commit:  $(git -C "$REPO" rev-parse --short HEAD)${PICOMQ_BIN:+ (of the checkout the script ran from; the binary is the picomq line)}"
    echo "targets: local = picomq serve (defaults), s3-like = picomq serve --store-latency 20ms, s3-restart = written with defaults, restarted with --store-latency 20ms, peer = @durable-streams/server@$PEER_VERSION (file store) on Node $(node -v 2>/dev/null || echo -)"
    echo "restart: kill = SIGKILL, term = SIGTERM and wait for the exit; then the same command on the same data dir"
    echo
    {
      printf 'target\trestart\tage s\twritten MB\tread MB\tread MB/s\trequests\tslowest ms\trestart s\tGETs/MiB read\tbg PUTs/MiB written\tbg GETs/MiB written\trecords\n'
      cat "$WORK/rows.tsv"
    } | md_table
    echo
    echo "MB = 10^6 B, MiB = 2^20 B. bg = object-store requests between the end of the writing and the read (recovery included), less the WAL's own PUTs; see the header of benchmarks/cold-read.sh. Details: results/json/$NAME/."
  } >"$OUT"
}

NOTE=$(machine_note)
: >"$WORK/rows.tsv"
for mode in $RESTART; do
  for age in $AGES; do
    for target in $TARGETS; do
      run "$target" "$mode" "$age"
    done
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT"
cat "$OUT"
log "written to $OUT"
