#include "fusetune/config/components.h"

#include "fusetune/config/scalars.h"
#include "fusetune/config/yaml_tree.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

bool ends_with_str(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `path` of a tokenizer.json-based tokenizer must not point at another format's file.
void check_hf_tokenizer_path(const Config& tok, Problems& p) {
  if (!tok.has("path") || tok.is_map("path") || tok.is_list("path")) return;
  std::string path = tok.str("path");
  bool model = ends_with_str(path, ".model");
  bool vocab = ends_with_str(path, "vocab.json");
  if (model || vocab)
    p.errors.push_back("config key '" + tok.full_key("path") + "' is '" + path +
                       "', but the hf tokenizer reads a Hugging Face tokenizer.json (" +
                       (model ? "a .model file is tiktoken or SentencePiece: use _component_: "
                                "torchtune.models.llama3.llama3_tokenizer for Llama 3's tiktoken "
                                "file, sentencepiece for SentencePiece"
                              : "for vocab.json + merges.txt use _component_: "
                                "torchtune.models.qwen2_5.qwen2_5_tokenizer with merges_file") +
                       ") (" + tok.where("path") + ")");
}

// The keys bitsandbytes' AdamW8bit / PagedAdamW8bit take (torchtune passes them through):
// each is implemented or refused with the reason; none is silently ignored.
std::vector<Field> adamw8bit_fields(bool paged) {
  std::vector<Field> f = {
      Field::List("betas")
          .items(kFloat)
          .size(2)
          .def("[0.9, 0.999]")
          .doc("coefficients of the running averages of the gradient and its square"),
      Field::Float("eps").def("1e-8").min(0).doc("added to the denominator"),
      Field::Float("weight_decay").def("0.01").min(0).doc("decoupled weight decay"),
      Field::Int("min_8bit_size")
          .def("4096")
          .min(1)
          .doc("parameters with fewer elements keep fp32 moments (plain AdamW)"),
      Field::Bool("amsgrad").def("false").doc(
          "must be false: bitsandbytes' 8-bit AdamW has no AMSGrad (it ignores the flag)"),
      Field::Int("optim_bits")
          .def("32")
          .doc("bitsandbytes ignores it for the 8-bit classes (32 is its compatibility default): "
               "the state is 8-bit either way"),
      Field::Int("percentile_clipping")
          .def("100")
          .doc("must be 100 (off): percentile gradient clipping is not implemented; use "
               "clip_grad_norm"),
      Field::Bool("block_wise")
          .def("true")
          .doc("must be true: only block-wise (2048-element blocks) 8-bit state is implemented"),
  };
  // PagedAdamW8bit's constructor has no is_paged argument; AdamW8bit's has.
  if (!paged)
    f.push_back(Field::Bool("is_paged")
                    .def("false")
                    .doc("paged state (CUDA unified memory): no meaning on a CPU; true only logs a "
                         "warning"));
  return f;
}

// The keys bitsandbytes' 32-bit PagedAdamW takes: AdamW's, plus its Optimizer2State arguments,
// each accepted with its only meaning for 32-bit state or refused with the reason.
std::vector<Field> paged_adamw_fields() {
  return {
      Field::List("betas")
          .items(kFloat)
          .size(2)
          .def("[0.9, 0.999]")
          .doc("coefficients of the running averages of the gradient and its square"),
      Field::Float("eps").def("1e-8").min(0).doc("added to the denominator"),
      Field::Float("weight_decay").def("0.01").min(0).doc("decoupled weight decay"),
      Field::Bool("amsgrad").def("false").doc("must be false: AMSGrad is not implemented"),
      Field::Int("optim_bits")
          .def("32")
          .doc("must be 32 (fp32 moments); for 8-bit state use PagedAdamW8bit"),
      Field::Int("min_8bit_size").def("4096").min(1).doc("no effect with 32-bit state"),
      Field::Int("percentile_clipping")
          .def("100")
          .doc("must be 100 (off): percentile gradient clipping is not implemented; use "
               "clip_grad_norm"),
      Field::Bool("block_wise").def("true").doc("no effect with 32-bit state"),
  };
}

// The PagedAdamW values fusetune refuses, each with its reason.
void check_paged_adamw(const Config& opt, Problems& p) {
  auto refuse = [&](const char* key, const std::string& why) {
    p.errors.push_back("config key '" + opt.full_key(key) + "' is " + opt.str(key) + ": " + why +
                       " (" + opt.where(key) + ")");
  };
  if (opt.has("amsgrad") && opt.boolean("amsgrad"))
    refuse("amsgrad", "AMSGrad is not implemented; set it to false");
  if (opt.has("optim_bits") && opt.i64("optim_bits") != 32)
    refuse("optim_bits",
           "fusetune's PagedAdamW keeps 32-bit state; for 8-bit state use "
           "bitsandbytes.optim.PagedAdamW8bit");
  if (opt.has("percentile_clipping") && opt.i64("percentile_clipping") != 100)
    refuse("percentile_clipping",
           "percentile gradient clipping is not implemented; use 100 (off) and clip_grad_norm "
           "for gradient clipping");
}

// The values of those keys fusetune refuses, each with its reason.
void check_adamw8bit(const Config& opt, Problems& p) {
  if (!opt.has("_component_") || opt.is_map("_component_") || opt.is_list("_component_")) return;
  const std::string c = opt.str("_component_");
  bool eight_bit = false;
  for (const auto& comp : component_table("optimizer")->components) {
    if (comp.name == "PagedAdamW" && comp.matches(c)) return check_paged_adamw(opt, p);
    if ((comp.name == "AdamW8bit" || comp.name == "PagedAdamW8bit") && comp.matches(c))
      eight_bit = true;
  }
  if (!eight_bit) return;
  auto refuse = [&](const char* key, const std::string& why) {
    p.errors.push_back("config key '" + opt.full_key(key) + "' is " + opt.str(key) + ": " + why +
                       " (" + opt.where(key) + ")");
  };
  if (opt.has("amsgrad") && opt.boolean("amsgrad"))
    refuse("amsgrad",
           "bitsandbytes' 8-bit AdamW has no AMSGrad variant (bitsandbytes ignores the flag; "
           "fusetune refuses it rather than silently run without it); set it to false");
  if (opt.has("percentile_clipping") && opt.i64("percentile_clipping") != 100)
    refuse("percentile_clipping",
           "percentile gradient clipping is not implemented; use 100 (off) and clip_grad_norm "
           "for gradient clipping");
  if (opt.has("block_wise") && !opt.boolean("block_wise"))
    refuse("block_wise",
           "only block-wise 8-bit state (2048-element blocks, one absmax each) is implemented, "
           "not one absmax per tensor; set it to true");
  if (opt.has("state_dtype") && opt.str("state_dtype") == "bf16")
    refuse("state_dtype",
           "the 8-bit classes store their moments in 8 bits (parameters below min_8bit_size keep "
           "fp32 moments), so bf16 state has no meaning; remove the key or set it to fp32");
  if (opt.has("optim_bits") && opt.i64("optim_bits") != 8 && opt.i64("optim_bits") != 32)
    refuse("optim_bits",
           "the 8-bit classes keep 8-bit state whatever optim_bits says (bitsandbytes ignores "
           "it; 32 is its default); only 8 or 32 are accepted");
}

// torchtune's tokenizer keys that fusetune does not implement are refused with the reason
// (none is accepted and ignored).
void check_tokenizer_keys(const Config& tok, const std::string& comp, const std::string& raw,
                          Problems& p) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    p.errors.push_back("config key '" + tok.full_key(key) + "' is not supported: " + why + " (" +
                       tok.where(key) + ")");
  };
  const bool spm = comp == "sentencepiece";
  // torchtune's default template of llama2_tokenizer / mistral_tokenizer is what fusetune's
  // llama2 / mistral chat formats write.
  const std::string spm_template = raw == "torchtune.models.mistral.mistral_tokenizer"
                                       ? "torchtune.models.mistral.MistralChatTemplate"
                                   : raw == "torchtune.models.llama2.llama2_tokenizer"
                                       ? "torchtune.models.llama2.Llama2ChatTemplate"
                                       : "";
  const YAML::Node pt = tok.node("prompt_template");
  if (pt.IsDefined() && pt.IsNull() && spm && !spm_template.empty()) {
    refuse("prompt_template",
           "null (no template) differs from " + spm_template +
               ", torchtune's default, which fusetune's chat formats for Llama 2 / Mistral always "
               "write; remove the key");
  } else if (pt.IsDefined() && !pt.IsNull()) {
    const bool is_default = pt.IsScalar() && !spm_template.empty() && pt.Scalar() == spm_template;
    if (!is_default)
      refuse("prompt_template",
             "fusetune does not apply a tokenizer-level prompt template; prompts are formatted by "
             "the dataset (dataset.template for instruct data; chat data use the model's chat "
             "format). Set it to null or remove it");
  }
  if (tok.has("truncation_type") && !tok.is_map("truncation_type") &&
      !tok.is_list("truncation_type")) {
    const std::string t = tok.str("truncation_type");
    if (t == "left")
      refuse("truncation_type",
             "left truncation (keeping the end of an over-long sample) is not implemented; "
             "fusetune truncates on the right, torchtune's default");
    else if (t != "right")
      p.errors.push_back("config key '" + tok.full_key("truncation_type") +
                         "' must be right (or left, which is not supported), got '" + t + "' (" +
                         tok.where("truncation_type") + ")");
  }
  if (comp != "qwen2" && comp != "qwen2_5" && comp != "qwen3") return;
  if (tok.has("bpe_cache_size"))
    refuse("bpe_cache_size",
           "fusetune's BPE word cache has a fixed size (it never changes token ids); remove the "
           "key");
  if (tok.has("errors") && !tok.is_map("errors") && !tok.is_list("errors") &&
      tok.str("errors") != "replace")
    refuse("errors", "decoding always replaces invalid UTF-8 with U+FFFD (errors: replace)");
  if (tok.has("path") && !tok.is_map("path") && !tok.is_list("path")) {
    const std::string path = tok.str("path");
    if (ends_with_str(path, ".json") && !ends_with_str(path, "tokenizer.json") &&
        !tok.has("merges_file"))
      p.errors.push_back("config key '" + tok.full_key("path") + "' is '" + path +
                         "', a vocab.json, which needs '" + tok.full_key("merges_file") +
                         "' (the merges.txt beside it) (" + tok.where("path") + ")");
  }
}

// The optimizers (optim/).
ComponentTable optimizer_table() {
  return {
      "optimizer",
      {Component("AdamW", {"torch.optim.AdamW"}, "Adam with decoupled weight decay",
                 {Field::List("betas")
                      .items(kFloat)
                      .size(2)
                      .def("[0.9, 0.999]")
                      .doc("coefficients of the running averages of the gradient and "
                           "its square"),
                  Field::Float("eps").def("1e-8").min(0).doc("added to the denominator"),
                  Field::Float("weight_decay").def("0.01").min(0).doc("decoupled weight decay")}),
       Component("AdamW8bit", {"bitsandbytes.optim.AdamW8bit"},
                 "AdamW with both moments stored block-wise quantized to 8 bits (bitsandbytes)",
                 adamw8bit_fields(false)),
       Component("PagedAdamW8bit", {"bitsandbytes.optim.PagedAdamW8bit"},
                 "AdamW8bit; paging (CUDA unified memory) has no meaning on a CPU and is not "
                 "done (a warning says so)",
                 adamw8bit_fields(true)),
       Component("PagedAdamW",
                 {"bitsandbytes.optim.PagedAdamW", "bitsandbytes.optim.PagedAdamW32bit"},
                 "AdamW (bitsandbytes' paged 32-bit AdamW); paging (CUDA unified memory) has no "
                 "meaning on a CPU and is not done (a warning says so)",
                 paged_adamw_fields()),
       Component("SGD", {"torch.optim.SGD"}, "stochastic gradient descent",
                 {Field::Float("momentum").def("0.0").min(0).doc("momentum factor"),
                  Field::Float("weight_decay")
                      .def("0.0")
                      .min(0)
                      .doc("L2 penalty added to the gradient")})},
      ""};
}

// The learning-rate schedules (optim/lr_schedule.h).
ComponentTable lr_scheduler_table() {
  return {"lr_scheduler",
          {Component("cosine_with_warmup",
                     {"torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                      "torchtune.training.get_cosine_schedule_with_warmup",
                      "torchtune.modules.get_cosine_schedule_with_warmup"},
                     "linear warmup, then cosine decay to 0",
                     {Field::Float("num_cycles")
                          .def("0.5")
                          .min(0)
                          .doc("number of cosine waves (0.5 = decay from lr to 0 once)")}),
           Component("linear_with_warmup", {}, "linear warmup, then linear decay to 0"),
           Component("constant", {}, "linear warmup, then the constant lr")},
          "constant"};
}

// The training losses: cross-entropy, and the DPO recipes' preference losses.
ComponentTable loss_table() {
  return {
      "loss",
      {Component("cross_entropy",
                 {"torchtune.modules.loss.CEWithChunkedOutputLoss",
                  "torchtune.modules.loss.LinearCrossEntropyLoss", "torch.nn.CrossEntropyLoss"},
                 "mean token cross-entropy, labels -100 ignored",
                 {Field::Int("num_output_chunks")
                      .ignore("fusetune chooses the chunking of the fused loss itself"),
                  Field::Int("ignore_index")
                      .values({"-100"})
                      .doc("label id that is not trained on (always -100)")}),
       // Preference losses (losses/preference.h): the DPO recipes only. torchtune's names,
       // and the TRL loss_type names that compute the same loss (sigmoid, hinge, simpo), are
       // aliases. TRL's `ipo` is not IPOLoss: TRL divides each sequence's log-probs by its
       // length for ipo, torchtune's IPOLoss sums them.
       Component("DPOLoss",
                 {"torchtune.rlhf.loss.DPOLoss", "torchtune.modules.rlhf.loss.DPOLoss", "sigmoid"},
                 "direct preference optimization against a reference model",
                 {Field::Float("beta").def("0.1").min(0).doc("temperature of the reward"),
                  Field::Float("label_smoothing")
                      .def("0.0")
                      .min(0)
                      .max(0.5)
                      .doc("assumed share of flipped preference labels (conservative DPO)")}),
       Component("RSOLoss",
                 {"torchtune.rlhf.loss.RSOLoss", "torchtune.modules.rlhf.loss.RSOLoss", "hinge"},
                 "hinge loss on the reward margin (statistical rejection sampling)",
                 {Field::Float("gamma").def("0.1").min(0).doc("scale of the margin")}),
       Component("IPOLoss", {"torchtune.rlhf.loss.IPOLoss", "torchtune.modules.rlhf.loss.IPOLoss"},
                 "identity preference optimization: squared distance to a target margin",
                 {Field::Float("tau").def("0.1").min(0).doc("regularization: margin 1/(2 tau)")}),
       Component(
           "SimPOLoss",
           {"torchtune.rlhf.loss.SimPOLoss", "torchtune.modules.rlhf.loss.SimPOLoss", "simpo"},
           "reference-free, length-normalized preference loss",
           {Field::Float("beta").def("2.0").min(0).doc("scale of the reward"),
            Field::Float("gamma").def("0.5").min(0).doc("target reward margin"),
            Field::Float("label_smoothing")
                .def("0.0")
                .min(0)
                .max(0.5)
                .doc("assumed share of flipped preference labels")}),
       // ORPO has no torchtune class; TRL runs it as its own trainer (ORPOTrainer), whose
       // ORPOConfig.beta is this beta.
       Component("ORPOLoss", {"orpo"},
                 "reference-free: the chosen answer's NLL plus an odds-ratio preference term",
                 {Field::Float("beta").def("0.1").min(0).doc(
                     "weight of the odds-ratio term (the paper's lambda)")}),
       // KTO: TRL's KTOTrainer (its KTOConfig keys), on paired data split into a desirable
       // (chosen) and an undesirable (rejected) example.
       Component("KTOLoss", {"kto"},
                 "Kahneman-Tversky optimization: each answer against a KL reference point",
                 {Field::Float("beta").def("0.1").min(0).doc("temperature of the reward"),
                  Field::Float("desirable_weight")
                      .def("1.0")
                      .min(0)
                      .doc("weight of the chosen (desirable) answers' losses"),
                  Field::Float("undesirable_weight")
                      .def("1.0")
                      .min(0)
                      .doc("weight of the rejected (undesirable) answers' losses")}),
       // PPO's loss (losses/ppo.h): ppo_full_finetune_single_device only.
       Component("PPOLoss", {"torchtune.rlhf.loss.PPOLoss", "torchtune.modules.rlhf.loss.PPOLoss"},
                 "PPO: the clipped policy ratio times the whitened GAE advantage, plus "
                 "value_coeff times the clipped value loss",
                 {Field::Float("epsilon").def("0.1").min(0).max(1, true).doc(
                      "the ratio is clipped to [1 - epsilon, 1 + epsilon]"),
                  Field::Float("value_clip_range")
                      .def("0.2")
                      .min(0)
                      .doc("a value may move this far from the rollout's before it is clipped"),
                  Field::Float("value_coeff").def("0.1").min(0).doc("weight of the value loss")}),
       // GRPO's policy losses (losses/grpo.h): the GRPO recipes only. torchtune's dev
       // GRPOSimpleLoss, and TRL's GRPOTrainer loss with its GRPOConfig keys.
       Component(
           "GRPOSimpleLoss", {"torchtune.dev.grpo.loss.GRPOSimpleLoss"},
           "torchtune's GRPO loss: clipped ratio times the group advantage, k3 KL penalty, "
           "each completion's mean over its tokens",
           {Field::Float("kl_coeff")
                .def("0.1")
                .min(0)
                .doc("weight of the KL penalty against the reference (0: no reference loaded)"),
            Field::Float("epsilon").def("0.1").min(0).max(1, true).doc(
                "the ratio is clipped to [1 - epsilon, 1 + epsilon]")}),
       Component("GRPOLoss", {}, "TRL's GRPOTrainer loss: loss_type grpo, bnpo, dr_grpo or dapo",
                 {Field::Enum("loss_type", {"grpo", "bnpo", "dr_grpo", "dapo"})
                      .def("grpo")
                      .doc("the normalization: per completion (grpo), per micro-batch token "
                           "(bnpo), by max_generated_tokens (dr_grpo), per step token (dapo)"),
                  Field::Float("beta").def("0.0").min(0).doc(
                      "weight of the k3 KL penalty (0: no reference loaded)"),
                  Field::Float("epsilon").def("0.2").min(0).max(1, true).doc(
                      "the ratio is clipped below at 1 - epsilon"),
                  Field::Float("epsilon_high")
                      .min(0)
                      .doc("the ratio is clipped above at 1 + epsilon_high (default epsilon)")})},
      "cross_entropy"};
}

// Where weights are read and written.
ComponentTable checkpointer_table() {
  return {
      "checkpointer",
      {Component(
          "FullModelHFCheckpointer",
          {"torchtune.training.FullModelHFCheckpointer", "torchtune.utils.FullModelHFCheckpointer"},
          "Hugging Face checkpoint directory (config.json + safetensors)",
          {Field::String("checkpoint_dir")
               .req()
               .doc("directory holding config.json and the weights"),
           Field::List("checkpoint_files")
               .also(kMap)
               .items(kString)
               .doc("weight files in checkpoint_dir (a list, or torchtune's "
                    "{filename_format, max_filename}); default: all "
                    "*.safetensors"),
           Field::Enum("model_type",
                       {"LLAMA2", "LLAMA3", "LLAMA3_2",  "MISTRAL",     "QWEN2", "QWEN3",   "GEMMA",
                        "GEMMA2", "GEMMA3", "PHI3_MINI", "PHI4",        "llama", "mistral", "qwen2",
                        "qwen3",  "gemma",  "gemma2",    "gemma3_text", "phi3",  "REWARD"})
               .doc("architecture family (also read from config.json); REWARD: a sequence "
                    "classifier with one score (a reward or value model; a causal LM "
                    "checkpoint gets a fresh score head)"),
           Field::String("output_dir").def("${output_dir}").doc("where checkpoints are written"),
           Field::String("recipe_checkpoint")
               .doc("recipe_state file to resume from (default: the latest "
                    "in output_dir)"),
           Field::Bytes("max_shard_size")
               .def("5GB")
               .doc("largest safetensors shard written (bytes or \"5GB\")"),
           Field::Enum("save_dtype", {"fp32", "bf16"})
               .doc("dtype of saved weights (default: the training dtype)"),
           Field::Bool("safe_serialization")
               .values({"true"})
               .doc("always true: fusetune writes safetensors only")})},
      "FullModelHFCheckpointer"};
}

// Text to token ids.
ComponentTable tokenizer_table() {
  // Tokenizers: fusetune's names, and torchtune's builders as aliases. Every key torchtune's
  // builders take is either honoured or refused by check_tokenizer_keys() with the reason.
  auto special_tokens_path = [] {
    return Field::String("special_tokens_path")
        .doc("a tokenizer.json whose added_tokens replace the built-in special tokens");
  };
  auto tokenizer_torchtune_keys = [](std::vector<Field> f) {
    f.push_back(Field::String("prompt_template")
                    .also(kMap)
                    .doc("torchtune's prompt template: only null (fusetune formats prompts in "
                         "the dataset: dataset.template, chat formats)"));
    f.push_back(Field::String("truncation_type")
                    .def("right")
                    .doc("right: over-long samples keep their beginning (left is not supported)"));
    return f;
  };
  auto qwen_fields = [&] {
    std::vector<Field> f = {
        Field::String("path").req().doc("vocab.json (with merges_file), or a tokenizer.json"),
        Field::String("merges_file").doc("merges.txt, with a vocab.json path"),
        special_tokens_path(),
        Field::String("bos_token").doc("special token used as BOS (default: none)"),
        Field::String("eos_token").doc("special token used as EOS (default: <|im_end|>)"),
        Field::String("pad_token").doc("special token used as PAD (default: <|endoftext|>)"),
        Field::String("unk_token")
            .doc("special token for unknown tokens (none occur: every byte is a token)"),
        Field::String("errors").doc("decoding of invalid UTF-8: replace only (U+FFFD)"),
        Field::Int("bpe_cache_size").doc("not supported: fusetune's BPE cache has a fixed size")};
    return tokenizer_torchtune_keys(std::move(f));
  };
  return {
      "tokenizer",
      {Component("byte", {}, "UTF-8 bytes, ids 0..255 + BOS/EOS/PAD (needs no file)"),
       Component("hf", {}, "Hugging Face tokenizer.json",
                 {Field::String("path").req().doc("the tokenizer.json file")}),
       Component(
           "llama3", {"torchtune.models.llama3.llama3_tokenizer"},
           "Llama 3 (3.1, 3.2, 3.3): tiktoken original/tokenizer.model, or tokenizer.json",
           tokenizer_torchtune_keys({Field::String("path").req().doc(
                                         "the tiktoken tokenizer.model (or a tokenizer.json)"),
                                     special_tokens_path()})),
       Component("qwen2_5", {"torchtune.models.qwen2_5.qwen2_5_tokenizer"},
                 "Qwen2.5: vocab.json + merges.txt (or tokenizer.json)", qwen_fields()),
       Component("qwen2", {"torchtune.models.qwen2.qwen2_tokenizer"},
                 "Qwen2: vocab.json + merges.txt (or tokenizer.json)", qwen_fields()),
       Component("qwen3", {"torchtune.models.qwen3.qwen3_tokenizer"},
                 "Qwen3: vocab.json + merges.txt (or tokenizer.json); <think> is special",
                 qwen_fields()),
       Component(
           "phi3_mini", {"torchtune.models.phi3.phi3_mini_tokenizer"},
           "Phi-3 (mini): SentencePiece tokenizer.model with Phi-3's added tokens "
           "32000..32010",
           tokenizer_torchtune_keys({Field::String("path").req().doc("the tokenizer.model file")})),
       Component(
           "phi4", {"torchtune.models.phi4.phi4_tokenizer"},
           "Phi-4: byte-level BPE vocab.json + merges.txt with Phi-4's special tokens",
           tokenizer_torchtune_keys({Field::String("vocab_path").req().doc("the vocab.json file"),
                                     Field::String("merges_path").req().doc("the merges.txt file"),
                                     special_tokens_path()})),
       Component(
           "sentencepiece",
           {"torchtune.models.llama2.llama2_tokenizer",
            "torchtune.models.mistral.mistral_tokenizer", "torchtune.models.gemma.gemma_tokenizer"},
           "SentencePiece tokenizer.model (Llama 2, Mistral, Gemma)",
           tokenizer_torchtune_keys(
               {Field::String("path").req().doc("the tokenizer.model file")}))},
      ""};
}

// Training (and validation) data.
ComponentTable dataset_table() {
  auto column_map = [] {
    return Field::Map("column_map").doc("renames the dataset's columns: {ours: theirs}");
  };
  auto train_on_input = [](const char* def) {
    return Field::Bool("train_on_input").def(def).doc("also train on prompt tokens");
  };
  return {
      "dataset",
      {Component("text_completion", {"torchtune.datasets.text_completion_dataset"},
                 "plain text, trained on every token",
                 {Field::String("column").def("text").doc("text column of a json/jsonl source"),
                  Field::Bool("add_eos").def("true").doc(
                      "append the tokenizer's EOS to each document (torchtune's; false for "
                      "prompts a model continues, as torchtune's PPO configs)")}),
       Component("pretokenized", {}, "token ids already computed (jsonl of id lists)",
                 {Field::String("column").def("input_ids").doc("column holding the ids")}),
       Component("alpaca",
                 {"torchtune.datasets.alpaca_dataset", "torchtune.datasets.alpaca_cleaned_dataset"},
                 "instruction/input/output records in the Alpaca prompt format",
                 {column_map(), train_on_input("true")}),
       Component("instruct", {"torchtune.datasets.instruct_dataset"},
                 "input/output records with an optional prompt template",
                 {column_map(), train_on_input("false"),
                  Field::String("template").doc("prompt template around the input"),
                  Field::String("new_system_prompt").doc("system prompt added to each sample")}),
       Component("chat", {"torchtune.datasets.chat_dataset"}, "multi-turn conversations",
                 {column_map(), train_on_input("false"),
                  Field::String("conversation_column")
                      .def("conversations")
                      .doc("column holding the list of messages"),
                  Field::Enum("conversation_style", {"openai", "sharegpt"})
                      .req()
                      .doc("openai: {role, content}; sharegpt: {from, value}"),
                  Field::String("new_system_prompt").doc("system prompt added to each sample")}),
       Component("preference", {"torchtune.datasets.preference_dataset"},
                 "prompt + chosen + rejected answers (the DPO recipes only)",
                 {column_map(), train_on_input("false"),
                  Field::Enum("conversation_style", {"auto", "openai", "sharegpt"})
                      .def("auto")
                      .doc("turn layout: openai {role, content}, sharegpt {from, value}"),
                  Field::String("template")
                      .doc("chat format of prompt and answers: auto (the model's, from its "
                           "model_type or tokenizer), or a name (plain: no chat tokens)"),
                  Field::String("new_system_prompt").doc("system prompt added to each sample")}),
       // TRL's unpaired preference rows (its KTOTrainer's dataset type), for KTOLoss.
       Component("unpaired_preference", {},
                 "prompt + completion + label (true: desirable) rows, TRL's unpaired format "
                 "(the DPO recipes with KTOLoss only)",
                 {column_map(), train_on_input("false"),
                  Field::Enum("conversation_style", {"auto", "openai", "sharegpt"})
                      .def("auto")
                      .doc("turn layout: openai {role, content}, sharegpt {from, value}"),
                  Field::String("new_system_prompt").doc("system prompt added to each sample")}),
       Component(
           "gsm8k",
           {"torchtune.dev.grpo.gsm8k.gsm8k_dataset", "torchtune.dev.grpo.data.gsm8k_dataset"},
           "question (+ answer) rows as prompts to generate from (the GRPO recipes only)",
           {column_map(),
            Field::String("partition")
                .doc("torchtune's 'a-b/n': parts a..b (from 0) of the split cut into n"),
            Field::String("prompt_template")
                .doc("the prompt around {question} (default: a reasoning prompt asking "
                     "for <think>/<answer> tags and the number after ####)")})},
      ""};
}

// Quantization-aware training's schemes.
ComponentTable quantizer_table() {
  // torchao's QAT quantizers (quant/qat.h) under torchtune's and torchao's names, and
  // llama.cpp's formats.
  return {
      "quantizer",
      {Component("Int8DynActInt4WeightQATQuantizer",
                 {"torchtune.training.quantization.Int8DynActInt4WeightQATQuantizer",
                  "torchao.quantization.qat.Int8DynActInt4WeightQATQuantizer"},
                 "int8 dynamic per-token activations, int4 symmetric per-group weights (torchao)",
                 {Field::Int("groupsize")
                      .def("256")
                      .min(1)
                      .doc("weights per quantization group along a row (the input dim)"),
                  Field::Bool("padding_allowed")
                      .def("false")
                      .values({"false"})
                      .doc("must be false: a layer whose rows are not whole groups is refused "
                           "(torchao would leave it unquantized)")}),
       Component("Int4WeightOnlyQATQuantizer",
                 {"torchtune.training.quantization.Int4WeightOnlyQATQuantizer",
                  "torchao.quantization.qat.Int4WeightOnlyQATQuantizer"},
                 "int4 (uint4 with a float zero point) per-group weights, bf16 scales (torchao)",
                 {Field::Int("groupsize")
                      .def("256")
                      .values({"32", "64", "128", "256"})
                      .doc("weights per quantization group along a row (the input dim)"),
                  Field::Int("inner_k_tiles")
                      .def("8")
                      .values({"2", "4", "8"})
                      .doc("the packing of torchao's tinygemm int4 kernel: checked as torchao "
                           "does, no effect on the numbers (there is no int4 kernel here)")}),
       Component("gguf_q4_0", {},
                 "llama.cpp Q4_0 weights (blocks of 32, fp16 scale), Q8_0 activations; "
                 "embedding and head as llama-quantize's defaults (quant/qat.h)"),
       Component("gguf_q8_0", {},
                 "llama.cpp Q8_0 weights and activations, embedding and head Q8_0")},
      ""};
}

// Where step metrics go.
ComponentTable metric_logger_table() {
  auto log_dir = [] {
    return Field::String("log_dir").def("${output_dir}/logs").doc("where log files go");
  };
  return {"metric_logger",
          {Component("stdout",
                     {"torchtune.training.metric_logging.StdoutLogger",
                      "torchtune.utils.metric_logging.StdoutLogger"},
                     "the step line on stdout only"),
           Component("disk",
                     {"torchtune.training.metric_logging.DiskLogger",
                      "torchtune.utils.metric_logging.DiskLogger"},
                     "the step lines in a text file", {log_dir()}),
           Component("jsonl", {}, "one JSON object per step", {log_dir()}),
           Component("tensorboard",
                     {"torchtune.training.metric_logging.TensorBoardLogger",
                      "torchtune.utils.metric_logging.TensorBoardLogger"},
                     "TensorBoard event files", {log_dir()})},
          "stdout"};
}

// Knowledge distillation's divergences (losses/distillation.h): torchtune's KD losses (the
// chunked variants compute the same loss) and TRL's generalized JSD.
ComponentTable kd_loss_table() {
  auto common = [](std::vector<Field> more) {
    std::vector<Field> f = {Field::Int("num_output_chunks")
                                .ignore("fusetune chooses the chunking of the fused loss itself"),
                            Field::Int("ignore_index")
                                .values({"-100"})
                                .doc("label id that is not trained on (always -100)"),
                            Field::Float("temperature")
                                .def("1.0")
                                .min(0)
                                .doc("divides both models' logits before the softmaxes (> 0)")};
    for (auto& m : more) f.push_back(std::move(m));
    return f;
  };
  return {"kd_loss",
          {Component("ForwardKLLoss",
                     {"torchtune.modules.loss.ForwardKLLoss",
                      "torchtune.modules.loss.ForwardKLWithChunkedOutputLoss"},
                     "-sum p_teacher log p_student per token (torchtune's forward KL: KL(teacher "
                     "|| student) without the teacher's entropy)",
                     common({})),
           Component("ReverseKLLoss",
                     {"torchtune.modules.loss.ReverseKLLoss",
                      "torchtune.modules.loss.ReverseKLWithChunkedOutputLoss"},
                     "KL(student || teacher) per token", common({})),
           Component("GeneralizedJSDLoss", {"generalized_jsd"},
                     "beta KL(teacher || m) + (1 - beta) KL(student || m), m the beta-mixture "
                     "(TRL's GKD); beta 0 is forward KL, 1 reverse KL",
                     common({Field::Float("beta").def("0.5").min(0).max(1).doc(
                         "weight of the teacher in the mixture")}))},
          "ForwardKLLoss"};
}

std::vector<ComponentTable> build_tables() {
  std::vector<ComponentTable> t = {optimizer_table(), lr_scheduler_table(), loss_table(),
                                   checkpointer_table()};
  // full_dpo_single_device's frozen reference model is read the same way.
  ComponentTable ref = t.back();
  ref.section = "ref_checkpointer";
  t.push_back(std::move(ref));
  // knowledge_distillation_single_device's frozen teacher too.
  ComponentTable teacher = t.back();
  teacher.section = "teacher_checkpointer";
  t.push_back(std::move(teacher));
  // PPO's frozen reference, its value model (trained) and reward model (frozen).
  for (const char* section :
       {"ref_policy_checkpointer", "value_checkpointer", "reward_checkpointer"}) {
    ComponentTable c = t.back();
    c.section = section;
    t.push_back(std::move(c));
  }
  t.push_back(kd_loss_table());
  t.push_back(tokenizer_table());
  t.push_back(dataset_table());
  // dataset_val (validation during training) takes the same components as dataset.
  ComponentTable val = t.back();
  val.section = "dataset_val";
  t.push_back(std::move(val));
  t.push_back(quantizer_table());
  t.push_back(metric_logger_table());
  return t;
}

// Keys every map of a section has, whatever its component.
std::vector<Field> common_fields(const std::string& section) {
  if (section == "optimizer")
    return {Field::Float("lr").req().min(0).doc("learning rate"),
            Field::Bool("fused").doc("accepted for torchtune configs; fusetune's optimizer step "
                                     "is always one fused loop"),
            Field::Enum("state_dtype", {"fp32", "bf16"})
                .def("fp32")
                .doc("dtype of the optimizer state (AdamW's moments, SGD's momentum buffer); bf16 "
                     "halves its memory (computed in fp32, stored with stochastic rounding). "
                     "AdamW8bit: must be fp32 (its moments are 8-bit)")};
  if (section == "lr_scheduler")
    return {Field::Int("num_warmup_steps").def("0").min(0).doc("steps of linear warmup from 0")};
  if (section == "tokenizer")
    return {Field::Int("max_seq_len").min(1).doc("truncate tokenized samples to this length")};
  if (section == "dataset" || section == "dataset_val")
    return {Field::String("source").req().doc(
                "a local file (.txt, .json, .jsonl); or, as in torchtune, a loader name "
                "(text, json) with data_files"),
            Field::String("data_files")
                .also(kList)
                .items(kString)
                .doc("file(s) for a loader-name source"),
            Field::String("split").def("train").doc("split of the source to use"),
            Field::Bool("packed").def("false").doc("pack samples into full max_seq_len rows"),
            Field::Int("max_seq_len").min(1).doc("truncate/pack samples to this length"),
            Field::Enum("on_bad_row", {"error", "skip"})
                .def("error")
                .doc("what to do with a malformed record")};
  return {};
}

}  // namespace

Component::Component(std::string name_, std::vector<std::string> aliases_, std::string help_)
    : Component(std::move(name_), std::move(aliases_), std::move(help_), std::vector<Field>{}) {}

Component::Component(std::string name_, std::vector<std::string> aliases_, std::string help_,
                     std::vector<Field> fields_)
    : name(std::move(name_)),
      aliases(std::move(aliases_)),
      help(std::move(help_)),
      fields(std::move(fields_)) {}

bool Component::matches(const std::string& value) const {
  if (value == name) return true;
  for (const auto& a : aliases)
    if (value == a) return true;
  return false;
}

const std::vector<ComponentTable>& component_tables() {
  static const std::vector<ComponentTable> tables = build_tables();
  return tables;
}

const ComponentTable* component_table(const std::string& section) {
  for (const auto& t : component_tables())
    if (t.section == section) return &t;
  return nullptr;
}

std::string not_an_alias(const std::string& section, const std::string& value) {
  if (section == "loss" && value == "ipo")
    return "TRL's loss_type ipo is IPO on each answer's log-probs averaged over its tokens, "
           "while IPOLoss (torchtune's) sums them: another loss, not an alias of IPOLoss";
  return "";
}

Field component_section(const std::string& section, std::vector<Field> common) {
  const ComponentTable* t = component_table(section);
  FT_CHECK(t, "no component table for config section '" + section + "'");
  std::vector<Field> fields = common_fields(section);
  for (auto& f : common) fields.push_back(std::move(f));
  Field f = Field::Section(section, std::move(fields), t->components);
  f.default_component = t->default_component;
  if (section == "optimizer")
    f.check([](const Config& opt, const Config&, Problems& p) { check_adamw8bit(opt, p); });
  if (section == "tokenizer") {
    f.check([](const Config& tok, const Config&, Problems& p) {
      if (!tok.has("_component_") || tok.is_map("_component_") || tok.is_list("_component_"))
        return;
      const std::string raw = tok.str("_component_");
      std::string comp;
      for (const auto& c : component_table("tokenizer")->components)
        if (c.matches(raw)) comp = c.name;
      if (comp == "hf") check_hf_tokenizer_path(tok, p);
      check_tokenizer_keys(tok, comp, raw, p);
    });
  }
  return f;
}

std::vector<std::string> checkpoint_file_list(const Config& ckpt) {
  if (!ckpt.has("checkpoint_files")) return {};
  if (!ckpt.is_map("checkpoint_files")) return ckpt.str_list("checkpoint_files");
  Config spec = ckpt.sub("checkpoint_files");
  std::string format = spec.str("filename_format");
  std::string max_name = spec.str("max_filename");
  auto count = parse_int(max_name);
  FT_CHECK(count && *count >= 1 && *count <= 100000,
           "config key '" + spec.full_key("max_filename") +
               "' must be a file count such as \"00004\", got '" + max_name + "' (" +
               spec.where("max_filename") + ")");
  size_t first = format.find("{}");
  size_t second = first == std::string::npos ? first : format.find("{}", first + 2);
  FT_CHECK(second != std::string::npos,
           "config key '" + spec.full_key("filename_format") +
               "' must contain two '{}' (file number and count), got '" + format + "' (" +
               spec.where("filename_format") + ")");
  std::vector<std::string> files;
  for (int64_t i = 1; i <= *count; ++i) {
    std::string num = std::to_string(i);
    if (num.size() < max_name.size()) num.insert(0, max_name.size() - num.size(), '0');
    files.push_back(format.substr(0, first) + num + format.substr(first + 2, second - first - 2) +
                    max_name + format.substr(second + 2));
  }
  return files;
}

}  // namespace fusetune
