// The executor: runs one planned batch through the model and hands back the
// logits each item asked for. It knows decode states and token ids but no
// requests, budgets or sampling.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"

namespace dsv4 {

struct ExecItem {
  SequenceState* state = nullptr;
  std::vector<int32_t> tokens;  // fed at positions state->n_tokens ...
  LogitRows logits = LogitRows::None;
  // The model's final HC state of the last `final_hc_rows` fed rows (the MTP
  // drafter's input), or null.
  std::vector<float>* final_hc = nullptr;
  int64_t final_hc_rows = 0;
  // The DSpark head's inputs (BatchItem::dspark_hidden) of the last
  // `dspark_rows` fed rows, or null.
  std::vector<float>* dspark_hidden = nullptr;
  int64_t dspark_rows = 0;
  int64_t replay_from = -1;  // BatchItem::replay_from
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
  int64_t vocab_ = 0;
  std::vector<float> data_;
  std::vector<int64_t> offset_, rows_;
};

class Executor {
 public:
  explicit Executor(const Model& model) : model_(model) {}
  // One Model::forward_batch over all items; each state advances by its
  // tokens. The logits of an item do not depend on the other items.
  StepLogits run(std::vector<ExecItem>& items) const;

 private:
  const Model& model_;
};

}  // namespace dsv4
