#!/usr/bin/env bash
# Tokenizer encode throughput, ours vs the Rust Hugging Face `tokenizers`
# (npm @anush008/tokenizers ships the real Rust library as a napi binary), on
# the same text, one core each. Usage: bench/tokenizer_vs_hf.sh [BUILD_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
HF_DIR="${DSV4_HF_DIR:-$ROOT/build-bench-hf}"   # ignored by git (/build*/)
TOKENIZER="$ROOT/assets/dsv4-tokenizer/tokenizer.json"
CORPUS="$HF_DIR/corpus.txt"

[ -x "$BUILD/bench_text" ] || { echo "build bench_text first (cmake --build $BUILD --target bench_text)" >&2; exit 1; }
mkdir -p "$HF_DIR"
if [ ! -d "$HF_DIR/node_modules/@anush008/tokenizers" ]; then
  (cd "$HF_DIR" && npm install --silent --no-audit --no-fund @anush008/tokenizers@0.6.0 >/dev/null)
fi

# The same mixed English / Chinese / code corpus bench_text uses by default.
cat "$ROOT/tests/data/text/tokenizer/long_texts/moby-dick.txt" \
    "$ROOT/tests/data/text/tokenizer/long_texts/tang300.txt" \
    "$ROOT/src/text/tokenizer.cpp" "$ROOT/src/text/chat_encoder.cpp" \
    "$ROOT/src/text/output_parser.cpp" "$ROOT/tools/text_commands.cpp" > "$CORPUS"
BYTES=$(stat -c %s "$CORPUS")

bench_ours() {
  DSV4_BENCH_CORPUS="$CORPUS" taskset -c 0 "$BUILD/bench_text" --benchmark_filter="^$1/" \
      --benchmark_format=json 2>/dev/null |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const b=JSON.parse(s).benchmarks[0];
             console.log((b.bytes_per_second/1e6).toFixed(2), b.tokens)})'
}
bench_hf() {  # $1 = whole | paragraphs
  (cd "$HF_DIR" && RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false UV_THREADPOOL_SIZE=1 taskset -c 0 node -e '
const { Tokenizer } = require("@anush008/tokenizers");
const fs = require("fs");
(async () => {
  const tok = Tokenizer.fromFile(process.argv[1]);
  const text = fs.readFileSync(process.argv[2], "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  const pieces = process.argv[3] === "whole" ? [text] : text.split(/(?<=\n\n)/);
  const opts = { addSpecialTokens: false };
  const run = async () => { let n = 0; for (const p of pieces) n += (await tok.encode(p, null, opts)).getIds().length; return n; };
  let tokens = await run();                         // warm-up (fills the BPE cache)
  let n = 0; const t0 = process.hrtime.bigint();
  while (Number(process.hrtime.bigint() - t0) < 3e9) { tokens = await run(); n++; }
  const sec = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log((bytes * n / sec / 1e6).toFixed(2), tokens);
})();' "$TOKENIZER" "$CORPUS" "$1")
}

echo "corpus: $CORPUS ($BYTES bytes, English + Chinese + C++), one core each"
printf "%-44s %10s %10s\n" "" "MB/s" "tokens"
read -r a b <<<"$(bench_ours BM_TokenizerEncode)";           printf "%-44s %10s %10s\n" "dsv4 C++, whole text in one call" "$a" "$b"
read -r a b <<<"$(bench_hf whole)";                          printf "%-44s %10s %10s\n" "HF tokenizers (Rust), whole text" "$a" "$b"
read -r a b <<<"$(bench_ours BM_TokenizerEncodeParagraphs)"; printf "%-44s %10s %10s\n" "dsv4 C++, one call per paragraph" "$a" "$b"
read -r a b <<<"$(bench_hf paragraphs)";                     printf "%-44s %10s %10s\n" "HF tokenizers (Rust), one call per paragraph" "$a" "$b"
