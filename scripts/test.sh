#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: the CTest suite (unit,
# golden, CLI and server tests) and a short run of each fuzzer.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
"$ROOT/scripts/build.sh"
cd "$ROOT/build"
ctest --output-on-failure -j"${JOBS:-2}" --timeout 900
if [ -x "$ROOT/fuzz/run_fuzzers.sh" ]; then
  "$ROOT/fuzz/run_fuzzers.sh" "${DSV4_FUZZ_SECONDS:-20}"
fi
