# shellcheck shell=bash
# Shared by the benchmark scripts (source it): build PicoMQ, start and stop servers
# on loopback, install the Durable Streams reference server from npm and Electric's
# Rust server from crates.io at run time, and run `picomq bench`. Nothing here talks
# to anything but 127.0.0.1 (and the package registries, to install).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)
RESULTS=${RESULTS:-$BENCH_DIR/results}
WORK=${BENCH_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/picomq-bench.XXXXXX")}
PEER_DIR=${PEER_DIR:-$HOME/.cache/picomq-bench/peer}
PEER_VERSION=0.3.7
# Electric's Rust server (crates.io `durable-streams`), built by cargo at first use.
ELECTRIC_DIR=${ELECTRIC_DIR:-$HOME/.cache/picomq-bench/electric}
ELECTRIC_VERSION=0.1.5
# Set PICOMQ_BIN to bench a binary you built elsewhere; otherwise we build one.
PICOMQ=${PICOMQ_BIN:-}
mkdir -p "$RESULTS" "$WORK"
PIDS=()

cleanup() {
  local pid
  for pid in "${PIDS[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
  [ -z "${BENCH_WORK:-}" ] && rm -rf "$WORK"
  return 0
}
trap cleanup EXIT

log() { echo "== $*" >&2; }

build_picomq() {
  if [ -z "$PICOMQ" ]; then
    log "building picomq (release)"
    (cd "$REPO" && cargo build --release -p picomq >&2)
    # A private copy: a rebuild during the run must not swap the binary under us.
    cp "${CARGO_TARGET_DIR:-$REPO/target}/release/picomq" "$WORK/picomq"
    PICOMQ="$WORK/picomq"
  fi
}

install_peer() {
  if [ "$(node -e 'try{console.log(require(process.argv[1]).version)}catch{}' "$PEER_DIR/node_modules/@durable-streams/server/package.json" 2>/dev/null)" != "$PEER_VERSION" ]; then
    log "installing @durable-streams/server@$PEER_VERSION into $PEER_DIR"
    mkdir -p "$PEER_DIR"
    echo '{"name":"picomq-bench-peer","private":true,"type":"module"}' > "$PEER_DIR/package.json"
    (cd "$PEER_DIR" && npm install --no-audit --no-fund --loglevel=error "@durable-streams/server@$PEER_VERSION" >&2)
  fi
  cp "$BENCH_DIR/peer-server.mjs" "$PEER_DIR/peer-server.mjs"
}

# The installed version is recorded in cargo's .crates.toml under the root.
install_electric() {
  if ! grep -qF "durable-streams $ELECTRIC_VERSION " "$ELECTRIC_DIR/.crates.toml" 2>/dev/null ||
    [ ! -x "$ELECTRIC_DIR/bin/durable-streams-server" ]; then
    log "installing durable-streams@$ELECTRIC_VERSION into $ELECTRIC_DIR (cargo, a few minutes)"
    cargo install --quiet --locked --version "$ELECTRIC_VERSION" --root "$ELECTRIC_DIR" durable-streams >&2
  fi
}

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)); }

wait_http() { # URL [seconds]
  local url=$1 limit=${2:-30} i
  for ((i = 0; i < limit * 20; i++)); do
    curl -s -o /dev/null "$url" && return 0
    sleep 0.05
  done
  echo "no answer from $url within ${limit}s" >&2
  return 1
}

wait_ready() { # URL [seconds]: until it answers 200 (a recovering PicoMQ answers 503)
  local url=$1 limit=${2:-60} i
  for ((i = 0; i < limit * 20; i++)); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url")" = 200 ] && return 0
    sleep 0.05
  done
  echo "$url not ready within ${limit}s" >&2
  return 1
}

# start_picomq PORT [serve flags...]: sets SERVER_PID; data in $WORK/picomq-PORT.
start_picomq() {
  local port=$1
  shift
  local dir="$WORK/picomq-$port"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$PICOMQ" serve --listen "127.0.0.1:$port" --data-dir "$dir" "$@" >"$dir.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_ready "http://127.0.0.1:$port/readyz"
  log "picomq $* on :$port (pid $SERVER_PID)"
}

# start_peer PORT: sets SERVER_PID; file-backed store in $WORK/peer-PORT.
start_peer() {
  local port=$1
  local dir="$WORK/peer-$port"
  rm -rf "$dir"
  mkdir -p "$dir"
  PORT=$port DATA_DIR="$dir" node "$PEER_DIR/peer-server.mjs" >"$dir.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_http "http://127.0.0.1:$port/"
  log "@durable-streams/server@$PEER_VERSION (file store) on :$port (pid $SERVER_PID)"
}

# start_electric PORT: sets SERVER_PID; data in $WORK/electric-PORT. Its defaults:
# WAL with group-commit fdatasync before the ack, one file of wire bytes per stream.
# A stream's name is the whole request path, so PicoMQ's /v1/stream/NAME works as is.
start_electric() {
  local port=$1
  local dir="$WORK/electric-$port"
  rm -rf "$dir"
  mkdir -p "$dir"
  "$ELECTRIC_DIR/bin/durable-streams-server" --host 127.0.0.1 --port "$port" --data-dir "$dir" \
    >"$dir.log" 2>&1 &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  wait_ready "http://127.0.0.1:$port/health"
  log "durable-streams-server $ELECTRIC_VERSION on :$port (pid $SERVER_PID)"
}

stop_server() {
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
}

# bench OUT.json PORT LABEL [bench flags...]: one run against the server on PORT.
bench() {
  local out=$1 port=$2 label=$3
  shift 3
  "$PICOMQ" bench "http://127.0.0.1:$port/v1/stream" --label "$label" \
    --server-pid "$SERVER_PID" --output json "$@" >"$out"
}

# md_table: tab-separated rows on stdin (the first is the header) -> a Markdown table
# with padded columns.
md_table() {
  awk -F'\t' '
    { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) }
      if (NF > cols) cols = NF }
    END {
      for (r = 1; r <= NR; r++) {
        line = "|"
        for (i = 1; i <= cols; i++) line = line sprintf(" %-*s |", w[i], cell[r, i])
        print line
        if (r == 1) {
          line = "|"
          for (i = 1; i <= cols; i++) { d = sprintf("%*s", w[i], ""); gsub(/ /, "-", d); line = line " " d " |" }
          print line
        }
      }
    }'
}

machine_note() {
  echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine: $(nproc) cpus, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
  echo "cpu:     $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min, at start)"
  if [ -n "${PICOMQ_BIN:-}" ]; then
    echo "picomq:  $PICOMQ_BIN (${PICOMQ_BUILD:-build not described})"
  else
    echo "picomq:  built from $(git -C "$REPO" rev-parse --short HEAD) $(git -C "$REPO" diff --quiet -- . ':!benchmarks/results' || echo '(with uncommitted changes)')"
  fi
}
