#include "engine/executor.h"

#include <algorithm>

namespace dsv4 {

void Executor::run(std::vector<ExecItem>& items, StepLogits& out) const {
  const int64_t V = model_.config().vocab_size;
  out.vocab_ = V;
  out.offset_.clear();
  out.rows_.clear();
  int64_t total = 0;
  for (const ExecItem& it : items) {
    const int64_t rows = it.logits == LogitRows::All ? int64_t(it.tokens.size()) : it.logits == LogitRows::Last ? 1 : 0;
    out.offset_.push_back(total * V);
    out.rows_.push_back(rows);
    total += rows;
  }
  out.data_.resize(size_t(total * V));
  const int64_t hc_width = model_.config().hc_mult * model_.config().dim;
  const int64_t dspark_width = int64_t(model_.config().dspark_target_layer_ids.size()) * model_.config().dim;
  std::vector<BatchItem> batch;
  batch.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    ExecItem& it = items[i];
    float* logits = out.rows_[i] > 0 && !it.defer_head ? out.data_.data() + out.offset_[i] : nullptr;
    // Only the last row when that is all the item needs: the vocabulary-sized
    // head is then skipped for the other rows of a prefill chunk.
    float* hc = nullptr;
    const int64_t hc_rows = std::min<int64_t>(it.final_hc_rows, int64_t(it.tokens.size()));
    if (it.final_hc && hc_rows > 0) {
      it.final_hc->resize(size_t(hc_rows * hc_width));
      hc = it.final_hc->data();
    }
    BatchItem b{it.state, it.tokens.data(), int64_t(it.tokens.size()), logits, hc, it.logits != LogitRows::All,
                hc_rows};
    const int64_t dspark_rows = std::min<int64_t>(it.dspark_rows, int64_t(it.tokens.size()));
    if (it.dspark_hidden && dspark_rows > 0) {
      it.dspark_hidden->resize(size_t(dspark_rows * dspark_width));
      b.dspark_hidden = it.dspark_hidden->data();
      b.dspark_hidden_rows = dspark_rows;
    }
    b.replay_from = it.replay_from;
    batch.push_back(b);
  }
  if (!batch.empty()) model_.forward_batch(batch);
}

void Executor::head_rows(const std::vector<HeadRow>& rows, RowBuffer& hc_rows, RowBuffer& logits,
                         StepLogits& out) const {
  if (rows.empty()) return;
  const int64_t width = model_.config().hc_mult * model_.config().dim, V = out.vocab_, n = int64_t(rows.size());
  hc_rows.resize(size_t(n * width));
  logits.resize(size_t(n * V));
  for (int64_t i = 0; i < n; ++i) std::copy_n(rows[size_t(i)].final_hc, width, hc_rows.data() + i * width);
  model_.head_logits(hc_rows.data(), n, logits.data());
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(logits.data() + i * V, V, out.mutable_row(rows[size_t(i)].item, rows[size_t(i)].row));
}

}  // namespace dsv4
