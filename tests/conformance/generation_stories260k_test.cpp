// Generation from the real stories260K: greedy decoding reproduces the 40 tokens llama2.c's
// run.c produced (golden.json) in every compile mode, each cached step's logits equal a full
// recomputation, and `fusetune generate` does the same from its config.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/generation/generator.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/eager_executor.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct Stories {
  HFCheckpoint ckpt;
  TensorMap params;
};

Stories load() {
  Stories s{load_hf_checkpoint(assets_dir() / "stories260K"), {}};
  for (auto& [name, t] : s.ckpt.tensors) s.params[name] = t;
  return s;
}

std::vector<int32_t> golden_greedy() {
  std::ifstream f(assets_dir() / "stories260K" / "golden.json");
  return nlohmann::json::parse(f)["greedy_from_bos_first40"].get<std::vector<int32_t>>();
}

TEST(Stories260KGeneration, GreedyFromBosReproducesTheGoldenTokensInEveryMode) {
  FT_REQUIRE_ASSET("stories260K/golden.json");
  Stories s = load();
  const std::vector<int32_t> want = golden_greedy();
  GenerationOptions o;
  o.max_new_tokens = int64_t(want.size());
  o.sampling.temperature = 0;
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    Generator gen(s.ckpt.config, s.params, {}, mode, DType::F32);
    EXPECT_EQ(gen.generate({{1}}, o).tokens[0], want) << compile_mode_name(mode);
  }
}

TEST(Stories260KGeneration, EveryCachedStepEqualsAFullRecomputation) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  Stories s = load();
  const int64_t V = s.ckpt.config.vocab_size;
  // Two prompts of different lengths (the shorter one left-padded), sampled.
  const std::vector<std::vector<int32_t>> prompts{{1, 403, 407, 261, 378}, {1, 317}};
  std::vector<std::vector<int32_t>> seqs = prompts;
  Generator gen(s.ckpt.config, s.params, {}, CompileMode::Full, DType::F32);
  double worst = 0;
  int64_t runs = 0;
  gen.on_logits = [&](const Tensor& logits) {
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int64_t T = int64_t(seqs[b].size());
      EagerExecutor ex(build_logits_graph(s.ckpt.config, 1, T, DType::F32));
      Tensor tok = Tensor::empty({1, T}, DType::I32), pos = Tensor::empty({1, T}, DType::I32);
      for (int64_t i = 0; i < T; ++i) {
        tok.data<int32_t>()[i] = seqs[b][size_t(i)];
        pos.data<int32_t>()[i] = int32_t(i);
      }
      Tensor full = ex.run({{"tokens", tok}, {"positions", pos}}, s.params)[0];
      double num = 0, den = 0;
      for (int64_t j = 0; j < V; ++j) {
        const double a = logits.data<float>()[int64_t(b) * V + j],
                     r = full.data<float>()[(T - 1) * V + j];
        num = std::max(num, std::abs(a - r));
        den = std::max(den, std::abs(r));
      }
      worst = std::max(worst, num / den);
    }
    ++runs;
  };
  GenerationOptions o;
  o.max_new_tokens = 24;
  o.sampling = {0.9, 40, 0.95};
  o.seed = 3;
  gen.generate(prompts, o, [&](int64_t b, int32_t id) { seqs[size_t(b)].push_back(id); });
  EXPECT_EQ(runs, 24);
  EXPECT_LE(worst, 1e-5) << "largest relative difference of a step's logits";
}

TEST(Stories260KGeneration, TheCommandGeneratesTheGoldenTokens) {
  FT_REQUIRE_ASSET("stories260K/golden.json");
  TempDir tmp;
  for (const char* mode : {"false", "true"}) {
    CliResult r = run_fusetune(std::string("generate --config stories260K/generation prompt='' ") +
                               "temperature=0 max_new_tokens=40 compile=" + mode +
                               " output_dir=" + tmp.path().string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("decode: 39 tokens"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
    std::ifstream f(tmp / "generations.json");
    const auto j = nlohmann::json::parse(f);
    EXPECT_EQ(j["generations"][0]["tokens"].get<std::vector<int32_t>>(), golden_greedy()) << mode;
    EXPECT_EQ(j["generations"][0]["prompt_tokens"], nlohmann::json::array({1}));
  }
  // Seeded sampling repeats exactly.
  auto text = [](const std::string& out) {  // the streamed text: the line after the header
    const size_t from = out.find('\n') + 1;
    return out.substr(from, out.find('\n', from) - from);
  };
  const std::string cmd = "generate --config stories260K/generation max_new_tokens=30 seed=7";
  const std::string a = text(run_fusetune(cmd).out), b = text(run_fusetune(cmd).out);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.rfind("Once upon a time", 0), 0u) << a;
  EXPECT_GT(a.size(), 40u) << a;
}

TEST(Stories260KGeneration, TheCommandExplainsBadKeys) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  CliResult r = run_fusetune("generate --config stories260K/generation top_p=2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("top_p"), std::string::npos) << r.out;
  r = run_fusetune("generate --config stories260K/generation max_new_token=3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("max_new_tokens"), std::string::npos) << r.out;  // the suggestion
  r = run_fusetune("generate --config stories260K/generation 'quantizer={_component_: x}'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("quantizer"), std::string::npos) << r.out;
  r = run_fusetune("plan generate --config stories260K/generation");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("trains nothing"), std::string::npos) << r.out;
  r = run_fusetune("generate --config stories260K/generation --adapter /nonexistent");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent"), std::string::npos) << r.out;
}

}  // namespace
