#!/usr/bin/env bash
# Cold replay of a long history: one stream of $MIB MiB (default 1024) written
# through the WAL, replayed from the start on a freshly started node (empty caches),
# compacted, and replayed again. Reports MiB/s and object-store GETs per MiB, on the
# local-directory store and on an S3-compatible server (PicoMQ's s3s test server)
# with 20 ms injected per request.
# Output: results/cold-replay.txt
#
#   benchmarks/cold-replay.sh            (MIB=256 benchmarks/cold-replay.sh for a quick run)
source "$(dirname "$0")/lib.sh"
build_picomq
MIB=${MIB:-1024}
OUT="$RESULTS/cold-replay.txt"
DRIVER="$BENCH_DIR/cold-replay.py"
# No tail cache (every read goes through the index), compaction only when asked.
COMMON=(--tail-cache-bytes 0 --compaction-interval 0 --compaction-delay 0s
  --compaction-bytes-per-sec 4000000000 --compaction-requests-per-sec 1000)

serve() { # DIR PORT [flags...]: start (or restart) a node on DIR
  local dir=$1 port=$2
  shift 2
  "$PICOMQ" serve --listen "127.0.0.1:$port" --data-dir "$dir" "${COMMON[@]}" "$@" >>"$dir.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_ready "http://127.0.0.1:$port/readyz" 300
}

stop() { kill "$SERVER_PID" && wait "$SERVER_PID" 2>/dev/null || true; }

run() { # TAG [serve flags...]
  local tag=$1
  shift
  local dir="$WORK/replay-$tag" port
  port=$(free_port)
  mkdir -p "$dir"
  local base="http://127.0.0.1:$port"
  serve "$dir" "$port" "$@"
  log "$tag: writing $MIB MiB"
  local wrote
  wrote=$(python3 "$DRIVER" write "$base" /history "$MIB")
  stop
  serve "$dir" "$port" "$@"
  log "$tag: cold replay through the WAL objects"
  local wal
  wal=$(python3 "$DRIVER" replay "$base" /history)
  log "$tag: compacting"
  local t0 t1 report
  t0=$(date +%s.%N)
  report=$(curl -s -X POST "$base/__picomq/compact?delay=0s")
  t1=$(date +%s.%N)
  stop
  serve "$dir" "$port" "$@"
  log "$tag: cold replay after compaction"
  local seg
  seg=$(python3 "$DRIVER" replay "$base" /history)
  stop
  {
    echo "## $tag: picomq serve ${COMMON[*]} $*"
    echo "write:                     $wrote"
    echo "replay before compaction:  $wal"
    echo "compaction ($(python3 -c "print(round($t1 - $t0, 1))") s): $report"
    echo "replay after compaction:   $seg"
    echo
  } | tee -a "$OUT.tmp"
}

rm -f "$OUT.tmp"
{
  echo "# Cold replay of one ${MIB} MiB stream ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "# picomq $(git -C "$REPO" rev-parse --short HEAD); records of 256 KiB; reads are catch-up GETs of at most 1 MiB each"
  echo
} >"$OUT.tmp"
run local-dir
bash "$REPO/.ci/s3-server.sh" start "$WORK/s3" >&2
PIDS+=("$(cat "$WORK/s3/pid")")
# shellcheck disable=SC1091
. "$WORK/s3/env"
run s3-20ms --store "s3://$PICOMQ_CI_S3_BUCKET/replay" --store-latency 20ms
mv "$OUT.tmp" "$OUT"
log "written to $OUT"
