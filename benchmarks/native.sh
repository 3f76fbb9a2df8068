#!/usr/bin/env bash
# The native record API against the Durable Streams path, on one PicoMQ server on its
# defaults (local directory store, SQLite index), everything on loopback:
# - appends: 16 writers (one stream each), 100 B and 1 KiB records, native batches of
#   1 and 100 records against Durable Streams appends of the same records (the lone
#   message, or a JSON array), 10 s each: records/s, MiB/s, request p50/p99;
# - catch-up reads of one 1M-record stream: records?seq=..&count=1000 against ?offset=..;
# - reads by time on a 10M-record stream (filled by 4 writers, native batches of
#   1,000): 1,000 random targets each for records?timestamp=T&count=1 (and with
#   bytes=1) and the Durable Streams ?timestamp=T, p50/p90/p99/max, every answer
#   checked against the fill's acknowledgements (mismatches must be 0).
# About 6 minutes on 2 cores. Output: results/native.txt (QUICK=1: a smoke run of
# about a minute into results/native-quick.txt).
#
#   benchmarks/native.sh      (WRITERS=16 SIZES=100,1024 BATCHES=1,100 DURATION=10s
#                              READ_RECORDS=1000000 SEEK_RECORDS=10000000 SEEKS=1000)
source "$(dirname "$0")/lib.sh"
if [ "${QUICK:-0}" = 1 ]; then
  : "${DURATION:=2s}" "${READ_RECORDS:=100000}" "${SEEK_RECORDS:=500000}" "${SEEKS:=200}"
  OUT="$RESULTS/native-quick.txt"
else
  OUT="$RESULTS/native.txt"
fi
build_picomq
port=$(free_port)
start_picomq "$port"

{
  echo "# native record API vs Durable Streams: picomq $(git -C "$REPO" rev-parse --short HEAD)"
  machine_note
  "$PICOMQ" bench native --url "http://127.0.0.1:$port" --server-pid "$SERVER_PID" \
    --writers "${WRITERS:-16}" --record-bytes "${SIZES:-100,1024}" --batch "${BATCHES:-1,100}" \
    --duration "${DURATION:-10s}" --read-records "${READ_RECORDS:-1000000}" \
    --seek-records "${SEEK_RECORDS:-10000000}" --seeks "${SEEKS:-1000}" \
    --fill-writers "${FILL_WRITERS:-4}"
  echo "server RSS at end: $(awk '/VmRSS/ {printf "%.0f MiB", $2/1024}' "/proc/$SERVER_PID/status"), data dir $(du -sh "$WORK/picomq-$port" | cut -f1)"
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$OUT"
