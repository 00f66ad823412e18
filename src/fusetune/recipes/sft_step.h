#pragma once
// The supervised fine-tuning step (full and LoRA recipes): the joint graph of the model and
// cross-entropy (models/training_graph.h), loss averaged over the unmasked labels.
#include <memory>
#include <optional>

#include "fusetune/models/llama.h"
#include "fusetune/recipes/training_step.h"

namespace fusetune {

struct ModelStepOptions {
  const ModelConfig* model = nullptr;
  const TensorMap* params = nullptr;  // bound by name at every run
  // When set, the step graphs take their parameters from it instead (ZeRO-3: gathered when
  // used); they are compiled with passes.params_at_use then.
  std::optional<ParamSource> param_source;
  // What the step graphs read: param_source when set, else params by name.
  ParamSource source() const { return param_source ? *param_source : ParamSource(*params); }
  TrainablePredicate trainable;
  LlamaOptions llama;
  std::optional<LlamaOptions> eval_llama;  // hooks for validation (no dropout); default: llama
  PassOptions passes;
  DType dtype = DType::F32;  // parameters and activations (dtype: fp32 or bf16)
  // Extra step inputs (a LoRA dropout seed): called for every micro-batch.
  std::function<void(TensorMap& inputs, int64_t global_step, int64_t micro_step)> add_inputs;
};

std::unique_ptr<TrainingStep> make_sft_step(ModelStepOptions opts);

}  // namespace fusetune
