#!/usr/bin/env bash
# Tiny `dsv4 bench-serve` runs against a test server: the summary shows every
# request successful, and the CSV and SVG are written; the multi-turn trace
# reports cached tokens per turn.
# Usage: bench_serve_test.sh [DSV4_BIN] [MODEL_DIR]   (or env DSV4_BIN / DSV4_TEST_MODEL)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${1:-${DSV4_BIN:-$ROOT/build/dsv4}}"
MODEL="${2:-${DSV4_TEST_MODEL:-$ROOT/build/test-smoke-model}}"
# The help is read whole first: `grep -q` quits at its first match, and with
# pipefail the writer's SIGPIPE would read as "not available".
HELP="$("$BIN" bench-serve --help 2>/dev/null || true)"
if ! grep -q -e "--random-input-len" <<<"$HELP"; then
  echo "SKIP: '$BIN bench-serve' is not available (register_bench_serve_command is not wired into tools/main.cpp)"
  exit 77
fi
# shellcheck source=server_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/server_lib.sh"
start_server --context-length 1024 --enable-cache-report

FAILS=0
check() { if eval "$2"; then echo "ok   - $1"; else echo "FAIL - $1"; FAILS=$((FAILS + 1)); fi; }

# 1. random prompts, /generate, all at once under a concurrency cap.
"$BIN" bench-serve --base-url "$URL" --dataset random --num-prompts 6 --random-input-len 32 --random-output-len 8 \
  --random-range-ratio 1 --max-concurrency 3 --seed 1 --output-csv "$WORK/a.csv" --output-svg "$WORK/a.svg" \
  --output-file "$WORK/a.jsonl" | tee "$WORK/a.txt"
check "generate: 6 successful requests" 'grep -Eq "^Successful requests: +6$" $WORK/a.txt'
check "generate: exact output length (6 x 8 tokens)" 'grep -Eq "^Total generated tokens: +48$" $WORK/a.txt'
check "generate: exact input length (6 x 32 tokens)" 'grep -Eq "^Total input tokens: +192$" $WORK/a.txt'
check "generate: TTFT and ITL reported" 'grep -Eq "^Median TTFT \(ms\): +[0-9.]+$" $WORK/a.txt && grep -Eq "^P99 ITL \(ms\): +[0-9.]+$" $WORK/a.txt'
check "generate: CSV has a header and 6 successful rows" \
  '[ "$(head -n1 $WORK/a.csv | cut -d, -f1-5)" = "request,start_s,prompt_tokens,output_tokens,success" ] &&
   [ "$(tail -n +2 $WORK/a.csv | awk -F, "\$3 == 32 && \$4 == 8 && \$5 == 1" | wc -l)" = 6 ]'
check "generate: SVG written" 'head -c 200 $WORK/a.svg | grep -q "<svg" && tail -n1 $WORK/a.svg | grep -q "</svg>"'
check "generate: JSON summary line" 'grep -q "\"completed\":6" $WORK/a.jsonl'

# 2. a JSONL file of text prompts, /v1/completions, Poisson arrivals.
printf '%s\n' '{"prompt": "Hello there, how are you?"}' '{"prompt": "Tell me a story.", "output_len": 5}' > "$WORK/prompts.jsonl"
"$BIN" bench-serve --host 127.0.0.1 --port "$PORT" --backend completions --dataset file --dataset-path "$WORK/prompts.jsonl" \
  --num-prompts 4 --random-output-len 6 --random-range-ratio 1 --request-rate 20 --output-csv "$WORK/b.csv" \
  --output-svg "$WORK/b.svg" | tee "$WORK/b.txt"
check "completions/file: 4 successful requests" 'grep -Eq "^Successful requests: +4$" $WORK/b.txt'
check "completions/file: output tokens 6+5+6+5" 'grep -Eq "^Total generated tokens: +22$" $WORK/b.txt'
check "completions/file: CSV and SVG written" '[ "$(wc -l < $WORK/b.csv)" = 5 ] && grep -q "</svg>" $WORK/b.svg'

# 3. the multi-turn agentic trace: 2 conversations x 3 turns over a shared
# system prompt and tools; every later turn resends the conversation, so the
# cache covers nearly all of the previous turn (its last answer token is
# never fed, hence not all).
"$BIN" bench-serve --base-url "$URL" --multi-turn --num-clients 2 --num-rounds 3 --max-parallel 2 \
  --system-prompt-length 96 --tool-schema-length 64 --num-tools 2 --request-length 24 --sub-question-input-length 12 \
  --output-length 4 --enable-round-barrier --output-csv "$WORK/m.csv" --output-requests-csv "$WORK/mr.csv" \
  --output-svg "$WORK/m.svg" --output-file "$WORK/m.jsonl" | tee "$WORK/m.txt"
check "multi-turn: 6 successful requests" 'grep -Eq "^Successful requests: +6$" $WORK/m.txt'
check "multi-turn: cache hit rate reported" 'grep -Eq "^Cache Hit Rate: +0\.[0-9]+$" $WORK/m.txt'
check "multi-turn: per-turn CSV, 3 turns of 2 requests" \
  '[ "$(head -n1 $WORK/m.csv | cut -d, -f1-4)" = "turn,requests,prompt_tokens_mean,cached_tokens_mean" ] &&
   [ "$(tail -n +2 $WORK/m.csv | awk -F, "\$2 == 2" | wc -l)" = 3 ]'
check "multi-turn: turns 2 and 3 cached >= 90% of the previous turn" \
  '[ "$(tail -n +3 $WORK/m.csv | awk -F, "\$7 >= 0.9" | wc -l)" = 2 ]'
check "multi-turn: per-request CSV and SVG written" \
  '[ "$(wc -l < $WORK/mr.csv)" = 7 ] && grep -q "</svg>" $WORK/m.svg && grep -q "\"mode\":\"multi-turn\"" $WORK/m.jsonl'

# 4. errors are reported, not hidden: a server that is not there.
if "$BIN" bench-serve --base-url http://127.0.0.1:1 --num-prompts 1 >"$WORK/c.txt" 2>&1; then
  echo "FAIL - bench-serve against a closed port should fail"; FAILS=$((FAILS + 1))
else
  check "unreachable server -> clear error" 'grep -q "cannot reach" $WORK/c.txt'
fi

if [ "$FAILS" -ne 0 ]; then echo "$FAILS bench-serve check(s) failed"; tail -n 20 "$WORK/server.err"; exit 1; fi
echo "all bench-serve checks passed"
