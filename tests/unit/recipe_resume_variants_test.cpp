// Resume is bitwise for LoRA and QLoRA (with a cosine schedule, lora_dropout > 0 and gradient
// accumulation: the dropout masks, the schedule and the data order must all continue where
// they stopped) and for compiled full fine-tuning. A run with step checkpoints goes to the
// end; a second run starts from a copy of one mid-run checkpoint and must log the same losses
// for every later step, bit for bit.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/cli/command.h"
#include "fusetune/util/fs.h"
#include "metrics_log.h"
#include "test_support.h"
#include "tiny_llama.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

std::string variants_yaml(const fs::path& out, bool lora) {
  std::ostringstream s;
  s << "output_dir: " << out.string() << "\n" << tiny_model_yaml(64);
  if (lora)
    s << "  lora_attn_modules: [q_proj, v_proj, output_proj]\n  apply_lora_to_mlp: true\n"
      << "  lora_rank: 4\n  lora_alpha: 8\n  lora_dropout: 0.1\n";
  s << "tokenizer:\n  _component_: byte\n  max_seq_len: 32\n"
    << "dataset:\n  _component_: text_completion\n  source: " << source_dir()
    << "/configs/demo/demo_corpus.txt\n  packed: true\n"
    << "seed: 5\nshuffle: true\nbatch_size: 2\nepochs: 2\nmax_steps_per_epoch: 5\n"
    << "gradient_accumulation_steps: 2\nsave_every_n_steps: 3\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n"
    << "lr_scheduler:\n  _component_: cosine_with_warmup\n  num_warmup_steps: 2\n"
    << "clip_grad_norm: 1.0\nnum_threads: 1\nlog_every_n_steps: 1\nlog_peak_memory_stats: false\n";
  return s.str();
}

// Runs the whole thing, then resumes a copy of `from` (a step checkpoint) and compares.
void check_resume(const std::string& recipe, bool lora, std::vector<std::string> extra,
                  const std::string& from) {
  TempDir tmp;
  write_file_atomic(tmp / "cfg.yaml", variants_yaml(tmp / "full", lora));
  std::vector<std::string> args = {recipe, "--config", (tmp / "cfg.yaml").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  ASSERT_EQ(cli::cmd_run(args), 0);
  const auto whole = logged_step_values(tmp / "full", "loss");
  ASSERT_EQ(whole.size(), 10u);

  fs::create_directories(tmp / "resumed");
  fs::copy(tmp / "full" / from, tmp / "resumed" / from, fs::copy_options::recursive);
  args.push_back("output_dir=" + (tmp / "resumed").string());
  args.push_back("resume_from_checkpoint=true");
  ASSERT_EQ(cli::cmd_run(args), 0);
  const auto resumed = logged_step_values(tmp / "resumed", "loss");
  const int64_t start = std::stoll(from.substr(from.find('_') + 1));
  ASSERT_EQ(int64_t(resumed.size()), int64_t(whole.size()) - start);
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].first, whole[size_t(start) + i].first);
    EXPECT_EQ(resumed[i].second, whole[size_t(start) + i].second)
        << recipe << " step " << resumed[i].first;
  }
}

}  // namespace

TEST(ResumeVariants, LoraWithDropoutScheduleAndAccumulationResumesBitwise) {
  check_resume("lora_finetune_single_device", true, {}, "step_3");
}

TEST(ResumeVariants, QloraResumesBitwise) {
  check_resume("lora_finetune_single_device", true,
               {"model.quantize_base=true", "model.hidden_size=64", "model.intermediate_size=128",
                "compile=true"},
               "step_6");
}

TEST(ResumeVariants, CompiledFullFineTuningResumesBitwise) {
  check_resume("full_finetune_single_device", false, {"compile=true"}, "step_3");
}
