#!/usr/bin/env bash
# Yjs ecosystem test (see late_joiner.mjs): installs the pinned packages from the npm
# registry into this folder (npm ci, from package-lock.json) and runs the test against
# a running Durable Streams server.   bash tests-ecosystem/yjs/run.sh http://127.0.0.1:PORT
set -euo pipefail
URL=${1:?usage: run.sh http://HOST:PORT (a running Durable Streams server)}
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
if ! node -e 'process.exit(require("./node_modules/@durable-streams/y-durable-streams/package.json").version === "0.2.7" ? 0 : 1)' 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error >&2
fi
exec node late_joiner.mjs "$URL"
