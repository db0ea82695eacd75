#!/usr/bin/env bash
# Builds the text-layer libFuzzer targets with clang (ASan + UBSan) into
# build-fuzz/ and runs each for SECONDS (default 60), seeded from the golden
# cases. Exits non-zero if any target reports a crash, leak, timeout or
# property violation. Usage: fuzz/run_fuzzers.sh [SECONDS] [target...]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(fuzz_tokenizer fuzz_output_parser fuzz_chat_encoder fuzz_grammar)
BUILD="${DSV4_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${JOBS:-$(nproc)}"

cmake -S "$ROOT/fuzz" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="${CC:-clang}" -DCMAKE_CXX_COMPILER="${CXX:-clang++}" >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}"

# Seed corpora from the golden cases (one file per case).
seed() {
  local target="$1" dir="$BUILD/corpus/$1"
  mkdir -p "$dir"
  [ -n "$(ls -A "$dir" 2>/dev/null)" ] && return 0
  command -v python3 >/dev/null || return 0
  python3 - "$ROOT/tests/data/text" "$target" "$dir" <<'PY'
import glob, json, os, sys
data, target, out = sys.argv[1:]
n = 0
def put(b):
    global n
    with open(os.path.join(out, "seed%04d" % n), "wb") as f:
        f.write(b)
    n += 1
if target == "fuzz_output_parser":
    for f in sorted(glob.glob(data + "/parsing/cases/*.json")):
        c = json.load(open(f))
        flags = (1 if c["dialect"] == "v41" else 0) | (2 if c["prompt_ends_with"] == "<think>" else 0) | (4 if c.get("tools_enabled") else 0) | 8 | 16
        put(bytes([flags, 0]) + c["raw"].encode())
elif target == "fuzz_chat_encoder":
    for f in sorted(glob.glob(data + "/encoding/**/*.json", recursive=True)):
        c = json.load(open(f))
        if isinstance(c, dict) and "request" in c:
            put(json.dumps(c["request"], ensure_ascii=False).encode())
elif target == "fuzz_grammar":
    put(b"\x00" + json.dumps({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 3}}, "required": ["a"], "$defs": {"n": {"anyOf": [{"type": "integer"}, {"enum": ["x", None]}]}}}).encode())
    put(b"\x30" + json.dumps({"type": "string", "pattern": "^[a-z]{2,4}-\\d+$"}).encode())
    put(b"\x01" + rb"(?:yes|no)+[!?]*\(\d{3}\) [^a-z]{1,3}")
    put(b"\x03" + b'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= [0-9]+ | "(" expr ")"')
elif target == "fuzz_tokenizer":
    for line in open(data + "/tokenizer/cases.jsonl"):
        c = json.loads(line)
        if "text" in c:
            put(c["text"].encode())
PY
}

status=0
for t in "${TARGETS[@]}"; do
  seed "$t"
  mkdir -p "$BUILD/artifacts/$t"
  echo "== $t: ${SECONDS_EACH}s"
  if ! "$BUILD/$t" "$BUILD/corpus/$t" -dict="$ROOT/fuzz/dsml.dict" -max_total_time="$SECONDS_EACH" \
      -timeout=10 -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 \
      -artifact_prefix="$BUILD/artifacts/$t/" 2>"$BUILD/$t.log"; then
    echo "!! $t FAILED (see $BUILD/$t.log and $BUILD/artifacts/$t/)"
    tail -30 "$BUILD/$t.log"
    status=1
  else
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$BUILD/$t.log" | sed "s/^/   /"
    grep -E '^#[0-9]+.*DONE' "$BUILD/$t.log" | tail -1 | sed "s/^/   /"
  fi
done
exit $status
