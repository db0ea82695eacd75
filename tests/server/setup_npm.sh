#!/usr/bin/env bash
# CTest fixture: installs the openai and @anthropic-ai/sdk npm packages into tests/server/node_modules
# (from package-lock.json) when it is missing or older than the lock file.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node/npm are not installed; the server API/load tests will be skipped (scripts/install-deps.sh installs them)"
  exit 77
fi
stamp="$DIR/node_modules/.package-lock.json"
if [ -f "$DIR/node_modules/openai/package.json" ] && [ -f "$DIR/node_modules/@anthropic-ai/sdk/package.json" ] && [ -f "$DIR/node_modules/ajv/package.json" ] &&
   [ -f "$stamp" ] && [ ! "$DIR/package-lock.json" -nt "$stamp" ]; then
  echo "node_modules is up to date"
  exit 0
fi
if [ -f "$DIR/package-lock.json" ]; then
  npm ci --prefix "$DIR" --no-audit --no-fund
else
  npm install --prefix "$DIR" --no-audit --no-fund
fi
