// `dsv4 logits`, the stable interface of external test harnesses: flags,
// token files, output layout, and clean failures.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "golden_util.h"
#include "run_command.h"

namespace dsv4::test {
namespace {
namespace fs = std::filesystem;

// The binary's exit status and everything it writes (stdout and stderr).
CommandResult run(const std::string& args) { return run_command(std::string(DSV4_BINARY) + " " + args + " 2>&1"); }

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("dsv4_cli_" + std::to_string(::getpid()) + "_" + name);
}

TEST(CliLogits, PrefillChunksDecodeAndMtpMatchLibrary) {
  const std::string model = model_dir("tiny-pro-fp8");
  std::vector<int32_t> tokens;
  for (int i = 0; i < 150; ++i) tokens.push_back(int32_t((i * 37 + 11) % 512));
  tokens[0] = 0;
  fs::path ids = temp_path("ids.txt"), out = temp_path("out.safetensors");
  {
    std::ofstream f(ids);
    for (size_t i = 0; i < tokens.size(); ++i) f << tokens[i] << (i % 10 == 9 ? "\n" : ",");
  }
  CommandResult r = run("logits --model " + model + " --tokens @" + ids.string() + " --out " + out.string() +
                        " --prefill 130 --chunk-size 7 --threads 2 --mtp");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  TensorStore s = TensorStore::open(out.string());
  const TensorInfo& logits = s.get("logits");
  EXPECT_EQ(logits.dtype, DType::F32);
  EXPECT_EQ(logits.shape, (std::vector<int64_t>{150, 512}));
  EXPECT_EQ(s.get("mtp_logits").shape, (std::vector<int64_t>{150, 512}));

  auto m = Model::load(model);
  RunResult expected = run_schedule(*m, tokens, 150, 150, true);
  EXPECT_EQ(read_f32(s, "logits"), expected.logits);
  EXPECT_EQ(read_f32(s, "mtp_logits"), expected.mtp_logits);
  fs::remove(ids);
  fs::remove(out);
}

TEST(CliLogits, InlineTokensWithoutMtpHaveOnlyLogits) {
  fs::path out = temp_path("inline.safetensors");
  CommandResult r = run("logits --model " + model_dir("tiny-flash-bf16") + " --tokens 0,5,6,7 --out " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  TensorStore s = TensorStore::open(out.string());
  EXPECT_EQ(s.get("logits").shape, (std::vector<int64_t>{4, 512}));
  EXPECT_EQ(s.find("mtp_logits"), nullptr);
  fs::remove(out);
}

// --dspark: the V4.1 golden drafts through the stable CLI, independent of
// --prefill / --chunk-size / --threads, in the order of the positions.
TEST(CliLogits, DsparkDraftsMatchGoldenWhateverTheSchedule) {
  const std::string model = model_dir("tiny-v41-flash");
  TensorStore g = TensorStore::open(model + "/golden.safetensors");
  std::vector<int32_t> tokens = read_i32(g, "tokens");
  for (int32_t t : read_i32(g, "decode_tokens")) tokens.push_back(t);
  const std::vector<int32_t> positions = {340, 335, 350};  // decode-route positions, out of order
  fs::path ids = temp_path("v41_ids.txt"), pos = temp_path("v41_pos.txt");
  {
    std::ofstream f(ids), p(pos);
    for (size_t i = 0; i < tokens.size(); ++i) f << tokens[i] << (i + 1 < tokens.size() ? "," : "\n");
    p << "340\n335\n350\n";
  }
  const std::vector<int32_t> golden_positions = read_i32(g, "dspark.positions");
  const std::vector<float> golden_logits = read_f32(g, "dspark.logits");
  const std::vector<int32_t> golden_ids = read_i32(g, "dspark.draft_ids");
  std::vector<float> first;
  for (const std::string& schedule : {std::string(" --prefill 333"), std::string(" --prefill 300 --chunk-size 17 --threads 1")}) {
    fs::path out = temp_path("v41_out.safetensors");
    CommandResult r = run("logits --model " + model + " --tokens @" + ids.string() + " --out " + out.string() +
                          " --dspark @" + pos.string() + schedule);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    TensorStore s = TensorStore::open(out.string());
    EXPECT_EQ(s.get("dspark_logits").shape, (std::vector<int64_t>{3, 5, 512}));
    EXPECT_EQ(s.get("dspark_ids").shape, (std::vector<int64_t>{3, 6}));
    EXPECT_EQ(s.get("dspark_ids").dtype, DType::I32);
    EXPECT_EQ(s.get("dspark_confidence").shape, (std::vector<int64_t>{3, 5}));
    const std::vector<float> logits = read_f32(s, "dspark_logits");
    const std::vector<int32_t> out_ids = read_i32(s, "dspark_ids");
    for (size_t i = 0; i < positions.size(); ++i) {
      const size_t k = size_t(std::find(golden_positions.begin(), golden_positions.end(), positions[i]) -
                              golden_positions.begin());
      ASSERT_LT(k, golden_positions.size());
      for (size_t j = 0; j < 6; ++j) EXPECT_EQ(out_ids[i * 6 + j], golden_ids[k * 6 + j]);
      for (size_t j = 0; j < 5 * 512; ++j) EXPECT_NEAR(logits[i * 2560 + j], golden_logits[k * 2560 + j], 1e-3);
    }
    if (first.empty())
      first = logits;
    else
      EXPECT_EQ(first, logits) << "drafts depend on the schedule";
    fs::remove(out);
  }
  CommandResult past_end = run("logits --model " + model + " --tokens 0,5,6 --out " + temp_path("x").string() +
                               " --dspark 2");
  EXPECT_NE(past_end.exit_code, 0);
  EXPECT_NE(past_end.output.find("--dspark position 2 needs token 3"), std::string::npos) << past_end.output;
  fs::remove(ids);
  fs::remove(pos);
}

TEST(CliLogits, FailuresAreOneClearLineAndNonZeroExit) {
  fs::path out = temp_path("never.safetensors");
  CommandResult missing = run("logits --model /nonexistent --tokens 1,2 --out " + out.string());
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("error"), std::string::npos);
  EXPECT_EQ(std::count(missing.output.begin(), missing.output.end(), '\n'), 1) << missing.output;

  CommandResult bad_token =
      run("logits --model " + model_dir("tiny-flash-bf16") + " --tokens 1,x --out " + out.string());
  EXPECT_NE(bad_token.exit_code, 0);
  EXPECT_NE(bad_token.output.find("invalid token id \"x\""), std::string::npos) << bad_token.output;

  CommandResult oov = run("logits --model " + model_dir("tiny-flash-bf16") + " --tokens 1,9999 --out " + out.string());
  EXPECT_NE(oov.exit_code, 0);
  EXPECT_NE(oov.output.find("outside the vocabulary"), std::string::npos) << oov.output;

  CommandResult unknown_flag = run("logits --model x --tokens 1 --out y --bogus");
  EXPECT_NE(unknown_flag.exit_code, 0);
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace dsv4::test
