#!/usr/bin/env bash
# Cold reads at any age: 16 JSON streams written at once with 100 B records, one
# record per POST, one connection per stream (wrk, cold-read.lua) for 15 s; then
# AGE seconds of quiet (or none: AGE "writing" sends the stop while the writers
# still run, each with an append in flight), a restart on the same data, and one stream (stream 0, a
# sixteenth of what was written) read from offset=-1 with catch-up GETs until
# Stream-Up-To-Date, every record checked (cold-read.py). One fresh data dir per
# (target, restart, age). Targets:
#   local    picomq serve, defaults (local-directory store with fsync, SQLite)
#   s3-like  the same with --store-latency 20ms on every object-store request
#   s3-restart  written on the local store at full speed (as much as `local`), then
#            restarted with --store-latency 20ms: a large stream read cold over S3
#            latency (s3-like writes little: every flush waits out the latency)
#   peer     @durable-streams/server (file store, benchmarks/peer-server.mjs)
#   cluster  two nodes on Postgres and the S3 test server (.ci/postgres.sh,
#            .ci/s3-server.sh): the writer (no added latency) serves stream 0 (a
#            prefix is picked so that it does) and is stopped; the taker (started
#            with --store-latency 20ms) takes its streams over, and stream 0 is read
#            through it from the moment it serves it. kill = kill -9 (a takeover
#            once the writer's lease lapses), term = SIGTERM (the writer drains and
#            hands its streams over). "restart s" is from the signal to the taker
#            serving stream 0; the store columns are the taker's.
# Output: results/cold-read.txt (one Markdown table) + per run, in
# results/json/cold-read/: TAG.json (everything), TAG-requests.csv (one line per
# read request), TAG-wrk.txt / TAG-wrk.tsv (the writer's report and counts).
#
#   benchmarks/cold-read.sh                  # ages 1 60 900 s, all targets (~55 min)
#   QUICK=1 benchmarks/cold-read.sh          # ages 1 10 s (~3 min; more when reads are slow)
#   AGES="60" TARGETS="local peer" RESTART="kill term" benchmarks/cold-read.sh
#
# Settings (environment): AGES (s, "1 60 900"; QUICK=1: "1 10"; or "writing"), TARGETS
# ("local s3-like s3-restart peer cluster"), RESTART (kill = SIGKILL, term = SIGTERM and wait for the exit;
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
TARGETS=${TARGETS:-"local s3-like s3-restart peer cluster"}
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

# The cluster target's Postgres and S3 test server, started on first use.
CLUSTER_SERVICES=""
cluster_services() {
  [ -n "$CLUSTER_SERVICES" ] && return 0
  if [ -z "${PICOMQ_S3_TEST_SERVER:-}" ] && [ -x "$(dirname "$PICOMQ")/picomq-s3-test-server" ]; then
    export PICOMQ_S3_TEST_SERVER="$(dirname "$PICOMQ")/picomq-s3-test-server"
  fi
  bash "$REPO/.ci/postgres.sh" start "$WORK/pg" >&2
  # shellcheck disable=SC1091
  . "$WORK/pg/env"
  bash "$REPO/.ci/s3-server.sh" start "$WORK/s3" >&2
  PIDS+=("$(cat "$WORK/s3/pid")")
  # shellcheck disable=SC1091
  . "$WORK/s3/env"
  CLUSTER_SERVICES=1
  trap 'cleanup; bash "$REPO/.ci/postgres.sh" stop "$WORK/pg" >/dev/null 2>&1 || true' EXIT
}

# start_cluster TAG DIR: the writer and the taker on a new database and prefix; sets
# WRITER_URL, TAKER_URL, SERVER_PID (the writer's) and TAKER_PID.
start_cluster() {
  local tag=$1 dir=$2 meta pw pt
  cluster_services
  meta=$(bash "$REPO/.ci/postgres.sh" createdb "$WORK/pg" "$(echo "$tag" | tr -c 'a-z0-9\n' '_')")
  pw=$(free_port)
  pt=$(free_port)
  "$PICOMQ" serve --listen "127.0.0.1:$pw" --data-dir "$dir/writer" --meta "$meta" \
    --store "s3://$PICOMQ_CI_S3_BUCKET/$tag" --node-id writer >>"$dir.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  "$PICOMQ" serve --listen "127.0.0.1:$pt" --data-dir "$dir/taker" --meta "$meta" \
    --store "s3://$PICOMQ_CI_S3_BUCKET/$tag" --node-id taker --store-latency 20ms >>"$dir-taker.log" 2>&1 &
  TAKER_PID=$!
  PIDS+=("$TAKER_PID")
  WRITER_URL="http://127.0.0.1:$pw"
  TAKER_URL="http://127.0.0.1:$pt"
  wait_ready "$WRITER_URL/readyz" 60
  wait_ready "$TAKER_URL/readyz" 60
  local tries
  for ((tries = 0; tries < 300; tries++)); do
    if curl -fsS "$WRITER_URL/__picomq/nodes" 2>/dev/null | python3 -c '
import json, sys
nodes = [m for m in json.load(sys.stdin)["nodes"] if m["state"] == "live"]
sys.exit(0 if len(nodes) == 2 and all(m["slots"] > 0 for m in nodes) and sum(m["slots"] for m in nodes) == 1024 else 1)'; then
      return 0
    fi
    sleep 0.1
  done
  echo "the two nodes did not share the slots" >&2
  return 1
}

served_by() { # URL: the node that served it (picomq-served-by), or the status
  curl -s -o /dev/null -w '%{http_code} %header{picomq-served-by}' -I "$1"
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
  local tag="$target-$mode-${age}"
  [ "$age" = writing ] || tag+=s
  local dir="$WORK/$tag" port base s prefix=$PREFIX metrics_url
  port=$(free_port)
  base="http://127.0.0.1:$port"
  # A run of the same tag in the same BENCH_WORK starts from nothing, not from the
  # streams the last one wrote.
  rm -rf "$dir" "$dir.log"
  mkdir -p "$dir"
  if [ "$target" = cluster ]; then
    start_cluster "$tag" "$dir"
    base=$WRITER_URL
    # A prefix whose stream 0 the writer serves.
    for ((s = 0; s < 64; s++)); do
      prefix="/v1/stream/cold-$s-"
      curl -sf -o /dev/null -X PUT -H 'content-type: application/json' "$base${prefix}0"
      [ "$(served_by "$base${prefix}0")" = "200 writer" ] && break
    done
    [ "$(served_by "$base${prefix}0")" = "200 writer" ] || { echo "no prefix served by the writer" >&2; return 1; }
  else
    serve "$target" "$dir" "$port" write
  fi
  # The taker's counters run on across the stop; a restarted server's start at zero.
  metrics_url=$base
  [ "$target" = cluster ] && metrics_url=$TAKER_URL
  for ((s = 0; s < STREAMS; s++)); do
    curl -sf -o /dev/null -X PUT -H 'content-type: application/json' "$base$prefix$s"
  done
  log "$tag: writing $STREAMS streams for ${WRITE_SECS}s"
  COLD_READ_COUNTS="$JSON/$tag-wrk.tsv" wrk -t"$STREAMS" -c"$STREAMS" -d"${WRITE_SECS}s" --timeout 30s \
    --latency -s "$BENCH_DIR/cold-read.lua" "$base" -- "$prefix" "$RECORD_BYTES" >"$JSON/$tag-wrk.txt" &
  local wrk_pid=$! m1 m2 m3 m4 t0 t1 rd
  if [ "$age" = writing ]; then
    # The stop lands while every connection has an append in flight; wrk runs on
    # against the stopped server (refused, counted as failed) until its end, and the
    # restart waits for it so that nothing is written afterwards.
    sleep "$((WRITE_SECS - 1))"
    m1=$(python3 "$DRIVER" metrics "$metrics_url")
    m2=$m1
    t0=$(now)
    stop "$mode"
    local exited
    exited=$(now)
    wait "$wrk_pid"
    # The restart column leaves out the wait for wrk's end.
    t0=$(python3 -c "print($t0 + $(now) - $exited)")
  else
    wait "$wrk_pid"
    m1=$(python3 "$DRIVER" metrics "$metrics_url")
    log "$tag: waiting ${age}s"
    sleep "$age"
    m2=$(python3 "$DRIVER" metrics "$metrics_url")
    t0=$(now)
    stop "$mode"
  fi
  if [ "$target" = cluster ]; then
    base=$TAKER_URL
    # Until the taker serves stream 0 itself (a takeover waits out the lease).
    local waited
    for ((waited = 0; waited < 6000; waited++)); do
      [ "$(served_by "$base${prefix}0")" = "200 taker" ] && break
      sleep 0.02
    done
    [ "$(served_by "$base${prefix}0")" = "200 taker" ] || { echo "the taker did not serve stream 0 within 120 s" >&2; return 1; }
    SERVER_PID=$TAKER_PID
  else
    serve "$target" "$dir" "$port" read
  fi
  t1=$(now)
  m3=$(python3 "$DRIVER" metrics "$base")
  local lo hi
  lo=$(awk -F'\t' '$1 == 0 {print $3}' "$JSON/$tag-wrk.tsv")
  hi=$((lo + 1)) # the append in flight when wrk stopped may have landed
  log "$tag: restarted in $(python3 -c "print(round($t1 - $t0, 2))") s; reading stream 0 ($lo..$hi records)"
  rd=$(python3 "$DRIVER" read "$base" "${prefix}0" 0 "$lo" "$hi" "$JSON/$tag-requests.csv" "$READ_TIMEOUT" "$READ_CAP")
  m4=$(python3 "$DRIVER" metrics "$base")
  stop term
  local flags=""
  case $target in
    peer) ;;
    cluster) flags="--meta postgres://... --store s3://... (2 nodes; the taker with --store-latency 20ms)" ;;
    *) flags=$(picomq_flags "$target") ;;
  esac
  python3 - "$JSON/$tag.json" "$m1" "$m2" "$m3" "$m4" "$rd" <<EOF
import json, sys
m1, m2, m3, m4, rd = (json.loads(a) for a in sys.argv[2:7])
counts = [list(map(int, l.split())) for l in open("$JSON/$tag-wrk.tsv") if l.strip()]
run = {
    "target": "$target", "restart": "$mode", "age_s": (lambda a: a if a == "writing" else float(a) if "." in a else int(a))("$age"),
    "server": "@durable-streams/server@$PEER_VERSION" if "$target" == "peer" else "picomq serve $flags".strip(),
    "write": {"streams": $STREAMS, "record_bytes": $RECORD_BYTES, "seconds": $WRITE_SECS,
              "per_stream": [{"stream": c[0], "request_calls": c[1], "acknowledged": c[2], "failed": c[3]} for c in counts]},
    "written_bytes": sum(c[2] for c in counts) * $RECORD_BYTES,
    "restart_s": round($t1 - $t0, 3),
    "counters_restart": "$target" != "cluster",
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
