#!/usr/bin/env bash
# The sanitizer job (CI runs it after scripts/test.sh):
#  - AddressSanitizer + UndefinedBehaviorSanitizer: the engine, scheduler,
#    model (golden, rollback) tests and the server API / lifecycle / curl
#    tests against an instrumented `dsv4 serve`;
#  - ThreadSanitizer: the engine and scheduler tests (the engine's scheduler
#    thread, request handles and their locks). OpenMP's runtime is not
#    instrumented, so these run with one compute thread (OMP_NUM_THREADS=1):
#    the engine's own threads and locks are what TSan checks here.
# Builds go to build-asan/ and build-tsan/ (no benchmarks, no fuzzers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
JOBS="${JOBS:-$(nproc)}"

configure() {  # dir sanitizer
  cmake -S "$ROOT" -B "$ROOT/$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSV4_SANITIZE="$2" \
        -DDSV4_BUILD_BENCH=OFF -DDSV4_BUILD_FUZZERS=OFF >/dev/null
}

echo "== ASan + UBSan"
configure build-asan address
cmake --build "$ROOT/build-asan" -j"$JOBS" --target dsv4 test_engine test_scheduler test_model_golden \
      test_model_rollback test_sampler
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Unit tests with leak checking; the server tests stop `dsv4 serve` with a
# signal, so leak reports at its exit are left to the unit tests.
(cd "$ROOT/build-asan" &&
 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 ctest --output-on-failure -j1 --timeout 1200 \
       -R '^(Engine|EngineScheduler|Sampler|Golden/GoldenModel|Golden/Rollback)' &&
 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 ctest --output-on-failure -j1 --timeout 1200 \
       -R '^(server_make_model|server_npm_install|server_api|server_lifecycle|server_curl)$')

echo "== TSan"
configure build-tsan thread
cmake --build "$ROOT/build-tsan" -j"$JOBS" --target test_engine test_scheduler
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 OMP_NUM_THREADS=1
"$ROOT/build-tsan/test_engine"
"$ROOT/build-tsan/test_scheduler"
echo "sanitizers: all passed"
