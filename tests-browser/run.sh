#!/usr/bin/env bash
# Browser tests (cors_sse.mjs, console.mjs): installs Debian's chromium and
# playwright-core if missing, starts PicoMQ with auth, a CORS allow-list and an admin
# port plus two static pages on two origins, and runs the scripts. The console test's
# screenshots go to $PICOMQ_CI_ARTIFACTS/console (else a fresh temporary directory);
# its path is printed. --screenshots DIR also writes the README's screenshots
# (console-overview.png, console-stream.png) into DIR, e.g. docs/.
# Usage: tests-browser/run.sh PICOMQ_BINARY [--screenshots DIR]
set -euo pipefail
BIN=$1
DOCS=""
if [ "${2:-}" = "--screenshots" ]; then DOCS=$(mkdir -p "$3" && cd "$3" && pwd); fi
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/picomq-browser.XXXXXX")
PIDS=()
# The server writes its last objects on SIGTERM: wait for every process to end before
# removing the directory it writes into.
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

cache=$(bash "$HERE/setup.sh")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api_port=$(free_port); good_port=$(free_port); evil_port=$(free_port); admin_port=$(free_port)
mkdir -p "$WORK/site"
echo '<!doctype html><title>picomq browser test</title>' >"$WORK/site/index.html"
python3 -m http.server "$good_port" --bind 127.0.0.1 --directory "$WORK/site" >/dev/null 2>&1 &
PIDS+=($!)
python3 -m http.server "$evil_port" --bind 127.0.0.1 --directory "$WORK/site" >/dev/null 2>&1 &
PIDS+=($!)

admin="pmq_browser_test_admin_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$admin" >"$WORK/bootstrap"
api="http://127.0.0.1:$api_port"
"$BIN" serve --listen "127.0.0.1:$api_port" --admin-listen "127.0.0.1:$admin_port" \
  --data-dir "$WORK/data" --auth required \
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

# The web console: a weaker token to be refused with, screenshots kept after the run.
reader=$(curl -fsS "${H[@]}" -X POST -H 'content-type: application/json' \
  --data '{"scopes": ["read:console/**"], "description": "console reader"}' "$api/__picomq/tokens" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
if [ -n "${PICOMQ_CI_ARTIFACTS:-}" ]; then
  shots="$PICOMQ_CI_ARTIFACTS/console"
else
  shots=$(mktemp -d "${TMPDIR:-/tmp}/picomq-console-screenshots.XXXXXX")
fi
cp "$HERE/console.mjs" "$cache/console.mjs"
node "$cache/console.mjs" "$api" "http://127.0.0.1:$admin_port" "$admin" "$reader" "$shots" $DOCS
echo "console screenshots: $shots"

body=$(curl -fsS "${H[@]}" "$api/chat/1?offset=-1")
[ "$body" = "hello from the page" ] || { echo "FAIL: stream holds '$body'" >&2; exit 1; }
if grep -q -e "$write" -e "$read" -e "$admin" -e "$reader" "$WORK/server.log"; then
  echo "FAIL: a credential appears in the server log" >&2; exit 1
fi
echo "browser test passed: stream holds '$body', no credential in the log"
