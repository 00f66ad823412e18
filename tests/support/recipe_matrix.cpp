#include "recipe_matrix.h"

#include "metrics_log.h"
#include "test_paths.h"

namespace fusetune::testing {

const Overrides kTinyLoraKeys = {{"model.lora_attn_modules", "[q_proj,v_proj]"},
                                 {"model.apply_lora_to_mlp", "true"},
                                 {"model.lora_rank", "8"},
                                 {"model.lora_alpha", "16"},
                                 {"model.lora_dropout", "0.1"}};
const Overrides kTinyQatKeys = {{"quantizer._component_", "Int8DynActInt4WeightQATQuantizer"},
                                {"quantizer.groupsize", "32"},
                                {"fake_quant_after_n_steps", "1"}};

namespace {
const Overrides kFp32 = {{"dtype", "fp32"}}, kBf16 = {{"dtype", "bf16"}};
const Overrides& kQat = kTinyQatKeys;
}  // namespace

const std::vector<RecipeCase>& recipe_matrix() {
  using D = TinyData;
  using Model = TinyModel;
  static const std::vector<RecipeCase> all = {
      // One process.
      {"full_fp32", "full_finetune_single_device", 1, D::Text, Model::Full, kFp32},
      {"full_bf16", "full_finetune_single_device", 1, D::Text, Model::Full, kBf16},
      {"full_bf16_bf16state", "full_finetune_single_device", 1, D::Text, Model::Full,
       with_keys(kBf16, {{"optimizer.state_dtype", "bf16"}})},
      {"lora_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora, kFp32},
      {"lora_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora, kBf16},
      {"lora_bf16_bf16state", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"optimizer.state_dtype", "bf16"}})},
      {"dora_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, {{"model.use_dora", "true"}})},
      {"dora_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"model.use_dora", "true"}})},
      {"qlora_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, {{"model.quantize_base", "true"}})},
      {"qlora_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"model.quantize_base", "true"}})},
      {"lora_adapter_only_fp32", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, {{"save_adapter_weights_only", "true"}})},
      {"lora_adapter_only_bf16", "lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, {{"save_adapter_weights_only", "true"}})},
      {"lora_dpo_fp32", "lora_dpo_single_device", 1, D::Pairs, Model::Lora, kFp32},
      {"lora_dpo_bf16", "lora_dpo_single_device", 1, D::Pairs, Model::Lora, kBf16},
      {"full_dpo_fp32", "full_dpo_single_device", 1, D::Pairs, Model::FromCheckpoint, kFp32},
      {"full_dpo_bf16", "full_dpo_single_device", 1, D::Pairs, Model::FromCheckpoint, kBf16},
      {"qat_fp32", "qat_single_device", 1, D::Text, Model::Full, with_keys(kFp32, kQat)},
      {"qat_bf16", "qat_single_device", 1, D::Text, Model::Full, with_keys(kBf16, kQat)},
      {"qat_lora_fp32", "qat_lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kFp32, kQat)},
      {"qat_lora_bf16", "qat_lora_finetune_single_device", 1, D::Text, Model::Lora,
       with_keys(kBf16, kQat)},
      // 2 ranks: fp32 over the ZeRO stages, bf16 at 0/1.
      {"full_dist_fp32_zero3", "full_finetune_distributed", 2, D::Text, Model::Full,
       with_keys(kFp32, {{"zero_stage", "3"}})},
      {"full_dist_bf16_zero1", "full_finetune_distributed", 2, D::Text, Model::Full,
       with_keys(kBf16, {{"zero_stage", "1"}})},
      {"lora_dist_fp32_zero2", "lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(kFp32, {{"zero_stage", "2"}})},
      {"lora_dist_bf16_zero1", "lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(kBf16, {{"zero_stage", "1"}})},
      {"qlora_dist_bf16_zero0", "lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(kBf16, {{"zero_stage", "0"}, {"model.quantize_base", "true"}})},
      {"qat_dist_fp32_zero1", "qat_distributed", 2, D::Text, Model::Full,
       with_keys(with_keys(kFp32, kQat), {{"zero_stage", "1"}})},
      {"qat_dist_bf16_zero0", "qat_distributed", 2, D::Text, Model::Full,
       with_keys(with_keys(kBf16, kQat), {{"zero_stage", "0"}})},
      {"qat_lora_dist_fp32_zero3", "qat_lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(with_keys(kFp32, kQat), {{"zero_stage", "3"}})},
      {"qat_lora_dist_bf16_zero1", "qat_lora_finetune_distributed", 2, D::Text, Model::Lora,
       with_keys(with_keys(kBf16, kQat), {{"zero_stage", "1"}})},
      {"lora_dpo_dist_fp32_zero2", "lora_dpo_distributed", 2, D::Pairs, Model::Lora,
       with_keys(kFp32, {{"zero_stage", "2"}})},
      {"lora_dpo_dist_bf16_zero1", "lora_dpo_distributed", 2, D::Pairs, Model::Lora,
       with_keys(kBf16, {{"zero_stage", "1"}})},
      {"full_dpo_dist_fp32_zero3", "full_dpo_distributed", 2, D::Pairs, Model::FromCheckpoint,
       with_keys(kFp32, {{"zero_stage", "3"}})},
      {"full_dpo_dist_bf16_zero0", "full_dpo_distributed", 2, D::Pairs, Model::FromCheckpoint,
       with_keys(kBf16, {{"zero_stage", "0"}})},
  };
  return all;
}

std::filesystem::path write_case_config(const RecipeCase& c, const std::filesystem::path& dir,
                                        Overrides& o) {
  const std::filesystem::path source =
      c.data == TinyData::Text
          ? std::filesystem::path(source_dir()) / "configs/demo/demo_corpus.txt"
          : write_tiny_pairs(dir);
  std::filesystem::path checkpoint;
  if (c.model == TinyModel::FromCheckpoint) {
    checkpoint = write_tiny_checkpoint(dir / "init", 64, 128);
    if (checkpoint.empty()) return {};
  }
  const std::filesystem::path config = dir / "config.yaml";
  write_text(config, tiny_run_yaml(c.data, source, checkpoint));
  if (c.model == TinyModel::Lora) o = with_keys(o, kTinyLoraKeys);
  o = with_keys(o, c.extra);
  return config;
}

std::map<int64_t, nlohmann::json> compared_step_values(const std::filesystem::path& output_dir) {
  static const char* const kCompared[] = {
      "loss", "lr", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins"};
  std::map<int64_t, nlohmann::json> steps;
  for (const nlohmann::json& j : metrics_lines(output_dir)) {
    if (!j.contains("loss")) continue;
    nlohmann::json kept;
    for (const char* k : kCompared)
      if (j.contains(k)) kept[k] = j.at(k);
    steps[j.at("step").get<int64_t>()] = kept;
  }
  return steps;
}

}  // namespace fusetune::testing
