#!/usr/bin/env bash
# The full hardening probe run (tests/probe/README.md): every probe class with
# the larger sizes (200 MiB header floods, 1000 slowloris connections, ...),
# a few minutes (bounded at 25). Extra arguments go to probe.mjs, e.g. --csv probe.csv.
#   DSV4_BIN         dsv4 executable          (default build/dsv4)
#   DSV4_TEST_MODEL  test checkpoint; made with `dsv4 make-model` when missing
#                    (default build/test-smoke-model)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DSV4_BIN="${DSV4_BIN:-$ROOT/build/dsv4}"
export DSV4_TEST_MODEL="${DSV4_TEST_MODEL:-$ROOT/build/test-smoke-model}"
if [ ! -x "$DSV4_BIN" ]; then
  echo "probe.sh: $DSV4_BIN not found; build it first:" \
       "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target dsv4" >&2
  exit 1
fi
if [ ! -f "$DSV4_TEST_MODEL/config.json" ]; then
  "$DSV4_BIN" make-model --out "$DSV4_TEST_MODEL"
fi
exec bash "$ROOT/tests/probe/run_probe.sh" --full "$@"
