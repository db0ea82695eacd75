// Two engines on one model whose steps take turns, one step of each in
// alternation, for `dsv4 bench --speculative`'s gate against plain decoding.
//
// On the shared VMs this project runs on, the machine's speed moves by a
// third within minutes, so two runs one after another compare two moments of
// the machine as much as two engines: the gate's ratio to plain decoding
// swung 0.58-1.03x between runs whose steps were all plain. Here each engine
// is timed only while it holds the turn, from the start of its step (after
// admission) to the end of its retirement, and the turns alternate step by
// step, so both see the same moments of the machine (docs/speculative.md,
// "Steps in turn").
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dsv4::tools {

// Waits for every handle's first token (or its end), calls `at_first` with
// the tokens the handles have had so far, then waits for every handle's last
// event; returns the tokens they had in all. Throws on a request that failed.
int64_t drain(const std::vector<std::shared_ptr<RequestHandle>>& handles,
              const std::function<void(int64_t tokens)>& at_first = {});

// Runs `rounds` batches of `batch` greedy requests (prompts of
// `prompt_tokens` copies of one id, `decode` tokens each, EOS ignored) on
// `engine` and waits for them: the gate of speculative decoding learns once
// per server, so its exploration belongs to a warm-up, not to the counted
// requests.
void warm_up_engine(Engine& engine, int64_t batch, int64_t prompt_tokens, int64_t decode, int rounds);

// `batch` greedy requests of `decode` tokens after `prompt_tokens` random
// ids each (seeded: the same prompts every call), EOS ignored.
std::vector<std::shared_ptr<RequestHandle>> submit_bench_batch(Engine& engine, int64_t vocab_size, int64_t batch,
                                                               int64_t prompt_tokens, int64_t decode);

// One engine's part of a run in turns: its decode steps after every request
// of both engines had its first token, timed while it held the turn. Totals,
// so that rounds add up (operator+=); the rates derive from them.
struct TurnRun {
  double held_seconds = 0;     // while it held the turn, over its counted steps
  double forward_seconds = 0;  // the engine's forward passes in those steps
  double draft_seconds = 0;    // and its drafts
  int64_t steps = 0, tokens = 0, bypassed_steps = 0;

  TurnRun& operator+=(const TurnRun& other);
  double tokens_per_second() const { return held_seconds > 0 ? double(tokens) / held_seconds : 0.0; }
  // Per counted decode step, in milliseconds: held, forward, drafts, and the
  // rest of the held time (sampling, the gate, the events).
  double per_step_ms(double seconds) const { return steps ? 1e3 * seconds / double(steps) : 0.0; }
  double outside_seconds() const { return held_seconds - forward_seconds - draft_seconds; }
};

// Engines with `options[0]` and `options[1]` (their on_phase hooks are the
// turns'), each warmed up with `warm_up[i]` batches of `warm_decode` tokens
// alone, then one batch of `decode` tokens each, their steps in turn.
// Between its turns an engine's OpenMP team is released and made again
// (pinned where options.pin_threads asks), outside the timed part, because
// two idle teams in one process exceed the CPUs and GNU OpenMP then stops
// spinning its waiting workers (docs/engine.md, "The engine's OpenMP
// team"), which would slow both engines' steps.
std::array<TurnRun, 2> run_in_turns(const std::shared_ptr<const Model>& model, std::array<EngineOptions, 2> options,
                                    int64_t batch, int64_t prompt_tokens, int64_t warm_decode, int64_t decode,
                                    std::array<int, 2> warm_up);

}  // namespace dsv4::tools
