#!/usr/bin/env bash
# Scale: create 1,000,000 streams with one small append each (64 requests in
# flight), report the time and server RSS right after and after the dormancy
# timeout (default 60 s; we wait 75 s), then append and read latency on 1,000
# random idle streams, one request at a time. Output: results/scale.txt
#
#   benchmarks/scale.sh            # STREAMS=100000 for a quicker look
#
# Each stream costs two requests (PUT, then POST of the record). With
# CREATE_WITH_BODY=1 each stream is one PUT carrying the record as the stream's
# initial data (output: results/scale-put-body.txt).
source "$(dirname "$0")/lib.sh"
build_picomq
MODE=""
SUFFIX=""
if [ -n "${CREATE_WITH_BODY:-}" ]; then
  MODE="--create-with-body"
  SUFFIX="-put-body"
fi
OUT="$RESULTS/scale$SUFFIX.txt"
JSON="$RESULTS/json/scale$SUFFIX"
mkdir -p "$JSON"
STREAMS=${STREAMS:-1000000}
NOTE=$(machine_note)
port=$(free_port)
start_picomq "$port" "$@"
# shellcheck disable=SC2086
bench "$JSON/scale.json" "$port" "picomq $STREAMS streams" --workload create \
  --streams "$STREAMS" --in-flight 64 --record-bytes 64 --idle-wait 75s --sample 1000 $MODE
{
  echo "# Scale: $STREAMS streams, one 64 B append each"
  echo "$NOTE"
  echo "server: picomq serve $* (defaults otherwise: dormancy 60s); bench: --workload create --in-flight 64 --idle-wait 75s --sample 1000 $MODE"
  echo "data on disk after: $(du -sh "$WORK/picomq-$port" | cut -f1)"
  echo
  "$PICOMQ" bench compare "$JSON/scale.json"
  echo
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
stop_server
