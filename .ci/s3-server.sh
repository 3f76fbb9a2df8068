#!/usr/bin/env bash
# A real S3-compatible server for CI: PicoMQ's test server (s3s + s3s-fs with atomic
# conditional PUTs and TCP_NODELAY), built from this workspace, started as a process.
#
#   .ci/s3-server.sh start DIR   build, start on a free loopback port, wait until it
#                                answers; writes DIR/pid and DIR/env (shell exports:
#                                AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
#                                AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP,
#                                PICOMQ_CI_S3_BUCKET)
#   .ci/s3-server.sh stop DIR    stop the server started with DIR
#
# PICOMQ_S3_TEST_SERVER=PATH uses that binary instead of building one.
# Objects live under DIR/root. The bucket is `picomq-ci`; use any prefix in it, e.g.
#   . DIR/env && picomq serve --store "s3://$PICOMQ_CI_S3_BUCKET/run-1"
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUCKET=picomq-ci
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

case "$cmd" in
start)
  mkdir -p "$dir/root"
  dir=$(cd "$dir" && pwd)
  if [ -n "${PICOMQ_S3_TEST_SERVER:-}" ]; then
    server=$PICOMQ_S3_TEST_SERVER # a binary built before (benchmarks)
  else
    # The whole workspace, so features unify as in the main build (a no-op after it).
    (cd "$ROOT" && cargo build --release --workspace)
    server=${CARGO_TARGET_DIR:-$ROOT/target}/release/picomq-s3-test-server
  fi
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$server" --listen "127.0.0.1:$port" --root "$dir/root" \
    --bucket "$BUCKET" >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 1 100); do
    # Any HTTP answer (403 without credentials) means it is serving.
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/" || true)
    if [ "$code" != "000" ]; then
      cat >"$dir/env" <<ENV
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=picomq-test
export AWS_SECRET_ACCESS_KEY=picomq-test-secret
export AWS_REGION=us-east-1
export AWS_ALLOW_HTTP=true
export PICOMQ_CI_S3_BUCKET=$BUCKET
ENV
      echo "s3 test server on http://127.0.0.1:$port (pid $(cat "$dir/pid")), env in $dir/env"
      exit 0
    fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/log" >&2; exit 1; }
    sleep 0.1
  done
  echo "s3 test server did not answer within 10s; log:" >&2
  cat "$dir/log" >&2
  exit 1
  ;;
stop)
  [ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null || true
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
