#pragma once
// What the inference recipes (generate, eval) share: the model in its run dtype with an
// optional unmerged PEFT adapter, the compile mode, and the tokenizer.
#include <memory>
#include <string>

#include "fusetune/compile/pass.h"
#include "fusetune/config/config.h"
#include "fusetune/models/llama.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

struct InferenceModel {
  LoadedModel model;   // params include the adapter's tensors when one is applied
  LlamaOptions llama;  // the adapter's hooks (dropout off), or the plain model
  DType dtype = DType::F32;
  CompileMode mode = CompileMode::Full;
  std::string description;  // "<weights> + adapter <dir>"
};

// Reads dtype, device, num_threads, compile, the model and `adapter`; the tokenizer must fit
// the model's vocabulary.
InferenceModel load_inference_model(const Config& cfg);
std::unique_ptr<Tokenizer> build_inference_tokenizer(const Config& cfg, const ModelConfig& model);

}  // namespace fusetune
