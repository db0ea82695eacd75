// Text-layer microbenchmarks: tokenizer encode/decode throughput on a large
// mixed English / Chinese / code corpus, chat rendering, and output parsing
// (non-streaming and streaming in small chunks). The corpus can be replaced
// with DSV4_BENCH_CORPUS=FILE (bench/tokenizer_vs_hf.sh uses that to measure
// the Rust HF tokenizers on the same bytes).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/chat_encoder.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

using namespace dsv4::text;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string& corpus() {
  static const std::string text = [] {
    if (const char* path = std::getenv("DSV4_BENCH_CORPUS")) return read_file(path);
    const fs::path root(DSV4_SOURCE_DIR);
    std::string t;
    t += read_file(root / "tests/data/text/tokenizer/long_texts/moby-dick.txt");
    t += read_file(root / "tests/data/text/tokenizer/long_texts/tang300.txt");
    for (const char* f : {"src/text/tokenizer.cpp", "src/text/chat_encoder.cpp", "src/text/output_parser.cpp",
                          "tools/text_commands.cpp"}) {
      t += read_file(root / f);
    }
    return t;
  }();
  return text;
}

std::shared_ptr<const Tokenizer> tokenizer() {
  static auto t = Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/assets/dsv4-tokenizer/tokenizer.json");
  return t;
}

std::string generated_text() {
  std::string s = "<think>";
  for (int i = 0; i < 200; ++i)
    s += "Let me reason about step " + std::to_string(i) + " carefully; 考虑一下这个问题。 ";
  s += "</think>Here is the plan.\n\n<｜DSML｜tool_calls>\n";
  for (int i = 0; i < 8; ++i) {
    s += "<｜DSML｜invoke name=\"write_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">src/f" +
         std::to_string(i) + ".cpp</｜DSML｜parameter>\n<｜DSML｜parameter name=\"content\" string=\"true\">";
    for (int k = 0; k < 40; ++k)
      s += "int f" + std::to_string(k) + "(int x) { return x * " + std::to_string(k) + "; }\n";
    s += "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"mode\" string=\"false\">{\"append\": false, \"perm\": "
         "420}</｜DSML｜parameter>\n</｜DSML｜invoke>\n";
  }
  s += "</｜DSML｜tool_calls>";
  return s;
}

ParserConfig parser_config() {
  ParserConfig cfg;
  cfg.starts_in_reasoning = true;
  cfg.tools_enabled = true;
  cfg.tool_names = {"write_file"};
  cfg.id_seed = 1;
  return cfg;
}

}  // namespace

static void BM_TokenizerEncode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto& text = corpus();
  size_t n = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n);
}
BENCHMARK(BM_TokenizerEncode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// The corpus cut at blank lines, one encode call per paragraph: closer to
// how prompts arrive than one 1.4 MB string.
static std::vector<std::string> paragraphs() {
  std::vector<std::string> out;
  const auto& t = corpus();
  size_t start = 0;
  while (start < t.size()) {
    size_t end = t.find("\n\n", start);
    end = end == std::string::npos ? t.size() : end + 2;
    out.push_back(t.substr(start, end - start));
    start = end;
  }
  return out;
}

static void BM_TokenizerEncodeParagraphs(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto paras = paragraphs();
  size_t n = 0;
  for (auto _ : state) {
    n = 0;
    for (const auto& p : paras) n += tok->encode(p).size();
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
  state.counters["tokens"] = static_cast<double>(n);
}
BENCHMARK(BM_TokenizerEncodeParagraphs)->Unit(benchmark::kMillisecond)->MinTime(2.0);

static void BM_TokenizerDecode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto ids = tok->encode(corpus());
  for (auto _ : state) {
    auto text = tok->decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
}
BENCHMARK(BM_TokenizerDecode)->Unit(benchmark::kMillisecond);

static void BM_StreamDecode(benchmark::State& state) {
  const auto& tok = tokenizer();
  const auto ids = tok->encode(corpus());
  for (auto _ : state) {
    StreamDecoder sd(tok);
    size_t total = 0;
    for (auto id : ids) total += sd.push(id).size();
    total += sd.finish().size();
    benchmark::DoNotOptimize(total);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * ids.size()));
}
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMillisecond);

static void BM_ParseOutputWhole(benchmark::State& state) {
  const std::string text = generated_text();
  const auto cfg = parser_config();
  for (auto _ : state) {
    auto m = parse_output(cfg, text, StopReason::Stop);
    benchmark::DoNotOptimize(m.tool_calls.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ParseOutputWhole)->Unit(benchmark::kMicrosecond);

// Token-sized chunks, as the server feeds the parser.
static void BM_ParseOutputStreaming(benchmark::State& state) {
  const std::string text = generated_text();
  const auto cfg = parser_config();
  const size_t chunk = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    OutputParser p(cfg);
    size_t out = 0;
    for (size_t i = 0; i < text.size(); i += chunk)
      out += p.feed(std::string_view(text).substr(i, chunk)).content.size();
    p.finish(StopReason::Stop);
    benchmark::DoNotOptimize(out);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ParseOutputStreaming)->Arg(4)->Arg(64)->Unit(benchmark::kMicrosecond);

static void BM_RenderChatRequest(benchmark::State& state) {
  ojson req = {{"messages", ojson::array()}, {"chat_template_kwargs", {{"thinking", true}}}};
  req["messages"].push_back({{"role", "system"}, {"content", "You are a helpful assistant."}});
  for (int i = 0; i < 20; ++i) {
    req["messages"].push_back({{"role", "user"}, {"content", "Question number " + std::to_string(i) + "?"}});
    req["messages"].push_back(
        {{"role", "assistant"}, {"content", "Answer " + std::to_string(i)}, {"reasoning_content", "thinking..."}});
  }
  req["messages"].push_back({{"role", "user"}, {"content", "Last question"}});
  req["tools"] = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  for (auto _ : state) {
    auto r = render_chat_request(req, EncoderProfile::V4_0731);
    benchmark::DoNotOptimize(r.prompt.data());
  }
}
BENCHMARK(BM_RenderChatRequest)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
