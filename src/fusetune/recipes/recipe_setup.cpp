#include "fusetune/recipes/recipe_setup.h"

#include <omp.h>

#include <cstdlib>
#include <functional>
#include <map>

#include "fusetune/config/components.h"
#include "fusetune/config/schema.h"
#include "fusetune/data/dataset_factory.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/models/model_family.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw8bit.h"
#include "fusetune/optim/sgd.h"
#include "fusetune/recipes/train_settings.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/util/error.h"

extern "C" void openblas_set_num_threads(int);

namespace fusetune {

int configure_threads(const Config& cfg) {
  int threads = omp_get_max_threads();
  if (auto n = cfg.opt_i64("num_threads")) {
    FT_CHECK(*n >= 1, "config key 'num_threads' must be >= 1, got " + std::to_string(*n));
    threads = int(*n);
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

namespace {

// The architecture of a randomly initialized model: `model.config` (a config.json) or the
// Hugging Face keys written inline under `model`.
ModelConfig random_model_config(const Config& m) {
  if (m.has("config")) return load_model_config(m.str("config"));
  nlohmann::json j;
  j["model_type"] = m.str("model_type", "llama");
  for (const char* k :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"})
    if (m.has(k)) j[k] = m.i64(k);
  for (const char* k : {"rope_theta", "rms_norm_eps"})
    if (m.has(k)) j[k] = m.f64(k);
  for (const char* k : {"tie_word_embeddings", "attention_bias"})
    if (m.has(k)) j[k] = m.boolean(k);
  return parse_model_config(j, m.where("") + " (model section)");
}

}  // namespace

LoadedModel load_model(const Config& cfg, DType dtype, ParamSink* sink) {
  LoadedModel out;
  const std::string init = cfg.str("model.init", "checkpoint");
  if (init == "random") {
    out.config = random_model_config(cfg.sub("model"));
    if (out.config.num_labels == 0) out.config.num_labels = requested_num_labels(cfg);
    TrainingGraphOptions o;
    o.dtype = dtype;
    // A classifier's parameters: the scoring graph's (it has no LM head to train with CE).
    const Graph g = out.config.num_labels > 0 ? build_sequence_scores_graph(out.config, 1, 1, dtype)
                                              : build_training_graph(out.config, o).graph;
    // Gemma's (1 + w) norms start at w = 0, an effective scale of 1 (as transformers').
    out.params = init_parameters(graph_parameters(g), config_seed(cfg), dtype,
                                 cfg.f64("model.initializer_range", 0.02), sink,
                                 model_family(out.config.model_type).norm_adds_one);
    out.description = "random init (seed " + std::to_string(config_seed(cfg)) + ")";
    return out;
  }
  FT_CHECK(init == "checkpoint",
           "config key 'model.init' must be 'random' or 'checkpoint', got '" + init + "'");
  out.checkpoint_dir = cfg.str("checkpointer.checkpoint_dir");
  // Owned weights in counted memory: they are trained in place, and the mapped file must stay
  // untouched (it may be the checkpoint we later overwrite).
  HFCheckpoint ck = load_hf_checkpoint_owned(
      out.checkpoint_dir, checkpoint_file_list(cfg.sub("checkpointer")), dtype, sink);
  out.config = ck.config;
  for (auto& [name, t] : ck.tensors) out.params[name] = std::move(t);
  out.description = out.checkpoint_dir.string();
  if (const int64_t labels = requested_num_labels(cfg); labels > 0)
    to_sequence_classifier(out, labels, config_seed(cfg), cfg.f64("model.initializer_range", 0.02));
  return out;
}

ModelConfig model_architecture(const Config& cfg) {
  ModelConfig c = cfg.str("model.init", "checkpoint") == "random"
                      ? random_model_config(cfg.sub("model"))
                      : load_model_config(cfg.str("checkpointer.checkpoint_dir"));
  if (const int64_t labels = requested_num_labels(cfg); labels > 0 && c.num_labels == 0)
    c.num_labels = labels;
  return c;
}

int64_t requested_num_labels(const Config& cfg) {
  if (cfg.has("model.num_labels")) return cfg.i64("model.num_labels");
  if (cfg.has("model.num_classes")) return cfg.i64("model.num_classes");
  std::string builder = cfg.str("model._component_", "");
  builder = builder.substr(builder.rfind('.') == std::string::npos ? 0 : builder.rfind('.') + 1);
  if (builder.find("_reward_") != std::string::npos) return 1;  // llama2_reward_7b
  FT_CHECK(builder.size() < 11 || builder.compare(builder.size() - 11, 11, "_classifier") != 0,
           "model._component_ " + cfg.str("model._component_") +
               " (torchtune's classifier builder) needs model.num_classes, the number of scores");
  return cfg.str("checkpointer.model_type", "") == "REWARD" ? 1 : 0;
}

void to_sequence_classifier(LoadedModel& m, int64_t num_labels, uint64_t seed, double init_std) {
  if (m.config.num_labels > 0) {
    FT_CHECK(m.config.num_labels == num_labels,
             "the checkpoint is a sequence classifier of " + std::to_string(m.config.num_labels) +
                 " labels, but the config asks for " + std::to_string(num_labels) +
                 " (model.num_labels)");
    return;
  }
  m.config.num_labels = num_labels;
  const auto embed = m.params.find("model.embed_tokens.weight");
  const DType dtype =
      embed != m.params.end() ? embed->second.dtype() : m.params.begin()->second.dtype();
  m.params.erase("lm_head.weight");
  Tensor score = Tensor::empty({num_labels, m.config.hidden_size}, dtype);
  init_parameter("score.weight", seed, init_std, score);
  m.params["score.weight"] = std::move(score);
  m.description += " (as a sequence classifier: score initialized fresh)";
}

int64_t configured_max_seq_len(const Config& cfg) {
  return cfg.i64("dataset.max_seq_len", cfg.i64("tokenizer.max_seq_len", 0));
}

OptimizerStateSize optimizer_state_ratio(const Config& cfg) {
  const OptimizerKind kind = parse_optimizer_kind(canonical_component(cfg, "optimizer"));
  // State bytes per parameter byte: one (SGD) or two (AdamW) buffers of state_dtype elements
  // (AdamW8bit's small parameters: fp32) over the parameter's element size (dtype).
  const double param_bytes = cfg.str("dtype", "fp32") == "bf16" ? 2.0 : 4.0;
  const double state_bytes =
      kind != OptimizerKind::AdamW8bit && cfg.str("optimizer.state_dtype", "fp32") == "bf16" ? 2.0
                                                                                             : 4.0;
  const double per_buffer = state_bytes / param_bytes;
  if (kind == OptimizerKind::SGD)
    return cfg.f64("optimizer.momentum", 0.0) != 0.0 ? per_buffer : 0.0;
  OptimizerStateSize s(2.0 * per_buffer);
  if (kind == OptimizerKind::AdamW8bit)
    s.min_8bit_numel = cfg.i64("optimizer.min_8bit_size", AdamW8bitOptions{}.min_8bit_size);
  return s;
}

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw Error("config key 'dtype': '" + s + "' is not supported (use fp32 or bf16)");
}

std::vector<std::string> cpu_notes(const Config& cfg) {
  std::vector<std::string> w;
  const std::string device = cfg.str("device", "cpu");
  if (device != "cpu")
    w.push_back("warning: device: " + device +
                ": this build of fusetune has no GPU backend; running on the CPU (set device: "
                "cpu to silence this)");
  if (cfg.boolean("enable_activation_offloading", false))
    w.push_back(
        "enable_activation_offloading: true moves saved activations from a GPU to host memory "
        "in torchtune; on a CPU they are in host memory already, so nothing changes "
        "(enable_activation_checkpointing: true is what trades compute for activation memory)");
  return w;
}

std::vector<std::string> optimizer_warnings(const Config& cfg) {
  const std::string kind = canonical_component(cfg, "optimizer");
  if (kind == "PagedAdamW8bit" || (kind == "AdamW8bit" && cfg.boolean("optimizer.is_paged", false)))
    return {"warning: " + kind + (kind == "AdamW8bit" ? " with is_paged: true" : std::string()) +
            ": paging (CUDA unified memory that spills optimizer state to the host) has no "
            "meaning on a CPU; the state is 8-bit AdamW8bit state in ordinary memory, not paged"};
  if (kind == "PagedAdamW")
    return {
        "warning: PagedAdamW: paging (CUDA unified memory that spills optimizer state to the "
        "host) has no meaning on a CPU; the state is AdamW's fp32 state in ordinary memory, "
        "not paged"};
  return {};
}

std::unique_ptr<Tokenizer> build_tokenizer(const Config& cfg) {
  TokenizerSpec spec;
  spec.type = canonical_component(cfg, "tokenizer");
  if (spec.type == "byte") return load_tokenizer(spec);
  const Config tok = cfg.sub("tokenizer");
  // torchtune's phi4_tokenizer names its two files vocab_path and merges_path.
  const bool phi4 = spec.type == "phi4";
  spec.path = tok.str(phi4 ? "vocab_path" : "path");
  spec.merges_file = tok.str(phi4 ? "merges_path" : "merges_file", "");
  spec.special_tokens_path = tok.str("special_tokens_path", "");
  // Absent: torchtune's default; null: none.
  auto token = [&](const char* key) -> std::optional<std::string> {
    const YAML::Node n = tok.node(key);
    if (!n.IsDefined()) return std::nullopt;
    return n.IsNull() ? std::string() : tok.str(key);
  };
  spec.bos_token = token("bos_token");
  spec.eos_token = token("eos_token");
  spec.pad_token = token("pad_token");
  spec.unk_token = token("unk_token");
  return load_tokenizer(spec);
}

namespace {

DatasetOptions dataset_options_from(const Config& cfg, const ModelConfig& model,
                                    const std::string& section = "dataset") {
  const Config d = cfg.sub(section);
  DatasetOptions o;
  o.kind = canonical_component(cfg, section);
  o.source = d.has("data_files") ? d.str("data_files") : d.str("source");
  o.column = d.str(o.kind == "chat" ? "conversation_column" : "column", "");
  if (d.has("column_map"))
    for (const std::string& k : d.sub("column_map").keys())
      o.column_map[k] = d.str("column_map." + k);
  o.split = d.str("split", "train");
  o.train_on_input =
      d.boolean("train_on_input", o.kind == "alpaca");  // the schema's defaults, as torchtune
  o.max_seq_len = d.has("max_seq_len") ? d.i64("max_seq_len") : configured_max_seq_len(cfg);
  o.packed = d.boolean("packed", false);
  o.template_name = d.str("template", "auto");
  o.model_family = model.model_type;
  o.conversation_style = d.str("conversation_style", "auto");
  o.new_system_prompt = d.str("new_system_prompt", "");
  o.on_bad_row = d.str("on_bad_row", "error");
  o.partition = d.str("partition", "");
  o.prompt_template = d.str("prompt_template", "");
  o.add_eos = d.boolean("add_eos", true);  // text_completion's (the schema's default)
  return o;
}

}  // namespace

std::unique_ptr<Dataset> build_dataset_from_config(const Config& cfg, const Tokenizer& tok,
                                                   const ModelConfig& model,
                                                   const std::string& section) {
  return build_dataset(dataset_options_from(cfg, model, section), tok);
}

std::unique_ptr<PreferenceDataset> build_preference_dataset_from_config(
    const Config& cfg, const Tokenizer& tok, const ModelConfig& model, const std::string& section) {
  return build_preference_dataset(dataset_options_from(cfg, model, section), tok);
}

LoaderOptions loader_options_from(const Config& cfg, const Tokenizer& tok) {
  LoaderOptions o;
  o.batch_size = cfg.i64("batch_size", 2);
  o.shuffle = cfg.boolean("shuffle", true);
  o.seed = config_seed(cfg);
  o.collate.max_seq_len = configured_max_seq_len(cfg);
  o.collate.pad_mode = parse_pad_mode(cfg.str("dataset.pad_to", "multiple"));
  o.collate.pad_id = tok.pad_id();
  return o;
}

namespace {

// What every optimizer takes besides its own keys.
struct OptimizerCommon {
  DType state = DType::F32;  // optimizer.state_dtype
  uint64_t seed = 0;         // bf16 values are written back with stochastic rounding
};

std::unique_ptr<Optimizer> build_sgd(const Config& o, const OptimizerCommon& c) {
  SGDOptions s;
  s.momentum = o.f64("momentum", 0.0);
  s.weight_decay = o.f64("weight_decay", 0.0);
  s.state_dtype = c.state;
  s.seed = c.seed;
  return std::make_unique<SGD>(s);
}

AdamWOptions adamw_options(const Config& o, const OptimizerCommon& c) {
  AdamWOptions a;
  if (o.has("betas")) {
    auto betas = o.f64_list("betas");
    FT_CHECK(betas.size() == 2, "config key 'optimizer.betas' must have two values");
    a.beta1 = betas[0];
    a.beta2 = betas[1];
  }
  a.eps = o.f64("eps", a.eps);
  a.weight_decay = o.f64("weight_decay", a.weight_decay);
  a.state_dtype = c.state;  // AdamW8bit refuses bf16 (its moments are 8-bit)
  a.seed = c.seed;
  return a;
}

std::unique_ptr<Optimizer> build_adamw(const Config& o, const OptimizerCommon& c) {
  return std::make_unique<AdamW>(adamw_options(o, c));
}

std::unique_ptr<Optimizer> build_adamw8bit(const Config& o, const OptimizerCommon& c, bool paged) {
  AdamW8bitOptions b;
  b.adamw = adamw_options(o, c);
  // The refused values (amsgrad, percentile_clipping, block_wise, optim_bits) were rejected
  // by the schema (config/components.cpp); checked again for configs built in code.
  FT_CHECK(!o.boolean("amsgrad", false), "optimizer.amsgrad: not supported by AdamW8bit");
  FT_CHECK(o.i64("percentile_clipping", 100) == 100,
           "optimizer.percentile_clipping: only 100 (off) is supported; use clip_grad_norm");
  FT_CHECK(o.boolean("block_wise", true), "optimizer.block_wise: only true is supported");
  b.min_8bit_size = o.i64("min_8bit_size", b.min_8bit_size);
  b.paged = paged;
  return std::make_unique<AdamW8bit>(b);
}

using OptimizerBuilder =
    std::function<std::unique_ptr<Optimizer>(const Config& section, const OptimizerCommon&)>;

// torchtune's instantiate for the optimizer: the builder of each component the table in
// config/components.cpp validates, by its canonical name.
const std::map<std::string, OptimizerBuilder>& optimizer_builders() {
  static const std::map<std::string, OptimizerBuilder> builders = {
      {"AdamW", build_adamw},
      {"PagedAdamW", build_adamw},  // bitsandbytes' paged 32-bit AdamW: no paging on a CPU
      {"AdamW8bit",
       [](const Config& o, const OptimizerCommon& c) {
         return build_adamw8bit(o, c, o.boolean("is_paged", false));
       }},
      {"PagedAdamW8bit",
       [](const Config& o, const OptimizerCommon& c) { return build_adamw8bit(o, c, true); }},
      {"SGD", build_sgd},
  };
  return builders;
}

}  // namespace

bool has_optimizer_builder(const std::string& component) {
  return optimizer_builders().count(component) > 0;
}

std::unique_ptr<Optimizer> build_optimizer(const Config& cfg) {
  const Config o = cfg.sub("optimizer");
  OptimizerCommon common;
  common.seed = config_seed(cfg);
  const std::string state_dtype = o.str("state_dtype", "fp32");
  FT_CHECK(state_dtype == "fp32" || state_dtype == "bf16",
           "config key 'optimizer.state_dtype' must be fp32 or bf16, got '" + state_dtype + "'");
  common.state = state_dtype == "bf16" ? DType::BF16 : DType::F32;
  const std::string component = canonical_component(cfg, "optimizer");
  auto it = optimizer_builders().find(component);
  FT_CHECK(it != optimizer_builders().end(), "optimizer '" + component + "' has no builder");
  return it->second(o, common);
}

LRSchedule build_lr_schedule(const Config& cfg, int64_t total_steps) {
  const double lr = cfg.f64("optimizer.lr");
  if (!cfg.has("lr_scheduler")) return LRSchedule::constant(lr);
  const std::string kind = canonical_component(cfg, "lr_scheduler");
  const int64_t warmup = cfg.i64("lr_scheduler.num_warmup_steps", 0);
  if (kind == "cosine_with_warmup")
    return LRSchedule::cosine_with_warmup(lr, warmup, total_steps,
                                          cfg.f64("lr_scheduler.num_cycles", 0.5));
  if (kind == "linear_with_warmup") return LRSchedule::linear_with_warmup(lr, warmup, total_steps);
  return warmup > 0 ? LRSchedule::constant_with_warmup(lr, warmup) : LRSchedule::constant(lr);
}

}  // namespace fusetune
