#!/usr/bin/env bash
# Azurite, Microsoft's Azure Blob Storage emulator (npm), for CI: PicoMQ's `az://`
# backend against a real implementation of the Blob API.
#
#   .ci/azurite.sh start DIR   install (npm, cached), start on a free loopback port,
#                              create the container `picomq-ci`; writes DIR/pid and
#                              DIR/env (AZURITE_BLOB_STORAGE_URL,
#                              PICOMQ_CI_AZ_CONTAINER)
#   .ci/azurite.sh stop DIR    stop it
#
# Then: . DIR/env && picomq serve --store "az://$PICOMQ_CI_AZ_CONTAINER/p?use_emulator=true"
# (object_store's emulator mode: the well-known devstoreaccount1 key, the endpoint
# from AZURITE_BLOB_STORAGE_URL).
set -euo pipefail

VERSION=3.37.0
CONTAINER=picomq-ci
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

case "$cmd" in
start)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cache="${PICOMQ_CI_CACHE:-$HOME/.cache/picomq}/azurite-$VERSION"
  if [ ! -x "$cache/node_modules/.bin/azurite-blob" ]; then
    mkdir -p "$cache"
    (cd "$cache" && npm install --silent --no-audit --no-fund --no-save "azurite@$VERSION" >/dev/null)
  fi
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$cache/node_modules/.bin/azurite-blob" --inMemoryPersistence --blobHost 127.0.0.1 \
    --blobPort "$port" --skipApiVersionCheck >"$dir/log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 1 100); do
    if python3 - "http://127.0.0.1:$port" "$CONTAINER" <<'PY' 2>/dev/null
# Create Container with SharedKey auth (the emulator's published account key).
import base64, hashlib, hmac, sys, urllib.error, urllib.request
from email.utils import formatdate
endpoint, container = sys.argv[1], sys.argv[2]
account = "devstoreaccount1"
key = base64.b64decode("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
date, version = formatdate(usegmt=True), "2021-08-06"
to_sign = ("PUT\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:{version}\n"
           + f"/{account}/{account}/{container}\nrestype:container")
sig = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
req = urllib.request.Request(f"{endpoint}/{account}/{container}?restype=container", method="PUT",
    headers={"x-ms-date": date, "x-ms-version": version, "Content-Length": "0",
             "Authorization": f"SharedKey {account}:{sig}"})
try:
    urllib.request.urlopen(req, timeout=5)
except urllib.error.HTTPError as e:
    sys.exit(0 if e.code == 409 else 1)
PY
    then
      cat >"$dir/env" <<ENV
export AZURITE_BLOB_STORAGE_URL=http://127.0.0.1:$port
export PICOMQ_CI_AZ_CONTAINER=$CONTAINER
ENV
      echo "azurite on http://127.0.0.1:$port (pid $(cat "$dir/pid")), env in $dir/env"
      exit 0
    fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/log" >&2; exit 1; }
    sleep 0.2
  done
  echo "azurite did not answer within 20s; log:" >&2
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
