#include "engine/executor.h"

namespace dsv4 {

StepLogits Executor::run(std::vector<ExecItem>& items) const {
  const int64_t V = model_.config().vocab_size;
  StepLogits out;
  out.vocab_ = V;
  int64_t total = 0;
  for (const ExecItem& it : items) {
    const int64_t rows = it.logits == LogitRows::All ? int64_t(it.tokens.size()) : it.logits == LogitRows::Last ? 1 : 0;
    out.offset_.push_back(total * V);
    out.rows_.push_back(rows);
    total += rows;
  }
  out.data_.resize(size_t(total * V));
  std::vector<BatchItem> batch;
  batch.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    ExecItem& it = items[i];
    float* logits = out.rows_[i] > 0 ? out.data_.data() + out.offset_[i] : nullptr;
    // Only the last row when that is all the item needs: the vocabulary-sized
    // head is then skipped for the other rows of a prefill chunk.
    batch.push_back(
        {it.state, it.tokens.data(), int64_t(it.tokens.size()), logits, nullptr, it.logits != LogitRows::All});
  }
  if (!batch.empty()) model_.forward_batch(batch);
  return out;
}

}  // namespace dsv4
