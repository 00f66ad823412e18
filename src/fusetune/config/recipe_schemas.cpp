#include "fusetune/config/recipe_schemas.h"

#include "fusetune/config/components.h"
#include "fusetune/config/scalars.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

const std::vector<std::string> kArchKeys = {
    "vocab_size",          "hidden_size",         "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim",          "rope_theta",
    "rms_norm_eps",        "tie_word_embeddings", "attention_bias",    "max_position_embeddings",
    "model_type"};
const std::vector<std::string> kRequiredArchKeys = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"};

// Cross-key rules of the model map: where the architecture and the weights come from.
void check_model(const Config& model, const Config& root, Problems& p, bool lora_recipe) {
  std::string init = model.str("init", "checkpoint");
  if (init == "random") {
    if (!model.has("config")) {
      std::vector<std::string> missing;
      for (const auto& k : kRequiredArchKeys)
        if (!model.has(k)) missing.push_back(k);
      if (!missing.empty())
        p.errors.push_back(
            "model.init: random needs model.config (a Hugging Face config.json) "
            "or the architecture keys; missing: " +
            join(missing, ", ") + " (" + model.where("init") + ")");
    }
  } else {
    for (const auto& k : kArchKeys) {
      if (model.has(k))
        p.errors.push_back("config key 'model." + k +
                           "' is only used with model.init: random; with init: checkpoint the "
                           "architecture comes from the checkpoint's config.json (" +
                           model.where(k) + ")");
    }
    if (model.has("config"))
      p.errors.push_back("config key 'model.config' is only used with model.init: random (" +
                         model.where("config") + ")");
    if (!root.has("checkpointer"))
      p.errors.push_back("model.init: checkpoint needs a checkpointer map with checkpoint_dir (" +
                         root.where("model") + ")");
  }
  if (model.has("num_attention_heads") && model.has("num_key_value_heads")) {
    int64_t h = model.i64("num_attention_heads"), kv = model.i64("num_key_value_heads");
    if (kv > 0 && h % kv != 0)
      p.errors.push_back("model.num_attention_heads (" + std::to_string(h) +
                         ") must be a multiple of model.num_key_value_heads (" +
                         std::to_string(kv) + ") (" + model.where("num_key_value_heads") + ")");
  }
  if (model.has("hidden_size") && model.has("num_attention_heads") && !model.has("head_dim")) {
    int64_t d = model.i64("hidden_size"), h = model.i64("num_attention_heads");
    if (h > 0 && d % h != 0)
      p.errors.push_back("model.hidden_size (" + std::to_string(d) +
                         ") must be a multiple of model.num_attention_heads (" + std::to_string(h) +
                         "), or set model.head_dim (" + model.where("hidden_size") + ")");
  }
  if (model.has("_component_")) {
    std::string builder = model.str("_component_");
    if (!starts_with(builder, "torchtune.models.")) {
      p.errors.push_back("config key 'model._component_' is '" + builder +
                         "', but fusetune accepts only torchtune model builders "
                         "(torchtune.models....) there; set model.init instead (" +
                         model.where("_component_") + ")");
    } else {
      std::string tail = builder.substr(builder.rfind('.') + 1);
      bool lora_builder = starts_with(tail, "lora_") || starts_with(tail, "qlora_");
      if (lora_builder && !lora_recipe)
        p.errors.push_back("model._component_ '" + builder +
                           "' is a LoRA builder; use the recipe lora_finetune_single_device (" +
                           model.where("_component_") + ")");
    }
  }
}

}  // namespace

Field model_field(bool lora_recipe) {
  auto int_pos = [](const char* name, const char* help) {
    return Field::Int(name).min(1).doc(help);
  };
  Field model = Field::Map(
      "model",
      {Field::String("_component_")
           .doc("a torchtune model builder (torchtune.models.llama3_2.llama3_2_1b); accepted, "
                "the architecture comes from the checkpoint's config.json"),
       Field::Enum("init", {"checkpoint", "random"})
           .def("checkpoint")
           .doc("checkpoint: weights and architecture from the checkpointer; random: a new "
                "model from model.config or the keys below"),
       Field::String("config").doc("with init: random, a Hugging Face config.json"),
       Field::Enum("model_type",
                   {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"})
           .doc("HF model_type (models/model_family.cpp)"),
       int_pos("vocab_size", "vocabulary size (>= the tokenizer's)"),
       int_pos("hidden_size", "model width"), int_pos("intermediate_size", "MLP width"),
       int_pos("num_hidden_layers", "number of decoder layers"),
       int_pos("num_attention_heads", "query heads"),
       int_pos("num_key_value_heads", "key/value heads (GQA); default num_attention_heads"),
       int_pos(
           "head_dim",
           "per-head width; default hidden_size / num_attention_heads (qwen3: 128, gemma: 256)"),
       Field::Float("rope_theta").min(0).doc("RoPE base"),
       Field::Float("rms_norm_eps").min(0).doc("RMSNorm epsilon"),
       Field::Bool("tie_word_embeddings").doc("output head shares the embedding matrix"),
       Field::Bool("attention_bias").doc("q/k/v projections have biases (Qwen2)"),
       int_pos("max_position_embeddings", "longest sequence the model is built for"),
       int_pos("num_labels",
               "a sequence classifier (reward / value model) with this many scores: the head "
               "is `score` [num_labels, hidden_size], read at each sequence's last token; a "
               "causal LM checkpoint gets it initialized fresh, as transformers does"),
       int_pos("num_classes", "torchtune's classifier builders' name for num_labels")});
  model.req().doc("the model: from a checkpoint, or a new one (init: random)");
  model.check([lora_recipe](const Config& m, const Config& root, Problems& p) {
    check_model(m, root, p, lora_recipe);
  });
  return model;
}

namespace {

// The rollout's sampling keys (GRPO and PPO generate with the same sampler).
void add_sampling_fields(Schema& s) {
  s.add(
      Field::Float("temperature")
          .def("1.0")
          .min(0)
          .doc(
              "sampling temperature (0: greedy); the log-probs are those of logits / temperature"));
  s.add(Field::Int("top_k").min(0).doc("sample among the k most likely tokens (null, 0: all)"));
}

void check_objective(const Config& root, bool preference, Problems& p, bool grpo = false,
                     bool reward = false, bool ppo = false);

// dataset.packed needs a row length.
void check_packing(const Config& root, const Config&, Problems& p) {
  if (!root.has("dataset") || !root.is_map("dataset")) return;
  Config ds = root.sub("dataset");
  if (ds.boolean("packed", false) && !ds.has("max_seq_len") &&
      !(root.is_map("tokenizer") && root.sub("tokenizer").has("max_seq_len")))
    p.errors.push_back("dataset.packed: true needs dataset.max_seq_len or tokenizer.max_seq_len (" +
                       ds.where("packed") + ")");
}

// preference: the DPO recipes' objective (a preference loss on pairs); grpo: the GRPO recipes'
// (a policy loss on prompts); reward: the reward model's (its own loss on pairs).
Schema build_full(bool preference = false, bool grpo = false, bool reward = false,
                  bool ppo = false) {
  Schema s;
  s.recipe = "full_finetune_single_device";
  auto pos_int = [](const char* name, const char* def, const char* help) {
    Field f = Field::Int(name).min(1).doc(help);
    if (*def) f.def(def);
    return f;
  };
  s.add(Field::String("output_dir").req().doc("where checkpoints and logs go"));
  s.add(Field::Int("seed").def("42").doc("random seed (data order, init, dropout)"));
  s.add(Field::Bool("shuffle").def("true").doc("shuffle the dataset each epoch"));
  s.add(pos_int("batch_size", "2", "samples per micro-batch"));
  s.add(pos_int("epochs", "1", "passes over the dataset"));
  s.add(pos_int("max_steps_per_epoch", "", "stop an epoch after this many optimizer steps"));
  s.add(pos_int("gradient_accumulation_steps", "1", "micro-batches per optimizer step"));
  s.add(Field::Enum("compile", {"false", "true", "model", "model+loss"})
            .def("false")
            .doc("false: eager; model: compile the model only; true (= model+loss): compile "
                 "model, loss and backward as one graph"));
  s.add(Field::Bool("enable_activation_checkpointing")
            .def("false")
            .doc("recompute layer activations in the backward to save memory"));
  s.add(Field::Enum("dtype", {"fp32", "bf16"}).def("fp32").doc("parameter dtype"));
  s.add(Field::Enum("device", {"cpu", "cuda"}).def("cpu").doc("where to train"));
  s.add(pos_int("num_threads", "", "CPU threads (default: OMP_NUM_THREADS or all cores)"));
  s.add(pos_int("log_every_n_steps", "1", "steps between log lines"));
  s.add(Field::Bool("log_peak_memory_stats").def("true").doc("log peak memory each step"));
  s.add(Field::Float("clip_grad_norm").min(0).doc("clip the global gradient norm to this"));
  s.add(Field::Bool("resume_from_checkpoint")
            .def("false")
            .doc("continue from the recipe state in checkpointer.output_dir"));
  s.add(pos_int("save_every_n_steps", "", "also checkpoint every n steps (default: per epoch)"));
  s.add(model_field(false));
  s.add(component_section("checkpointer").doc("where weights are read and written"));
  s.field("checkpointer")
      .add(Field::Int("keep_last_n_checkpoints")
               .min(1)
               .doc("after each new checkpoint is complete, remove older epoch_N/step_N "
                    "checkpoints beyond the last n (default: keep all)"));
  s.add(Field::Bool("low_cpu_ram")
            .def("false")
            .doc("torchtune's low-CPU-RAM loading/saving; changes nothing here (weights are "
                 "mapped, each copied once), a log line says so"));
  s.add(component_section("tokenizer").req().doc("text to token ids"));
  s.add(component_section("dataset").req().doc("training data"));
  s.add(component_section("optimizer").req().doc("parameter update rule"));
  s.add(component_section("lr_scheduler").def("{}").doc("learning-rate schedule"));
  s.add(component_section("loss").def("{}").doc("training loss"));
  s.add(component_section("metric_logger").def("{}").doc("where step metrics go"));
  s.add(Field::Map("profiler")
            .doc("torchtune's profiler section: accepted, ignored")
            .check([](const Config& prof, const Config&, Problems& p) {
              YAML::Node enabled = prof.node("enabled");
              if (!enabled.IsScalar() || !parse_bool(enabled.Scalar()).value_or(false)) return;
              p.warnings.push_back(
                  "config key 'profiler' is ignored: fusetune has no profiler "
                  "(see `fusetune plan` and the step log)");
            }));
  s.add(Field::Bool("memory_check")
            .def("true")
            .doc("before loading the model, stop when `fusetune plan`'s peak for the configured "
                 "compile mode exceeds the memory available to the process (MemAvailable or "
                 "the memory cgroup's limit; FUSETUNE_AVAILABLE_MEMORY_BYTES replaces it), "
                 "naming settings that fit; false skips the check"));
  s.add(Field::Bool("optimizer_in_bwd")
            .def("false")
            .doc("update each parameter as soon as its gradient is computed and free the "
                 "gradient (needs gradient_accumulation_steps: 1, no clip_grad_norm)"));
  // torchtune keys that fusetune accepts so pasted configs validate.
  // torchtune moves saved activations from GPU to host memory; on a CPU they live there
  // already, so the key has nothing to do (said once when true).
  s.add(Field::Bool("enable_activation_offloading")
            .doc("torchtune's GPU-to-host activation offloading: nothing to offload on a CPU "
                 "(enable_activation_checkpointing is what saves activation memory here)"));
  s.add(Field::String("log_level").ignore("fusetune has one log level"));
  s.checks.push_back(check_packing);
  s.checks.push_back([preference, reward](const Config& root, const Config&, Problems& p) {
    if (!root.has("optimizer_in_bwd") || !root.boolean("optimizer_in_bwd", false)) return;
    const std::string at = " (" + root.where("optimizer_in_bwd") + ")";
    if (reward)
      p.errors.push_back("optimizer_in_bwd: true is not supported by the reward-model recipe" + at);
    else if (preference)
      p.errors.push_back("optimizer_in_bwd: true is not supported by the DPO recipes" + at);
    if (root.has("clip_grad_norm") && root.opt_f64("clip_grad_norm"))
      p.errors.push_back(
          "clip_grad_norm cannot be combined with optimizer_in_bwd: true: the global gradient "
          "norm needs all the gradients before any parameter is updated (torchtune refuses it "
          "too)" +
          at);
    if (root.i64("gradient_accumulation_steps", 1) != 1)
      p.errors.push_back(
          "optimizer_in_bwd: true needs gradient_accumulation_steps: 1 (each parameter is "
          "updated as soon as its gradient is ready)" +
          at);
  });
  s.checks.push_back(
      [preference, grpo, reward, ppo](const Config& root, const Config&, Problems& p) {
        check_objective(root, preference, p, grpo, reward, ppo);
      });
  {  // validation loss (torchtune's keys)
    s.add(component_section("dataset_val")
              .doc("validation data (preference pairs for the DPO recipes): its mean loss is "
                   "logged as "
                   "val_loss (run_val_every_n_steps, else at the end of each epoch)"));
    s.add(pos_int("run_val_every_n_steps", "", "validate every n optimizer steps"));
    s.add(pos_int("batch_size_val", "",
                  "samples per validation batch (default: batch_size); val_loss is the mean "
                  "over every labelled token whatever the batching"));
    s.checks.push_back([](const Config& root, const Config&, Problems& p) {
      if (root.has("run_val_every_n_steps") && !root.has("dataset_val"))
        p.errors.push_back(
            "config key 'run_val_every_n_steps' needs dataset_val, the data to "
            "validate on (" +
            root.where("run_val_every_n_steps") + ")");
    });
  }
  return s;
}

Schema build_lora(bool preference = false, bool grpo = false, bool reward = false) {
  Schema s = build_full(preference, grpo, reward);
  s.recipe = "lora_finetune_single_device";
  Field model = model_field(true);
  model.add(Field::List("lora_attn_modules")
                .req()
                .items(kString)
                .values({"q_proj", "k_proj", "v_proj", "output_proj"})
                .doc("attention projections that get LoRA adapters"));
  model.add(Field::Bool("apply_lora_to_mlp").def("false").doc("adapters on the MLP projections"));
  model.add(Field::Bool("apply_lora_to_output").def("false").doc("an adapter on the output head"));
  model.add(Field::Int("lora_rank").def("8").min(1).doc("rank r of the adapters"));
  model.add(Field::Float("lora_alpha").def("16").min(0).doc("scale alpha (update = alpha/r BA)"));
  model.add(Field::Float("lora_dropout")
                .def("0.0")
                .min(0)
                .max(1, true)
                .doc("dropout on the adapter input"));
  model.add(Field::Bool("use_dora").def("false").doc("DoRA: learn a magnitude vector too"));
  // No schema default: absent means true for torchtune's qlora_* builders (lora_config_from).
  model.add(Field::Bool("quantize_base")
                .doc("store the frozen base as NF4 (QLoRA): layer projections, embedding and head; "
                     "default true for torchtune's qlora_* builders, else false"));
  s.add(model);
  s.checks.push_back([](const Config& root, const Config&, Problems& p) {
    if (!root.has("model") || !root.is_map("model")) return;
    const Config m = root.sub("model");
    auto flag = [&](const char* key, bool def) {
      if (!m.has(key) || m.is_map(key) || m.is_list(key)) return def;
      try {
        return m.boolean(key);
      } catch (const Error&) {
        return def;  // a non-boolean is reported by the field's own check
      }
    };
    std::string builder;
    if (m.has("_component_") && !m.is_map("_component_") && !m.is_list("_component_"))
      builder = m.str("_component_");
    const bool qlora = starts_with(builder.substr(builder.rfind('.') + 1), "qlora_");
    if (flag("use_dora", false) && flag("quantize_base", qlora))
      p.errors.push_back(
          "config key 'model.use_dora' is true with an NF4 base (" +
          std::string(m.has("quantize_base") ? "quantize_base: true" : builder) +
          "): DoRA on an NF4 base (QDoRA) is not supported yet; use DoRA on a bf16/fp32 base "
          "(quantize_base: false) or QLoRA without DoRA (" +
          m.where("use_dora") + ")");
  });
  s.field("checkpointer")
      .add(Field::String("adapter_checkpoint")
               .doc("PEFT adapter to resume from, in checkpoint_dir"));
  s.add(Field::Bool("save_adapter_weights_only")
            .def("false")
            .doc("save only the adapter (PEFT format), not merged full weights"));
  return s;
}

// Which losses and datasets a recipe takes: the supervised recipes cross-entropy on samples,
// the DPO recipes a preference loss on pairs.
// PPO: PPOLoss on prompts from any sample dataset (not pairs), no validation loss.
void check_ppo_objective(const Config& root, const std::string& loss, const std::string& data,
                         Problems& p) {
  if (loss != "PPOLoss")
    p.errors.push_back("config key 'loss._component_' is " + loss +
                       ", but ppo_full_finetune_single_device trains with PPOLoss "
                       "(torchtune.rlhf.loss.PPOLoss)" +
                       (root.has("loss") ? " (" + root.where("loss") + ")" : std::string()));
  if (data == "preference" || data == "unpaired_preference")
    p.errors.push_back("config key 'dataset._component_' is " + data +
                       ", but PPO generates from prompts: a sample dataset (text_completion with "
                       "column: prompt, as torchtune's PPO configs) (" +
                       root.where("dataset") + ")");
}

void check_objective(const Config& root, bool preference, Problems& p, bool grpo, bool reward,
                     bool ppo) {
  auto component = [&](const char* section, const std::string& def) {
    if (!root.has(section) || !root.is_map(section)) return def;
    Config m = root.sub(section);
    if (!m.has("_component_") || m.is_map("_component_")) return def;
    const std::string v = m.str("_component_");
    for (const Component& c : component_table(section)->components)
      if (c.matches(v)) return c.name;
    return def;  // an unknown name is reported by the section's own check
  };
  if (reward) {  // TRL RewardTrainer's loss; its one option is center_rewards_coefficient
    if (root.has("loss"))
      p.errors.push_back(
          "config key 'loss': the reward-model recipe trains with TRL RewardTrainer's loss "
          "(-log sigmoid(r_chosen - r_rejected - margin)), set by center_rewards_coefficient; "
          "remove the loss section (" +
          root.where("loss") + ")");
    for (const char* section : {"dataset", "dataset_val"}) {
      const std::string data = component(section, "");
      if (!data.empty() && data != "preference")
        p.errors.push_back("config key '" + std::string(section) + "._component_' is " + data +
                           ", but the reward-model recipe needs preference pairs (_component_: "
                           "preference) (" +
                           root.where(section) + ")");
    }
    return;
  }
  const std::string loss = component("loss", ppo    ? "PPOLoss"
                                             : grpo ? "GRPOSimpleLoss"
                                                    : "cross_entropy");
  if (ppo) {
    check_ppo_objective(root, loss, component("dataset", ""), p);
    return;
  }
  if (loss == "PPOLoss") {
    p.errors.push_back(
        "config key 'loss._component_' is PPOLoss, which belongs to "
        "ppo_full_finetune_single_device (" +
        root.where("loss") + ")");
    return;
  }
  const bool grpo_loss = loss == "GRPOSimpleLoss" || loss == "GRPOLoss";
  if (grpo_loss != grpo) {
    p.errors.push_back("config key 'loss._component_' is " + loss + ", but " +
                       (grpo ? "the GRPO recipes train with GRPOSimpleLoss or GRPOLoss"
                             : loss + " belongs to the GRPO recipes") +
                       (root.has("loss") ? " (" + root.where("loss") + ")" : std::string()));
    return;
  }
  if (grpo) {
    if (root.has("dataset_val"))
      p.errors.push_back("config key 'dataset_val': the GRPO recipes have no validation loss (" +
                         root.where("dataset_val") + ")");
    for (const char* section : {"dataset", "dataset_val"}) {
      const std::string data = component(section, "");
      if (!data.empty() && data != "gsm8k")
        p.errors.push_back("config key '" + std::string(section) + "._component_' is " + data +
                           ", but the GRPO recipes generate from prompts (_component_: gsm8k) (" +
                           root.where(section) + ")");
    }
    return;
  }
  const bool pref_loss = loss != "cross_entropy";
  if (pref_loss != preference)
    p.errors.push_back(
        "config key 'loss._component_' is " + loss + ", but this recipe trains with " +
        (preference
             ? "a preference loss (DPOLoss, RSOLoss, IPOLoss, SimPOLoss, ORPOLoss or KTOLoss)"
             : "cross_entropy; " + loss +
                   " belongs to lora_dpo_single_device or "
                   "full_dpo_single_device") +
        " (" + root.where("loss") + ")");
  for (const char* section : {"dataset", "dataset_val"}) {
    const std::string data = component(section, "");
    const bool unpaired = data == "unpaired_preference";
    if (!data.empty() && data == "gsm8k")
      p.errors.push_back("config key '" + std::string(section) +
                         "._component_' is gsm8k, prompts for the GRPO recipes (" +
                         root.where(section) + ")");
    else if (unpaired && preference && loss != "KTOLoss")
      p.errors.push_back("config key '" + std::string(section) +
                         "._component_' is unpaired_preference, which only KTOLoss trains on; " +
                         loss + " needs preference pairs (_component_: preference) (" +
                         root.where(section) + ")");
    else if (!data.empty() && (data == "preference" || unpaired) != preference)
      p.errors.push_back("config key '" + std::string(section) + "._component_' is " + data +
                         ", but this recipe " +
                         (preference ? "needs preference pairs (_component_: preference)"
                                     : "trains on samples; preference pairs belong to the DPO "
                                       "recipes") +
                         " (" + root.where(section) + ")");
  }
  // The step's graphs are built for one layout: validation data of the training data's kind.
  const std::string train_data = component("dataset", ""), val_data = component("dataset_val", "");
  if (preference && !val_data.empty() && !train_data.empty() && val_data != train_data &&
      (train_data == "unpaired_preference" || val_data == "unpaired_preference"))
    p.errors.push_back("config key 'dataset_val._component_' is " + val_data + ", but dataset is " +
                       train_data + ": KTOLoss validates on data of the kind it trains on (" +
                       root.where("dataset_val") + ")");
}

Field precompute_ref_field() {
  return Field::Bool("precompute_ref_log_probs")
      .def("false")
      .doc(
          "compute the reference model's log-probs once per pair before training (saves a "
          "forward per step; the losses are the same)");
}

Schema build_lora_dpo() {
  Schema s = build_lora(true);
  s.recipe = "lora_dpo_single_device";
  s.add(precompute_ref_field());
  return s;
}

Schema build_full_dpo() {
  Schema s = build_full(true);
  s.recipe = "full_dpo_single_device";
  s.add(component_section("ref_checkpointer")
            .doc("the frozen reference model, usually the starting weights (not read by "
                 "SimPOLoss and ORPOLoss, which have no reference)"));
  s.add(precompute_ref_field());
  return s;
}

// reward_model_finetune_single_device: full fine-tuning's keys on preference pairs, the loss
// TRL RewardTrainer's (docs/design.md §12).
// The reward recipes' keys on `s` (full or LoRA): the loss is fixed, TRL's.
Schema with_reward_keys(Schema s) {
  // The loss is fixed: a `loss` section is refused with the reason (check_objective).
  std::erase_if(s.fields, [](const Field& f) { return f.name == "loss"; });
  s.add(Field::Map("loss").doc(
      "not accepted: the loss is TRL RewardTrainer's, set by center_rewards_coefficient"));
  s.add(Field::Float("center_rewards_coefficient")
            .def("0.0")
            .min(0)
            .doc("TRL's: adds c * mean((r_chosen + r_rejected)^2) to the loss, which keeps the "
                 "rewards centred on 0"));
  return s;
}

Schema build_reward() {
  Schema s = with_reward_keys(build_full(true, false, true));
  s.recipe = "reward_model_finetune_single_device";
  return s;
}

// LoRA adapters on the trunk, the score head trained in full (TRL RewardTrainer with a PEFT
// config: PEFT's SEQ_CLS task keeps `score` in modules_to_save).
Schema build_lora_reward() {
  Schema s = with_reward_keys(build_lora(true, false, true));
  s.recipe = "lora_reward_model_finetune_single_device";
  s.checks.push_back([](const Config& root, const Config&, Problems& p) {
    bool on = false;
    try {
      on = root.boolean("model.apply_lora_to_output", false);
    } catch (const Error&) {
      return;  // the field's own check reports a non-boolean
    }
    if (on)
      p.errors.push_back(
          "config key 'model.apply_lora_to_output' is true, but a reward model has no output "
          "head to adapt: its `score` head trains in full (" +
          root.where("model.apply_lora_to_output") + ")");
  });
  return s;
}

// The GRPO recipes: the training loop's keys, prompts (dataset kind gsm8k) as data, the
// rollout's keys (torchtune's names; TRL's num_iterations and scale_rewards), the rewards.
Schema build_grpo(bool lora) {
  Schema s = lora ? build_lora(false, true) : build_full(false, true);
  s.recipe = lora ? "lora_grpo_finetune_single_device" : "grpo_full_finetune_single_device";
  if (!lora)
    s.add(component_section("ref_checkpointer")
              .doc("the frozen reference model of the KL penalty, usually the starting weights "
                   "(not read when the KL weight is 0)"));
  // A config without `loss` trains with torchtune's GRPOSimpleLoss (its dev configs name it).
  s.field("loss")
      .default_comp("GRPOSimpleLoss")
      .doc(
          "GRPOSimpleLoss (torchtune.dev.grpo.loss.GRPOSimpleLoss, the default) or GRPOLoss (TRL's "
          "loss_type variants)");
  s.add(Field::Int("grpo_samples").def("4").min(2).doc("completions sampled per prompt (a group)"));
  s.add(Field::Int("max_generated_tokens").def("64").min(1).doc("longest completion"));
  add_sampling_fields(s);
  s.add(Field::Int("num_iterations")
            .min(1)
            .doc("optimizer steps per rollout (TRL's; default 1): from the second on the ratio "
                 "departs "
                 "from 1 and clipping acts"));
  s.add(Field::Int("ppo_epochs").min(1).doc("torchtune's name for num_iterations"));
  s.add(Field::Int("forward_batch_size")
            .min(1)
            .doc("rollout rows per scoring forward (policy and reference; default: all at once)"));
  s.add(Field::Bool("scale_rewards")
            .def("true")
            .doc("divide each advantage by its group's reward standard deviation (TRL's)"));
  s.add(Field::Map("rewards").doc(
      "the rewards, by kind (answer_match, format, length, stop_token, target_word, external, "
      "reward_model; "
      "docs/grpo.md); default: format and answer_match"));
  s.add(Field::Int("num_steps")
            .min(1)
            .doc("stop after this many optimizer steps in all "
                 "(torchtune's; the lr schedule spans them)"));
  s.add(Field::Int("save_every_n_epochs")
            .values({"1"})
            .doc("torchtune's: a checkpoint at the end of every epoch, which every recipe "
                 "writes (only 1)"));
  // torchtune's dev GRPO configs name values once and refer to them (${name}, ${base_model_path}).
  s.add(Field::String("name").doc("a name for ${name} references (torchtune's dev GRPO configs)"));
  s.add(Field::String("base_model_path")
            .doc("a directory for ${base_model_path} references (torchtune's dev GRPO configs)"));
  return s;
}

// A PPO model map (policy_model, reward_and_value_model): torchtune's builder and its
// architecture keys, which the recipe checks against the checkpoint's config.json.
Field ppo_model_field(const char* name, bool classifier) {
  const std::string checked = "checked against the checkpoint's config.json ";
  auto arch_int = [&checked](const char* key, const char* hf) {
    return Field::Int(key).min(1).doc(checked + "(" + hf + ")");
  };
  Field m = Field::Map(
      name, {Field::String("_component_")
                 .doc("a torchtune model builder; the architecture comes from the checkpoint"),
             arch_int("vocab_size", "vocab_size"), arch_int("num_layers", "num_hidden_layers"),
             arch_int("num_heads", "num_attention_heads"),
             arch_int("num_kv_heads", "num_key_value_heads"), arch_int("embed_dim", "hidden_size"),
             arch_int("intermediate_dim", "intermediate_size"),
             arch_int("max_seq_len", "max_position_embeddings"),
             Field::Float("norm_eps").min(0).doc(checked + "(rms_norm_eps)"),
             Field::Float("attn_dropout")
                 .values({"0", "0.0"})
                 .doc("only 0: fusetune's attention has no dropout (torchtune disables it too)")});
  if (classifier) {
    m.add(Field::Int("num_classes").values({"1"}).doc("one score: a reward / value model"));
    m.add(Field::String("base_model_path")
              .doc("torchtune's classifier_model: the base builder (the checkpoint decides)"));
  }
  return m.req();
}

// PPO's batch sizes divide each other: batch_size by ppo_batch_size (the updates' rows) and by
// forward_batch_size (the rollout's forwards), ppo_batch_size by gradient_accumulation_steps.
void check_ppo_batch_sizes(const Config& root, const Config&, Problems& p) {
  auto positive = [&root](const char* key, int64_t def) -> std::optional<int64_t> {
    if (!root.has(key)) return def;
    const std::optional<int64_t> v =
        root.node(key).IsScalar() ? parse_int(root.node(key).Scalar()) : std::optional<int64_t>{};
    return v && *v >= 1 ? v : std::nullopt;  // else the field's own check reports it
  };
  const auto batch = positive("batch_size", 1), ppo = positive("ppo_batch_size", 1),
             fwd = positive("forward_batch_size", 1),
             ga = positive("gradient_accumulation_steps", 1);
  auto divides = [&root, &p](const char* big, std::optional<int64_t> b, const char* small,
                             std::optional<int64_t> s) {
    if (b && s && *b % *s != 0)
      p.errors.push_back(std::string(big) + " (" + std::to_string(*b) +
                         ") must be exactly divisible by " + small + " (" + std::to_string(*s) +
                         ") (" + root.where(root.has(small) ? small : big) + ")");
  };
  divides("batch_size", batch, "ppo_batch_size", ppo);
  divides("batch_size", batch, "forward_batch_size", fwd);
  divides("ppo_batch_size", ppo, "gradient_accumulation_steps", ga);
}

// ppo_full_finetune_single_device: the training loop's keys without `model` (policy_model
// instead), four checkpointers, the rollout's and PPO's keys (torchtune's names).
Schema build_ppo() {
  Schema s = build_full(false, false, false, true);
  s.recipe = "ppo_full_finetune_single_device";
  std::erase_if(s.fields, [](const Field& f) {
    return f.name == "model" || f.name == "dataset_val" || f.name == "run_val_every_n_steps" ||
           f.name == "batch_size_val";
  });
  s.field("batch_size").doc("prompts per trajectory (one rollout, then its PPO updates)");
  // torchtune's PPO has no epochs key: it runs num_steps // batch_size steps, over as many
  // passes of the data as that takes (a checkpoint at the end of each).
  s.field("epochs").def("1000000").doc(
      "passes over the dataset (default: as many as num_steps needs, as torchtune's PPO)");
  s.field("gradient_accumulation_steps").doc("micro-batches per PPO update (of ppo_batch_size)");
  // PPOLoss is the one loss PPO trains with: a config without `loss` gets it, with its defaults.
  s.field("loss").default_comp("PPOLoss").doc("PPOLoss (torchtune.rlhf.loss.PPOLoss), the default");
  s.add(ppo_model_field("policy_model", false)
            .doc("the policy: trained, read by checkpointer; its reference by "
                 "ref_policy_checkpointer"));
  s.add(ppo_model_field("reward_and_value_model", true)
            .doc("the reward model (frozen, reward_checkpointer) and the value model (trained, "
                 "value_checkpointer): classifiers of one score"));
  s.add(component_section("ref_policy_checkpointer")
            .req()
            .doc("the frozen reference policy of the KL penalty, usually the starting weights"));
  s.add(component_section("value_checkpointer")
            .req()
            .doc("the value model's starting weights (usually the reward model's)"));
  s.add(component_section("reward_checkpointer").req().doc("the frozen reward model"));
  auto pos = [](const char* key, const char* help) { return Field::Int(key).min(1).doc(help); };
  s.add(pos("num_steps", "prompts to train on in all (torchtune's): num_steps // batch_size steps")
            .req());
  s.add(pos("ppo_epochs", "passes over each trajectory").def("1"));
  s.add(pos("ppo_batch_size", "rows per PPO update (batch_size must be a multiple)").req());
  s.add(pos("forward_batch_size", "rows per rollout forward: generation, log-probs, values, scores")
            .req());
  s.add(pos("max_generated_tokens", "longest response").req());
  add_sampling_fields(s);
  s.add(Field::List("stop_token_ids")
            .items(kInt)
            .doc("tokens that end a response (default: the tokenizer's and model's EOS)"));
  s.add(Field::Bool("enable_kv_cache")
            .def("true")
            .doc("generate with a KV cache (false: every token re-runs the whole prefix)"));
  s.add(Field::Int("min_response_length")
            .min(0)
            .doc("responses shorter than this get reward_penalty as their score (null: none)"));
  s.add(Field::Bool("penalise_no_eos")
            .def("false")
            .doc("responses without a stop token get reward_penalty as their score"));
  s.add(Field::Float("reward_penalty").def("-3.0").doc("the score of a penalised response"));
  s.add(Field::Float("kl_coeff")
            .def("0.01")
            .min(0)
            .doc("weight of the per-token KL penalty (logp - ref_logp) in the rewards"));
  s.add(Field::Float("gamma").def("1.0").min(0).max(1).doc("GAE's discount"));
  s.add(Field::Float("lmbda").def("0.95").min(0).max(1).doc("GAE's lambda"));
  s.add(Field::Bool("whiten_rewards")
            .def("false")
            .values({"false"})
            .doc("only false: torchtune's recipe reads it but never whitens the rewards"));
  s.checks.push_back(check_ppo_batch_sizes);
  return s;
}

// The vocabulary size a model map states itself (init: random with vocab_size), or 0.
int64_t stated_vocab_size(const Config& root, const char* section) {
  if (!root.is_map(section)) return 0;
  const Config m = root.sub(section);
  if (m.str("init", "checkpoint") != "random" || !m.has("vocab_size")) return 0;
  return parse_int(m.str("vocab_size")).value_or(0);
}

// KD's teacher_logits: the teacher restricted to its top-k tokens, optionally precomputed
// once into a file (recipes/kd_teacher_topk.h, docs/distillation.md).
void add_teacher_logits(Schema& s) {
  s.add(Field::Map("teacher_logits",
                   {Field::Int("top_k").req().min(1).doc(
                        "keep the teacher's k most probable tokens per position (its "
                        "distribution restricted to them and renormalized)"),
                    Field::Bool("precompute")
                        .def("false")
                        .doc("run the teacher once over the training samples (and dataset_val's) "
                             "into files under `path` (reused when they are there) and train "
                             "without loading it"),
                    Field::String("path").doc("the directory of the precomputed file")})
            .doc("the teacher's top-k logits (for teachers too large to run every step)"));
  s.checks.push_back([](const Config& root, const Config&, Problems& p) {
    if (!root.is_map("teacher_logits")) return;
    const Config t = root.sub("teacher_logits");
    if (t.boolean("precompute", false) && !t.has("path"))
      p.errors.push_back("teacher_logits.precompute: true needs teacher_logits.path (" +
                         t.where("precompute") + ")");
    if (!t.boolean("precompute", false) && t.has("path"))
      p.errors.push_back("teacher_logits.path is only read with precompute: true (" +
                         t.where("path") + ")");
    const std::string kind = canonical_component(root, "kd_loss");
    if (kind != "ForwardKLLoss")
      p.errors.push_back(
          "teacher_logits: the top-k teacher takes kd_loss ForwardKLLoss (the "
          "divergence defined on its top-k support), not " +
          kind + " (" + root.where("kd_loss") + ")");
  });
}

// knowledge_distillation_single_device: lora_finetune's keys (the LoRA keys optional: without
// model.lora_attn_modules every weight of the student trains) plus the teacher and kd_loss.
Schema build_kd() {
  Schema s = build_lora();
  s.recipe = "knowledge_distillation_single_device";
  s.field("model").find("lora_attn_modules")->required = false;
  s.field("model").doc(
      "the student: from a checkpoint, or a new one (init: random); LoRA adapters when "
      "lora_attn_modules is set, else every weight trains");
  Field teacher_field = model_field(false);
  teacher_field.name = "teacher_model";
  teacher_field.checks.clear();
  teacher_field.doc(
      "the frozen teacher: from teacher_checkpointer (its config.json), or a new one "
      "(init: random); its vocabulary must be the student's");
  // torchtune's Qwen2.5 KD config builds its teacher with a LoRA builder: adapters that start
  // at zero and never train, so the teacher computes exactly its base weights.
  const std::string exact =
      "the teacher is frozen and a new adapter is zero, so the teacher is its base weights";
  for (const char* key : {"lora_attn_modules", "apply_lora_to_mlp", "apply_lora_to_output",
                          "lora_rank", "lora_alpha", "lora_dropout"})
    teacher_field.add(Field::String(key).also(kList | kInt | kFloat | kBool).ignore(exact));
  teacher_field.check([](const Config& m, const Config& root, Problems& p) {
    if (m.str("init", "checkpoint") == "checkpoint" && !root.has("teacher_checkpointer"))
      p.errors.push_back(
          "teacher_model.init: checkpoint needs a teacher_checkpointer map with checkpoint_dir "
          "(" +
          root.where("teacher_model") + ")");
  });
  s.add(teacher_field);
  s.add(component_section("teacher_checkpointer").doc("where the teacher's weights are read"));
  s.add(component_section("kd_loss").doc(
      "the divergence between the student's and the teacher's next-token distributions"));
  s.add(Field::Float("kd_ratio")
            .def("0.5")
            .min(0)
            .max(1)
            .doc("loss = (1 - kd_ratio) cross-entropy + kd_ratio kd_loss"));
  s.checks.push_back([](const Config& root, const Config&, Problems& p) {
    const int64_t student = stated_vocab_size(root, "model");
    const int64_t teacher = stated_vocab_size(root, "teacher_model");
    if (student > 0 && teacher > 0 && student != teacher)
      p.errors.push_back(
          "the student and the teacher must share a vocabulary: model.vocab_size is " +
          std::to_string(student) + ", teacher_model.vocab_size " + std::to_string(teacher) + " (" +
          root.where("teacher_model") + ")");
    if (root.is_map("dataset") && root.sub("dataset").boolean("packed", false))
      p.errors.push_back(
          "dataset.packed: true: knowledge distillation does not take packed rows yet (" +
          root.sub("dataset").where("packed") + ")");
  });
  add_teacher_logits(s);
  return s;
}

// The QAT recipes: fine-tuning with fake-quantized linear layers (quant/qat.h).
Schema build_qat(bool lora) {
  Schema s = lora ? build_lora() : build_full();
  s.recipe = lora ? "qat_lora_finetune_single_device" : "qat_single_device";
  s.add(component_section("quantizer")
            .req()
            .doc("the quantization the model is trained for (quant/qat.h): torchao's "
                 "Int8DynActInt4WeightQATQuantizer / Int4WeightOnlyQATQuantizer or llama.cpp's "
                 "gguf_q4_0 / gguf_q8_0"));
  s.add(Field::Int("fake_quant_after_n_steps")
            .min(0)
            .doc("train this many optimizer steps without fake quantization, then switch it on "
                 "(default: on from the first step)"));
  s.checks.push_back([lora](const Config& root, const Config&, Problems& p) {
    if (!lora || !root.is_map("model")) return;
    const Config m = root.sub("model");
    for (const char* key : {"use_dora", "quantize_base"})
      if (m.has(key) && !m.is_map(key) && !m.is_list(key) && parse_bool(m.str(key)).value_or(false))
        p.errors.push_back(std::string("config key 'model.") + key +
                           "' is true: the QAT recipe fake-quantizes a float base (" +
                           (std::string(key) == "use_dora"
                                ? "DoRA's weight norm needs it unquantized"
                                : "an NF4 base is a different quantization") +
                           ") (" + m.where(key) + ")");
  });
  return s;
}

}  // namespace

const Schema& qat_schema() {
  static const Schema s = build_qat(false);
  return s;
}

const Schema& qat_lora_schema() {
  static const Schema s = build_qat(true);
  return s;
}

const Schema& lora_dpo_schema() {
  static const Schema s = build_lora_dpo();
  return s;
}

const Schema& full_dpo_schema() {
  static const Schema s = build_full_dpo();
  return s;
}

const Schema& grpo_full_schema() {
  static const Schema s = build_grpo(false);
  return s;
}

const Schema& lora_grpo_schema() {
  static const Schema s = build_grpo(true);
  return s;
}

const Schema& reward_model_schema() {
  static const Schema s = build_reward();
  return s;
}

const Schema& lora_reward_model_schema() {
  static const Schema s = build_lora_reward();
  return s;
}

const Schema& ppo_schema() {
  static const Schema s = build_ppo();
  return s;
}

const Schema& knowledge_distillation_schema() {
  static const Schema s = build_kd();
  return s;
}

const Schema& full_finetune_schema() {
  static const Schema s = build_full();
  return s;
}

const Schema& lora_finetune_schema() {
  static const Schema s = build_lora();
  return s;
}

}  // namespace fusetune
