// `dsv4 token-map`: a draft vocabulary for EAGLE (`--speculative-token-map`)
// from the user's own text, the way FR-Spec builds its maps: the tokens that
// occur most often in a corpus. DeepSeek-V4 has no published map, and which
// tokens matter depends on the traffic (code, a language, tool calls), so
// the map is built from samples of it (docs/speculative.md).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace dsv4::tools {

namespace {

namespace fs = std::filesystem;

// Text is tokenized in pieces of about this many bytes, cut after a newline
// where there is one: memory stays bounded for large corpora, and a token
// split at a cut only moves a count or two.
constexpr size_t kPieceBytes = size_t(1) << 20;

struct TokenMapArgs {
  std::string tokenizer, out;
  std::vector<std::string> files;
  int64_t top = 32768;
};

void count_file(const text::Tokenizer& tok, const std::string& path, std::vector<int64_t>& counts, int64_t& total) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("token-map: cannot read " + path);
  std::string carry, piece(kPieceBytes, '\0');
  auto encode = [&](const std::string& text) {
    for (text::TokenId id : tok.encode(text)) {
      if (size_t(id) >= counts.size()) counts.resize(size_t(id) + 1, 0);
      ++counts[size_t(id)];
      ++total;
    }
  };
  while (in) {
    in.read(piece.data(), std::streamsize(piece.size()));
    carry.append(piece.data(), size_t(in.gcount()));
    if (carry.size() < kPieceBytes && in) continue;
    const size_t cut = in ? carry.rfind('\n') : std::string::npos;
    if (cut == std::string::npos) {
      encode(carry);
      carry.clear();
    } else {
      encode(carry.substr(0, cut + 1));
      carry.erase(0, cut + 1);
    }
  }
  if (!carry.empty()) encode(carry);
}

void run_token_map(const TokenMapArgs& a) {
  fs::path tokenizer = a.tokenizer;
  if (fs::is_directory(tokenizer)) tokenizer /= "tokenizer.json";
  if (!fs::exists(tokenizer)) throw Error("token-map: no tokenizer at " + tokenizer.string());
  const auto tok = text::Tokenizer::from_file(tokenizer.string());
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (const std::string& file : a.files) count_file(*tok, file, counts, total);
  std::vector<int32_t> ids;
  for (size_t id = 0; id < counts.size(); ++id)
    if (counts[id] > 0) ids.push_back(int32_t(id));
  if (ids.empty()) throw Error("token-map: the files hold no text");
  // Most frequent first; equal counts by id, so the map is reproducible.
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t x, int32_t y) { return counts[size_t(x)] > counts[size_t(y)]; });
  const size_t distinct = ids.size(), kept = std::min(distinct, size_t(a.top));
  int64_t covered = 0;
  for (size_t i = 0; i < kept; ++i) covered += counts[size_t(ids[i])];
  ids.resize(kept);
  std::string json = "[";
  for (size_t i = 0; i < ids.size(); ++i) json += (i ? ", " : "") + std::to_string(ids[i]);
  json += "]\n";
  if (a.out.empty()) {
    std::fwrite(json.data(), 1, json.size(), stdout);
  } else {
    std::ofstream out(a.out, std::ios::binary);
    out << json;
    out.close();
    if (!out) throw Error("token-map: cannot write " + a.out);
  }
  std::fprintf(stderr,
               "token-map: %lld tokens in %zu file(s), %zu distinct; the %zu most frequent cover %.2f%% of them%s\n",
               (long long)total, a.files.size(), distinct, kept, 100.0 * double(covered) / double(total),
               kept < size_t(a.top) ? " (fewer distinct tokens than --top: all of them are kept)" : "");
}

}  // namespace

void register_token_map_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TokenMapArgs>();
  auto* cmd = app.add_subcommand(
      "token-map",
      "A draft vocabulary for --speculative-token-map: the most frequent tokens of text files, as a JSON array");
  cmd->add_option("--tokenizer", a->tokenizer, "tokenizer.json, or a model directory holding one")->required();
  cmd->add_option("--top", a->top, "tokens kept (32768, FR-Spec's usual size)")->check(CLI::PositiveNumber);
  cmd->add_option("--out", a->out, "write the map here instead of standard output");
  cmd->add_option("files", a->files, "text files: samples of the traffic the server will see")->required();
  cmd->callback([a, &exit_code] {
    try {
      run_token_map(*a);
      exit_code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace dsv4::tools
