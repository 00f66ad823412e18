#include "fusetune/recipes/recipe_state.h"

#include <nlohmann/json.hpp>

#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"

namespace fusetune {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "fusetune.recipe_state.v1";  // what resumes look for

void write_recipe_state(const fs::path& dir, const RecipeState& s) {
  NamedTensors tensors;
  if (s.optimizer) s.optimizer->save_state(tensors);
  for (auto& [name, t] : tensors) name = "optimizer." + name;
  for (const auto& named : s.extra) tensors.push_back(named);
  save_safetensors(dir / "recipe_state.safetensors", tensors);

  nlohmann::json j;
  j["format"] = kFormat;
  j["epoch"] = s.progress.epoch;
  j["step_in_epoch"] = s.progress.step_in_epoch;
  j["global_step"] = s.progress.global_step;
  j["loader_epoch"] = s.progress.loader.epoch;
  j["loader_index"] = s.progress.loader.index;
  j["seed"] = s.progress.seed;
  j["optimizer"] = s.optimizer ? s.optimizer->name() : "";
  j["master_weights"] = s.master_weights;
  if (s.adapter) j["adapter"] = true;
  write_file_atomic(dir / "recipe_state.json", j.dump(2) + "\n");
}

bool replaceable(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;
  return fs::is_empty(dir, ec) || fs::exists(dir / "config.json", ec) ||
         fs::exists(dir / "adapter_config.json", ec) || fs::exists(dir / "recipe_state.json", ec);
}

}  // namespace

void publish_checkpoint(const fs::path& dir,
                        const std::function<void(const fs::path&)>& write_model,
                        const RecipeState& state) {
  // Only ever replace a checkpoint (a directory we would otherwise wipe may be the user's).
  FT_CHECK(replaceable(dir),
           "refusing to replace '" + dir.string() + "': it is not a checkpoint directory");
  AtomicDirectory staging(dir);
  write_model(staging.path());
  write_recipe_state(staging.path(), state);
  staging.commit();
}

std::optional<TrainingProgress> read_recipe_progress(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "recipe_state.json", ec)) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(read_file(dir / "recipe_state.json"), nullptr, false);
  FT_CHECK(!j.is_discarded() && j.is_object() && j.value("format", "") == kFormat,
           (dir / "recipe_state.json").string() +
               " is damaged: not a fusetune.recipe_state.v1 JSON object");
  TrainingProgress p;
  p.epoch = j.at("epoch").get<int64_t>();
  p.step_in_epoch = j.at("step_in_epoch").get<int64_t>();
  p.global_step = j.at("global_step").get<int64_t>();
  p.loader.epoch = j.at("loader_epoch").get<int64_t>();
  p.loader.index = j.at("loader_index").get<int64_t>();
  p.seed = j.at("seed").get<uint64_t>();
  return p;
}

}  // namespace fusetune
