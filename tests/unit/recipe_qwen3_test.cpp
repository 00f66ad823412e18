// A Qwen3 (model.model_type: qwen3, random init) through the recipes: full fine-tuning in each
// compile mode (the same losses as eager) and LoRA on q/v and the MLP; the saved checkpoints
// read back as Qwen3 with their q/k norms, trained.
#include <gtest/gtest.h>

#include <cmath>

#include "fusetune/io/hf_checkpoint.h"
#include "metrics_log.h"
#include "recipe_matrix.h"
#include "resume_runs.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

// head_dim 24: apart from hidden_size / heads (16) and from Qwen3's default (128).
const Overrides kQwen3 = {{"model.model_type", "qwen3"},
                          {"model.head_dim", "24"},
                          {"model.tie_word_embeddings", "true"},
                          {"max_steps_per_epoch", "3"}};

// The recipe matrix's tiny run as a Qwen3: its config written under `tmp`, `o` given the keys.
fs::path write_config(const TempDir& tmp, const char* recipe, TinyModel model, Overrides& o) {
  return write_case_config({"qwen3", recipe, 1, TinyData::Text, model, kQwen3}, tmp.path(), o);
}

TEST(RecipeQwen3, FullFineTuningMatchesEagerInEveryModeAndSavesTheQkNorms) {
  const TempDir tmp;
  Overrides keys;
  const fs::path config = write_config(tmp, "full_finetune_single_device", TinyModel::Full, keys);
  std::vector<double> eager;
  for (const char* mode : {"false", "model", "true"}) {
    SCOPED_TRACE(mode);
    const fs::path out = tmp / (std::string("out_") + mode);
    Overrides o = with_keys(keys, {{"compile", mode}, {"output_dir", out.string()}});
    const CliRun r = run_recipe(1, "full_finetune_single_device", config, o, tmp / "io");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    const std::vector<double> losses = logged_values(out, "loss");
    ASSERT_EQ(losses.size(), 3u);
    if (eager.empty()) eager = losses;
    for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], eager[i], 1e-5 * eager[i]);
    const HFCheckpoint ck = load_hf_checkpoint(out / "epoch_0");
    EXPECT_EQ(ck.config.model_type, "qwen3");
    EXPECT_EQ(ck.config.head_dim, 24);
    const Tensor& qn = ck.tensors.at("model.layers.1.self_attn.q_norm.weight");
    ASSERT_EQ(qn.numel(), 24);
    double moved = 0;  // initialized to ones; trained away from them
    for (int64_t i = 0; i < qn.numel(); ++i) moved += std::fabs(qn.data<float>()[i] - 1.0f);
    EXPECT_GT(moved, 0.0);
  }
  EXPECT_LT(eager.back(), eager.front());
}

TEST(RecipeQwen3, LoraTrainsAndSavesItsAdapter) {
  const TempDir tmp;
  Overrides o = {{"output_dir", (tmp / "lora").string()}};
  const fs::path text = write_config(tmp, "lora_finetune_single_device", TinyModel::Lora, o);
  CliRun r = run_recipe(1, "lora_finetune_single_device", text, o, tmp / "io");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(tmp / "lora" / "epoch_0" / "adapter_model.safetensors"));
  const std::vector<double> lora = logged_values(tmp / "lora", "loss");
  ASSERT_EQ(lora.size(), 3u);
  EXPECT_TRUE(std::isfinite(lora.back()));
}

}  // namespace
