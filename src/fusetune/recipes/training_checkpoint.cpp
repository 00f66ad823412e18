#include "fusetune/recipes/training_checkpoint.h"

#include <algorithm>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"

namespace fusetune {

namespace fs = std::filesystem;

void save_training_checkpoint(const fs::path& dir, const CheckpointContent& c) {
  NamedTensors model;
  for (const auto& [name, shape] : expected_parameters(*c.config)) {
    auto it = c.params->find(name);
    FT_CHECK(it != c.params->end(),
             "checkpoint: parameter '" + name + "' is missing from the model");
    model.push_back({name, it->second});
  }
  SaveOptions so;
  so.dtype = c.save_dtype;
  so.max_shard_bytes = c.max_shard_bytes;
  so.copy_files_from = c.copy_files_from;
  RecipeState state;
  state.progress = c.progress;
  state.optimizer = c.optimizer;
  // Weights the HF files rounded (an fp32 run saved as bf16): keep them exactly, to resume.
  for (const auto& [name, t] : model)
    if (t.dtype() != c.save_dtype) {
      state.extra.push_back({"master." + name, t});
      state.master_weights = true;
    }
  publish_checkpoint(
      dir, [&](const fs::path& staging) { save_hf_checkpoint(staging, *c.config, model, so); },
      state);
}

namespace {

// epoch_<n> or step_<n> exactly: not the `.tmp-*` staging or `.old-*` leftovers of a save.
bool is_checkpoint_name(const std::string& name) {
  std::string digits;
  if (name.rfind("epoch_", 0) == 0)
    digits = name.substr(6);
  else if (name.rfind("step_", 0) == 0)
    digits = name.substr(5);
  return !digits.empty() &&
         std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::optional<TrainingProgress> read_progress(const fs::path& dir) {
  return read_recipe_progress(dir);
}

}  // namespace

std::optional<fs::path> latest_resumable_checkpoint(const fs::path& output_dir,
                                                    std::vector<std::string>* damaged) {
  std::optional<fs::path> best;
  int64_t best_step = -1;
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return best;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !is_checkpoint_name(name)) continue;
    try {
      auto p = read_progress(entry.path());
      if (p && p->global_step > best_step) {
        best_step = p->global_step;
        best = entry.path();
      }
    } catch (const std::exception& e) {
      // A damaged state file makes that directory non-resumable; older ones still are.
      if (damaged) damaged->push_back(entry.path().string() + ": " + e.what());
    }
  }
  return best;
}

std::vector<fs::path> prune_checkpoints(const fs::path& output_dir, const fs::path& just_saved,
                                        int64_t keep_last_n) {
  FT_CHECK(keep_last_n >= 1, "checkpointer.keep_last_n_checkpoints must be >= 1, got " +
                                 std::to_string(keep_last_n) +
                                 " (removing every checkpoint would leave nothing to resume)");
  std::vector<fs::path> removed;
  try {  // only once the new checkpoint is complete
    if (!read_progress(just_saved)) return removed;
  } catch (const std::exception&) {
    return removed;
  }
  struct Entry {
    int64_t step;
    bool saved;
    fs::path path;
  };
  std::vector<Entry> all;
  std::error_code ec;
  const fs::path saved = fs::weakly_canonical(just_saved, ec);
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    if (!entry.is_directory() || !is_checkpoint_name(entry.path().filename().string())) continue;
    try {
      auto p = read_progress(entry.path());
      if (!p) continue;  // not resumable: not ours to judge
      std::error_code ec2;
      all.push_back(
          {p->global_step, fs::weakly_canonical(entry.path(), ec2) == saved, entry.path()});
    } catch (const std::exception&) {
      continue;  // damaged: left alone
    }
  }
  // Newest first (the first is what a resume picks); the just-saved one first among equals.
  std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
    if (a.step != b.step) return a.step > b.step;
    if (a.saved != b.saved) return a.saved;
    return a.path.filename().string() > b.path.filename().string();
  });
  for (size_t i = size_t(keep_last_n); i < all.size(); ++i) {
    if (all[i].saved) continue;
    const fs::path aside = unique_sibling(all[i].path, ".removing");
    fs::rename(all[i].path, aside, ec);
    FT_CHECK(!ec, "keep_last_n_checkpoints: cannot remove " + all[i].path.string() + ": " +
                      ec.message());
    fs::remove_all(aside, ec);
    FT_CHECK(!ec, "keep_last_n_checkpoints: cannot remove " + aside.string() + ": " + ec.message());
    removed.push_back(all[i].path);
  }
  return removed;
}

ResumedState load_training_checkpoint(const fs::path& dir, DType dtype) {
  auto progress = read_progress(dir);
  FT_CHECK(progress,
           "cannot resume from " + dir.string() + ": recipe_state.json is missing or unreadable");
  ResumedState r;
  r.progress = *progress;
  HFCheckpoint ck = load_hf_checkpoint_owned(dir, {}, dtype);  // owned: trained in place
  for (auto& [name, t] : ck.tensors) r.params[name] = std::move(t);
  SafetensorsFile st = SafetensorsFile::open(dir / "recipe_state.safetensors");
  for (const std::string& name : st.names()) {
    if (name.rfind("optimizer.", 0) == 0)
      r.optimizer[name.substr(10)] = st.tensor(name).clone();
    else if (name.rfind("master.", 0) == 0)
      r.params[name.substr(7)] = st.tensor(name).to(dtype);
  }
  return r;
}

}  // namespace fusetune
