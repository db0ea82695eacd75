// Constrained decoding: the cost of one token mask over the real V4
// vocabulary (~128k tokens) while a JSON document that matches a schema is
// generated, warm (the per-context token classes of the compiled grammar
// filled in, the steady state of a server that sees a schema again) and cold
// (compile plus every class computed on first use, the first request).
#include <benchmark/benchmark.h>

#include "text/grammar_json.h"
#include "text/grammar_matcher.h"
#include "text/tokenizer.h"

using namespace dsv4::text;

namespace {

std::shared_ptr<const Tokenizer> tokenizer() {
  static auto t = Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/assets/dsv4-tokenizer/tokenizer.json");
  return t;
}

const nlohmann::ordered_json& schema() {
  static const auto s = nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string"},
      "age": {"type": "integer"},
      "email": {"type": "string", "format": "email"},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
      "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                  "zip": {"type": "string"}}, "required": ["city"], "additionalProperties": false},
      "score": {"type": "number"},
      "active": {"type": "boolean"},
      "role": {"enum": ["admin", "user", "guest"]}
    },
    "required": ["name", "age", "tags", "address", "active", "role"],
    "additionalProperties": false
  })");
  return s;
}

// A document the schema accepts, as the tokenizer would split it.
const std::vector<TokenId>& document() {
  static const auto ids = tokenizer()->encode(
      R"({"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "email": "ada@example.org", )"
      R"("tags": ["mathematics", "analytical engine", "poetry of science"], "address": {"street": "12 St James's )"
      R"(Square", "city": "London", "zip": "SW1Y 4JH"}, "score": -12.75e2, "active": true, "role": "admin"})");
  return ids;
}

// One mask per token of the document; counters report the time per mask.
void run_document(benchmark::State& state, bool cold) {
  auto trie = TokenTrie::for_tokenizer(tokenizer());
  const Grammar grammar = json_schema_grammar(schema());
  auto compiled = std::make_shared<const CompiledGrammar>(grammar, trie);
  TokenMask mask((trie->vocab_size() + 63) / 64);
  int64_t masks = 0, allowed = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      compiled = std::make_shared<const CompiledGrammar>(grammar, trie);
      state.ResumeTiming();
    }
    GrammarMatcher matcher(compiled);
    for (TokenId token : document()) {
      std::fill(mask.begin(), mask.end(), 0);
      matcher.fill_mask(mask);
      for (uint64_t word : mask) allowed += __builtin_popcountll(word);
      if (!matcher.accept(token)) state.SkipWithError("the document does not match its schema");
      ++masks;
    }
  }
  // Seconds per mask (printed with an SI prefix, e.g. 30us).
  state.counters["per_mask"] =
      benchmark::Counter(double(masks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["allowed_per_mask"] = double(allowed) / double(masks);
}

void BM_JsonSchemaMaskWarm(benchmark::State& state) { run_document(state, false); }
void BM_JsonSchemaMaskCold(benchmark::State& state) { run_document(state, true); }

void BM_TrieBuild(benchmark::State& state) {
  std::vector<std::string> bytes(tokenizer()->vocab_size());
  for (size_t t = 0; t < bytes.size(); ++t) bytes[t] = tokenizer()->token_bytes(TokenId(t));
  for (auto _ : state) benchmark::DoNotOptimize(TokenTrie(bytes).nodes());
}

BENCHMARK(BM_JsonSchemaMaskWarm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_JsonSchemaMaskCold)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_TrieBuild)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
