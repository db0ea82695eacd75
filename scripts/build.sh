#!/usr/bin/env bash
# Configures and builds dsv4.cpp (Release) into build/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# DSV4_CMAKE_ARGS: extra configure options (CI passes -DDSV4_WERROR=ON).
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release ${DSV4_CMAKE_ARGS:-} >/dev/null
cmake --build "$ROOT/build" -j"${JOBS:-$(nproc)}"
