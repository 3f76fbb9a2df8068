#!/usr/bin/env bash
# Streams as Iceberg tables (benchmarks/tables.py): export throughput of a
# backlog (records/s, MiB/s), the object-store requests per MiB exported, and
# the delay from append to query visibility at commitInterval 1s and at the
# default 1m; one PicoMQ server on its defaults (local directory store, SQLite),
# everything on loopback. No peer runs here: Redpanda's Iceberg topics and the
# Kafka Connect Iceberg sink need their own clusters.
# About 5 minutes on 2 cores (most of it waiting on the 1m interval).
# Output: results/tables.txt
#
#   benchmarks/tables.sh      (STREAMS=8 RECORDS=1000000 RECORD_BYTES=200 VIS_DEFAULT=3 VIS_FAST=10)
source "$(dirname "$0")/lib.sh"
OUT="$RESULTS/tables.txt"
build_picomq
port=$(free_port)
start_picomq "$port"
{
  machine_note
  python3 -u "$BENCH_DIR/tables.py" "http://127.0.0.1:$port"
} | tee "$OUT"
