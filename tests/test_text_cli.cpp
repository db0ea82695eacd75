// The stable text-layer CLI (`dsv4 tokenize|detokenize|render|parse`) run as a
// subprocess over the golden cases, the way external harnesses use it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "run_command.h"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(DSV4_TEST_DATA) / "text";
const std::string kTokenizer = std::string(DSV4_SOURCE_DIR) + "/assets/dsv4-tokenizer/tokenizer.json";

// The binary's standard output and exit status; its stderr is dropped.
dsv4::test::CommandResult run(const std::string& args) {
  return dsv4::test::run_command(std::string("'") + DSV4_BINARY + "' " + args + " 2>/dev/null");
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

fs::path model_dir(const std::string& model_type) {
  const fs::path dir = fs::temp_directory_path() / ("dsv4_text_cli_" + model_type + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << json{
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", model_type}}.dump();
  fs::copy_file(kTokenizer, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  return dir;
}

std::string profile_flag(const std::string& profile) {
  if (profile == "v4_preview") return "v4";
  if (profile == "v4_0731") return "v4-0731";
  if (profile == "v41") return "v41";
  return "v41-tiers";
}

}  // namespace

TEST(TextCli, TokenizeAndDetokenize) {
  auto r = run("tokenize --tokenizer " + quote(kTokenizer) + " --text " + quote("Hello, world! <think>"));
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(json::parse(r.output), json({19923, 14, 2058, 3, 223, 128821}));
  r = run("detokenize --tokenizer " + quote(kTokenizer) + " --ids 19923,14,2058,3");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "Hello, world!");
  r = run("tokenize --tokenizer /nonexistent.json --text x");
  EXPECT_NE(r.exit_code, 0);
}

// `dsv4 token-map` (a draft vocabulary for --speculative-token-map): the
// most frequent tokens of the files first, at most --top of them, each
// once; the same map whether the text comes in one file or in many pieces.
TEST(TextCli, TokenMapRanksTokensByFrequency) {
  const fs::path dir = fs::temp_directory_path() / ("dsv4_token_map_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 60; ++i) text += "zebra\n";
  for (int i = 0; i < 7; ++i) text += "apple\n";
  std::ofstream(dir / "a.txt") << text;
  auto ids_of = [&](const std::string& s) {
    auto r = run("tokenize --tokenizer " + quote(kTokenizer) + " --text " + quote(s));
    return json::parse(r.output).get<std::vector<int>>();
  };
  const std::vector<int> zebra = ids_of("zebra"), apple = ids_of("apple"), newline = ids_of("\n");
  ASSERT_EQ(newline.size(), 1u);
  auto r = run("token-map --tokenizer " + quote(kTokenizer) + " " + quote((dir / "a.txt").string()));
  ASSERT_EQ(r.exit_code, 0);
  const std::vector<int> map = json::parse(r.output).get<std::vector<int>>();
  ASSERT_FALSE(map.empty());
  EXPECT_EQ(map[0], newline[0]);  // 67 times
  auto rank = [&](int id) { return std::find(map.begin(), map.end(), id) - map.begin(); };
  for (int z : zebra)
    for (int a : apple) {
      if (z == a) continue;
      EXPECT_LT(rank(z), rank(a)) << z << " " << a;
    }
  EXPECT_EQ(std::set<int>(map.begin(), map.end()).size(), map.size());
  r = run("token-map --tokenizer " + quote(kTokenizer) + " --top 2 --out " + quote((dir / "m.json").string()) + " " +
          quote((dir / "a.txt").string()));
  ASSERT_EQ(r.exit_code, 0);
  std::ifstream in(dir / "m.json");
  EXPECT_EQ(json::parse(in).get<std::vector<int>>(), std::vector<int>(map.begin(), map.begin() + 2));
  EXPECT_NE(run("token-map --tokenizer " + quote(kTokenizer) + " /nonexistent.txt").exit_code, 0);
  fs::remove_all(dir);
}

TEST(TextCli, RenderGoldenEncodingCases) {
  const auto dir = model_dir("deepseek_v4");
  int checked = 0;
  for (const auto& e : fs::directory_iterator(kData / "encoding" / "generated")) {
    std::ifstream in(e.path());
    const json c = json::parse(in);
    const std::string profile = c["profile"];
    const auto r = run("render --model " + quote(dir.string()) + " --request " + quote(e.path().string()) +
                       " --profile " + profile_flag(profile));
    ++checked;
    if (c["expected"].contains("error")) {
      EXPECT_NE(r.exit_code, 0) << c["id"];
      continue;
    }
    ASSERT_EQ(r.exit_code, 0) << c["id"];
    EXPECT_EQ(r.output, c["expected"]["prompt"].get<std::string>()) << c["id"];
    if (profile.rfind("v4", 0) == 0 && profile.find("v41") == std::string::npos && checked % 7 == 0) {
      const auto ids = run("render --ids --model " + quote(dir.string()) + " --request " + quote(e.path().string()) +
                           " --profile " + profile_flag(profile));
      ASSERT_EQ(ids.exit_code, 0);
      EXPECT_EQ(json::parse(ids.output), c["expected"]["token_ids"]) << c["id"];
    }
  }
  EXPECT_GT(checked, 100);
  fs::remove_all(dir);
}

TEST(TextCli, ProfileFromConfig) {
  const auto dir = model_dir("deepseek_v41");
  const fs::path req = dir / "req.json";
  std::ofstream(req) << R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}]})";
  const auto r = run("render --model " + quote(dir.string()) + " --request " + quote(req.string()));
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "<｜begin▁of▁sentence｜><｜System｜>s<｜User｜>q<｜Assistant｜></think>");
  fs::remove(dir / "tokenizer.json");
  EXPECT_NE(run("render --ids --model " + quote(dir.string()) + " --request " + quote(req.string())).exit_code, 0);
  fs::remove_all(dir);
}

// The request file's drop_thinking is honoured: false keeps the earlier
// turns' reasoning, for every profile; the default drops it.
TEST(TextCli, RenderHonoursDropThinking) {
  const auto dir = model_dir("deepseek_v4");
  const fs::path keep = dir / "keep.json", drop = dir / "drop.json";
  const std::string messages =
      R"("messages":[{"role":"user","content":"q1"},{"role":"assistant","reasoning_content":"R1","content":"a1"},)"
      R"({"role":"user","content":"q2"}],"thinking":true)";
  std::ofstream(keep) << "{" << messages << R"(,"drop_thinking":false})";
  std::ofstream(drop) << "{" << messages << "}";
  const std::string kept = "<｜User｜>q1<｜Assistant｜><think>R1</think>a1<｜end▁of▁sentence｜><｜User｜>q2<｜Assistant｜><think>";
  for (const char* profile : {"v4", "v4-0731", "v41"}) {
    for (const char* semantics : {"reference", "sglang"}) {
      const std::string args = std::string(" --model ") + quote(dir.string()) + " --profile " + profile +
                               " --semantics " + semantics + " --request ";
      const auto k = run("render" + args + quote(keep.string()));
      ASSERT_EQ(k.exit_code, 0) << profile;
      EXPECT_GE(k.output.size(), kept.size());
      EXPECT_EQ(k.output.substr(k.output.size() - std::min(k.output.size(), kept.size())), kept) << profile << "\n"
                                                                                                 << k.output;
      if (std::string(profile) != "v41") {
        EXPECT_EQ(k.output, "<｜begin▁of▁sentence｜>" + kept) << profile;
      }
      const auto d = run("render" + args + quote(drop.string()));
      ASSERT_EQ(d.exit_code, 0) << profile;
      EXPECT_EQ(d.output.find("R1"), std::string::npos) << profile << "\n" << d.output;
    }
  }
  fs::remove_all(dir);
}

// Request files go through the same nesting limit as HTTP bodies: 100k
// nested arrays are an error (exit 1), not a stack overflow.
TEST(TextCli, DeeplyNestedRequestIsRefused) {
  const auto dir = model_dir("deepseek_v4");
  const fs::path req = dir / "deep.json";
  std::ofstream(req) << R"({"messages":[{"role":"user","content":"q"}],"x":)" << std::string(100000, '[')
                     << std::string(100000, ']') << "}";
  EXPECT_EQ(run("render --model " + quote(dir.string()) + " --request " + quote(req.string())).exit_code, 1);
  EXPECT_EQ(run("parse --model " + quote(dir.string()) + " --request " + quote(req.string())).exit_code, 1);
  fs::remove_all(dir);
}

TEST(TextCli, ParseGoldenParsingCases) {
  const auto dir = model_dir("deepseek_v4");
  for (const auto& e : fs::directory_iterator(kData / "parsing" / "cases")) {
    std::ifstream in(e.path());
    const json c = json::parse(in);
    const auto r = run("parse --model " + quote(dir.string()) + " --request " + quote(e.path().string()));
    ASSERT_EQ(r.exit_code, 0) << c["id"];
    const json got = json::parse(r.output);
    const json& exp = c["expected"];
    EXPECT_EQ(got["reasoning_content"], exp["reasoning_content"]) << c["id"];
    EXPECT_EQ(got["content"], exp["content"]) << c["id"];
    EXPECT_EQ(got["finish_reason"], exp["finish_reason"]) << c["id"];
    EXPECT_EQ(got["tool_calls"].is_null(), exp["tool_calls"].is_null()) << c["id"];
    if (!exp["tool_calls"].is_null()) {
      ASSERT_EQ(got["tool_calls"].size(), exp["tool_calls"].size());
      for (size_t i = 0; i < exp["tool_calls"].size(); ++i) {
        EXPECT_EQ(got["tool_calls"][i]["function"]["name"], exp["tool_calls"][i]["name"]);
        EXPECT_EQ(json::parse(got["tool_calls"][i]["function"]["arguments"].get<std::string>()),
                  exp["tool_calls"][i]["arguments"]);
      }
    }
  }
  // A chat request plus a text file, as the server would parse it.
  const fs::path req = dir / "req.json";
  const fs::path gen = dir / "gen.txt";
  std::ofstream(req)
      << R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"ls"}}],"chat_template_kwargs":{"thinking":true}})";
  std::ofstream(gen)
      << "hmm</think>ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ls\">\n<｜DSML｜parameter name=\"d\" "
         "string=\"false\">[1]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
  const auto r = run("parse --model " + quote(dir.string()) + " --request " + quote(req.string()) + " --text " +
                     quote(gen.string()));
  ASSERT_EQ(r.exit_code, 0);
  const json got = json::parse(r.output);
  EXPECT_EQ(got["reasoning_content"], "hmm");
  EXPECT_EQ(got["content"], "ok");
  EXPECT_EQ(got["tool_calls"][0]["function"]["arguments"], "{\"d\": [1]}");
  EXPECT_EQ(got["finish_reason"], "tool_calls");
  fs::remove_all(dir);
}

// `render --ids` keeps the reference ids by default (special-token text in user
// content becomes control tokens, as in the golden data); the opt-in
// --no-special-tokens-in-content gives the server's default ids instead.
TEST(TextCli, RenderIdsWithSpecialTokenTextInContent) {
  const auto dir = model_dir("deepseek_v4");
  const fs::path file = kData / "encoding" / "generated" / "enc_unicode_special_strings_in_user_text__v4_preview.json";
  std::ifstream in(file);
  const json c = json::parse(in);
  const std::string base =
      "render --model " + quote(dir.string()) + " --request " + quote(file.string()) + " --profile v4";

  const auto ref = run(base + " --ids");
  ASSERT_EQ(ref.exit_code, 0);
  EXPECT_EQ(json::parse(ref.output), c["expected"]["token_ids"]);

  const auto safe = run(base + " --ids --no-special-tokens-in-content");
  ASSERT_EQ(safe.exit_code, 0);
  const auto ids = json::parse(safe.output).get<std::vector<int>>();
  EXPECT_NE(json(ids), c["expected"]["token_ids"]);
  // Only the template's markers are control tokens: <bos><｜User｜> ... <｜Assistant｜></think>.
  ASSERT_GT(ids.size(), 4u);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 128803);
  EXPECT_EQ(ids[ids.size() - 2], 128804);
  EXPECT_EQ(ids.back(), 128822);
  for (size_t i = 2; i + 2 < ids.size(); ++i) EXPECT_TRUE(ids[i] > 2 && ids[i] < 128000) << i << ": " << ids[i];
  std::string spec;
  for (int id : ids) spec += std::to_string(id) + ",";
  spec.pop_back();
  const auto text = run("detokenize --tokenizer " + quote(kTokenizer) + " --ids " + spec);
  ASSERT_EQ(text.exit_code, 0);
  EXPECT_EQ(text.output, c["expected"]["prompt"].get<std::string>());

  // The prompt string itself does not depend on the flag.
  const auto p1 = run(base);
  const auto p2 = run(base + " --no-special-tokens-in-content");
  ASSERT_EQ(p1.exit_code, 0);
  EXPECT_EQ(p1.output, c["expected"]["prompt"].get<std::string>());
  EXPECT_EQ(p2.output, p1.output);
  fs::remove_all(dir);
}
