#pragma once
// Small whole runs for the resume and guard tests: a tiny model's config (SFT on the demo
// corpus or DPO on generated pairs), a run with one process or N MPI ranks, and a checkpoint's
// tensor files read back for bitwise comparisons.
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_llama.h"

namespace fusetune::testing {

// `a` with `b`'s keys added or replaced.
inline Overrides with_keys(Overrides a, const Overrides& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

// What a tiny run trains on: text (the demo corpus, packed) or preference pairs.
enum class TinyData { Text, Pairs };

// 48 preference pairs whose answers differ in length.
inline std::filesystem::path write_tiny_pairs(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 48; ++i)
    rows.push_back({{"prompt", "Name a color " + std::to_string(i) + "."},
                    {"chosen", (i % 2 ? "Blue, like the sky " : "Green ") +
                                   std::string(size_t(i * 7 % 23), char('a' + i % 26))},
                    {"rejected", (i % 3 ? "I will not " : "Seven is a number ") +
                                     std::string(size_t(i * 5 % 17), 'z')}});
  const std::filesystem::path p = dir / "pairs.json";
  write_text(p, rows.dump());
  return p;
}

// The tiny Llama of these runs (byte vocabulary; width 64 so that NF4 and 32-wide quantization
// groups divide every projection).
inline const char* kTinyLlamaYaml =
    "  model_type: llama\n  vocab_size: 259\n  hidden_size: 64\n  intermediate_size: 128\n"
    "  num_hidden_layers: 2\n  num_attention_heads: 4\n  num_key_value_heads: 2\n"
    "  max_position_embeddings: 128\n";

// A random checkpoint of that model (width 64), for recipes that start from one (full DPO's
// policy and reference): write_tiny_checkpoint(dir, 64, 128) (tiny_llama.h).

// A config of the tiny model: random weights (or `checkpoint`'s, as policy and reference),
// the byte tokenizer, AdamW with warmup and clipping, one thread, every step logged, no
// checkpoints; keys beyond these come as overrides.
inline std::string tiny_run_yaml(TinyData data, const std::filesystem::path& source,
                                 const std::filesystem::path& checkpoint = {}) {
  std::ostringstream s;
  s << "output_dir: /tmp/unused\nmodel:\n";
  if (checkpoint.empty())
    s << "  init: random\n" << kTinyLlamaYaml;
  else
    s << "  init: checkpoint\ncheckpointer:\n  checkpoint_dir: " << checkpoint.string()
      << "\n  checkpoint_files: [model.safetensors]\nref_checkpointer:\n  checkpoint_dir: "
      << checkpoint.string() << "\n  checkpoint_files: [model.safetensors]\n";
  if (data == TinyData::Text)
    s << "tokenizer:\n  _component_: byte\n  max_seq_len: 32\n"
      << "dataset:\n  _component_: text_completion\n  source: " << source.string()
      << "\n  packed: true\n";
  else
    s << "tokenizer:\n  _component_: byte\n  max_seq_len: 64\n"
      << "dataset:\n  _component_: preference\n  source: " << source.string() << "\n"
      << "loss:\n  _component_: DPOLoss\n  beta: 0.1\n";
  s << "seed: 7\nshuffle: true\nbatch_size: 2\nepochs: 1\n"
    << "optimizer:\n  _component_: AdamW\n  lr: 1e-2\n"
    << "lr_scheduler:\n  _component_: cosine_with_warmup\n  num_warmup_steps: 1\n"
    << "clip_grad_norm: 1.0\ncompile: false\nnum_threads: 1\nlog_every_n_steps: 1\n"
    << "log_peak_memory_stats: false\n";
  return s.str();
}

// `fusetune run RECIPE` with one process (ranks 1) or under mpirun with `ranks` ranks;
// `env` (VAR=value ...) is set for the run (and exported to the ranks).
inline CliRun run_recipe(int ranks, const std::string& recipe, const std::filesystem::path& config,
                         const Overrides& o, const std::filesystem::path& scratch,
                         const std::string& env = "", const std::string& mpirun_options = "") {
  std::string options = mpirun_options;
  if (!env.empty()) {
    std::istringstream vars(env);
    for (std::string v; vars >> v;) options += " -x " + v.substr(0, v.find('='));
  }
  const std::string cmd = ranks == 1 ? run_command(recipe, config.string(), o)
                                     : mpirun_command(ranks, recipe, config.string(), o, options);
  return run_shell((env.empty() ? "" : env + " ") + cmd, scratch);
}

// The *.safetensors files of a checkpoint directory (weights, adapters, optimizer state), by
// name, with their bytes.
inline std::map<std::string, std::string> tensor_files(const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors")
      files[e.path().filename().string()] = read_text(e.path());
  return files;
}

// Checks that checkpoints `got` and `want` hold the same tensor files, bit for bit.
inline void expect_same_tensor_files(const std::filesystem::path& got,
                                     const std::filesystem::path& want, const std::string& what) {
  const auto a = tensor_files(got), b = tensor_files(want);
  ASSERT_FALSE(b.empty()) << what << ": no tensor files in " << want;
  std::vector<std::string> names_a, names_b;
  for (const auto& [n, bytes] : a) names_a.push_back(n);
  for (const auto& [n, bytes] : b) names_b.push_back(n);
  ASSERT_EQ(names_a, names_b) << what;
  for (const auto& [n, bytes] : b)
    EXPECT_TRUE(a.at(n) == bytes) << what << ": " << n << " differs from " << (want / n);
}

}  // namespace fusetune::testing
