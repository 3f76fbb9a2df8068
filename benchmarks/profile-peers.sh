#!/usr/bin/env bash
# Where each server's CPU goes under the same load: PicoMQ and Electric's Rust
# server (crates.io durable-streams, lib.sh install_electric) in turn, each fresh,
# driven by `picomq bench` (1 KiB JSON records, 64 streams, 512 in flight, as in
# peers.sh's `many`), `perf record -g` of the server for SECONDS_PROFILED seconds
# in the middle of the run, then the heaviest symbols by self time and the split
# by binary (kernel, the server, libc). Output: results/profile-peers-SERVER.txt
# (results/profile-peers-NAME-SERVER.txt with NAME set).
# WORKLOAD=bytes profiles the catch-up reads of benchmarks/bytes.py instead (one
# 256 MiB stream: 10 passes by one reader, then 16 readers at once; perf starts
# after the warm-up read and stops when the reads end), into
# results/profile-peers-bytes-SERVER.txt.
#
#   benchmarks/profile-peers.sh
#   NAME=batched WORKLOAD="--record-bytes 100 --batch 10 --streams 4 --in-flight 64" benchmarks/profile-peers.sh
#   WORKLOAD=bytes benchmarks/profile-peers.sh
#
# Needs perf (Debian: linux-perf) and root or perf_event_paranoid <= 1.
source "$(dirname "$0")/lib.sh"
SERVERS=${SERVERS:-"picomq electric"}
WORKLOAD=${WORKLOAD:-"--record-bytes 1024 --batch 1 --streams 64 --in-flight 512"}
SECONDS_PROFILED=${SECONDS_PROFILED:-10}
NAME=${NAME:-}

command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }
build_picomq
install_electric

for server in $SERVERS; do
  port=$(free_port)
  case $server in
    picomq) start_picomq "$port" ;;
    electric) start_electric "$port" ;;
    *) echo "unknown server $server (picomq, electric)" >&2 && exit 2 ;;
  esac
  if [ "$WORKLOAD" = bytes ]; then
    out="$RESULTS/profile-peers-bytes-$server.txt"
    rm -f "$WORK/mark"
    python3 "$BENCH_DIR/bytes.py" "http://127.0.0.1:$port/v1/stream" --server-pid "$SERVER_PID" \
      --passes 10 --mark "$WORK/mark" >"$WORK/bytes-$server.json" &
    bytes_pid=$!
    while [ ! -e "$WORK/mark" ]; do sleep 0.1; done
    log "perf record -g until the reads end (pid $SERVER_PID)"
    perf record -q -g -p "$SERVER_PID" -o "$WORK/perf-$server.data" 2>/dev/null &
    perf_pid=$!
    wait "$bytes_pid"
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
  else
    out="$RESULTS/profile-peers-${NAME:+$NAME-}$server.txt"
    total=$((SECONDS_PROFILED + 8))
    # shellcheck disable=SC2086
    bench "$WORK/bench-$server.json" "$port" "$server" $WORKLOAD --duration "${total}s" --warmup 1s --quiet &
    bench_pid=$!
    sleep 4
    log "perf record -g for ${SECONDS_PROFILED}s (pid $SERVER_PID)"
    perf record -q -g -p "$SERVER_PID" -o "$WORK/perf-$server.data" -- sleep "$SECONDS_PROFILED" 2>/dev/null
    wait "$bench_pid"
  fi
  stop_server
  {
    if [ "$WORKLOAD" = bytes ]; then
      echo "# $server serving catch-up reads of one 256 MiB stream (benchmarks/bytes.py --passes 10)"
    else
      echo "# $server under picomq bench $WORKLOAD"
    fi
    machine_note
    if [ "$server" = electric ]; then echo "electric: durable-streams-server $ELECTRIC_VERSION (crates.io), defaults"; fi
    if [ "$WORKLOAD" = bytes ]; then
      echo "perf record -g -p PID from the end of the warm-up read to the end of the reads"
      python3 - "$WORK/bytes-$server.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
one, n = r["catch_up_1"], r["catch_up_n"]
print(f"bytes.py: 1 reader {min(p['mib_per_s'] for p in one):,.0f}-{max(p['mib_per_s'] for p in one):,.0f} MiB/s "
      f"({one[0]['requests']} requests per read), 16 readers {n['mib_per_s']:,.0f} MiB/s")
PY
    else
      echo "perf record -g -p PID for ${SECONDS_PROFILED}s, starting 4 s into a $((total + 1)) s bench run"
      python3 - "$WORK/bench-$server.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
a, s = r["append"], r.get("server") or {}
print(f"bench (whole run): {a['records_per_s']:,.0f} records/s, ack p99 {a['ack_latency_ms']['p99']:.1f} ms, "
      f"server CPU {s.get('cpu_s', 0):.1f} s ({s.get('cpu_s_per_million_records', 0):.1f} us/record)")
PY
    fi
    echo
    echo "## by binary (self time)"
    perf report -i "$WORK/perf-$server.data" --no-children -g none --sort dso --percent-limit 1 --stdio 2>/dev/null |
      grep -v '^#' | grep -v '^$' | sed -n 1,12p
    echo
    echo "## symbols, self time, flat (perf report --no-children -g none --percent-limit 0.7)"
    perf report -i "$WORK/perf-$server.data" --no-children -g none --percent-limit 0.7 --stdio 2>/dev/null |
      grep -v '^#' | grep -v '^$'
    echo
    echo "## with call chains (perf report --no-children --percent-limit 2 --stdio | head -80)"
    # sed, not head: head would stop reading, and perf's SIGPIPE fail the pipeline.
    perf report -i "$WORK/perf-$server.data" --no-children --percent-limit 2 --stdio 2>/dev/null | sed -n 1,80p
  } >"$out"
  log "wrote $out"
done
