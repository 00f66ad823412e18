#pragma once
// The components a config can select with `_component_`, per map ("optimizer", "dataset",
// ...), with torchtune's names as aliases so that torchtune configs can be pasted. Recipes
// read the choice with canonical_component(cfg, "optimizer") and compare it to the names
// here.
#include <string>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/config/schema.h"

namespace fusetune {

struct ComponentTable {
  std::string section;                // the config key: "optimizer"
  std::vector<Component> components;  // the first name is fusetune's spelling
  std::string default_component;      // when `_component_` is absent ("" = required)
};

// The table for a map key (the last part of a dotted key), or nullptr. Sections:
//   optimizer      AdamW | AdamW8bit | PagedAdamW8bit | PagedAdamW | SGD
//   lr_scheduler   cosine_with_warmup | linear_with_warmup | constant        (default constant)
//   loss           cross_entropy (default) | DPOLoss | RSOLoss | IPOLoss | SimPOLoss | ORPOLoss |
//   KTOLoss | GRPOSimpleLoss | GRPOLoss
//                  | PPOLoss
//   checkpointer   FullModelHFCheckpointer                                   (default)
//   ref_checkpointer  the same (full_dpo_single_device's reference model)
//   teacher_checkpointer  the same (knowledge distillation's teacher)
//   ref_policy_checkpointer, value_checkpointer, reward_checkpointer  the same (PPO's models)
//   kd_loss        ForwardKLLoss (default) | ReverseKLLoss | GeneralizedJSDLoss
//   tokenizer      byte | hf | llama3 | qwen2_5 | qwen2 | qwen3 | sentencepiece
//   dataset        text_completion | pretokenized | alpaca | instruct | chat | preference | gsm8k
//   dataset_val    the same, for validation during training
//   metric_logger  stdout | disk | jsonl | tensorboard                       (default stdout)
const ComponentTable* component_table(const std::string& section);
const std::vector<ComponentTable>& component_tables();

// Why `value` is refused for `section`'s _component_ although another tool uses the name for
// something close to a component here ("" for any other name): TRL's loss_type `ipo` is not
// IPOLoss.
std::string not_an_alias(const std::string& section, const std::string& value);

// A schema Field for `section` built from its table (common keys + one set per component).
Field component_section(const std::string& section, std::vector<Field> common = {});

// The checkpoint files a checkpointer map names, in order: a list as written, or torchtune's
// form {filename_format: "model-{}-of-{}.safetensors", max_filename: "00004"} expanded to
// model-00001-of-00004.safetensors ... model-00004-of-00004.safetensors. Empty when absent.
std::vector<std::string> checkpoint_file_list(const Config& checkpointer);

}  // namespace fusetune
