#!/usr/bin/env bash
# Installs dependencies, builds, and starts the OpenAI-compatible server.
# With no arguments it serves the embedded smoke-test model on port 30000;
# any arguments are passed to `dsv4 serve` (e.g. --model-path DIR --port N).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
"$ROOT/scripts/build.sh"
exec "$ROOT/build/dsv4" serve "$@"
