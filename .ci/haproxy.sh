#!/usr/bin/env bash
# HAProxy (Debian's package) in front of several PicoMQ nodes for cluster tests: HTTP
# mode, round robin, health checks on GET /readyz.
#
#   .ci/haproxy.sh start DIR PORT BACKEND...   install (apt, if missing), listen on
#                                              127.0.0.1:PORT, balance over the
#                                              BACKENDs (host:port), wait until the
#                                              port accepts connections; writes
#                                              DIR/pid, DIR/env (PICOMQ_CI_HAPROXY_URL),
#                                              DIR/haproxy.cfg, log in DIR/log
#   .ci/haproxy.sh admin DIR COMMAND...        one command on the admin socket
#                                              (DIR/admin.sock); prints the answer
#   .ci/haproxy.sh stop DIR                    stop it; a no-op when it is not running
#
# The servers are named s1, s2, ... in BACKEND order, in the backend `picomq`, e.g.
#   .ci/haproxy.sh admin DIR set server picomq/s2 state maint    # no new requests
#   .ci/haproxy.sh admin DIR set server picomq/s2 state ready    # back in rotation
#   .ci/haproxy.sh admin DIR show servers state picomq
#   .ci/haproxy.sh admin DIR show stat
#
# Behaviour the tests can rely on:
# - A server is taken out after 2 failed checks 500 ms apart (a refused connection:
#   under 1 s; a hung node, each check timing out after 1 s: ~3 s) and back after 1
#   good one (/readyz answering 200). Sessions on a server that
#   the check marks down are cut (on-marked-down shutdown-sessions), so a long-poll
#   or SSE stream on a hung node ends instead of waiting for the timeout; `state
#   maint` only stops new requests.
# - Only connection failures are retried (retry-on conn-failure, 3 times,
#   redispatched to another server): a request that reached a server, a POST above
#   all, is never sent twice. With every server down the answer is 503.
# - Keep-alive on both sides (option http-keep-alive). Client and server timeouts are
#   10 minutes, so long-polls and SSE streams are not cut by HAProxy; timeout tunnel
#   (upgraded connections) is 1 hour.
set -euo pipefail

usage() {
  echo "usage: $0 start DIR PORT HOST:PORT... | admin DIR COMMAND... | stop DIR" >&2
  exit 2
}
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage

# One command on the admin socket (Python: socat is not always installed).
admin() {
  python3 - "$1" "$2" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
out = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode(errors="replace"))
PY
}

# Alive: the process exists and is not a zombie (an orphan waits for its reaper).
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) && [ -n "$st" ] && [ "$st" != Z ]
}

# Running: the recorded pid is alive and still haproxy (not a reused pid).
running() {
  [ -f "$dir/pid" ] && [ "$(cat "/proc/$(cat "$dir/pid")/comm" 2>/dev/null)" = haproxy ] &&
    alive "$(cat "$dir/pid")"
}

case "$cmd" in
start)
  port=${3:-}
  [ -n "$port" ] && [ $# -ge 4 ] || usage
  case "$port" in *[!0-9]*) echo "haproxy: PORT must be a number, not $port" >&2; exit 2 ;; esac
  shift 3
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if running; then echo "haproxy: already running for $dir (pid $(cat "$dir/pid"))" >&2; exit 1; fi
  # The admin socket's path must fit in sun_path (107 bytes).
  [ ${#dir} -le 90 ] || { echo "haproxy: DIR path too long for the admin socket: $dir" >&2; exit 2; }
  if ! command -v haproxy >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { echo "haproxy: not installed and not root to install it" >&2; exit 1; }
    echo "haproxy: installing Debian's haproxy package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt=(apt-get -y -q -o DPkg::Lock::Timeout=300 install --no-install-recommends haproxy)
    if ! "${apt[@]}" >"$dir/apt.log" 2>&1; then
      # A clean machine may have no (or stale) package lists.
      apt-get -q -o DPkg::Lock::Timeout=300 update >>"$dir/apt.log" 2>&1 || true
      "${apt[@]}" >>"$dir/apt.log" 2>&1 || {
        echo "haproxy: apt-get install haproxy failed; log:" >&2; cat "$dir/apt.log" >&2; exit 1; }
    fi
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "haproxy: 127.0.0.1:$port is already in use" >&2
    exit 1
  fi

  servers=
  i=0
  for b in "$@"; do
    case "$b" in *:*) ;; *) echo "haproxy: BACKEND must be host:port, not $b" >&2; exit 2 ;; esac
    i=$((i + 1))
    servers+="    server s$i $b"$'\n'
  done
  rm -f "$dir/admin.sock"
  cat >"$dir/haproxy.cfg" <<CFG
global
    maxconn 4096
    stats socket $dir/admin.sock mode 600 level admin
    stats timeout 1m
    log stdout format raw local0 info

defaults
    mode http
    log global
    option httplog
    option log-health-checks
    option http-keep-alive
    option redispatch 1
    retries 3
    retry-on conn-failure
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    timeout tunnel 1h
    timeout client-fin 10s
    timeout server-fin 10s
    timeout http-request 30s
    timeout http-keep-alive 2m
    timeout queue 10s
    timeout check 1s

frontend picomq
    bind 127.0.0.1:$port
    default_backend picomq

backend picomq
    balance roundrobin
    option httpchk
    http-check send meth GET uri /readyz
    http-check expect status 200
    default-server check inter 500ms fastinter 500ms downinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
$servers
CFG
  haproxy -c -q -f "$dir/haproxy.cfg" || { echo "haproxy: bad config $dir/haproxy.cfg" >&2; exit 1; }
  # Foreground (-db): the pid we record is haproxy's own; SIGTERM stops it.
  haproxy -db -f "$dir/haproxy.cfg" >"$dir/log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && [ -S "$dir/admin.sock" ]; then
      echo "export PICOMQ_CI_HAPROXY_URL=http://127.0.0.1:$port" >"$dir/env"
      echo "haproxy $(haproxy -v | awk 'NR==1{print $3}') on http://127.0.0.1:$port over $# backend(s)" \
        "(pid $(cat "$dir/pid")), env in $dir/env"
      exit 0
    fi
    running || { echo "haproxy exited; log:" >&2; cat "$dir/log" >&2; exit 1; }
    sleep 0.1
  done
  echo "haproxy did not listen on 127.0.0.1:$port within 10s; log:" >&2
  cat "$dir/log" >&2
  kill "$(cat "$dir/pid")" 2>/dev/null || true
  exit 1
  ;;
admin)
  shift 2
  [ $# -ge 1 ] || usage
  [ -S "$dir/admin.sock" ] || { echo "haproxy: no admin socket in $dir" >&2; exit 1; }
  admin "$dir/admin.sock" "$*"
  ;;
stop)
  [ -d "$dir" ] || exit 0
  running || exit 0
  pid=$(cat "$dir/pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    alive "$pid" || exit 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  ;;
*)
  usage
  ;;
esac
