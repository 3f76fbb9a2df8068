#!/usr/bin/env bash
# The cluster on this machine: PicoMQ nodes on one Postgres and one S3-compatible
# server (PicoMQ's s3s-fs test server), HAProxy round robin in front.
#
#   benchmarks/cluster.sh            all four parts, tables in results/cluster.txt
#   PARTS="throughput proxy" benchmarks/cluster.sh    some of them
#
# Parts:
#   throughput  1 node vs 3 nodes behind HAProxy: `picomq bench` appends (1 KiB
#               records, 64 in flight, 16 streams, 10 s), appends/s and latency.
#   proxy       the hop a non-owner adds: one append at a time, straight to the
#               stream's owner vs to another node (which forwards it), p50/p99.
#   failover    benchmarks/failover.py: writers through HAProxy, KILLS (10) rounds of
#               `kill -9` of the node serving most streams, time to the first
#               acknowledged append on each of its streams; every acknowledged
#               record read back afterwards.
#   create      stream creation rate on one node on Postgres, CREATE_STREAMS
#               (1,000,000) streams, then a random sample appended to and read.
#
# Everything shares the machine's cores: the nodes, Postgres, the S3 server, HAProxy
# and the load generator. A 3-node figure here says what routing and ownership cost
# on 2 cores, not what 3 machines would do.
source "$(dirname "$0")/lib.sh"

PARTS=${PARTS:-throughput proxy failover create}
KILLS=${KILLS:-10}
CREATE_STREAMS=${CREATE_STREAMS:-1000000}
LEASE=${LEASE:-}
OUT="$RESULTS/cluster.txt"
JSON="$RESULTS/json/cluster"
mkdir -p "$JSON"

build_picomq
# The S3 test server: beside a given PICOMQ_BIN, else built with the workspace.
if [ -z "${PICOMQ_S3_TEST_SERVER:-}" ] && [ -x "$(dirname "$PICOMQ")/picomq-s3-test-server" ]; then
  export PICOMQ_S3_TEST_SERVER="$(dirname "$PICOMQ")/picomq-s3-test-server"
fi

log "starting Postgres and the S3 server"
bash "$REPO/.ci/postgres.sh" start "$WORK/pg" >&2
# shellcheck disable=SC1091
. "$WORK/pg/env"
bash "$REPO/.ci/s3-server.sh" start "$WORK/s3" >&2
PIDS+=("$(cat "$WORK/s3/pid")")
# shellcheck disable=SC1091
. "$WORK/s3/env"
stop_services() {
  bash "$REPO/.ci/haproxy.sh" stop "$WORK/haproxy" >/dev/null 2>&1 || true
  cleanup
  bash "$REPO/.ci/postgres.sh" stop "$WORK/pg" >/dev/null 2>&1 || true
}
trap stop_services EXIT

NODE_PIDS=()
NODE_URLS=()
# start_nodes TAG N [flags]: N nodes on a fresh database and bucket prefix TAG.
start_nodes() {
  local tag=$1 n=$2 i port
  shift 2
  local meta
  meta=$(bash "$REPO/.ci/postgres.sh" createdb "$WORK/pg" "$tag")
  NODE_PIDS=()
  NODE_URLS=()
  mkdir -p "$WORK/$tag"
  for ((i = 1; i <= n; i++)); do
    port=$(free_port)
    local cmd="exec '$PICOMQ' serve --listen 127.0.0.1:$port --advertise http://127.0.0.1:$port \
--data-dir '$WORK/$tag/node$i' --meta '$meta' --store 's3://$PICOMQ_CI_S3_BUCKET/$tag' \
--node-id node$i ${LEASE:+--lease $LEASE} $*"
    echo "$cmd" >"$WORK/$tag/node$i.cmd"
    bash -c "$cmd" >"$WORK/$tag/node$i.log" 2>&1 &
    echo $! >"$WORK/$tag/node$i.pid"
    NODE_PIDS+=($!)
    PIDS+=($!)
    NODE_URLS+=("http://127.0.0.1:$port")
  done
  for url in "${NODE_URLS[@]}"; do wait_ready "$url/readyz" 60; done
  # Every node sees every other, every slot is owned and the shares are settled
  # (each at least three quarters of a fair share): no hand-over under way.
  local tries
  for ((tries = 0; tries < 200; tries++)); do
    if curl -fsS "${NODE_URLS[0]}/__picomq/nodes" 2>/dev/null | python3 -c '
import json, sys
n = int(sys.argv[1])
nodes = [m for m in json.load(sys.stdin)["nodes"] if m["state"] == "live"]
fair = 1024 / n
settled = sum(m["slots"] for m in nodes) == 1024 and all(m["slots"] >= 0.75 * fair for m in nodes)
sys.exit(0 if len(nodes) == n and settled else 1)' "$n" 2>/dev/null; then
      log "$n nodes up and balanced ($tag)"
      return 0
    fi
    sleep 0.1
  done
  log "$tag: the nodes did not balance; node ls:"
  "$PICOMQ" node ls --url "${NODE_URLS[0]}" >&2 || true
  return 1
}

stop_nodes() {
  local pid
  for pid in "${NODE_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${NODE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}

start_lb() { # sets LB_URL
  local port
  port=$(free_port)
  bash "$REPO/.ci/haproxy.sh" stop "$WORK/haproxy" >/dev/null 2>&1 || true
  bash "$REPO/.ci/haproxy.sh" start "$WORK/haproxy" "$port" "${NODE_URLS[@]#http://}" >&2
  LB_URL="http://127.0.0.1:$port"
}

run_bench() { # OUT.json URL LABEL [flags]
  local out=$1 url=$2 label=$3
  shift 3
  "$PICOMQ" bench "$url/v1/stream" --label "$label" --metrics-url off --output json "$@" >"$out"
}

{
  echo "# benchmarks/cluster.sh"
  machine_note
  echo "postgres: $(postgres --version 2>/dev/null || ls /usr/lib/postgresql)"
  echo "haproxy: $(haproxy -v 2>/dev/null | head -1)"
  echo
} >"$OUT"

BENCH_FLAGS=(--record-bytes 1024 --in-flight 64 --streams 16 --duration 10s --warmup 2s)

for part in $PARTS; do
  case $part in
  throughput)
    log "throughput: 1 node"
    start_nodes tput1 1
    run_bench "$JSON/one-node.json" "${NODE_URLS[0]}" "1 node (Postgres + S3)" "${BENCH_FLAGS[@]}"
    stop_nodes
    log "throughput: 3 nodes behind HAProxy"
    start_nodes tput3 3
    start_lb
    run_bench "$JSON/three-nodes.json" "$LB_URL" "3 nodes via HAProxy" "${BENCH_FLAGS[@]}"
    stop_nodes
    {
      echo "## 1 node vs 3 nodes behind HAProxy (${BENCH_FLAGS[*]})"
      "$PICOMQ" bench compare "$JSON/one-node.json" "$JSON/three-nodes.json"
      echo
    } >>"$OUT"
    ;;
  proxy)
    log "proxy: one append at a time, to the owner and through a non-owner"
    start_nodes proxy 3
    curl -fsS -X PUT -H 'content-type: application/json' "${NODE_URLS[0]}/v1/stream/hop-0" -o /dev/null
    owner=$(curl -fsS -D - -o /dev/null -X POST -H 'content-type: application/json' \
      --data '[1]' "${NODE_URLS[0]}/v1/stream/hop-0" | tr -d '\r' | awk -F': ' 'tolower($1)=="picomq-served-by" {print $2}')
    [ -n "$owner" ] || { log "no picomq-served-by header"; exit 1; }
    idx=${owner#node}
    other=$((idx % 3 + 1))
    lone=(--record-bytes 100 --in-flight 1 --streams 1 --stream-prefix hop --duration 10s --warmup 1s)
    run_bench "$JSON/lone-owner.json" "${NODE_URLS[$((idx - 1))]}" "lone append, to the owner" "${lone[@]}"
    run_bench "$JSON/lone-proxied.json" "${NODE_URLS[$((other - 1))]}" "lone append, via a non-owner" "${lone[@]}"
    stop_nodes
    {
      echo "## The added hop: lone 100 B appends to the owner ($owner) vs via node$other"
      "$PICOMQ" bench compare "$JSON/lone-owner.json" "$JSON/lone-proxied.json"
      echo
    } >>"$OUT"
    ;;
  failover)
    log "failover: $KILLS kills through HAProxy"
    start_nodes failover 3
    start_lb
    {
      echo "## Failover: kill -9 of the node serving most streams, $KILLS rounds (lease ${LEASE:-default})"
      python3 "$BENCH_DIR/failover.py" "$LB_URL" "$KILLS" "$WORK/failover"
      echo
    } >>"$OUT" || { log "failover.py failed"; tail -40 "$OUT" >&2; exit 1; }
    # The restarted nodes are not in NODE_PIDS; stop them by their pid files.
    for i in 1 2 3; do kill "$(cat "$WORK/failover/node$i.pid")" 2>/dev/null || true; done
    stop_nodes
    ;;
  create)
    log "create: $CREATE_STREAMS streams on one node on Postgres"
    start_nodes create 1
    run_bench "$JSON/create.json" "${NODE_URLS[0]}" "create $CREATE_STREAMS streams (Postgres)" \
      --workload create --streams "$CREATE_STREAMS" --in-flight 64 --sample 1000
    rows=$(psql "${PICOMQ_CI_PG_URL%/*}/create" -tAc 'select count(*) from streams')
    stop_nodes
    {
      echo "## Creating $CREATE_STREAMS streams on one node on Postgres"
      "$PICOMQ" bench compare "$JSON/create.json"
      echo "rows in the streams table afterwards: $rows"
      echo
    } >>"$OUT"
    ;;
  *)
    log "unknown part $part"
    exit 2
    ;;
  esac
done
cat "$OUT"
