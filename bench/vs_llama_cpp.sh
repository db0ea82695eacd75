#!/usr/bin/env bash
# dsv4 against llama.cpp's `deepseek4` on the same checkpoint slice, same
# threads, alternating runs: prefill tokens/s at each PREFILL length and
# decode tokens/s at batch 1, 4 and 16 after a DECODE_PROMPT-token prompt.
#
# Usage: bench/vs_llama_cpp.sh SLICE_DIR [BUILD_DIR]
#   SLICE_DIR: a checkpoint from `dsv4 make-model --preset flash --layers 2`
#   env: PREFILL ("512 4096"), DECODE_PROMPT (512), DECODE (64), ROUNDS (2),
#        THREADS (2), DSV4_LLAMA_DIR (/tmp/dsv4-llama-cpp: llama.cpp's source,
#        build and the converted GGUF; outside the repository)
#
# llama.cpp's source comes from npm: node-llama-cpp ships the llama.cpp
# release it binds as a git bundle (llama/gitRelease.bundle). The slice is
# converted by bench/llama_cpp_convert.py with llama.cpp's gguf-py (numpy
# from apt). Nothing of llama.cpp enters the repository. Results: a table on
# stdout and $DSV4_LLAMA_DIR/vs_llama_cpp.csv (round, test, dsv4, llama.cpp).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SLICE="$(cd "${1:?usage: bench/vs_llama_cpp.sh SLICE_DIR [BUILD_DIR]}" && pwd)"
BUILD="${2:-$ROOT/build}"
WORK="${DSV4_LLAMA_DIR:-/tmp/dsv4-llama-cpp}"
NODE_LLAMA_CPP_VERSION=3.22.1
PREFILL="${PREFILL:-512 4096}"
DECODE_PROMPT="${DECODE_PROMPT:-512}"
DECODE="${DECODE:-64}"
ROUNDS="${ROUNDS:-2}"
THREADS="${THREADS:-2}"
BATCHES="1 4 16"
MAX_BATCH="${BATCHES##* }"  # the last (largest) of BATCHES: llama-batched-bench's KV holds that many sequences

[ -x "$BUILD/dsv4" ] || { echo "build dsv4 first (scripts/build.sh, or cmake --build $BUILD)" >&2; exit 1; }
mkdir -p "$WORK"

if [ ! -d "$WORK/llama.cpp" ]; then
  echo "fetching llama.cpp's source (npm node-llama-cpp@$NODE_LLAMA_CPP_VERSION)" >&2
  (cd "$WORK" && npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP_VERSION" >/dev/null &&
     tar xzf "node-llama-cpp-$NODE_LLAMA_CPP_VERSION.tgz" package/llama/gitRelease.bundle &&
     git -c advice.detachedHead=false clone -q package/llama/gitRelease.bundle llama.cpp)
fi
if [ ! -x "$WORK/build/bin/llama-batched-bench" ]; then
  echo "building llama.cpp (CPU, native) in $WORK/build" >&2
  cmake -S "$WORK/llama.cpp" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$WORK/build" --target llama-bench llama-batched-bench >/dev/null
fi
/usr/bin/python3 -c 'import numpy' 2>/dev/null || apt-get install -y -q python3-numpy >/dev/null
GGUF="$WORK/$(basename "$SLICE").gguf"
if [ ! -s "$GGUF" ] || [ "$SLICE/config.json" -nt "$GGUF" ]; then
  echo "converting $SLICE to $GGUF" >&2
  /usr/bin/python3 "$ROOT/bench/llama_cpp_convert.py" "$WORK/llama.cpp/gguf-py" "$SLICE" "$GGUF.tmp" >&2
  mv "$GGUF.tmp" "$GGUF"
fi

CSV="$WORK/vs_llama_cpp.csv"
echo "round,test,dsv4_tokens_per_s,llama_cpp_tokens_per_s" > "$CSV"
ours_csv="$WORK/dsv4_bench.csv"
# dsv4 bench's CSV rows: phase,batch,tokens,seconds,tokens_per_second,...
ours() { awk -F, -v phase="$1" -v batch="$2" '$1 == phase && $2 == batch { print $5 }' "$ours_csv" | tail -1; }

for round in $(seq "$ROUNDS"); do
  declare -A dsv4=() llama=()
  for prompt in $PREFILL; do
    "$BUILD/dsv4" bench --model "$SLICE" --threads "$THREADS" --prompt "$prompt" --decode 1 --batch 1 \
      --no-split --csv "$ours_csv" >/dev/null 2>&1
    dsv4[pp$prompt]=$(ours prefill 1)
    # llama-bench's markdown table: | model | ... | test | t/s (mean ± deviation) |
    llama[pp$prompt]=$("$WORK/build/bin/llama-bench" -m "$GGUF" -t "$THREADS" -p "$prompt" -n 0 -r 1 2>/dev/null |
      awk -F'|' -v test="pp$prompt" 'NF > 3 && $(NF - 2) ~ "^ *" test " *$" { split($(NF - 1), rate, " "); print rate[1] }')
  done
  "$BUILD/dsv4" bench --model "$SLICE" --threads "$THREADS" --prompt "$DECODE_PROMPT" --decode "$DECODE" \
    --batch "${BATCHES// /,}" --no-split --csv "$ours_csv" >/dev/null 2>&1
  for batch in $BATCHES; do dsv4[tg$batch]=$(ours decode "$batch"); done
  # llama-batched-bench prints a markdown table: | PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | ...
  while read -r batch rate; do llama[tg$batch]=$rate; done < <(
    "$WORK/build/bin/llama-batched-bench" -m "$GGUF" -t "$THREADS" -c $((MAX_BATCH * (DECODE_PROMPT + DECODE) + 256)) \
      -b 2048 -ub 512 -npp "$DECODE_PROMPT" -ntg "$DECODE" -npl "${BATCHES// /,}" 2>/dev/null |
      awk -F'|' '$2 ~ /^ *[0-9]+ *$/ { gsub(" ", "", $4); gsub(" ", "", $9); print $4, $9 }')
  for test in $(for prompt in $PREFILL; do echo "pp$prompt"; done) $(for batch in $BATCHES; do echo "tg$batch"; done); do
    echo "$round,$test,${dsv4[$test]},${llama[$test]}" >> "$CSV"
  done
  unset dsv4 llama
done

echo "dsv4 against llama.cpp $(git -C "$WORK/llama.cpp" describe --always 2>/dev/null), $THREADS threads, $ROUNDS alternating rounds"
echo "(ppN: prefill of N tokens; tgB: decode at batch B after $DECODE_PROMPT-token prompts, tokens/s over all streams)"
awk -F, 'NR > 1 { printf "round %s  %-7s dsv4 %8.2f  llama.cpp %8.2f  %s\n", $1, $2, $3, $4, ($3 > 0 && $4 > 0) ? sprintf("%.2fx", $3 / $4) : "n/a" }' "$CSV"
echo "CSV: $CSV"
