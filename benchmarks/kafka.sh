#!/usr/bin/env bash
# Kafka clients on object storage: PicoMQ's Kafka listener against tansu (a
# Kafka-compatible broker in Rust, crates.io `tansu`, storage engine s3://BUCKET/),
# both on the same S3-compatible server (PicoMQ's s3s test server, .ci/s3-server.sh),
# and PicoMQ's own HTTP path on the same PicoMQ server. One server at a time, the
# clients on the same machine, everything on loopback:
#   1. picomq serve --store s3://picomq-ci/kafka-bench --kafka-listen ...:
#      benchmarks/kafka_bench.py (librdkafka through confluent-kafka): RECORDS
#      records of 1 KiB produced to a one-partition topic with acks=all
#      (linger.ms=5), ack latency per record (produce() to delivery report), then
#      all of them consumed from offset 0 by an assigned consumer (no group)
#   2. the same server: `picomq bench` over HTTP, 1 KiB appends, one per request,
#      one stream, HTTP_IN_FLIGHT requests in flight, HTTP_SECS measured after 2 s
#      Then the same records once more from kcat (C, on the librdkafka that
#      confluent-kafka bundles), whose hand-over costs a fraction of Python's, so
#      that the broker rather than the client is what the 2 cores bound
#   3. tansu broker --storage-engine s3://tansu/ (its own bucket on the same
#      server; the topic is created through the admin API): as 1.
# Output: results/kafka.txt (the HTTP run's summary, then one table: PicoMQ over
# Kafka, PicoMQ over HTTP (produce rows only), tansu, and PicoMQ/tansu).
#
#   benchmarks/kafka.sh                          # ~2-3 minutes
#   RECORDS=100000 benchmarks/kafka.sh
#
# Settings (environment): RECORDS (200000), HTTP_IN_FLIGHT (256), HTTP_SECS (10),
# KCAT (the kcat binary, default: kcat on PATH; KCAT= skips its rows),
# PRODUCE_API (produce: one produce() call per record; batch: produce_batch() of
# 1,000, so the Python loop takes less of the 2 cores; results/kafka-batch.txt),
# PICOMQ_BIN (default: the release binary in ~/.cache/picomq/target if there, else
# built), TANSU_BIN (default: tansu $TANSU_VERSION installed with cargo, feature
# dynostore, into TANSU_DIR = ~/.cache/picomq-bench/tansu at first use: 20+ minutes).
# Needs python3 with confluent-kafka (installed with pip if missing).
if [ -z "${PICOMQ_BIN:-}" ] && [ -x "$HOME/.cache/picomq/target/release/picomq" ]; then
  export PICOMQ_BIN=$HOME/.cache/picomq/target/release/picomq
  PICOMQ_BUILD=${PICOMQ_BUILD:-"release build of $(date -u -r "$PICOMQ_BIN" '+%Y-%m-%d %H:%M UTC')"}
fi
source "$(dirname "$0")/lib.sh"
RECORDS=${RECORDS:-200000}
HTTP_IN_FLIGHT=${HTTP_IN_FLIGHT:-256}
HTTP_SECS=${HTTP_SECS:-10}
PRODUCE_API=${PRODUCE_API:-produce}
TANSU_VERSION=0.6.0
TANSU_DIR=${TANSU_DIR:-$HOME/.cache/picomq-bench/tansu}
TANSU_BUCKET=tansu
OUT="$RESULTS/kafka.txt"
[ "$PRODUCE_API" = produce ] || OUT="$RESULTS/kafka-$PRODUCE_API.txt"
DRIVER="$BENCH_DIR/kafka_bench.py"
KCAT=${KCAT-$(command -v kcat || true)}
KCAT_ARGS=()
[ -n "$KCAT" ] && KCAT_ARGS=(--kcat "$KCAT")
build_picomq

if ! python3 -c 'import confluent_kafka' 2>/dev/null; then
  log "installing confluent-kafka"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore confluent-kafka==2.16.1 >&2
fi
if [ -z "${TANSU_BIN:-}" ]; then
  TANSU_BIN=$TANSU_DIR/bin/tansu
  if ! grep -qF "tansu $TANSU_VERSION " "$TANSU_DIR/.crates.toml" 2>/dev/null || [ ! -x "$TANSU_BIN" ]; then
    log "installing tansu@$TANSU_VERSION into $TANSU_DIR (cargo, 20+ minutes)"
    cargo install --version "$TANSU_VERSION" --features dynostore --root "$TANSU_DIR" tansu >&2
  fi
fi

# The S3 test server: beside PICOMQ_BIN, else built with the workspace.
if [ -z "${PICOMQ_S3_TEST_SERVER:-}" ] && [ -x "$(dirname "$PICOMQ")/picomq-s3-test-server" ]; then
  PICOMQ_S3_TEST_SERVER="$(dirname "$PICOMQ")/picomq-s3-test-server"
  export PICOMQ_S3_TEST_SERVER
fi
bash "$REPO/.ci/s3-server.sh" start "$WORK/s3" >&2
S3_PID=$(cat "$WORK/s3/pid")
PIDS+=("$S3_PID")
# shellcheck disable=SC1091
. "$WORK/s3/env"
# A bucket is a directory under the server's root.
mkdir -p "$WORK/s3/root/$TANSU_BUCKET"
NOTE=$(machine_note)

wait_tcp() { # PORT [seconds]
  local port=$1 limit=${2:-30} i
  for ((i = 0; i < limit * 20; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# 1 and 2: PicoMQ on the bucket, Kafka then HTTP.
port=$(free_port)
kport=$(free_port)
start_picomq "$port" --store "s3://$PICOMQ_CI_S3_BUCKET/kafka-bench" --kafka-listen "127.0.0.1:$kport"
wait_tcp "$kport"
log "picomq over Kafka: $RECORDS records"
python3 "$DRIVER" "127.0.0.1:$kport" --records "$RECORDS" --label "picomq kafka" --produce-api "$PRODUCE_API" \
  --server-pid "$SERVER_PID" --store-pid "$S3_PID" "${KCAT_ARGS[@]}" --json "$WORK/picomq-kafka.json" >&2
log "picomq over HTTP: $HTTP_IN_FLIGHT in flight, ${HTTP_SECS}s"
HTTP_FLAGS="--record-bytes 1024 --batch 1 --streams 1 --in-flight $HTTP_IN_FLIGHT --duration ${HTTP_SECS}s --warmup 2s --content-type application/octet-stream"
# shellcheck disable=SC2086
bench "$WORK/picomq-http.json" "$port" "picomq http" $HTTP_FLAGS --quiet
stop_server
grep -iE ' (WARN|ERROR) ' "$WORK/picomq-$port.log" | head -5 >&2 || true

# 3: tansu on its own bucket of the same server.
port=$(free_port)
TANSU_LOG="$WORK/tansu-$port.log"
tansu_ok=1
"$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
  --storage-engine "s3://$TANSU_BUCKET/" >"$TANSU_LOG" 2>&1 &
SERVER_PID=$!
PIDS+=("$SERVER_PID")
if wait_tcp "$port"; then
  log "tansu $TANSU_VERSION on :$port (pid $SERVER_PID): $RECORDS records"
  python3 "$DRIVER" "127.0.0.1:$port" --records "$RECORDS" --label tansu --produce-api "$PRODUCE_API" \
    --server-pid "$SERVER_PID" --store-pid "$S3_PID" "${KCAT_ARGS[@]}" --json "$WORK/tansu.json" >&2 || tansu_ok=0
else
  tansu_ok=0
fi
stop_server
if [ "$tansu_ok" = 0 ]; then
  log "tansu failed; the end of its log:"
  tail -20 "$TANSU_LOG" >&2
  rm -f "$WORK/tansu.json"
fi

{
  echo "# Kafka clients on an S3-compatible server: PicoMQ vs tansu $TANSU_VERSION, and PicoMQ's HTTP path"
  echo "$NOTE"
  echo "commit:  $(git -C "$REPO" rev-parse --short HEAD)"
  echo "setup:   2 cores shared by everything, loopback, PicoMQ's s3s test server (.ci/s3-server.sh) as the one store; one server at a time"
  echo "picomq:  picomq serve --store s3://$PICOMQ_CI_S3_BUCKET/kafka-bench --kafka-listen 127.0.0.1:K (defaults otherwise)"
  echo "tansu:   tansu broker --storage-engine s3://$TANSU_BUCKET/ (crates.io tansu $TANSU_VERSION, feature dynostore; S3 endpoint and keys from AWS_* variables)"
  echo "kafka:   benchmarks/kafka_bench.py, librdkafka $(python3 -c 'import confluent_kafka as c; print(c.libversion()[0])') via confluent-kafka $(python3 -c 'import confluent_kafka as c; print(c.__version__)'): $RECORDS records of 1 KiB, one partition, acks=all, linger.ms=5, no compression, records handed over with $([ "$PRODUCE_API" = batch ] && echo 'produce_batch() 1,000 at a time' || echo 'one produce() call each'); ack = produce() to delivery report; then consumed from offset 0 by an assigned consumer"
  [ -n "$KCAT" ] && echo "kcat:    the same records to a second topic: $KCAT -P -l FILE -X acks=all -X linger.ms=5 (kcat $("$KCAT" -V 2>/dev/null | sed -n 's/^Version \([^ ]*\).*/\1/p') on the same librdkafka; records/s = records over kcat's run, start to exit; no ack latency)"
  echo "http:    picomq bench URL $HTTP_FLAGS"
  echo
  echo "## PicoMQ over HTTP, same server"
  "$PICOMQ" bench compare "$WORK/picomq-http.json"
  echo
  echo "## 1 KiB records, acks=all (HTTP: one record per request, acknowledged once durable)"
  python3 - "$WORK/picomq-kafka.json" "$WORK/picomq-http.json" "$WORK/tansu.json" <<'EOF' | md_table
import json, os, sys
k = json.load(open(sys.argv[1]))
h = json.load(open(sys.argv[2]))["append"]
t = json.load(open(sys.argv[3])) if os.path.exists(sys.argv[3]) else None
# figure | PicoMQ Kafka key | HTTP value | format | higher is better
rows = [
    ("produce records/s", "produce_records_per_s", h["records_per_s"], "{:,.0f}", True),
    ("produce MiB/s", "produce_mib_per_s", h["mib_per_s"], "{:.1f}", True),
    ("ack p50 ms", "ack_p50_ms", h["ack_latency_ms"]["p50"], "{:.1f}", False),
    ("ack p99 ms", "ack_p99_ms", h["ack_latency_ms"]["p99"], "{:.1f}", False),
    ("produce records/s, kcat", "kcat_produce_records_per_s", None, "{:,.0f}", True),
    ("produce MiB/s, kcat", "kcat_produce_mib_per_s", None, "{:.1f}", True),
    ("consume records/s", "consume_records_per_s", None, "{:,.0f}", True),
    ("consume MiB/s", "consume_mib_per_s", None, "{:.1f}", True),
]
print("figure\tPicoMQ (Kafka)\tPicoMQ (HTTP)\ttansu\tPicoMQ/tansu\ttarget")
for name, key, http, fmt, higher in rows:
    if key not in k:
        continue
    ratio = k[key] / t[key] if t and t.get(key) else None
    if ratio is None:
        target = "-"
    elif name.startswith(("produce records/s", "consume records")):
        target = ">= 2x: " + ("met" if ratio >= 2 else "not met")
    elif name == "ack p99 ms":
        target = "lower: " + ("met" if ratio < 1 else "not met")
    else:
        target = ""
    print("\t".join([name, fmt.format(k[key]), "-" if http is None else fmt.format(http),
                     fmt.format(t[key]) if t and key in t else "failed",
                     "-" if ratio is None else f"{ratio:.2f}x", target]))
EOF
  echo
  python3 - "$WORK/picomq-kafka.json" "$WORK/tansu.json" <<'EOF'
import json, os, sys
runs = [("PicoMQ", sys.argv[1]), ("tansu", sys.argv[2])]
parts = [f"{name} {r['enqueue_s']:.2f} s of {r['produce_s']:.2f} s"
         for name, path in runs if os.path.exists(path) for r in [json.load(open(path))]]
cpu = []
for name, path in runs:
    if not os.path.exists(path):
        continue
    r = json.load(open(path))
    for label, pre, client in (("Python", "produce", "client"), ("kcat", "kcat_produce", "kcat")):
        if r.get(pre + "_store_cpu_s") is not None:
            cpu.append(f"{name} with {label}: broker {r[pre + '_server_cpu_s']:.2f} s, store "
                       f"{r[pre + '_store_cpu_s']:.2f} s, {client} {r[pre + '_client_cpu_s']:.2f} s "
                       f"in {r[pre + '_s']:.2f} s of wall time")
if cpu:
    print("CPU while producing (utime + stime; 2 cores give at most twice the wall time): "
          + "; ".join(cpu) + ".")
    print()
print("Kafka ack latency includes the time a record waits in librdkafka's queue: every record"
      " is handed to produce() at once (" + ", ".join(parts) + "), so ack p50 comes"
      " close to half the produce time. HTTP: a fixed number of requests in flight, no queue.")
EOF
  echo
  if [ "$tansu_ok" = 0 ]; then
    echo "tansu failed; the end of its log:"
    tail -20 "$TANSU_LOG" | sed 's/^/    /'
    echo
  fi
  echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
log "written to $OUT"
