// The executor: runs one planned batch through the model and hands back the
// logits each item asked for. It knows decode states and token ids but no
// requests, budgets or sampling.
#pragma once
#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "engine/scheduler.h"
#include "model/model.h"

namespace dsv4 {

// Float buffers of megabytes that a step fills (the logits rows: 0.5 MB a
// row at V4's vocabulary, 33 MB for a batch-16 verify of 4 rows each; the
// final HC rows, 64 KB a row at V4-Flash's width) or that a sequence keeps
// (its draft rows). They live in 2 MB pages and are reused from step to
// step: where a first touch of a 4 KB page traps to a hypervisor it cost
// about 15 us here (60 ms for 16 MB, against 1.5 ms in 2 MB pages), and
// glibc hands buffers over 32 MB back to the system when freed, so a new one
// each step paid that again (docs/speculative.md, "The gate", its "Page
// faults" item). The price: each buffer holds at least one 2 MB page, also
// a step item's 64 KB of HC rows (EAGLE and DSPARK engines only; released
// when the engine goes idle).
using RowBuffer = std::vector<float, HugePageAllocator<float>>;

struct ExecItem {
  SequenceState* state = nullptr;
  std::vector<int32_t> tokens;  // fed at positions state->n_tokens ...
  LogitRows logits = LogitRows::None;
  // The model's final HC state of the last `final_hc_rows` fed rows (the MTP
  // drafter's input), or null.
  RowBuffer* final_hc = nullptr;
  int64_t final_hc_rows = 0;
  // The DSpark head's inputs (BatchItem::dspark_hidden) of the last
  // `dspark_rows` fed rows, or null.
  RowBuffer* dspark_hidden = nullptr;
  int64_t dspark_rows = 0;
  int64_t replay_from = -1;  // BatchItem::replay_from
  // With LogitRows::All: the forward pass leaves the logits rows unfilled
  // (the head does not run on them) and `final_hc` must take all rows; the
  // engine then fills the rows it needs with Executor::head_rows.
  bool defer_head = false;
};

// A logits row to fill from a final HC row (Executor::head_rows).
struct HeadRow {
  size_t item;
  int64_t row;
  const float* final_hc;  // [hc_mult, dim]
};

// The logits of one forward pass: item i has rows(i) rows of `vocab` floats
// (0, 1 or its token count, by what it asked for).
class StepLogits {
 public:
  int64_t rows(size_t item) const { return rows_[item]; }
  const float* row(size_t item, int64_t r) const { return data_.data() + offset_[item] + r * vocab_; }
  const float* last_row(size_t item) const { return row(item, rows_[item] - 1); }

 private:
  friend class Executor;
  float* mutable_row(size_t item, int64_t r) { return data_.data() + offset_[item] + r * vocab_; }
  int64_t vocab_ = 0;
  RowBuffer data_;  // kept by the caller from step to step
  std::vector<int64_t> offset_, rows_;
};

class Executor {
 public:
  explicit Executor(const Model& model) : model_(model) {}
  // One Model::forward_batch over all items; each state advances by its
  // tokens. The logits of an item do not depend on the other items. `out`
  // is refilled; its buffer is reused.
  void run(std::vector<ExecItem>& items, StepLogits& out) const;
  StepLogits run(std::vector<ExecItem>& items) const {
    StepLogits out;
    run(items, out);
    return out;
  }
  // The LM head on the listed rows, in one product (the head's weights read
  // once for all of them), into their rows of `out`: the bits the forward
  // pass would have written there. `hc_rows` and `logits` are scratch kept
  // by the caller from step to step.
  void head_rows(const std::vector<HeadRow>& rows, RowBuffer& hc_rows, RowBuffer& logits, StepLogits& out) const;

 private:
  const Model& model_;
};

}  // namespace dsv4
