#!/usr/bin/env bash
# The measurements behind the leads in docs/performance.md, "Against Electric's
# durable-streams server": for PicoMQ and Electric's server (each fresh, defaults)
#   heads   response head bytes of a create, an append and a catch-up read
#   conns   VmHWM and VmRSS of the fresh server before any request, then RSS per
#           idle keep-alive connection (512 connections, one append each)
#   io      the 1 KiB load of peers.sh (10 s, no warm-up, so that everything the
#           server wrote is counted): bytes the server passed to write/pwrite
#           (wchar) and bytes it caused to be written to disk (write_bytes), from
#           /proc/PID/io, per byte of record acknowledged
# then PicoMQ alone with one setting changed, the rest as above:
#   io  with --block-cache-bytes 0 (memory and page faults of the block cache)
#   catch-up (benchmarks/bytes.py): defaults, --max-read-bytes 16MiB (fewer
#   requests), --block-cache-bytes 1GiB (the 256 MiB stream fits in the cache), both
# Output: results/peers-leads.txt, JSON in results/json/peers-leads/.
#
#   benchmarks/peers-leads.sh        # ~5 minutes
source "$(dirname "$0")/lib.sh"
build_picomq
install_electric
JSON="$RESULTS/json/peers-leads"
OUT="$RESULTS/peers-leads.txt"
LOAD="--record-bytes 1024 --batch 1 --streams 64 --in-flight 512 --duration 10s --warmup 0s"
mkdir -p "$JSON"
rm -f "$JSON"/*.json
NOTE=$(machine_note)

io_field() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/io"; }

# io_run NAME: the 1 KiB load on the server at $port, with /proc/PID/io around it.
io_run() {
  local name=$1 w0 b0
  w0=$(io_field "$SERVER_PID" wchar)
  b0=$(io_field "$SERVER_PID" write_bytes)
  # shellcheck disable=SC2086
  bench "$JSON/io-$name.json" "$port" "$name" $LOAD --quiet
  echo "{\"wchar\": $(($(io_field "$SERVER_PID" wchar) - w0)), \"write_bytes\": $(($(io_field "$SERVER_PID" write_bytes) - b0))}" \
    >"$JSON/io-$name-proc.json"
}

start() { # SERVER [flags]
  local server=$1
  shift
  port=$(free_port)
  if [ "$server" = electric ]; then start_electric "$port"; else start_picomq "$port" "$@"; fi
}

for server in picomq electric; do
  start "$server"
  python3 "$BENCH_DIR/peers-leads.py" conns "http://127.0.0.1:$port/v1/stream" --server-pid "$SERVER_PID" \
    >"$JSON/conns-$server.json"
  python3 "$BENCH_DIR/peers-leads.py" headers "http://127.0.0.1:$port/v1/stream" >"$JSON/heads-$server.json"
  stop_server
  start "$server"
  io_run "$server"
  stop_server
done
start picomq --block-cache-bytes 0
io_run picomq-block-cache-0
stop_server
# name | serve flags
declare -A READ_FLAGS=(
  [defaults]=""
  [read-16MiB]="--max-read-bytes 16MiB"
  [cache-1GiB]="--block-cache-bytes 1GiB"
  [both]="--max-read-bytes 16MiB --block-cache-bytes 1GiB"
)
for v in defaults read-16MiB cache-1GiB both; do
  # shellcheck disable=SC2086
  start picomq ${READ_FLAGS[$v]}
  python3 "$BENCH_DIR/bytes.py" "http://127.0.0.1:$port/v1/stream" --server-pid "$SERVER_PID" \
    --label "picomq ${READ_FLAGS[$v]}" >"$JSON/bytes-picomq-$v.json"
  stop_server
done

{
  echo "# Leads: PicoMQ vs Electric's durable-streams-server $ELECTRIC_VERSION, small measurements"
  echo "$NOTE"
  echo "load: picomq bench URL $LOAD"
  echo
  python3 - "$JSON" <<'PY'
import json, os, sys
d = sys.argv[1]
j = lambda n: json.load(open(os.path.join(d, n + ".json")))
print("response head bytes (status line + headers), JSON stream:")
for s in ("picomq", "electric"):
    h = j(f"heads-{s}")
    print(f"  {s:9} create {h['create']['head_bytes']}, append {h['append']['head_bytes']}, "
          f"catch-up read {h['catch_up']['head_bytes']} (body {h['catch_up']['body_bytes']})")
print("\nfresh server, before any request; then RSS per idle keep-alive connection (512, one append each):")
for s in ("picomq", "electric"):
    c = j(f"conns-{s}")
    print(f"  {s:9} VmHWM {c['hwm_kib_at_start'] / 1024:.1f} MiB, VmRSS {c['rss_kib_before'] / 1024:.1f} MiB; "
          f"with the connections {c['rss_kib_after'] / 1024:.1f} MiB: {c['kib_per_conn']:.1f} KiB per connection")
print("\n1 KiB load, whole run; writes per byte of record acknowledged (/proc/PID/io):")
for s in ("picomq", "electric", "picomq-block-cache-0"):
    r, p = j(f"io-{s}"), j(f"io-{s}-proc")
    a, sv = r["append"], r["server"]
    print(f"  {s:21} {a['records_per_s']:9,.0f} appends/s  CPU {sv['cpu_s_per_million_records']:5.1f} us/record  "
          f"VmHWM {sv['vm_hwm_mb']:6.1f} MiB  RSS sampled {sv['rss_mb_peak_sampled']:6.1f} MiB  "
          f"wchar {p['wchar'] / a['bytes']:.2f}  write_bytes {p['write_bytes'] / a['bytes']:.2f}")
print("\nPicoMQ catch-up of one 256 MiB stream (benchmarks/bytes.py), serve flags changed:")
for m, flags in (("defaults", "defaults"), ("read-16MiB", "--max-read-bytes 16MiB"),
                 ("cache-1GiB", "--block-cache-bytes 1GiB"), ("both", "both")):
    b = j(f"bytes-picomq-{m}")
    one = max(p["mib_per_s"] for p in b["catch_up_1"])
    n = b["catch_up_n"]
    cpu = n["server_cpu_s"] / (n["readers"] * b["stream_bytes"] / 2**30)
    print(f"  {flags:24} 1 reader {one:6,.0f} MiB/s  16 readers {n['mib_per_s']:6,.0f} MiB/s  "
          f"server CPU {cpu:.2f} s/GiB  requests per read {b['catch_up_1'][0]['requests']}  "
          f"sequential 64 KiB appends {b['sequential']['mib_per_s']:.0f} MiB/s")
PY
  echo
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
