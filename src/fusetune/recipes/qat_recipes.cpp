// The QAT recipes: full fine-tuning's and LoRA's jobs (train_loop.h) with fake quantization
// added to the step graphs (the *_distributed QAT recipes run the same jobs as ranks):
//   - the linear hooks of quant/qat.h (for LoRA: under the adapters, on the frozen base);
//   - the [] I32 input "fake_quant_enabled" fed each micro-batch: 0 before
//     fake_quant_after_n_steps optimizer steps, then 1 (torchtune enables fake quantization
//     when global_step reaches it);
//   - validation (dataset_val) always on the fake-quantized model: its loss is the quantized
//     model's.
// Checkpoints hold the float weights (torchtune's QAT recipes save the prepared model's float
// weights too); quantizing them is the export's job. Unlike torchtune's recipe, compile: true
// is accepted: the fake-quantized matmuls are ordinary graph ops for every compile mode.
#include "fusetune/recipes/qat_recipes.h"

#include <iostream>

#include "fusetune/peft/lora.h"
#include "fusetune/quant/qat.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Adds fake quantization to `job`. `hooks(on_switch)`: the step's model hooks, reading the
// enable input (true) or always on (false).
void add_fake_quant(TrainJob& job, const quant::QatConfig& q,
                    const std::shared_ptr<ModelConfig>& model,
                    const std::function<LlamaOptions(bool)>& hooks) {
  job.llama = hooks(true);
  job.eval_llama = hooks(false);
  auto prepare = job.prepare;
  job.prepare = [model, prepare](LoadedModel& m) {
    // The hooks were chosen for the architecture read from the config; the loaded one is it.
    FT_CHECK(m.config.tie_word_embeddings == model->tie_word_embeddings &&
                 m.config.vocab_size == model->vocab_size,
             "QAT: the loaded model's architecture differs from the one its config announced");
    *model = m.config;
    if (prepare) prepare(m);
  };
  auto inputs = job.add_inputs;
  job.add_inputs = [q, inputs](TensorMap& in, int64_t step, int64_t micro) {
    if (inputs) inputs(in, step, micro);
    Tensor on = Tensor::empty({}, DType::I32);
    on.data<int32_t>()[0] = quant::fake_quant_enabled_at(q, step) ? 1 : 0;
    in[quant::kFakeQuantEnabledInput] = on;
  };
}

// The architecture (config.json or model.*), checked against the scheme before anything loads.
std::shared_ptr<ModelConfig> qat_model(const Config& cfg, const quant::QatConfig& q) {
  auto model = std::make_shared<ModelConfig>(model_architecture(cfg));
  for (const std::string& site : quant::check_model(q, *model))
    std::cerr << "note: quantizer " << quant::scheme_name(q.scheme) << ": " << site
              << " is not a whole number of quantization groups and stays float\n";
  return model;
}

}  // namespace

TrainJob qat_training_job(const Config& cfg, const std::string& recipe) {
  const quant::QatConfig q = quant::qat_config_from(cfg);
  auto model = qat_model(cfg, q);
  TrainJob job;
  job.recipe = recipe;
  job.trainable = [](const std::string&) { return true; };
  add_fake_quant(job, q, model, [q, model](bool on_switch) {
    return quant::qat_llama_options(q, model, on_switch);
  });
  return job;
}

TrainJob qat_lora_training_job(const Config& cfg, const std::string& recipe) {
  const quant::QatConfig q = quant::qat_config_from(cfg);
  const peft::LoraConfig lora = lora_config_from(cfg);
  FT_CHECK(!lora.quantize_base && !lora.use_dora,
           recipe +
               " fake-quantizes a float base: model.quantize_base and model.use_dora must be "
               "false");
  auto model = qat_model(cfg, q);
  TrainJob job = lora_training_job(cfg, recipe).job;
  // The adapters on the fake-quantized base (torchtune's QAT LoRA linear: the base product
  // from fake-quantized input and weight, the adapter from the float input); validation
  // without dropout.
  add_fake_quant(job, q, model, [q, model, lora](bool on_switch) {
    const LlamaOptions base = quant::qat_llama_options(q, model, on_switch);
    peft::LoraConfig c = lora;
    if (!on_switch) c.dropout = 0;
    return peft::lora_llama_options(c, nullptr, &base);
  });
  return job;
}

int qat_single_device(const Config& cfg) {
  return run_training(cfg, qat_training_job(cfg, "qat_single_device"));
}

int qat_lora_finetune_single_device(const Config& cfg) {
  return run_training(cfg, qat_lora_training_job(cfg, "qat_lora_finetune_single_device"));
}

}  // namespace fusetune
