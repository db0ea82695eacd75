#!/usr/bin/env bash
# A tiny `dsv4 bench-serve` run against a test server: the summary shows every
# request successful, and the CSV and SVG are written.
# Usage: bench_serve_test.sh [DSV4_BIN] [MODEL_DIR]   (or env DSV4_BIN / DSV4_TEST_MODEL)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${1:-${DSV4_BIN:-$ROOT/build/dsv4}}"
MODEL="${2:-${DSV4_TEST_MODEL:-$ROOT/build/test-smoke-model}}"
if ! "$BIN" bench-serve --help 2>/dev/null | grep -q -e "--random-input-len"; then
  echo "SKIP: '$BIN bench-serve' is not available (register_bench_serve_command is not wired into tools/main.cpp)"
  exit 77
fi
# shellcheck source=server_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/server_lib.sh"
start_server --context-length 1024

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

# 3. errors are reported, not hidden: a server that is not there.
if "$BIN" bench-serve --base-url http://127.0.0.1:1 --num-prompts 1 >"$WORK/c.txt" 2>&1; then
  echo "FAIL - bench-serve against a closed port should fail"; FAILS=$((FAILS + 1))
else
  check "unreachable server -> clear error" 'grep -q "cannot reach" $WORK/c.txt'
fi

if [ "$FAILS" -ne 0 ]; then echo "$FAILS bench-serve check(s) failed"; tail -n 20 "$WORK/server.err"; exit 1; fi
echo "all bench-serve checks passed"
