// QAT on the real stories260K: `fusetune eval` with a `quantizer` section scores the model as
// the QAT step graph (switched on) computes its loss on the same tokens, for each scheme; Q8_0
// costs less perplexity than Q4_0, and both more than none. One sample per batch on both sides:
// with several (padded) rows per batch the fake-quantized mean NLL moved by ~5e-4 relative
// (the float model's by < 1e-5: a different GEMM rounding flips a few quantized activations).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "fusetune/data/collate.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/quant/qat.h"
#include "fusetune/recipes/evaluate.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/eager_executor.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

Config eval_config(const std::string& extra) {
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
          "task: perplexity\nbatch_size: 1\nlimit: 10\ncompile: false\n" +
          extra,
      "test");
}

}  // namespace

TEST(Stories260KQat, FakeQuantizedEvalEqualsTheQatStepLossOnTheSameTokens) {
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  double plain_nll = 0;
  std::map<std::string, double> nll_of;
  for (const char* scheme : {"", "gguf_q8_0", "gguf_q4_0", "Int8DynActInt4WeightQATQuantizer"}) {
    SCOPED_TRACE(scheme);
    const std::string q =
        *scheme ? std::string("quantizer: {_component_: ") + scheme +
                      (std::string(scheme).rfind("Int8", 0) == 0 ? ", groupsize: 32}\n" : "}\n")
                : "";
    const Config cfg = eval_config(q);
    InferenceModel m = load_inference_model(cfg);
    auto tok = build_inference_tokenizer(cfg, m.model.config);
    const PerplexityResult r = evaluate_perplexity(cfg, m, *tok);
    ASSERT_GT(r.tokens, 200);
    if (!*scheme) {
      plain_nll = r.mean_nll();
      continue;
    }
    nll_of[scheme] = r.mean_nll();
    // The QAT recipe's step graph (eager, fake quantization switched on), sample by sample.
    const quant::QatConfig qc = quant::qat_config_from(cfg);
    const LlamaOptions hooks =
        quant::qat_llama_options(qc, std::make_shared<ModelConfig>(m.model.config), true);
    auto ds = build_dataset_from_config(cfg, *tok, m.model.config, "dataset");
    const CollateOptions opts = loader_options_from(cfg, *tok).collate;
    double nll = 0;
    int64_t tokens = 0;
    for (int64_t i = 0; i < std::min<int64_t>(10, ds->size()); ++i) {
      const Batch b = collate({&ds->get(i)}, opts);
      TrainingGraphOptions o;
      o.batch_size = 1;
      o.seq_len = b.seq_len;
      o.trainable = [](const std::string&) { return false; };
      o.llama = hooks;
      TrainingGraph tg = build_training_graph(m.model.config, o);
      TensorMap in = batch_inputs(b);
      const int64_t n = b.num_valid_labels();
      in["loss_scale"] = scalar_input(1.0 / double(n), DType::F32);
      Tensor on = Tensor::empty({}, DType::I32);
      on.data<int32_t>()[0] = 1;
      in[quant::kFakeQuantEnabledInput] = on;
      nll += EagerExecutor(tg.graph).run(in, m.model.params)[0].data<float>()[0] * double(n);
      tokens += n;
    }
    EXPECT_EQ(r.tokens, tokens);
    EXPECT_NEAR(r.mean_nll(), nll / double(tokens), 1e-5 * nll / double(tokens));
  }
  EXPECT_GT(nll_of["gguf_q8_0"], plain_nll);
  EXPECT_GT(nll_of["gguf_q4_0"], nll_of["gguf_q8_0"]);
}
