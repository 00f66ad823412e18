#include "fusetune/data/hub_datasets.h"

#include <cctype>
#include <filesystem>

#include <yaml-cpp/yaml.h>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

const std::vector<DatasetBuilder>& dataset_builders() {
  static const std::vector<DatasetBuilder> t = {
      {"alpaca_dataset", "tatsu-lab/alpaca", "alpaca", {}, {}, "instruction, input, output"},
      {"alpaca_cleaned_dataset",
       "yahma/alpaca-cleaned",
       "alpaca",
       {},
       {},
       "instruction, input, output"},
      {"slimorca_dataset",
       "Open-Orca/SlimOrca-Dedup",
       "chat",
       {},
       {{"conversation_column", "conversations"}, {"conversation_style", "sharegpt"}},
       "conversations: [{from, value}, ...] (ShareGPT)"},
      {"samsum_dataset",
       "Samsung/samsum",
       "instruct",
       {{"input", "dialogue"}, {"output", "summary"}},
       {},
       "dialogue, summary"},
      {"grammar_dataset",
       "liweili/c4_200m",
       "instruct",
       {{"input", "input"}, {"output", "output"}},
       {},
       "input, output"},
      {"wikitext_dataset",
       "EleutherAI/wikitext_document_level",
       "text_completion",
       {},
       {{"column", "page"}},
       "page (text)"},
      {"cnn_dailymail_articles_dataset",
       "abisee/cnn_dailymail",
       "text_completion",
       {},
       {{"column", "article"}},
       "article (text)"},
      {"stack_exchange_paired_dataset",
       "lvwerra/stack-exchange-paired",
       "preference",
       {{"prompt", "question"}, {"chosen", "response_j"}, {"rejected", "response_k"}},
       {},
       "question, response_j (chosen), response_k (rejected)"},
      {"hh_rlhf_helpful_dataset",
       "RLHFlow/HH-RLHF-Helpful-Standard",
       "preference",
       {{"chosen", "chosen"}, {"rejected", "rejected"}},
       {{"conversation_style", "openai"}},
       "chosen, rejected: [{role, content}, ...] each"},
      {"instruct_dataset", "", "instruct", {}, {}, "input, output (column_map renames)"},
      {"chat_dataset", "", "chat", {}, {}, "a list of turns (conversation_column)"},
      {"text_completion_dataset", "", "text_completion", {}, {}, "text (column)"},
      {"preference_dataset", "", "preference", {}, {}, "chosen, rejected (and prompt)"},
  };
  return t;
}

const DatasetBuilder* find_dataset_builder(const std::string& component) {
  std::string name = component;
  const std::string prefix = "torchtune.datasets.";
  if (starts_with(name, prefix)) name = name.substr(prefix.size());
  for (const auto& b : dataset_builders())
    if (b.name == name) return &b;
  return nullptr;
}

std::string supported_dataset_formats() {
  return "fusetune reads a .json file (an array of rows, or JSON lines), .jsonl (JSON lines) "
         "and, for text datasets, .txt; Parquet, CSV and Arrow files are not read (convert "
         "them to JSON lines, e.g. with datasets' Dataset.to_json)";
}

bool looks_like_hub_dataset(const std::string& source) {
  const size_t slash = source.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= source.size()) return false;
  if (source.find('/', slash + 1) != std::string::npos) return false;  // a deeper path
  if (source[0] == '.' || source[0] == '~') return false;
  for (char c : source)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '/'))
      return false;
  const std::string ext = std::filesystem::path(source).extension().string();
  if (ext == ".json" || ext == ".jsonl" || ext == ".txt" || ext == ".parquet" || ext == ".csv" ||
      ext == ".arrow")
    return false;
  std::error_code ec;
  return !std::filesystem::exists(source, ec);
}

namespace {

[[noreturn]] void hub_error(const std::string& section, const std::string& component,
                            const std::string& hub, bool named_in_source) {
  const std::string example = "python -c \"import datasets; datasets.load_dataset('" + hub +
                              "', split='train').to_json('copy.json')\"";
  throw Error(
      section + "." + (named_in_source ? "source '" + hub + "'" : "_component_ " + component) +
      (named_in_source ? " is" : " reads") + " the Hugging Face Hub dataset " + hub +
      ", and fusetune does not download datasets: download it (for example `" + example +
      "`) and set " + section + ".source=/path/to/local/copy.json. " + supported_dataset_formats());
}

}  // namespace

void apply_dataset_builder(Config& cfg, const std::string& section) {
  if (!cfg.is_map(section) || !cfg.has(section + "._component_")) return;
  const YAML::Node comp_node = cfg.node(section + "._component_");
  if (!comp_node.IsScalar()) return;
  const std::string component = comp_node.as<std::string>();
  const DatasetBuilder* b = find_dataset_builder(component);
  if (!b) return;
  Config d = cfg.sub(section);
  // torchtune's loader-name form (source: json, data_files: ...) reads local files.
  if (!d.has("data_files")) {
    const YAML::Node src = d.has("source") ? d.node("source") : YAML::Node();
    const std::string source = src.IsDefined() && src.IsScalar() ? src.as<std::string>() : "";
    if (source.empty() && !b->hub_source.empty())
      hub_error(section, component, b->hub_source, false);
    if (!source.empty() && looks_like_hub_dataset(source))
      hub_error(section, component, source, true);
  }
  if (b->hub_source.empty()) return;  // the generic builders are aliases of their kind
  cfg.set(section + "._component_", YAML::Node(b->kind));
  if (!b->column_map.empty() && !d.has("column_map")) {
    YAML::Node m(YAML::NodeType::Map);
    for (const auto& [ours, theirs] : b->column_map) m[ours] = theirs;
    cfg.set(section + ".column_map", m);
  }
  for (const auto& [key, value] : b->options)
    if (!d.has(key)) cfg.set(section + "." + key, YAML::Node(value));
}

void apply_dataset_builders(Config& cfg) {
  for (const char* section : {"dataset", "dataset_val"}) apply_dataset_builder(cfg, section);
}

}  // namespace fusetune
