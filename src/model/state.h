// Per-sequence decode state of DeepSeek-V4 (docs/architecture.md): everything
// a later token needs from the earlier ones. Chunked prefill, decode and
// prefix reuse all go through it, so a snapshot restores a sequence
// byte-exactly, and a checkpoint lets a sequence step back (speculative
// verification) to the state a run that never went further would have.
//
// Cached rows are kept in the exact form the reference rounds them to (see
// model/cache_rows.h); the compressors' partial windows are raw fp32
// projections, kept as they are.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/cache_rows.h"
#include "model/layer_kind.h"

namespace dsv4 {

// Raw projections of the tokens of a compression window that is not complete
// yet. Overlapping compressors (CSA) keep the previous window too.
struct CompressorState {
  std::vector<float> kv;     // [slots, slot_width]
  std::vector<float> score;  // [slots, slot_width], -inf where empty
  void reset(int64_t slots, int64_t slot_width);

  // While a checkpoint is open, every write first saves what it overwrites,
  // tagged with the position of the token that wrote it.
  void save(int64_t position, int64_t offset, int64_t count);
  struct Undo {
    int64_t position, offset;
    std::vector<float> kv, score;
  };
  bool journaling = false;
  std::vector<Undo> journal;
  void undo_from(int64_t position);
};

struct LayerState {
  LayerLayout layout;
  KvRows window;       // ring of `window` rows; position p in slot p % window
  KvRows compressed;   // one row per `ratio` tokens
  Fp4Rows index_keys;  // CSA layers (V4.1: KV sources): one row per compressed row
  // V4.1 KV sources: the group's compressed rows (FP4, E4M3 scales); the
  // other layers of the group read their source's.
  Fp4Rows compressed_fp4;
  CompressorState compressor, index_compressor;

  // Window row of `position` (already rounded), through the journal.
  void write_window(int64_t position, const float* row);

  struct WindowUndo {
    int64_t position, slot;
    std::vector<uint8_t> bytes;
  };
  bool journaling = false;
  std::vector<WindowUndo> window_journal;
  void set_journaling(bool on);
  // Back to the state after `tokens` tokens (journal entries of later
  // positions undone, later rows dropped).
  void rollback(int64_t tokens);
};

struct SequenceState {
  int64_t n_tokens = 0;  // positions already processed by the main model
  std::vector<LayerState> layers;
  int64_t mtp_tokens = 0;  // positions already processed by the MTP block
  std::vector<LayerState> mtp_layers;
  // DSpark head: each stage's ring of window KV rows of the main model's
  // projected hidden states, position p in slot p % window, for positions
  // before `dspark_tokens`. Only positions the main model committed are
  // written (the engine extends them after verification), so a rollback
  // never needs to undo them. Not part of a snapshot: a restored state
  // starts with empty rings, which costs draft quality for one window, not
  // correctness.
  std::vector<KvRows> dspark_rings;
  int64_t dspark_tokens = 0;
  // V4.1 Engram: the token ids of positions 0 .. n_tokens-1, of which an
  // n-gram hash reads the last few (kept whole: 4 bytes a token, and a
  // rollback or snapshot needs nothing else).
  std::vector<int32_t> tokens;

  void reset(const ModelConfig& config);
  bool empty() const { return layers.empty(); }

  // Rollback: checkpoint() marks the current position; until
  // end_checkpoint(), rollback(t) returns the state to what it was after t
  // tokens for any t from the checkpoint on (and the MTP block to after
  // mtp_t positions; -1: min(its count, t)), bitwise equal to a run that
  // stopped there. Costs what the overwritten window and compressor slots
  // take, nothing for the prefix.
  void checkpoint();
  void rollback(int64_t tokens, int64_t mtp_tokens = -1);
  void end_checkpoint();
  bool has_checkpoint() const { return checkpoint_tokens_ >= 0; }

  // Byte-exact serialization (the prefix cache stores these). A checkpoint
  // is not part of it.
  std::vector<uint8_t> snapshot() const;
  void restore(const std::vector<uint8_t>& bytes);
  int64_t memory_bytes() const;

 private:
  int64_t checkpoint_tokens_ = -1, checkpoint_mtp_tokens_ = -1;
};

}  // namespace dsv4
