// lora_finetune_single_device: LoRA / DoRA / QLoRA adapters on a frozen base, one device.
// The training loop is full fine-tuning's (train_loop.h); this file says what changes:
// the model's linear layers (peft/lora.h), which parameters train (the adapters only), the
// base weights' storage (with quantize_base: the layers' projections, the embedding table and
// the head as NF4; configs/README.md), and what a checkpoint holds:
//   output_dir/epoch_N/adapter_model.safetensors + adapter_config.json  (PEFT format)
//   output_dir/epoch_N/config.json + model*.safetensors  merged weights, unless
//                                                        save_adapter_weights_only
//   output_dir/epoch_N/recipe_state.{json,safetensors}   optimizer state of the adapters
#include "fusetune/recipes/lora_finetune_single_device.h"

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/safetensors.h"
#include "fusetune/models/model_family.h"
#include "fusetune/peft/adapter.h"
#include "fusetune/peft/head_parts.h"
#include "fusetune/peft/parameter_count.h"
#include "fusetune/recipes/recipe_state.h"
#include "fusetune/recipes/train_loop.h"
#include "fusetune/recipes/train_settings.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fusetune {

namespace fs = std::filesystem;

namespace {

// True when model._component_ is one of torchtune's qlora_* builders, which mean
// quantize_base: true unless the config sets it.
bool qlora_builder(const Config& cfg) {
  if (!cfg.has("model._component_") || cfg.is_map("model._component_") ||
      cfg.is_list("model._component_"))
    return false;
  const std::string builder = cfg.str("model._component_");
  return starts_with(builder.substr(builder.rfind('.') + 1), "qlora_");
}

}  // namespace

peft::LoraConfig lora_config_from(const Config& cfg) {
  peft::LoraConfig c;
  const Config m = cfg.sub("model");
  c.attn_modules = m.str_list("lora_attn_modules");
  c.apply_to_mlp = m.boolean("apply_lora_to_mlp", false);
  c.apply_to_output = m.boolean("apply_lora_to_output", false);
  c.rank = m.i64("lora_rank", 8);
  c.alpha = m.f64("lora_alpha", 16);
  c.dropout = m.f64("lora_dropout", 0.0);
  c.use_dora = m.boolean("use_dora", false);
  // torchtune's qlora_* builders are their lora_* builders with quantize_base=True (a
  // functools.partial: an explicit key still wins).
  c.quantize_base = m.boolean("quantize_base", qlora_builder(cfg));
  c.validate();
  return c;
}

namespace {

// What the hooks share: filled by `prepare`, read by the linear hooks and the checkpointing.
struct LoraRun {
  peft::LoraConfig lora;
  std::shared_ptr<peft::NF4Store> nf4;  // empty unless quantize_base
  ModelConfig model;
  std::string base_name;
};

void save_lora_checkpoint(const LoraRun& run, bool adapter_only, const fs::path& dir,
                          const CheckpointContent& c) {
  RecipeState state;
  state.progress = c.progress;
  state.optimizer = c.optimizer;
  state.adapter = true;
  publish_checkpoint(
      dir,
      [&](const fs::path& staging) {
        if (!adapter_only) {
          // Merged weights: the base (dequantized where it is NF4) plus the adapters.
          TensorMap full = *c.params;
          if (run.nf4)
            for (const auto& [name, w] : *run.nf4) full[name] = peft::dequantize_nf4(w, DType::F32);
          peft::merge_adapters(full, *c.config, run.lora);
          NamedTensors model;
          for (const auto& [name, shape] : expected_parameters(*c.config)) {
            auto it = full.find(name);
            FT_CHECK(it != full.end(),
                     "checkpoint: parameter '" + name + "' is missing from the model");
            model.push_back({name, it->second});
          }
          SaveOptions so;
          so.dtype = c.save_dtype;
          so.max_shard_bytes = c.max_shard_bytes;
          so.copy_files_from = c.copy_files_from;
          save_hf_checkpoint(staging, *c.config, model, so);
        }
        peft::save_peft_adapter(staging, run.lora, *c.params, run.base_name, c.config);
      },
      state);
}

// Whether a saved adapter targets the modules the config does. On Phi-3's fused qkv_proj a
// config naming only some of q/k/v saves an adapter on all of qkv_proj (peft/lora.h).
bool same_targets(const peft::LoraConfig& saved, const peft::LoraConfig& config,
                  const ModelConfig& model) {
  const bool fused = model_family(model.model_type).fused_projections;
  return peft::target_modules(saved, fused) == peft::target_modules(config, fused);
}

// The adapters of a PEFT adapter directory in the run's dtype: they are saved as fp32 (which
// holds bf16 values exactly, so a bf16 run's adapters come back bit for bit).
TensorMap adapters_in(peft::Adapter& a, DType dtype) {
  TensorMap out;
  for (auto& [name, t] : a.tensors) out[name] = t.dtype() == dtype ? std::move(t) : t.to(dtype);
  return out;
}

ResumedState load_lora_checkpoint(const LoraRun& run, const fs::path& dir, DType dtype) {
  const std::optional<TrainingProgress> progress = read_recipe_progress(dir);
  FT_CHECK(progress, "cannot resume from " + dir.string() + ": recipe_state.json is unreadable");
  ResumedState r;
  r.progress = *progress;
  peft::Adapter a = peft::load_peft_adapter(dir, run.model);
  FT_CHECK(a.config.rank == run.lora.rank && a.config.use_dora == run.lora.use_dora &&
               same_targets(a.config, run.lora, run.model),
           "cannot resume from " + dir.string() +
               ": its adapter (r, target_modules, use_dora) differs from the config's");
  r.params = adapters_in(a, dtype);
  SafetensorsFile st = SafetensorsFile::open(dir / "recipe_state.safetensors");
  for (const std::string& name : st.names())
    if (name.rfind("optimizer.", 0) == 0) r.optimizer[name.substr(10)] = st.tensor(name).clone();
  return r;
}

}  // namespace

LoraJob lora_training_job(const Config& cfg, const std::string& recipe) {
  auto run = std::make_shared<LoraRun>();
  run->lora = lora_config_from(cfg);
  const bool adapter_only = cfg.boolean("save_adapter_weights_only", false);
  const uint64_t seed = config_seed(cfg);

  TrainJob job;
  job.recipe = recipe;
  job.trainable = [](const std::string& name) { return peft::is_adapter_param(name); };
  // The hooks read run->nf4 when a graph is built, after `prepare` filled it.
  LlamaOptions hooks;
  hooks.linear = [run](Builder& b, Value x, const LinearSite& s) {
    return peft::lora_llama_options(run->lora, run->nf4).linear(b, x, s);
  };
  // quantize_base stores the embedding and the head as NF4 too (peft/nf4_weight.h): both
  // then have hooks.
  if (run->lora.apply_to_output || run->lora.quantize_base)
    hooks.head = [run](Builder& b, Value x, const LinearSite& s) {
      return peft::lora_llama_options(run->lora, run->nf4).head(b, x, s);
    };
  if (run->lora.quantize_base)
    hooks.embedding = [run](Builder& b, Value ids, const LinearSite& s) {
      return peft::lora_llama_options(run->lora, run->nf4).embedding(b, ids, s);
    };
  job.llama = hooks;
  // Validation runs the adapters without dropout (torchtune's model.eval()).
  if (run->lora.dropout > 0) {
    LlamaOptions eval = hooks;
    eval.linear = [run](Builder& b, Value x, const LinearSite& s) {
      peft::LoraConfig no_dropout = run->lora;
      no_dropout.dropout = 0;
      return peft::lora_llama_options(no_dropout, run->nf4).linear(b, x, s);
    };
    if (hooks.head)
      eval.head = [run](Builder& b, Value x, const LinearSite& s) {
        peft::LoraConfig no_dropout = run->lora;
        no_dropout.dropout = 0;
        return peft::lora_llama_options(no_dropout, run->nf4).head(b, x, s);
      };
    job.eval_llama = eval;
  }
  // quantize_base: the base is quantized to NF4 tensor by tensor as it is loaded, never held
  // in float as a whole (peft::NF4BaseSink); `prepare` collects the store.
  std::shared_ptr<peft::NF4BaseSink> nf4_sink;
  if (run->lora.quantize_base) job.sink = nf4_sink = std::make_shared<peft::NF4BaseSink>();
  job.prepare = [run, &cfg, seed, nf4_sink](LoadedModel& m) {
    run->model = m.config;
    run->base_name = m.checkpoint_dir.empty() ? m.description : m.checkpoint_dir.string();
    for (auto& [name, t] : m.params)
      FT_CHECK(!peft::is_adapter_param(name),
               "the base checkpoint already has adapter tensor '" + name + "'");
    // Adapters train in the model's dtype (fp32 or bf16), as the base was loaded (the norms
    // stay in m.params when the projections went to NF4).
    const DType dtype = m.params.empty() ? DType::F32 : m.params.begin()->second.dtype();
    if (nf4_sink) run->nf4 = nf4_sink->finish(m.config);
    peft::init_adapters(m.params, m.config, run->lora, seed, dtype, run->nf4.get());
    if (cfg.has("checkpointer.adapter_checkpoint")) {
      // Start from a saved PEFT adapter (checkpoint_dir/adapter_checkpoint).
      const fs::path dir = fs::path(cfg.str("checkpointer.checkpoint_dir")) /
                           cfg.str("checkpointer.adapter_checkpoint");
      peft::Adapter a = peft::load_peft_adapter(dir, m.config);
      FT_CHECK(a.config.rank == run->lora.rank && same_targets(a.config, run->lora, m.config) &&
                   a.config.use_dora == run->lora.use_dora,
               "checkpointer.adapter_checkpoint: the adapter in " + dir.string() +
                   " does not match the model's LoRA settings");
      for (auto& [name, t] : adapters_in(a, dtype)) m.params[name] = t;
    }
  };
  job.params_stored_elsewhere = [run]() { return run->nf4 ? peft::nf4_numel(*run->nf4) : 0; };
  job.shard_stored_elsewhere = [run]() {
    return run->nf4 ? peft::bind_nf4_at_run(*run->nf4) : std::map<std::string, Tensor*>{};
  };
  // An adapter-only checkpoint reads the adapters alone: ZeRO-3 then gathers no base to rank 0.
  if (adapter_only)
    job.save_reads = [](const std::string& name) { return peft::is_adapter_param(name); };
  if (run->lora.dropout > 0) {
    const int64_t accum = cfg.i64("gradient_accumulation_steps", 1);
    job.add_inputs = [seed, accum](TensorMap& in, int64_t step, int64_t micro) {
      Tensor t = Tensor::empty({}, DType::I32);
      t.data<int32_t>()[0] =
          int32_t(uint32_t((seed * 1000003u + uint64_t(step * accum + micro)) & 0x7fffffffu));
      in[peft::kDropoutSeedInput] = t;
    };
  }
  job.save = [run, adapter_only](const fs::path& dir, const CheckpointContent& c) {
    save_lora_checkpoint(*run, adapter_only, dir, c);
  };
  job.load = [run](const fs::path& dir, DType dtype) {
    return load_lora_checkpoint(*run, dir, dtype);
  };
  LoraJob out{std::move(job), {}, {}, {}};
  out.head_parts = [run](std::shared_ptr<KdStudentHead> parts) {
    return peft::head_parts_hook(
        run->lora, [run]() -> const peft::NF4Store* { return run->nf4.get(); }, std::move(parts));
  };
  if (run->lora.dropout > 0)
    out.eval_head_parts = [run](std::shared_ptr<KdStudentHead> parts) {
      peft::LoraConfig no_dropout = run->lora;
      no_dropout.dropout = 0;
      return peft::head_parts_hook(
          no_dropout, [run]() -> const peft::NF4Store* { return run->nf4.get(); },
          std::move(parts));
    };
  // The base without adapters, for the DPO reference; NF4 where `prepare` quantized it.
  out.base.linear = [run](Builder& b, Value x, const LinearSite& s) {
    return peft::base_llama_options(run->nf4).linear(b, x, s);
  };
  if (run->lora.quantize_base) {
    out.base.head = [run](Builder& b, Value x, const LinearSite& s) {
      return peft::base_llama_options(run->nf4).head(b, x, s);
    };
    out.base.embedding = [run](Builder& b, Value ids, const LinearSite& s) {
      return peft::base_llama_options(run->nf4).embedding(b, ids, s);
    };
  }
  return out;
}

int lora_finetune_single_device(const Config& cfg) {
  return run_training(cfg, lora_training_job(cfg, "lora_finetune_single_device").job);
}

}  // namespace fusetune
