#!/usr/bin/env bash
# Installs what the browser tests and the console benchmark drive: Debian's chromium
# (apt) and playwright-core (npm) into a cache folder, once. Prints that folder, where
# scripts importing "playwright-core" are copied to run.
# Usage: dir=$(bash tests-browser/setup.sh)
set -euo pipefail
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
echo "$cache"
