#!/usr/bin/env bash
# Browser test (see cors_sse.mjs): installs Debian's chromium and playwright-core if
# missing, starts PicoMQ with auth and a CORS allow-list plus two static pages on two
# origins, and runs the script. Usage: tests-browser/run.sh PICOMQ_BINARY
set -euo pipefail
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/picomq-browser.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT

if ! command -v chromium >/dev/null; then
  # Fresh images may have no package lists yet: update once if the install fails.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
  }
fi
cache="${PICOMQ_CI_CACHE:-$HOME/.cache/picomq}/playwright-core-1.64.1"
if [ ! -d "$cache/node_modules/playwright-core" ]; then
  mkdir -p "$cache"
  (cd "$cache" && npm install --silent --no-audit --no-fund --no-save playwright-core@1.64.1 >/dev/null)
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api_port=$(free_port); good_port=$(free_port); evil_port=$(free_port)
mkdir -p "$WORK/site"
echo '<!doctype html><title>picomq browser test</title>' >"$WORK/site/index.html"
python3 -m http.server "$good_port" --bind 127.0.0.1 --directory "$WORK/site" >/dev/null 2>&1 &
PIDS+=($!)
python3 -m http.server "$evil_port" --bind 127.0.0.1 --directory "$WORK/site" >/dev/null 2>&1 &
PIDS+=($!)

admin="pmq_browser_test_admin_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$admin" >"$WORK/bootstrap"
api="http://127.0.0.1:$api_port"
"$BIN" serve --listen "127.0.0.1:$api_port" --data-dir "$WORK/data" --auth required \
  --bootstrap-token-file "$WORK/bootstrap" --cors-origins "http://127.0.0.1:$good_port" \
  >"$WORK/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do curl -fsS "$api/readyz" >/dev/null 2>&1 && break; sleep 0.1; done

H=(-H "authorization: Bearer $admin")
curl -fsS "${H[@]}" -X PUT -H 'content-type: text/plain' --data 'hello' "$api/chat/1" >/dev/null
write=$(curl -fsS "${H[@]}" -X POST -H 'content-type: application/json' \
  --data '{"scopes": ["append:chat/**"], "description": "browser"}' "$api/__picomq/tokens" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
read=$(curl -fsS "${H[@]}" -X POST -H 'content-type: application/json' \
  --data '{"stream": "chat/1", "expiresInSeconds": 300}' "$api/__picomq/read-tokens" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')

# ES modules resolve packages from the script's own directory: run a copy there.
cp "$HERE/cors_sse.mjs" "$cache/cors_sse.mjs"
node "$cache/cors_sse.mjs" "$api" \
  "http://127.0.0.1:$good_port/" "http://127.0.0.1:$evil_port/" "$write" "$read"

body=$(curl -fsS "${H[@]}" "$api/chat/1?offset=-1")
[ "$body" = "hello from the page" ] || { echo "FAIL: stream holds '$body'" >&2; exit 1; }
if grep -q -e "$write" -e "$read" -e "$admin" "$WORK/server.log"; then
  echo "FAIL: a credential appears in the server log" >&2; exit 1
fi
echo "browser test passed: stream holds '$body', no credential in the log"
