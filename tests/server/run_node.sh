#!/usr/bin/env bash
# Runs a node test or script of tests/server, skipping (exit 77) when node is
# not installed. Usage: run_node.sh [node args...]
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed; the server API/load tests drive dsv4 serve with the openai npm package" \
       "(scripts/install-deps.sh installs nodejs and npm)"
  exit 77
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 18 ]; then
  echo "SKIP: node $(node --version) is too old (18 or newer needed: fetch, node:test)"
  exit 77
fi
if [ ! -f "$DIR/node_modules/openai/package.json" ]; then
  echo "FAIL: $DIR/node_modules/openai is missing: run npm ci --prefix $DIR (the server_npm_install test does)"
  exit 1
fi
cd "$DIR"
exec node "$@"
