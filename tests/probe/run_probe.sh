#!/usr/bin/env bash
# Runs the hardening probe suite (tests/probe/probe.mjs), skipping (exit 77)
# when node is missing or older than 18. Usage: run_probe.sh [--short|--full] [--csv FILE] [--only RE]
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v node >/dev/null 2>&1; then
  echo "SKIP: node is not installed; the probe suite drives dsv4 serve from node (scripts/install-deps.sh installs nodejs)"
  exit 77
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 18 ]; then
  echo "SKIP: node $(node --version) is too old (18 or newer needed: fetch, node:net)"
  exit 77
fi
exec node "$DIR/probe.mjs" "$@"
