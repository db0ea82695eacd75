#!/usr/bin/env bash
# `dsv4 bench` on the smoke checkpoint: the CSV has its documented columns and
# one row per phase with positive rates, the SVG chart is written, --repeat
# reports every run and keeps the best, and bad arguments fail with one
# clear line.
set -euo pipefail
BIN="${DSV4_BIN:?}"; MODEL="${DSV4_TEST_MODEL:?}"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
OMP_WAIT_POLICY=passive "$BIN" bench --model "$MODEL" --prompt 40 --decode 3 --batch 1,2 --repeat 2 \
  --csv "$WORK/b.csv" --plot "$WORK/b.svg" > "$WORK/out.txt"
fail() { echo "FAIL: $*"; cat "$WORK/out.txt"; cat "$WORK/b.csv" 2>/dev/null; exit 1; }
head -1 "$WORK/b.csv" | grep -qx 'phase,batch,tokens,seconds,tokens_per_second,weight_bytes_per_token,achieved_gb_per_s,bandwidth_gb_per_s,achieved_gflop_per_s,peak_gemm_gflop_per_s' \
  || fail "CSV header"
for phase in 'prefill,1,40' 'decode,1,3' 'decode,2,6' 'decode_43_layers_estimate,1' 'prefill_43_layers_estimate,1,40'; do
  grep -q "^$phase," "$WORK/b.csv" || fail "no CSV row $phase"
done
# tokens_per_second (column 5) is positive on every row but the splits' and products' (seconds per
# operation); the prefill row has FLOP/s and a peak.
awk -F, 'NR > 1 && $1 !~ /_split_|_product_/ && !($5 > 0) { exit 1 }' "$WORK/b.csv" || fail "non-positive tokens/s"
# The prefill split: one row per timed operation, the weight products among them, seconds >= 0.
grep -q "^prefill_split_linear,1,40," "$WORK/b.csv" || fail "no prefill split rows"
awk -F, '$1 ~ /^prefill_split_/ && !($4 >= 0) { exit 1 }' "$WORK/b.csv" || fail "prefill split seconds"
grep -q "^  not weight products: [0-9.]*% of the prefill" "$WORK/out.txt" || fail "no prefill split summary"
# The decode splits: a line after each batch and CSV rows per operation.
grep -q "^decode_split_linear,2,6," "$WORK/b.csv" || fail "no decode split rows"
awk -F, '$1 ~ /^decode_split_/ && !($4 >= 0) { exit 1 }' "$WORK/b.csv" || fail "decode split seconds"
[ "$(grep -c "^  split (one more run, each operation timed; [0-9.]* ms/step): weight products + experts [0-9.]* ms = [0-9.]* GB/s of the step's bytes" "$WORK/out.txt")" = 2 ] \
  || fail "not one decode split line per batch"
# Each split names its weight products by kind, with time, bytes and rate; CSV rows carry them.
[ "$(grep -c "^  by product (per step, slowest first): [A-Z].* [0-9.]* ms, [0-9.]* GB at [0-9.]* GB/s" "$WORK/out.txt")" = 2 ] \
  || fail "not one by-product line per decode batch"
# ... and each kind against its own floor: as many "% of its floor" as products, then what the floor is.
while read -r line; do
  products=$(echo "$line" | grep -o " GB at [0-9.]* GB/s" | wc -l)
  floors=$(echo "$line" | grep -o " GB at [0-9.]* GB/s, [0-9]*% of its floor" | wc -l)
  [ "$products" -gt 0 ] && [ "$products" = "$floors" ] || fail "a product without its floor: $line"
  echo "$line" | grep -q " (floor: the bytes at [0-9.]* GB/s or each weight decoded at its one-token rate and the other multiply-adds at the FMA ceiling, whichever is longer)$" \
    || fail "no floor definition: $line"
done < <(grep "^  by product (per step, slowest first): " "$WORK/out.txt")
grep -q "^  by product (the whole prefill, slowest first): .*experts .* (.* tokens per matrix)" "$WORK/out.txt" \
  || fail "no by-product line for the prefill"
grep -q "^decode_product_experts_[a-z0-9]*,2,6," "$WORK/b.csv" || fail "no decode product rows"
awk -F, '$1 ~ /_product_/ && !($4 > 0 && $6 > 0 && $7 > 0) { exit 1 }' "$WORK/b.csv" || fail "product rows' seconds, bytes or rate"
# Each decode batch against the limits read around its run (bandwidth, FMA ceiling, one-token rates)
# and at the run-wide best; batch 1 with its decoding floor.
limits="[0-9.]*, [0-9]*, [0-9.]*/[0-9.]*/[0-9.]*"
grep -q "^decode batch   1: .*\[limits around this run: $limits; run-wide best: $limits\] .* of the bandwidth around this run (.* of the run-wide best); the bytes at that bandwidth: [0-9.]* ms; decoding the weights at the one-token rates + the FMAs: [0-9.]* ms; the products one after another, each weight format at the longer of the two: [0-9.]* ms ([0-9]*% of the step), so the roofline is [0-9.]* tokens/s (bound by \(the bytes\|decoding the weights\|the products one after another\); at most [0-9.]*% of the bandwidth, [0-9.]*% at the run-wide best limits) and the step is at [0-9]*% of it ([0-9]*% of the [0-9.]* at the run-wide best limits)$" \
  "$WORK/out.txt" || fail "no batch-1 roofline line"
# The products one after another are never below the bytes alone or the decoding alone (0.1 ms of rounding).
serial=$(grep "^decode batch   1: " "$WORK/out.txt" |
  sed 's/.*the bytes at that bandwidth: \([0-9.]*\) ms; decoding the weights at the one-token rates + the FMAs: \([0-9.]*\) ms; the products one after another, each weight format at the longer of the two: \([0-9.]*\) ms.*/\1 \2 \3/')
echo "$serial" | awk '{ exit !($3 + 0.1 >= $1 && $3 + 0.1 >= $2) }' || fail "serial floor below the bytes or the decoding: $serial"
awk -F, '$1 == "prefill" && !($9 > 0 && $10 > 0) { exit 1 }' "$WORK/b.csv" || fail "prefill FLOP/s or peak missing"
grep -q "measured memory read bandwidth" "$WORK/out.txt" || fail "no bandwidth line"
grep -q "of the peak GEMM" "$WORK/out.txt" || fail "no peak GEMM share"
grep -q "^decode batch   2: .*x batch 1, [0-9]*% of the roofline" "$WORK/out.txt" || fail "no batched roofline share"
grep -q "^decode batch   2: .*decoding the weights once + the FMAs: [0-9]* ms; the products one after another, each weight format at the longer of its bytes and its decoding: [0-9]* ms; at the run-wide best limits the roofline is [0-9.]*, [0-9]*% of it); the roofline allows [0-9.]*x batch 1" "$WORK/out.txt" \
  || fail "no decoding floor on the batched line"
grep -q "one-token products from cache, 4 MB a core .*: BF16 [0-9.]*, FP8 [0-9.]*, FP4 [0-9.]*$" "$WORK/out.txt" || fail "no one-token rates"
grep -q "^  decode batch 1: .* tokens/s at the measured .*; decoding its weights at the one-token rates takes [0-9]* ms per token here (at most [0-9.]* tokens/s); its products one after another, each weight format at the longer of its bytes and its decoding, [0-9]* ms (at most [0-9.]* tokens/s, [0-9]*% of the read bandwidth)$" \
  "$WORK/out.txt" || fail "no 43-layer decoding bound"
grep -q "^  decode batch 2: [0-9.]* GB per step (uniform routing): at most [0-9.]* tokens/s at the measured bandwidth, [0-9.]*x batch 1 by bytes alone$" \
  "$WORK/out.txt" || fail "no 43-layer batch memory bound"
grep -q "^decode_43_layers_memory_bound,2," "$WORK/b.csv" || fail "no CSV row for the 43-layer batch memory bound"
# Two runs of each measurement; the CSV's time is the smaller of the two.
grep -q "^prefill: 2 runs, " "$WORK/out.txt" && grep -q "^decode batch 2: 2 runs, " "$WORK/out.txt" || fail "no per-run times"
runs=$(grep "^prefill: 2 runs, " "$WORK/out.txt" | sed 's/.*runs, \([0-9.]*\) \([0-9.]*\) s.*/\1 \2/')
best=$(awk -F, '$1 == "prefill" { print $4 }' "$WORK/b.csv")
awk -v r="$runs" -v b="$best" 'BEGIN { split(r, t, " "); m = t[1] < t[2] ? t[1] : t[2]; exit !(b <= m + 0.0005 && b >= m - 0.0005) }' \
  || fail "prefill time $best is not the best of the runs $runs"
if "$BIN" bench --model "$MODEL" --repeat 0 > "$WORK/err.txt" 2>&1; then fail "--repeat 0 accepted"; fi
# How the weights are held: auto copies a checkpoint this small and says why.
grep -q "^weights paged in: [0-9.]* s, copied into huge-page memory (--load-mode auto: the [0-9.]* GB checkpoint fits in the [0-9.]* GB available)$" \
  "$WORK/out.txt" || fail "no residency line"
if "$BIN" bench --model "$MODEL" --load-mode mlock > "$WORK/err.txt" 2>&1; then fail "--load-mode mlock accepted"; fi
if "$BIN" bench --model "$MODEL" --load-mode mmap --no-mmap > "$WORK/err.txt" 2>&1; then fail "--no-mmap with mmap accepted"; fi
grep -q "contradicts" "$WORK/err.txt" || fail "contradiction message: $(cat "$WORK/err.txt")"
grep -q "<svg" "$WORK/b.svg" && grep -q "batch 2" "$WORK/b.svg" || fail "SVG chart"
if "$BIN" bench --model "$MODEL" --batch 1,x > "$WORK/err.txt" 2>&1; then fail "bad --batch accepted"; fi
grep -q "invalid batch list" "$WORK/err.txt" || fail "bad --batch message: $(cat "$WORK/err.txt")"
# Long contexts from synthetic states: a line per context and batch, set
# against the limits read around its best run and the run-wide best, and CSV
# rows; --repeat 2 runs each row twice and prints both runs.
OMP_WAIT_POLICY=passive "$BIN" bench --model "$MODEL" --prompt 8 --decode 2 --no-split --context 256,512 \
  --context-batch 1,2 --repeat 2 --csv "$WORK/c.csv" > "$WORK/out.txt"
grep -q "^long contexts: each sequence starts from a synthetic decode state" "$WORK/out.txt" || fail "no --context header"
grep -q "^context     512: per token, attention + indexer read" "$WORK/out.txt" || fail "no --context cost line"
grep -q "^  batch  2: .* tokens/s = .*% of the roofline .* at the limits around this run \[.*\] (.*% of the .* at the run-wide best limits)" \
  "$WORK/out.txt" || fail "no --context batch line: $(grep '^  batch  2:' "$WORK/out.txt")"
[ "$(grep -c '^  batch  2: 2 runs, .* ms/step; the best counts' "$WORK/out.txt")" = 2 ] || fail "--repeat did not repeat the context rows"
grep -q "^decode_context_512,2,4," "$WORK/c.csv" || fail "no --context CSV row"
if grep -q "^prefill_split_" "$WORK/c.csv"; then fail "--no-split still split the prefill"; fi
if "$BIN" bench --model "$MODEL" --prompt 8 --decode 1 --no-split --context 4 > "$WORK/err.txt" 2>&1; then
  fail "a context shorter than the window accepted"
fi
# Speculative decoding against what its verify and draft steps allow (bytes
# and decoding work), with the gate's result beside it, then one more run
# with each phase's kernels timed (the draft's and the verify's products).
# A draft vocabulary (every third token id, as a list) narrows the MTP head
# the model counts for the draft. --repeat runs the plain and speculative
# runs in rounds and prints each round. --speculative-prompt sets each
# request's prompt (16 by default).
seq 0 3 129279 > "$WORK/map.txt"
if "$BIN" bench --model "$MODEL" --prompt 8 --decode 1 --speculative EAGLE --speculative-prompt 1 \
  > "$WORK/err.txt" 2>&1; then
  fail "a one-token speculative prompt accepted"
fi
OMP_WAIT_POLICY=passive "$BIN" bench --model "$MODEL" --prompt 8 --decode 4 --batch 1 --repeat 2 --gate-decode 12 \
  --speculative EAGLE --accept-len 2 --speculative-token-map "$WORK/map.txt" --speculative-prompt 20 \
  --csv "$WORK/s.csv" > "$WORK/out.txt"
grep -q "^speculative decoding (EAGLE, 3 drafts per step, greedy, 20-token prompts, 8 tokens per request)" \
  "$WORK/out.txt" || fail "no speculative header with the prompt length"
grep -q "^draft vocabulary: the MTP head scores 43094 of 129280 tokens" "$WORK/out.txt" || fail "no draft vocabulary line"
grep -q "^batch   1 plain: *[0-9.]* tokens/s (.*); best of 2 rounds: [0-9.]* [0-9.]*$" "$WORK/out.txt" \
  || fail "no plain line with its rounds"
L='[0-9.]*, [0-9]*, [0-9.]*/[0-9.]*/[0-9.]*'
grep -q "^batch   1 plain: *[0-9.]* tokens/s ([0-9.]* ms per step; the model allows [0-9.]* tokens/s, [0-9]*% of it; [0-9.]* at the limits read around the run, [0-9]*%)" \
  "$WORK/out.txt" || fail "no plain line against the limits around its run"
grep -q "^  limits read around the counted runs (GB/s read; fp32 FMA GFLOP/s; G weights/s decoded, BF16/FP8/FP4): plain $L; accept 2.0 $L; the model takes the best read in this run, $L$" \
  "$WORK/out.txt" || fail "no limits line for the runs"
grep -q "^    rounds, speculative: tokens/s and x that round's plain run: [0-9.]* [0-9.]*x; [0-9.]* [0-9.]*x$" \
  "$WORK/out.txt" || fail "no rounds line"
grep -q "^  accept 2.0: speculative  *[0-9.]* tokens/s = [0-9.]*x plain, [0-9]*% of the [0-9.]* the model allows, [0-9]*% of the [0-9.]* at the limits read around the run (verify [0-9.]* ms, draft [0-9.]* ms per step)$" \
  "$WORK/out.txt" || fail "no speculative line"
# The gate: its engine's steps in turn with a plain engine's, one pair a
# round, and two plain engines the same way (the method against itself),
# over requests of --gate-decode tokens.
R='[0-9.]* / [0-9.]* = [0-9.]*'
grep -q "^    with the bypass (after 4 warm-up batches; 12 tokens a request), its steps in turn with a plain engine's: [0-9.]*x that engine's tokens/s (median of 2; rounds: $R $R); [0-9]* of [1-9][0-9]* steps plain; a step [0-9.]* ms: forward pass [0-9.]*, drafts [0-9.]*, outside them -\?[0-9.]*; plain [0-9.]*: [0-9.]*, -, -\?[0-9.]*$" \
  "$WORK/out.txt" || fail "no gate line"
grep -q "^  two plain engines, their steps in turn (the gate's method against itself): [0-9.]*x (median of 2; [0-9.]* [0-9.]*)$" \
  "$WORK/out.txt" || fail "no line of two plain engines in turn"
grep -q "^    the model, per step: verify [0-9.]* ms (the LM head on [0-9]* of its [0-9]* rows), draft [0-9.]* ms, the MTP block over the 20-token prompts [0-9.]* ms" \
  "$WORK/out.txt" || fail "no speculative model line"
for phase in draft verify; do
  # The products' order is measured (another test on the same cores can
  # slow one product class), so check that the line is sorted, not which
  # class comes first; the printed times are rounded, which keeps the order.
  split=$(grep -A1 "^    $phase, per step: [0-9.]* ms; kernels: weight products [0-9.]* ms, .*; outside the kernels -\?[0-9.]* ms$" \
    "$WORK/out.txt" | grep "^    by product (per step, slowest first): ") || fail "no $phase split"
  echo "$split" | grep -q "BF16 x[0-9]* [0-9.]* ms, [0-9.]* GB at [0-9.]* GB/s, [0-9]*% of its floor" \
    || fail "no BF16 product against its floor in the $phase split"
  echo "$split" | grep -o "[0-9.]* ms, [0-9.]* GB at" | awk '{ if (NR > 1 && $1 > prev) bad = 1; prev = $1 } END { exit bad }' \
    || fail "the $phase split is not slowest first: $split"
  grep -q "^speculative_2_${phase}_product_bf16_x[0-9]*,1,[0-9]*,[0-9.e-]*,,[0-9.e+]*,[0-9.e+-]*,,,$" "$WORK/s.csv" \
    || fail "no $phase product CSV rows"
done
echo "bench CLI ok"
