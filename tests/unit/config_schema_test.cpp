// Validation against the recipe schemas: every problem reported at once, suggestions,
// component aliases, enums, defaults.
#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/config/components.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/optim/optimizer.h"
#include "fusetune/recipes/lora_finetune_single_device.h"
#include "fusetune/util/error.h"
#include "tiny_llama.h"

using namespace fusetune;
using fusetune::testing::contains;
using fusetune::testing::error_of;

namespace {

const std::string kValid =
    fusetune::testing::tiny_config_yaml("tokenizer:\n  _component_: byte\n  max_seq_len: 64\n");

Config with(const std::vector<std::string>& overrides, const std::string& yaml = kValid) {
  Config c = Config::from_string(yaml, "configs/t.yaml");
  c.apply_overrides(overrides);
  return c;
}

std::string problems(const std::vector<std::string>& overrides,
                     const Schema& schema = full_finetune_schema()) {
  return error_of([&] { validate(with(overrides), schema); });
}

}  // namespace

TEST(ConfigSchema, MinimalConfigIsValid) {
  EXPECT_EQ(problems({}), "");
  EXPECT_TRUE(check_config(with({}), full_finetune_schema()).warnings.empty());
}

TEST(ConfigSchema, MisspelledTopLevelKeySuggestsTheRightOne) {
  Config c = Config::from_string(kValid + "optimzer:\n  lr: 1\n", "configs/t.yaml");
  std::string msg = error_of([&] { validate(c, full_finetune_schema()); });
  EXPECT_TRUE(contains(msg,
                       "unknown config key 'optimzer' (did you mean 'optimizer'?) "
                       "(configs/t.yaml:19)"))
      << msg;
}

TEST(ConfigSchema, MisspelledNestedKeySuggestsTheRightOne) {
  std::string msg = problems({"optimizer.lrr=1"});
  EXPECT_TRUE(contains(msg, "unknown config key 'optimizer.lrr' (did you mean 'optimizer.lr'?)"))
      << msg;
  msg = problems({"dataset.pakced=true"});
  EXPECT_TRUE(contains(msg, "did you mean 'dataset.packed'?")) << msg;
}

TEST(ConfigSchema, UnrelatedUnknownKeyListsValidKeysOfSmallMaps) {
  std::string msg = problems({"loss.zzzzzzzz=1"});
  EXPECT_TRUE(contains(msg, "unknown config key 'loss.zzzzzzzz'; valid keys in 'loss': ")) << msg;
}

TEST(ConfigSchema, ReportsAllProblemsInOneError) {
  std::string msg = problems({"optimzer=1", "optimizer.lr=abc", "~output_dir", "compile=fast",
                              "dtype=fp16", "batch_size=0"});
  EXPECT_TRUE(contains(msg,
                       "configs/t.yaml: 6 problems in the config for recipe "
                       "full_finetune_single_device:"))
      << msg;
  EXPECT_TRUE(contains(msg, "unknown config key 'optimzer'")) << msg;
  EXPECT_TRUE(contains(msg,
                       "config key 'optimizer.lr' must be a number, got 'abc' "
                       "(override 'optimizer.lr=abc')"))
      << msg;
  EXPECT_TRUE(contains(msg, "missing required config key 'output_dir'")) << msg;
  EXPECT_TRUE(contains(msg, "'compile' must be one of false, true, model, model+loss; got 'fast'"))
      << msg;
  EXPECT_TRUE(contains(msg, "'dtype' must be one of fp32, bf16; got 'fp16' (did you mean 'fp32'?)"))
      << msg;
  EXPECT_TRUE(contains(msg, "'batch_size' must be >= 1, got 0")) << msg;
}

TEST(ConfigSchema, TypesAreChecked) {
  std::string msg =
      problems({"seed=abc", "shuffle=yes", "clip_grad_norm=[1]", "optimizer.betas=[0.9]",
                "optimizer.eps=[a]", "model.hidden_size=6.5", "checkpointer.max_shard_size=big"});
  EXPECT_TRUE(contains(msg, "'seed' must be an integer, got 'abc'")) << msg;
  EXPECT_TRUE(contains(msg, "'shuffle' must be true or false, got 'yes'")) << msg;
  EXPECT_TRUE(contains(msg, "'clip_grad_norm' must be a number, got a list")) << msg;
  EXPECT_TRUE(contains(msg, "'optimizer.betas' must be a list of 2 items, got 1")) << msg;
  EXPECT_TRUE(contains(msg, "'optimizer.eps' must be a number, got a list")) << msg;
  EXPECT_TRUE(contains(msg, "'model.hidden_size' must be an integer, got '6.5'")) << msg;
  EXPECT_TRUE(contains(msg, "'checkpointer.max_shard_size' must be a byte size")) << msg;
}

TEST(ConfigSchema, EnumsAcceptYamlBooleansAndNames) {
  EXPECT_EQ(problems({"compile=False"}), "");
  EXPECT_EQ(problems({"compile=true"}), "");
  EXPECT_EQ(problems({"compile=model"}), "");
  EXPECT_EQ(problems({"compile=model+loss"}), "");
  EXPECT_EQ(problems({"dtype=bf16", "device=cuda"}), "");
  EXPECT_TRUE(contains(problems({"device=gpu"}), "'device' must be one of cpu, cuda; got 'gpu'"));
  EXPECT_TRUE(contains(problems({"dataset.on_bad_row=ignore"}), "must be one of error, skip"));
}

TEST(ConfigSchema, TorchtuneComponentNamesAreAliases) {
  Config c = with({"optimizer=torch.optim.AdamW",
                   "lr_scheduler={_component_: "
                   "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup, "
                   "num_warmup_steps: 10}",
                   "loss={_component_: torchtune.modules.loss.CEWithChunkedOutputLoss}",
                   "dataset={_component_: torchtune.datasets.alpaca_dataset, source: a.json}",
                   "metric_logger={_component_: torchtune.training.metric_logging.DiskLogger, "
                   "log_dir: /tmp/l}"});
  EXPECT_NO_THROW(validate(c, full_finetune_schema()));
  EXPECT_EQ(canonical_component(c, "optimizer"), "AdamW");
  EXPECT_EQ(canonical_component(c, "lr_scheduler"), "cosine_with_warmup");
  EXPECT_EQ(canonical_component(c, "loss"), "cross_entropy");
  EXPECT_EQ(canonical_component(c, "dataset"), "alpaca");
  EXPECT_EQ(canonical_component(c, "metric_logger"), "disk");
  EXPECT_EQ(canonical_component(c, "tokenizer"), "byte");

  Config d = with({"optimizer=torch.optim.SGD", "loss={_component_: torch.nn.CrossEntropyLoss}",
                   "tokenizer={_component_: torchtune.models.llama3.llama3_tokenizer, path: "
                   "/m/tokenizer.json}",
                   "dataset={_component_: torchtune.datasets.chat_dataset, source: c.json, "
                   "conversation_style: sharegpt}"});
  EXPECT_NO_THROW(validate(d, full_finetune_schema()));
  EXPECT_EQ(canonical_component(d, "optimizer"), "SGD");
  EXPECT_EQ(canonical_component(d, "loss"), "cross_entropy");
  EXPECT_EQ(canonical_component(d, "tokenizer"), "llama3");
  EXPECT_EQ(canonical_component(d, "dataset"), "chat");
  Config e =
      with({"tokenizer={_component_: torchtune.models.llama2.llama2_tokenizer, path: "
            "/m/tokenizer.model}",
            "dataset={_component_: torchtune.datasets.instruct_dataset, source: i.json}", "~model",
            "model={_component_: torchtune.models.llama2.llama2_7b}",
            "checkpointer={_component_: torchtune.training.FullModelHFCheckpointer, "
            "checkpoint_dir: /m, checkpoint_files: [a.safetensors], model_type: LLAMA2}"});
  EXPECT_NO_THROW(validate(e, full_finetune_schema()));
  EXPECT_EQ(canonical_component(e, "tokenizer"), "sentencepiece");
  EXPECT_EQ(canonical_component(e, "dataset"), "instruct");
  EXPECT_EQ(canonical_component(e, "checkpointer"), "FullModelHFCheckpointer");
  EXPECT_EQ(canonical_component(with({"dataset._component_=pretokenized"}), "dataset"),
            "pretokenized");
}

TEST(ConfigSchema, DefaultComponentsWhenAbsent) {
  Config c = with({});
  EXPECT_EQ(canonical_component(c, "loss"), "cross_entropy");
  EXPECT_EQ(canonical_component(c, "lr_scheduler"), "constant");
  EXPECT_EQ(canonical_component(c, "metric_logger"), "stdout");
  Config d = with({"~optimizer._component_"});
  EXPECT_TRUE(contains(error_of([&] { canonical_component(d, "optimizer"); }),
                       "'optimizer._component_' (a string) is required but missing"));
  EXPECT_TRUE(contains(problems({"~optimizer._component_"}),
                       "missing required key 'optimizer._component_' (one of: AdamW, "
                       "AdamW8bit, PagedAdamW8bit, PagedAdamW, SGD)"));
}

// bitsandbytes' 32-bit PagedAdamW (torchtune's *_low_memory and Qwen2.5 full configs) is
// AdamW; the Optimizer2State values that would change it are refused with the reason.
TEST(ConfigSchema, PagedAdamWIsAdamW) {
  EXPECT_EQ(problems({"optimizer._component_=bitsandbytes.optim.PagedAdamW"}), "");
  EXPECT_EQ(problems({"optimizer._component_=bitsandbytes.optim.PagedAdamW32bit",
                      "optimizer.weight_decay=0.1", "optimizer.min_8bit_size=16"}),
            "");
  std::string msg = problems({"optimizer._component_=bitsandbytes.optim.PagedAdamW",
                              "optimizer.optim_bits=8", "optimizer.amsgrad=true"});
  EXPECT_TRUE(contains(msg,
                       "'optimizer.optim_bits' is 8: fusetune's PagedAdamW keeps 32-bit "
                       "state; for 8-bit state use bitsandbytes.optim.PagedAdamW8bit"))
      << msg;
  EXPECT_TRUE(contains(msg, "'optimizer.amsgrad' is true: AMSGrad is not implemented")) << msg;
  EXPECT_EQ(fusetune::parse_optimizer_kind("bitsandbytes.optim.PagedAdamW"),
            fusetune::OptimizerKind::AdamW);
}

// torchtune's qlora_* builders are its lora_* builders with quantize_base=True: the same here,
// after the schema's defaults, unless the config sets the key; QDoRA is refused by validate.
TEST(ConfigSchema, QloraBuilderMeansQuantizeBase) {
  const char* yaml = R"(output_dir: /tmp/out
model:
  _component_: torchtune.models.llama3_2.qlora_llama3_2_1b
  lora_attn_modules: [q_proj, v_proj]
checkpointer:
  checkpoint_dir: /m
tokenizer:
  _component_: byte
dataset:
  _component_: text_completion
  source: data/corpus.txt
optimizer:
  _component_: AdamW
  lr: 1e-3
)";
  const Schema& schema = lora_finetune_schema();
  EXPECT_EQ(error_of([&] { validate(with({}, yaml), schema); }), "");
  EXPECT_TRUE(fusetune::lora_config_from(with_defaults(with({}, yaml), schema)).quantize_base);
  EXPECT_FALSE(
      fusetune::lora_config_from(with_defaults(with({"model.quantize_base=false"}, yaml), schema))
          .quantize_base);
  EXPECT_FALSE(
      fusetune::lora_config_from(
          with_defaults(
              with({"model._component_=torchtune.models.llama3_2.lora_llama3_2_1b"}, yaml), schema))
          .quantize_base);
  std::string msg = error_of([&] { validate(with({"model.use_dora=true"}, yaml), schema); });
  EXPECT_TRUE(contains(msg, "DoRA on an NF4 base (QDoRA) is not supported yet")) << msg;
  msg = error_of([&] {
    validate(with({"model.use_dora=true", "model.quantize_base=false"}, yaml), schema);
  });
  EXPECT_EQ(msg, "");
}

TEST(ConfigSchema, UnknownComponentSuggestsClosest) {
  std::string msg = problems({"optimizer=AdamWW"});
  EXPECT_TRUE(contains(msg,
                       "unknown optimizer._component_ 'AdamWW' (did you mean 'AdamW'?); "
                       "valid: AdamW, AdamW8bit, PagedAdamW8bit, PagedAdamW, SGD"))
      << msg;
  msg = problems({"optimizer=torch.optim.Adamw"});
  EXPECT_TRUE(contains(msg, "(did you mean 'torch.optim.AdamW'?)")) << msg;
  msg = problems({"metric_logger={_component_: torchtune.training.metric_logging.WandBLogger}"});
  EXPECT_TRUE(contains(msg, "unknown metric_logger._component_")) << msg;
  EXPECT_FALSE(contains(msg, "did you mean")) << msg;  // not "DiskLogger"
  Config c = with({"optimizer=Adamm"});
  EXPECT_TRUE(contains(error_of([&] { canonical_component(c, "optimizer"); }),
                       "unknown optimizer._component_ 'Adamm' (did you mean 'AdamW'?)"));
}

TEST(ConfigSchema, ComponentDecidesValidSiblingKeys) {
  std::string msg = problems({"optimizer.momentum=0.9"});
  EXPECT_TRUE(contains(msg,
                       "config key 'optimizer.momentum' is not valid with "
                       "optimizer._component_ AdamW (it belongs to SGD)"))
      << msg;
  EXPECT_EQ(problems({"optimizer=SGD", "optimizer.momentum=0.9"}), "");
  msg = problems({"optimizer=SGD", "optimizer.betas=[0.9,0.99]"});
  EXPECT_TRUE(contains(msg, "belongs to AdamW")) << msg;
  // An unknown component does not also flag every sibling key.
  msg = problems({"optimizer=Nope", "optimizer.momentum=0.9"});
  EXPECT_FALSE(contains(msg, "momentum")) << msg;
  msg = problems({"dataset._component_=chat"});
  EXPECT_TRUE(contains(msg, "missing required config key 'dataset.conversation_style'")) << msg;
}

TEST(ConfigSchema, ModelSectionRules) {
  std::string msg = problems({"~model.vocab_size", "~model.num_hidden_layers"});
  EXPECT_TRUE(contains(msg,
                       "model.init: random needs model.config (a Hugging Face config.json) "
                       "or the architecture keys; missing: vocab_size, num_hidden_layers"))
      << msg;
  EXPECT_EQ(problems({"~model", "model={init: random, config: /m/config.json}"}), "");
  msg = problems({"model.init=checkpoint"});
  EXPECT_TRUE(contains(msg, "config key 'model.hidden_size' is only used with model.init: random"))
      << msg;
  EXPECT_TRUE(contains(msg, "model.init: checkpoint needs a checkpointer")) << msg;
  EXPECT_EQ(problems({"~model", "model.init=checkpoint", "checkpointer.checkpoint_dir=/m"}), "");
  msg = problems({"model.num_key_value_heads=3"});
  EXPECT_TRUE(contains(msg, "must be a multiple of model.num_key_value_heads (3)")) << msg;
  msg = problems({"~model", "model={_component_: torchtune.models.llama3_2.lora_llama3_2_1b}",
                  "checkpointer.checkpoint_dir=/m"});
  EXPECT_TRUE(contains(msg, "is a LoRA builder; use the recipe lora_finetune_single_device"))
      << msg;
  msg = problems({"~model", "model={_component_: my.builder}", "checkpointer.checkpoint_dir=/m"});
  EXPECT_TRUE(contains(msg, "accepts only torchtune model builders")) << msg;
  EXPECT_TRUE(contains(problems({"~model"}), "missing required config key 'model'"));
}

TEST(ConfigSchema, CrossKeyChecks) {
  std::string msg = problems({"~tokenizer.max_seq_len", "dataset.packed=true"});
  EXPECT_TRUE(contains(msg,
                       "dataset.packed: true needs dataset.max_seq_len or "
                       "tokenizer.max_seq_len"))
      << msg;
  EXPECT_EQ(problems({"dataset.packed=true"}), "");  // tokenizer.max_seq_len is set
  msg = problems({"tokenizer={_component_: hf, path: /m/original/tokenizer.model}"});
  EXPECT_TRUE(contains(msg, "the hf tokenizer reads a Hugging Face tokenizer.json")) << msg;
  // Offloading (GPU to host) has nothing to do on a CPU: accepted, said in the run's log.
  EXPECT_EQ(problems({"optimizer_in_bwd=true", "enable_activation_offloading=True"}), "");
  EXPECT_EQ(problems({"optimizer_in_bwd=False"}), "");
  EXPECT_EQ(problems({"optimizer_in_bwd=true"}), "");
  msg = problems({"optimizer_in_bwd=true", "clip_grad_norm=1.0"});
  EXPECT_TRUE(contains(msg, "clip_grad_norm cannot be combined with optimizer_in_bwd")) << msg;
  msg = problems({"optimizer_in_bwd=true", "gradient_accumulation_steps=2"});
  EXPECT_TRUE(contains(msg, "optimizer_in_bwd: true needs gradient_accumulation_steps: 1")) << msg;
}

TEST(ConfigSchema, IgnoredKeysWarn) {
  Problems p = check_config(with({"profiler={_component_: torchtune.training.setup_torch_profiler, "
                                  "enabled: true, cpu: true}",
                                  "loss.num_output_chunks=8", "log_level=INFO"}),
                            full_finetune_schema());
  EXPECT_TRUE(p.errors.empty());
  ASSERT_EQ(p.warnings.size(), 3u);
  EXPECT_TRUE(contains(p.warnings[0], "'loss.num_output_chunks' is ignored"));
  // A disabled profiler is silent.
  p = check_config(with({"profiler={enabled: False}"}), full_finetune_schema());
  EXPECT_TRUE(p.warnings.empty());
}

TEST(ConfigSchema, InterpolationIsResolvedBeforeChecking) {
  EXPECT_EQ(problems({"dataset.max_seq_len=${tokenizer.max_seq_len}"}), "");
  std::string msg = problems({"dataset.max_seq_len=${tokenizer.max_seq_lenn}"});
  EXPECT_TRUE(contains(msg, "did you mean 'tokenizer.max_seq_len'?")) << msg;
}

TEST(ConfigSchema, WithDefaultsFillsAndNormalizes) {
  Config c = with({"compile=False", "shuffle=True", "optimizer=torch.optim.AdamW",
                   "metric_logger._component_=torchtune.training.metric_logging.DiskLogger",
                   "checkpointer.checkpoint_dir=/m"});
  validate(c, full_finetune_schema());
  Config f = with_defaults(c, full_finetune_schema());
  EXPECT_TRUE(f.resolved());
  EXPECT_EQ(f.i64("seed"), 42);
  EXPECT_EQ(f.i64("batch_size"), 2);
  EXPECT_EQ(f.i64("epochs"), 1);
  EXPECT_EQ(f.i64("gradient_accumulation_steps"), 1);
  EXPECT_EQ(f.str("compile"), "false");
  EXPECT_EQ(f.str("shuffle"), "true");
  EXPECT_EQ(f.str("dtype"), "fp32");
  EXPECT_EQ(f.str("device"), "cpu");
  EXPECT_TRUE(f.boolean("log_peak_memory_stats"));
  EXPECT_FALSE(f.has("max_steps_per_epoch"));
  EXPECT_FALSE(f.has("clip_grad_norm"));
  EXPECT_EQ(f.str("optimizer._component_"), "AdamW");
  EXPECT_DOUBLE_EQ(f.f64("optimizer.weight_decay"), 0.01);
  EXPECT_EQ(f.f64_list("optimizer.betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(f.str("loss._component_"), "cross_entropy");
  EXPECT_EQ(f.str("lr_scheduler._component_"), "constant");
  EXPECT_EQ(f.i64("lr_scheduler.num_warmup_steps"), 0);
  EXPECT_EQ(f.str("metric_logger._component_"), "disk");
  EXPECT_EQ(f.str("metric_logger.log_dir"), "/tmp/out/logs");
  EXPECT_EQ(f.str("checkpointer._component_"), "FullModelHFCheckpointer");
  EXPECT_EQ(f.str("checkpointer.output_dir"), "/tmp/out");
  EXPECT_EQ(f.bytes("checkpointer.max_shard_size"), 5000000000LL);
  EXPECT_EQ(f.str("dataset.split"), "train");
  EXPECT_FALSE(f.boolean("dataset.packed"));
  EXPECT_EQ(f.str("dataset.column"), "text");
  EXPECT_EQ(f.str("model.init"), "random");
  EXPECT_FALSE(f.has("profiler"));
  // The defaults validate too.
  EXPECT_NO_THROW(validate(f, full_finetune_schema()));
  // The input is unchanged.
  EXPECT_FALSE(c.has("seed"));
}

TEST(ConfigSchema, LoraSchemaAddsLoraKeys) {
  const char* lora_overrides = "model.lora_attn_modules=[q_proj,v_proj]";
  EXPECT_EQ(problems({lora_overrides, "model.lora_rank=16", "save_adapter_weights_only=true"},
                     lora_finetune_schema()),
            "");
  std::string msg = problems({lora_overrides}, full_finetune_schema());
  EXPECT_TRUE(contains(msg, "unknown config key 'model.lora_attn_modules'")) << msg;
  msg = problems({}, lora_finetune_schema());
  EXPECT_TRUE(contains(msg, "missing required config key 'model.lora_attn_modules'")) << msg;
  msg = problems(
      {"model.lora_attn_modules=[q_proj,o_proj]", "model.lora_dropout=1.0", "model.lora_rank=0"},
      lora_finetune_schema());
  EXPECT_TRUE(contains(msg,
                       "'model.lora_attn_modules[1]' must be one of q_proj, k_proj, v_proj, "
                       "output_proj; got 'o_proj'"))
      << msg;
  EXPECT_TRUE(contains(msg, "'model.lora_dropout' must be < 1, got 1.0")) << msg;
  EXPECT_TRUE(contains(msg, "'model.lora_rank' must be >= 1, got 0")) << msg;
  Config f = with_defaults(with({lora_overrides}), lora_finetune_schema());
  EXPECT_EQ(f.i64("model.lora_rank"), 8);
  EXPECT_DOUBLE_EQ(f.f64("model.lora_alpha"), 16);
  EXPECT_FALSE(f.boolean("model.use_dora"));
  EXPECT_FALSE(f.has("model.quantize_base"));  // the model builder decides
  EXPECT_FALSE(fusetune::lora_config_from(f).quantize_base);
  EXPECT_FALSE(f.boolean("save_adapter_weights_only"));
  EXPECT_EQ(problems({lora_overrides, "~model.init", "model.init=checkpoint", "~model.vocab_size",
                      "~model.hidden_size", "~model.intermediate_size", "~model.num_hidden_layers",
                      "~model.num_attention_heads", "~model.num_key_value_heads",
                      "checkpointer.checkpoint_dir=/m",
                      "checkpointer.adapter_checkpoint=adapter_model.safetensors"},
                     lora_finetune_schema()),
            "");
}

TEST(ConfigSchema, SchemasAreExtensible) {
  Schema s = full_finetune_schema();
  s.recipe = "my_recipe";
  s.add(Field::Int("beta_steps").def("3").min(0).doc("a new key"));
  s.field("optimizer").add(Field::Bool("foreach").def("false"));
  EXPECT_EQ(problems({"beta_steps=4", "optimizer.foreach=true"}, s), "");
  EXPECT_TRUE(contains(problems({"beta_steps=-1"}, s), "'beta_steps' must be >= 0"));
  EXPECT_TRUE(contains(problems({"beta_steps=4"}), "unknown config key 'beta_steps'"));
  EXPECT_EQ(with_defaults(with({}), s).i64("beta_steps"), 3);
  EXPECT_TRUE(
      contains(error_of([&] { s.field("optimizer.nope"); }), "has no key 'optimizer.nope'"));
  std::vector<std::string> paths = s.key_paths();
  EXPECT_NE(std::find(paths.begin(), paths.end(), "optimizer.momentum"), paths.end());
  EXPECT_NE(std::find(paths.begin(), paths.end(), "beta_steps"), paths.end());
}

TEST(ConfigSchema, CheckpointFileList) {
  Config c = Config::from_string(
      "a: {checkpoint_files: [x.safetensors, y.safetensors]}\n"
      "b: {checkpoint_files: {filename_format: 'model-{}-of-{}.safetensors', max_filename: "
      "\"00003\"}}\n"
      "c: {checkpoint_files: {filename_format: model.safetensors, max_filename: \"00003\"}}\n"
      "d: {}\n",
      "f.yaml");
  EXPECT_EQ(checkpoint_file_list(c.sub("a")),
            (std::vector<std::string>{"x.safetensors", "y.safetensors"}));
  EXPECT_EQ(checkpoint_file_list(c.sub("b")),
            (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                      "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors"}));
  EXPECT_TRUE(contains(error_of([&] { checkpoint_file_list(c.sub("c")); }), "two '{}'"));
  EXPECT_TRUE(checkpoint_file_list(c.sub("d")).empty());
  // Both forms validate.
  EXPECT_EQ(problems({"checkpointer={checkpoint_dir: /m, checkpoint_files: {filename_format: "
                      "'m-{}-of-{}.safetensors', max_filename: '00002'}}"}),
            "");
}

TEST(ConfigSchema, PastedTorchtuneConfigValidates) {
  // torchtune's llama3_2/1B_full_single_device.yaml with the choices fusetune has.
  const char* tt = R"(output_dir: /tmp/torchtune/llama3_2_1B/full_single_device
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Llama-3.2-1B-Instruct/tokenizer.json
  max_seq_len: null
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  source: /tmp/alpaca.json
  packed: False
seed: null
shuffle: True
model:
  _component_: torchtune.models.llama3_2.llama3_2_1b
checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  checkpoint_dir: /tmp/Llama-3.2-1B-Instruct/
  checkpoint_files: [
    model.safetensors
  ]
  recipe_checkpoint: null
  output_dir: ${output_dir}
  model_type: LLAMA3_2
resume_from_checkpoint: False
batch_size: 4
epochs: 1
optimizer:
  _component_: torch.optim.AdamW
  lr: 2e-5
  fused: True
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
max_steps_per_epoch: null
gradient_accumulation_steps: 1
optimizer_in_bwd: False
clip_grad_norm: null
compile: False
device: cpu
enable_activation_checkpointing: False
enable_activation_offloading: False
dtype: bf16
metric_logger:
  _component_: torchtune.training.metric_logging.DiskLogger
  log_dir: ${output_dir}/logs
log_every_n_steps: 1
log_peak_memory_stats: True
profiler:
  _component_: torchtune.training.setup_torch_profiler
  enabled: False
  output_dir: ${output_dir}/profiling_outputs
  cpu: True
  cuda: True
  profile_memory: False
  with_stack: False
  record_shapes: True
  with_flops: False
  wait_steps: 5
  warmup_steps: 3
  active_steps: 2
  num_cycles: 1
)";
  Config c = Config::from_string(tt, "torchtune.yaml");
  std::vector<std::string> warnings;
  EXPECT_NO_THROW(validate(c, full_finetune_schema(), &warnings));
  EXPECT_TRUE(warnings.empty());
  Config f = with_defaults(c, full_finetune_schema());
  EXPECT_EQ(f.str("checkpointer.output_dir"), "/tmp/torchtune/llama3_2_1B/full_single_device");
  EXPECT_EQ(f.str("optimizer._component_"), "AdamW");
  EXPECT_EQ(f.str("dataset._component_"), "alpaca");
  EXPECT_EQ(f.i64("seed"), 42);  // null = absent = the default
}
