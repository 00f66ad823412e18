// fusetune eval on the real stories260K: perplexity equals the training recipes' loss on the
// same tokens; an unmerged adapter scores as its merged weights do; the shipped choice task.
#include <gtest/gtest.h>

#include <cmath>

#include "cli_runner.h"
#include "fusetune/data/collate.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/adapter.h"
#include "fusetune/recipes/evaluate.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/eager_executor.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

Config eval_config(const std::string& extra = "") {
  const auto a = assets_dir();
  return Config::from_string(
      "model: {init: checkpoint}\n"
      "checkpointer: {_component_: FullModelHFCheckpointer, checkpoint_dir: " +
          (a / "stories260K").string() +
          "}\n"
          "tokenizer: {_component_: hf, path: " +
          (a / "stories260K" / "tokenizer.json").string() +
          ", max_seq_len: 128}\n"
          "dataset: {_component_: text_completion, source: " +
          (a / "datasets" / "tinystories_sample.txt").string() +
          "}\n"
          "task: perplexity\nbatch_size: 3\ncompile: true\n" +
          extra,
      "test");
}

TEST(Stories260KEval, PerplexityAgreesWithTheTrainingLossOnTheSameTokens) {
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  const Config cfg = eval_config();
  InferenceModel m = load_inference_model(cfg);
  auto tok = build_inference_tokenizer(cfg, m.model.config);
  const PerplexityResult r = evaluate_perplexity(cfg, m, *tok);
  ASSERT_GT(r.tokens, 500);

  // The training step graph's loss (mean cross-entropy), one sample at a time, weighted by
  // its token count.
  auto ds = build_dataset_from_config(cfg, *tok, m.model.config, "dataset");
  const CollateOptions opts = loader_options_from(cfg, *tok).collate;
  double nll = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const Batch b = collate({&ds->get(i)}, opts);
    TrainingGraphOptions o;
    o.batch_size = 1;
    o.seq_len = b.seq_len;
    o.trainable = [](const std::string&) { return false; };
    TrainingGraph tg = build_training_graph(m.model.config, o);
    TensorMap in = batch_inputs(b);
    const int64_t n = b.num_valid_labels();
    in["loss_scale"] = scalar_input(1.0 / double(n), DType::F32);
    const double loss = EagerExecutor(tg.graph).run(in, m.model.params)[0].data<float>()[0];
    nll += loss * double(n);
    tokens += n;
  }
  EXPECT_EQ(r.tokens, tokens);
  EXPECT_NEAR(r.mean_nll(), nll / double(tokens), 1e-5 * nll / double(tokens));
  EXPECT_NEAR(r.perplexity(), std::exp(nll / double(tokens)), 1e-4);
}

TEST(Stories260KEval, AnUnmergedAdapterScoresAsItsMergedWeights) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  TempDir tmp;
  const Config base_cfg = eval_config();
  InferenceModel base = load_inference_model(base_cfg);
  auto tok = build_inference_tokenizer(base_cfg, base.model.config);
  // An adapter with nonzero B, so it changes the model.
  peft::LoraConfig c;
  c.attn_modules = {"q_proj", "v_proj", "output_proj"};
  c.apply_to_mlp = true;
  c.rank = 4;
  TensorMap params = base.model.params;
  peft::init_adapters(params, base.model.config, c, 5, DType::F32);
  for (auto& [name, t] : params)
    if (name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.02f * float((i * 7) % 11 - 5);
  peft::save_peft_adapter(tmp / "adapter", c, params, "stories260K");

  const Config with_adapter = eval_config("adapter: " + (tmp / "adapter").string() + "\n");
  InferenceModel unmerged = load_inference_model(with_adapter);
  const double a = evaluate_perplexity(with_adapter, unmerged, *tok).mean_nll();
  InferenceModel merged = base;
  merged.model.params = params;
  peft::merge_adapters(merged.model.params, base.model.config, c);
  const double b = evaluate_perplexity(base_cfg, merged, *tok).mean_nll();
  const double plain = evaluate_perplexity(base_cfg, base, *tok).mean_nll();
  EXPECT_NEAR(a, b, 1e-5 * b);
  EXPECT_GT(std::abs(a - plain), 1e-3) << "the adapter should change the model";
}

TEST(Stories260KEval, TheCommandScoresTheShippedTask) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  TempDir tmp;
  CliResult r = run_fusetune("eval --config stories260K/eval task=multiple_choice output_dir=" +
                             tmp.path().string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("acc 1.0000, acc_norm 1.0000 (12 questions)"), std::string::npos) << r.out;
  r = run_fusetune("eval --config stories260K/eval compile=false");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("perplexity: 3.56"), std::string::npos) << r.out;
  r = run_fusetune(
      "eval --config stories260K/eval task=multiple_choice task_file=/nonexistent.jsonl");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent.jsonl"), std::string::npos) << r.out;
}

}  // namespace
