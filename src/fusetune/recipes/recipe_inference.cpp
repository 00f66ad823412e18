#include "fusetune/recipes/recipe_inference.h"

#include <set>
#include <vector>

#include "fusetune/config/builtin_configs.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

namespace {

// torchtune's recipes that fusetune has no recipe for yet, with the closest single-device
// recipe fusetune has ("" when none) and what it leaves out.
struct MissingRecipe {
  const char* name;
  const char* closest;
  const char* note;
};

const std::vector<MissingRecipe>& missing_recipes() {
  static const std::vector<MissingRecipe> t = {
      {"eleuther_eval", "eval",
       "i.e. `fusetune eval`, which scores perplexity and multiple-choice tasks, not "
       "lm-evaluation-harness's"},
      {"quantize", "", ""},
      {"dev/generate_v2", "generate", "i.e. `fusetune generate`"},
      {"dev/generate_v2_distributed", "generate", "i.e. `fusetune generate`, on one device"},
      {"dev/early_exit_finetune_distributed", "", ""},
  };
  return t;
}

bool registered(const std::string& name) {
  for (const auto& r : recipes())
    if (r.name == name) return true;
  return false;
}

std::string strip_py(std::string s) {
  if (s.size() > 3 && s.compare(s.size() - 3, 3, ".py") == 0) s.resize(s.size() - 3);
  return s;
}

// The leading comment block's lines, '#' and surrounding spaces removed. A commented-out
// command ("#   # tune run ...") loses both marks.
std::vector<std::string> header_comments(std::string_view text) {
  std::vector<std::string> out;
  for (const auto& raw : split(text, '\n')) {
    std::string line = trim(raw);
    if (line.empty()) continue;
    if (line[0] != '#') break;
    while (!line.empty() && line[0] == '#') line = trim(std::string_view(line).substr(1));
    out.push_back(line);
  }
  return out;
}

// Launcher options that take no value (torchrun's flags); every other option takes one
// unless written --key=value.
bool is_flag(const std::string& opt) {
  static const std::set<std::string> flags = {
      "--standalone", "--no-python", "--no_python", "--run-path",
      "--run_path",   "-m",          "--module",    "--ignore-distributed-errors"};
  return flags.count(opt) > 0;
}

std::string model_builder(const Config& cfg) {
  if (!cfg.has("model._component_")) return "";
  const YAML::Node n = cfg.node("model._component_");
  return n.IsScalar() ? n.as<std::string>() : "";
}

struct RunLine {
  std::string recipe;  // "" when the line is not a run line
  std::string config;  // its --config value, ".yaml" dropped ("" when none)
  bool fusetune = false;
};

std::string strip_yaml(std::string s) {
  if (s.size() > 5 && s.compare(s.size() - 5, 5, ".yaml") == 0) s.resize(s.size() - 5);
  return s;
}

// One comment line "tune run [options] RECIPE [--config CONFIG] ...".
RunLine parse_run_line(const std::string& line) {
  std::vector<std::string> words;
  for (const auto& w : split(line, ' '))
    if (!trim(w).empty()) words.push_back(trim(w));
  if (words.size() < 3 || (words[0] != "tune" && words[0] != "fusetune") || words[1] != "run")
    return {};
  size_t i = 2;
  while (i < words.size() && words[i][0] == '-') {
    const std::string& opt = words[i];
    if (opt == "--config" || opt == "-c") return {};
    i += (opt.find('=') != std::string::npos || is_flag(opt)) ? 1 : 2;
  }
  if (i >= words.size()) return {};
  RunLine r{strip_py(words[i]), "", words[0] == "fusetune"};
  for (size_t j = i + 1; j + 1 < words.size(); ++j)
    if (words[j] == "--config" || words[j] == "-c") r.config = strip_yaml(words[j + 1]);
  return r;
}

// The run line that launches this config: one whose --config names it (a config's header may
// also show the command that prepares it, e.g. a distillation teacher's fine-tune), else the
// last one (the launch command follows the preparation steps).
RunLine find_run_line(std::string_view yaml_text, const std::string& config_name) {
  const std::string self = strip_yaml(config_name);
  RunLine last;
  for (const std::string& line : header_comments(yaml_text)) {
    RunLine r = parse_run_line(line);
    if (r.recipe.empty()) continue;
    if (!self.empty() && !r.config.empty() &&
        (self == r.config ||
         (self.size() > r.config.size() &&
          self.compare(self.size() - r.config.size(), r.config.size(), r.config) == 0 &&
          self[self.size() - r.config.size() - 1] == '/')))
      return r;
    last = r;
  }
  return last;
}

}  // namespace

std::string tune_run_recipe(std::string_view yaml_text, const std::string& config_name) {
  return find_run_line(yaml_text, config_name).recipe;
}

std::string missing_torchtune_recipe(const std::string& raw, const std::string& origin) {
  const std::string name = strip_py(raw);
  if (registered(name) || (name.rfind("dev/", 0) == 0 && registered(name.substr(4)))) return "";
  std::string closest, note;
  bool known = false;
  for (const auto& r : missing_recipes())
    if (name == r.name) {
      known = true;
      closest = r.closest;
      note = r.note;
    }
  // Any other *_distributed recipe: its single-device counterpart, when fusetune has it.
  const std::string suffix = "_distributed";
  if (!known) {
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      return "";
    // torchtune's dev/ recipes (dev/grpo_full_finetune_distributed) are named without it here.
    const size_t from = name.rfind("dev/", 0) == 0 ? 4 : 0;
    const std::string single =
        name.substr(from, name.size() - suffix.size() - from) + "_single_device";
    if (registered(single)) {
      closest = single;
      note = "which trains on one device";
    }
  }
  std::string msg = "recipe '" + name + "'" + (origin.empty() ? "" : " (" + origin + ")") +
                    " is one of torchtune's recipes; fusetune has no such recipe yet";
  if (!closest.empty())
    msg += " (the closest is " + closest + (note.empty() ? "" : ", " + note) + "; pass --recipe " +
           closest + " to use it)";
  else
    msg += ", nor a single-device recipe close to it";
  return msg;
}

RecipeChoice infer_recipe(const std::string& explicit_recipe, std::string_view yaml_text,
                          const Config& cfg, const std::string& config_name) {
  if (!explicit_recipe.empty()) return {explicit_recipe, "given on the command line"};
  if (std::string r = recipe_comment(yaml_text); !r.empty())
    return {r, "from the config's `# recipe:` line"};
  if (RunLine r = find_run_line(yaml_text, config_name); !r.recipe.empty())
    return {r.recipe, r.fusetune ? "from the config's `fusetune run` line"
                                 : "from the config's `tune run` line"};
  const std::string builder = model_builder(cfg);
  const std::string leaf =
      builder.substr(builder.rfind('.') == std::string::npos ? 0 : builder.rfind('.') + 1);
  if (starts_with(leaf, "lora_") || starts_with(leaf, "qlora_"))
    return {"lora_finetune_single_device", "from the model component " + builder};
  if (!builder.empty())
    return {"full_finetune_single_device", "from the model component " + builder};
  if (cfg.has("model.lora_attn_modules") || cfg.has("model.lora_rank"))
    return {"lora_finetune_single_device", "from the model's LoRA keys"};
  return {"full_finetune_single_device", "the default: the config names no recipe"};
}

const RecipeInfo& chosen_recipe(const RecipeChoice& choice) {
  if (std::string msg = missing_torchtune_recipe(choice.name, choice.reason); !msg.empty())
    throw Error(msg);
  try {
    return find_recipe(choice.name);
  } catch (const Error& e) {
    if (choice.reason == "given on the command line") throw;
    throw Error(std::string(e.what()) + " (the recipe name came " + choice.reason +
                "; pass --recipe NAME to choose)");
  }
}

std::string describe(const RecipeChoice& choice) {
  return "recipe " + strip_py(choice.name) + " (" + choice.reason + ")";
}

}  // namespace fusetune
