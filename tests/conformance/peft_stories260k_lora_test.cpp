// LoRA on a real pretrained model: stories260K (TinyStories) fine-tuned on Alpaca answers
// (a new domain) with the lora recipe, trained on train[:90%]; the merged checkpoint it
// saves must have a lower loss than the base on the held-out train[90%:].
#include <gtest/gtest.h>

#include <sstream>

#include "engine_lookups.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/config.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/fs.h"
#include "test_support.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

std::string yaml(const fs::path& assets, const fs::path& out, const std::string& split) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n"
    << "model:\n  init: checkpoint\n  lora_attn_modules: [q_proj, k_proj, v_proj, output_proj]\n"
    << "  apply_lora_to_mlp: true\n  lora_rank: 8\n  lora_alpha: 16\n"
    << "tokenizer:\n  _component_: hf\n  path: " << (assets / "stories260K/tokenizer.json").string()
    << "\n  max_seq_len: 64\n"
    << "checkpointer:\n  _component_: FullModelHFCheckpointer\n  checkpoint_dir: "
    << (assets / "stories260K").string() << "\n"
    << "  checkpoint_files: [model.safetensors]\n  output_dir: " << out.string()
    << "\n  model_type: LLAMA2\n"
    << "dataset:\n  _component_: text_completion\n  source: "
    << (assets / "datasets/alpaca_en_demo.json").string() << "\n"
    << "  column: output\n  split: \"" << split << "\"\n  packed: true\n"
    << "seed: 1\nshuffle: true\nbatch_size: 4\nepochs: 1\nmax_steps_per_epoch: 15\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 3e-3\n  weight_decay: 0.0\n"
    << "loss:\n  _component_: cross_entropy\nclip_grad_norm: 1.0\ncompile: true\ndevice: "
       "cpu\ndtype: fp32\n"
    << "save_adapter_weights_only: false\nlog_every_n_steps: 5\n";
  return s.str();
}

// Mean per-token loss of `params` over the first `batches` batches of the config's dataset.
double eval_loss(const Config& cfg, const ModelConfig& model, const TensorMap& params,
                 int batches) {
  auto tok = build_tokenizer(cfg);
  auto ds = build_dataset_from_config(cfg, *tok, model);
  LoaderOptions lo = loader_options_from(cfg, *tok);
  lo.shuffle = false;
  DataLoader loader(*ds, lo);
  double nll = 0, tokens = 0;
  for (int i = 0; i < batches && i < loader.steps_per_epoch(); ++i) {
    Batch b = loader.next();
    TrainingGraphOptions o;
    o.batch_size = b.batch_size;
    o.seq_len = b.seq_len;
    o.packed = !b.doc_ids.empty();
    o.trainable = [](const std::string&) { return false; };
    TrainingGraph tg = build_training_graph(model, o);
    TensorMap in;
    auto ids = [&](const std::vector<int32_t>& v) {
      Tensor t = Tensor::empty({b.batch_size, b.seq_len}, DType::I32);
      std::copy(v.begin(), v.end(), t.data<int32_t>());
      return t;
    };
    in["tokens"] = ids(b.tokens);
    in["labels"] = ids(b.labels);
    in["positions"] = ids(b.positions);
    if (!b.doc_ids.empty()) in["doc_ids"] = ids(b.doc_ids);
    Tensor one = Tensor::empty({}, DType::F32);
    one.data<float>()[0] = 1.0f;
    in["loss_scale"] = one;
    nll += element_as_double(EagerExecutor(tg.graph).run(in, params)[0], 0);
    tokens += double(b.num_valid_labels());
  }
  return nll / tokens;
}

}  // namespace

TEST(Stories260KLora, FineTuneLowersHeldOutLoss) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/alpaca_en_demo.json");
  const fs::path assets = assets_dir();
  TempDir tmp;
  const fs::path out = tmp / "run";
  write_file_atomic(tmp / "train.yaml", yaml(assets, out, "train[:90%]"));
  ASSERT_EQ(
      cli::cmd_run({"lora_finetune_single_device", "--config", (tmp / "train.yaml").string()}), 0);
  ASSERT_TRUE(fs::exists(out / "epoch_0" / "adapter_model.safetensors"));

  const Config eval = Config::from_string(yaml(assets, out, "train[90%:]"), "eval.yaml");
  HFCheckpoint base = load_hf_checkpoint(assets / "stories260K");
  const double before =
      eval_loss(eval, base.config, load_checkpoint_params(assets / "stories260K"), 6);
  const double after = eval_loss(eval, base.config, load_checkpoint_params(out / "epoch_0"), 6);
  std::printf("held-out loss (train[90%%:], 6 batches): base %.4f -> LoRA merged %.4f\n", before,
              after);
  EXPECT_LT(after, before - 0.05);
}
