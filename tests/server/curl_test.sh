#!/usr/bin/env bash
# curl-level checks of `dsv4 serve`: plain JSON routes, SSE streaming framing
# (data: lines, data: [DONE] last), error statuses. Loopback only.
# Usage: curl_test.sh [DSV4_BIN] [MODEL_DIR]   (or env DSV4_BIN / DSV4_TEST_MODEL)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${1:-${DSV4_BIN:-$ROOT/build/dsv4}}"
MODEL="${2:-${DSV4_TEST_MODEL:-$ROOT/build/test-smoke-model}}"
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }

# shellcheck source=server_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/server_lib.sh"
start_server --context-length 1024

FAILS=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; FAILS=$((FAILS + 1)); }
check() { if eval "$2"; then pass "$1"; else fail "$1"; fi; }

# status BODYFILE METHOD PATH [curl args...]: prints the HTTP status.
status() {
  local out="$1" method="$2" path="$3"; shift 3
  curl -sS -o "$out" -w '%{http_code}' -X "$method" "$URL$path" "$@"
}

check "GET /health -> 200" '[ "$(status $WORK/h GET /health)" = 200 ]'
check "GET /v1/models lists the model" \
  '[ "$(status $WORK/m GET /v1/models)" = 200 ] && grep -q "\"object\":\"list\"" $WORK/m && grep -q "test-smoke-model" $WORK/m'

CHAT='{"model":"x","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"seed":1,"ignore_eos":true}'
check "POST /v1/chat/completions (non-streaming) -> chat.completion" \
  '[ "$(status $WORK/c POST /v1/chat/completions -H "Content-Type: application/json" -d "$CHAT")" = 200 ] &&
   grep -q "\"object\":\"chat.completion\"" $WORK/c && grep -q "\"completion_tokens\":8" $WORK/c'

# Streaming: every event is a "data: " line followed by a blank line; the last is [DONE].
STREAM='{"model":"x","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"seed":1,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}'
code="$(curl -sS -N -D "$WORK/sh" -o "$WORK/s" -w '%{http_code}' "$URL/v1/chat/completions" -H "Content-Type: application/json" -d "$STREAM")"
check "streaming chat -> 200 text/event-stream" '[ "$code" = 200 ] && grep -qi "^content-type: text/event-stream" $WORK/sh'
check "streaming chat: last data line is [DONE]" '[ "$(grep "^data: " $WORK/s | tail -n1)" = "data: [DONE]" ]'
check "streaming chat: exactly one [DONE]" '[ "$(grep -c "^data: \[DONE\]$" $WORK/s)" = 1 ]'
check "streaming chat: only data lines, comments and blank lines" '! grep -v -e "^data: " -e "^:" -e "^$" $WORK/s'
check "streaming chat: chunk objects, finish_reason length, usage chunk" \
  'grep -q "\"object\":\"chat.completion.chunk\"" $WORK/s && grep -q "\"finish_reason\":\"length\"" $WORK/s &&
   grep -q "\"usage\":{\"prompt_tokens\"" $WORK/s'
check "streaming chat: first chunk carries the assistant role" \
  'grep "^data: " $WORK/s | head -n1 | grep -q "\"role\":\"assistant\""'

code="$(curl -sS -N -o "$WORK/g" -w '%{http_code}' "$URL/generate" -H "Content-Type: application/json" -d '{"text":"hi","stream":true,"sampling_params":{"max_new_tokens":4,"ignore_eos":true}}')"
check "streaming /generate ends with [DONE]" '[ "$code" = 200 ] && [ "$(grep "^data: " $WORK/g | tail -n1)" = "data: [DONE]" ] &&
   [ "$(grep -c "\"output_ids\"" $WORK/g)" = 4 ]'
code="$(curl -sS -N -o "$WORK/p" -w '%{http_code}' "$URL/v1/completions" -H "Content-Type: application/json" -d '{"prompt":"hi","max_tokens":4,"stream":true}')"
check "streaming /v1/completions ends with [DONE]" '[ "$code" = 200 ] && [ "$(grep "^data: " $WORK/p | tail -n1)" = "data: [DONE]" ]'

check "bad JSON -> 400 with a message" \
  '[ "$(status $WORK/e1 POST /v1/chat/completions -H "Content-Type: application/json" -d "{not json")" = 400 ] && grep -q "\"message\":\"malformed JSON" $WORK/e1'
# Without an API key only JSON bodies are taken: a web page can post
# text/plain or form data cross-origin without asking first.
check "form-encoded POST without a key -> 415" \
  '[ "$(status $WORK/e4 POST /abort_request -d "{\"abort_all\":true}")" = 415 ]'
check "unknown route -> 404" '[ "$(status $WORK/e2 GET /no/such/route)" = 404 ] && grep -q "\"error\"" $WORK/e2'
check "empty messages -> 400" '[ "$(status $WORK/e3 POST /v1/chat/completions -H "Content-Type: application/json" -d "{\"messages\":[]}")" = 400 ]'
check "GET /metrics has sglang:num_requests_total" \
  '[ "$(status $WORK/mt GET /metrics)" = 200 ] && grep -q "^sglang:num_requests_total{" $WORK/mt'
check "GET /flush_cache -> 200" '[ "$(status $WORK/f GET /flush_cache)" = 200 ]'

if [ "$FAILS" -ne 0 ]; then
  echo "$FAILS curl check(s) failed; server log:"; tail -n 30 "$WORK/server.err"
  exit 1
fi
echo "all curl checks passed"
