#!/usr/bin/env bash
# The sanitizer job (CI runs it after scripts/test.sh):
#  - AddressSanitizer + UndefinedBehaviorSanitizer: the engine, scheduler,
#    model (golden, rollback) and speculative tests (DSpark's drafts inside
#    a grammar among them) and the server API / lifecycle / curl tests
#    against an instrumented `dsv4 serve`;
#  - ThreadSanitizer: the engine and scheduler tests (the engine's scheduler
#    thread, request handles and their locks). OpenMP's runtime is not
#    instrumented, so these run with one compute thread (OMP_NUM_THREADS=1):
#    the engine's own threads and locks are what TSan checks here, and the
#    kernels are built without TSan (CMakeLists.txt says why).
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
      test_model_rollback test_sampler test_speculative test_dspark
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Unit tests with leak checking. The golden tests that compare bits across
# SIMD paths, thread counts and chunkings repeat the same code many times
# and take minutes under ASan. The logits of every golden model (each
# weight format's kernels), then batching, snapshots and rollback once each,
# on a different model each (they run the same state code whatever the
# format, at about 40 s apiece under ASan), cover the memory accesses. The
# server API, lifecycle, speculative and curl tests run in the same ctest
# call, their chain beside the unit tests (it leaves a core idle for a third
# of its time); they stop `dsv4 serve` with a signal, so CMakeLists.txt
# switches their leak report off and leaks are left to the unit tests. The
# probe's bad-input classes (deep JSON, wrong types,
# framing, refused and duplicate requests, CORS, leaks between clients) run
# against the instrumented server (floods and slowloris measure memory and
# latency, which ASan changes).
(cd "$ROOT/build-asan" &&
 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 ctest --output-on-failure -j"$JOBS" --timeout 1200 \
       -R '^(Engine|EngineScheduler|EngineValidate|Sampler|Golden/GoldenModel\.(LogitsMatch|MtpLogitsMatch)|Golden/GoldenModel\.BatchingDoesNotChangeBits/tiny_flash_fp8|Golden/GoldenModel\.Snapshot.*/tiny_flash_bf16|Golden/Rollback\..*/tiny_pro_fp8|Ngram|SpecAccept|SpecGate|SpecEngine\.(NgramSampled|EagleDrafts|SimulatedAcceptance|StopToken|TokensTheGrammarForces|MtpChainDrafts)|DsparkCheckpoint\.MarkovChainDrafts|(server_make_model|server_npm_install|server_api|server_lifecycle|server_speculative|server_curl)$)')
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 DSV4_BIN="$ROOT/build-asan/dsv4" \
  DSV4_TEST_MODEL="$ROOT/build-asan/test-smoke-model" \
  bash "$ROOT/tests/probe/run_probe.sh" --short --only '^(deep_json|types|framing|refused|dup_rid|cors|leak|max_tokens)' 

echo "== TSan"
configure build-tsan thread
cmake --build "$ROOT/build-tsan" -j"$JOBS" --target test_engine test_scheduler test_speculative
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 OMP_NUM_THREADS=1
"$ROOT/build-tsan/test_engine"
"$ROOT/build-tsan/test_speculative" --gtest_filter='SpecEngine.NgramSampled*:SpecEngine.StopToken*'
"$ROOT/build-tsan/test_scheduler"
echo "sanitizers: all passed"
