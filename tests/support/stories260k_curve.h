#pragma once
// The stories260K fine-tune that the conformance curve tests compare (8-bit AdamW against
// AdamW, bf16 against fp32): the real checkpoint and tokenizer, TinyStories text, batch
// 4 x 128, lr 2e-3 with a cosine schedule and 10 warmup steps, clip 1.0, compile true, one
// thread, every step logged.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "recipe_runs.h"
#include "test_support.h"

namespace fusetune::testing {

// `optimizer`: the optimizer section's component line ("  _component_: AdamW\n"); `extra`:
// more top-level keys ("dtype: bf16\n").
inline std::string stories260k_curve_config(const std::filesystem::path& out, int64_t steps,
                                            const std::string& optimizer,
                                            const std::string& extra = "") {
  const std::filesystem::path a = assets_dir();
  return "output_dir: " + out.string() + "\nmodel:\n  init: checkpoint\ncheckpointer:\n" +
         "  checkpoint_dir: " + (a / "stories260K").string() +
         "\ntokenizer:\n  _component_: hf\n  path: " +
         (a / "stories260K" / "tokenizer.json").string() +
         "\n  max_seq_len: 128\ndataset:\n  _component_: text_completion\n  source: " +
         (a / "datasets" / "tinystories_197k.txt").string() +
         "\n  packed: false\nseed: 3\nshuffle: true\nbatch_size: 4\nepochs: 1\n"
         "max_steps_per_epoch: " +
         std::to_string(steps) + "\noptimizer:\n" + optimizer +
         "  lr: 2e-3\n  weight_decay: 0.01\n"
         "lr_scheduler:\n  _component_: cosine_with_warmup\n  num_warmup_steps: 10\n"
         "clip_grad_norm: 1.0\ncompile: true\nnum_threads: 1\nlog_every_n_steps: 1\n"
         "log_peak_memory_stats: false\n" +
         extra;
}

// Runs that config as `name` under `tmp` (full_finetune_single_device) and returns the
// logged losses.
inline std::vector<double> train_stories260k_curve(const TempDir& tmp, const std::string& name,
                                                   int64_t steps, const std::string& optimizer,
                                                   const std::string& extra = "") {
  const std::filesystem::path yaml = tmp / (name + ".yaml");
  write_text(yaml, stories260k_curve_config(tmp / name, steps, optimizer, extra));
  CliRun r = run_shell(run_command("full_finetune_single_device", yaml.string(), {}),
                       tmp / (name + "_io"));
  EXPECT_EQ(r.code, 0) << r.err;
  return losses_of(logged_steps(tmp / name));
}

}  // namespace fusetune::testing
