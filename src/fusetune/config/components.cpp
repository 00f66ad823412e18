#include "fusetune/config/components.h"

#include "fusetune/config/scalars.h"
#include "fusetune/config/yaml_tree.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

// `path` of a tokenizer.json-based tokenizer must not point at another format's file.
void check_hf_tokenizer_path(const Config& tok, const Config&, Problems& p) {
  if (!tok.has("path") || tok.is_map("path") || tok.is_list("path")) return;
  std::string path = tok.str("path");
  bool spm = path.size() >= 6 && path.compare(path.size() - 6, 6, ".model") == 0;
  bool vocab = path.size() >= 10 && path.compare(path.size() - 10, 10, "vocab.json") == 0;
  if (spm || vocab)
    p.errors.push_back("config key '" + tok.full_key("path") + "' is '" + path +
                       "', but the hf tokenizer reads a Hugging Face tokenizer.json (" +
                       (spm ? "a .model file is SentencePiece or tiktoken: use _component_: "
                              "sentencepiece for SentencePiece, or point path at tokenizer.json"
                            : "point path at the tokenizer.json beside vocab.json") +
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

// The values of those keys fusetune refuses, each with its reason.
void check_adamw8bit(const Config& opt, Problems& p) {
  if (!opt.has("_component_") || opt.is_map("_component_") || opt.is_list("_component_")) return;
  const std::string c = opt.str("_component_");
  bool eight_bit = false;
  for (const auto& comp : component_table("optimizer")->components)
    if ((comp.name == "AdamW8bit" || comp.name == "PagedAdamW8bit") && comp.matches(c))
      eight_bit = true;
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
  if (opt.has("optim_bits") && opt.i64("optim_bits") != 8 && opt.i64("optim_bits") != 32)
    refuse("optim_bits",
           "the 8-bit classes keep 8-bit state whatever optim_bits says (bitsandbytes ignores "
           "it; 32 is its default); only 8 or 32 are accepted");
}

std::vector<ComponentTable> build_tables() {
  std::vector<ComponentTable> t;

  t.push_back(
      {"optimizer",
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
        Component("SGD", {"torch.optim.SGD"}, "stochastic gradient descent",
                  {Field::Float("momentum").def("0.0").min(0).doc("momentum factor"),
                   Field::Float("weight_decay")
                       .def("0.0")
                       .min(0)
                       .doc("L2 penalty added to the gradient")})},
       ""});

  t.push_back({"lr_scheduler",
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
               "constant"});

  t.push_back(
      {"loss",
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
        // and TRL's loss_type names, are aliases.
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
        Component("IPOLoss",
                  {"torchtune.rlhf.loss.IPOLoss", "torchtune.modules.rlhf.loss.IPOLoss", "ipo"},
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
                 .doc("assumed share of flipped preference labels")})},
       "cross_entropy"});

  t.push_back(
      {"checkpointer",
       {Component(
           "FullModelHFCheckpointer",
           {"torchtune.training.FullModelHFCheckpointer",
            "torchtune.utils.FullModelHFCheckpointer"},
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
            Field::Enum("model_type", {"LLAMA2", "LLAMA3", "LLAMA3_2", "MISTRAL", "QWEN2", "llama",
                                       "mistral", "qwen2"})
                .doc("architecture family (also read from config.json)"),
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
       "FullModelHFCheckpointer"});
  // full_dpo_single_device's frozen reference model is read the same way.
  ComponentTable ref = t.back();
  ref.section = "ref_checkpointer";
  t.push_back(std::move(ref));

  t.push_back(
      {"tokenizer",
       {Component("byte", {}, "UTF-8 bytes, ids 0..255 + BOS/EOS/PAD (needs no file)"),
        Component(
            "hf",
            {"torchtune.models.llama3.llama3_tokenizer", "torchtune.models.qwen2.qwen2_tokenizer",
             "torchtune.models.qwen2_5.qwen2_5_tokenizer"},
            "Hugging Face tokenizer.json",
            {Field::String("path").req().doc("the tokenizer.json file"),
             Field::String("merges_file").ignore("tokenizer.json already holds the merges")}),
        Component("sentencepiece",
                  {"torchtune.models.llama2.llama2_tokenizer",
                   "torchtune.models.mistral.mistral_tokenizer"},
                  "SentencePiece tokenizer.model",
                  {Field::String("path").req().doc("the tokenizer.model file")})},
       ""});

  auto column_map = [] {
    return Field::Map("column_map").doc("renames the dataset's columns: {ours: theirs}");
  };
  auto train_on_input = [](const char* def) {
    return Field::Bool("train_on_input").def(def).doc("also train on prompt tokens");
  };
  t.push_back(
      {"dataset",
       {Component("text_completion", {"torchtune.datasets.text_completion_dataset"},
                  "plain text, trained on every token",
                  {Field::String("column").def("text").doc("text column of a json/jsonl source")}),
        Component("pretokenized", {}, "token ids already computed (jsonl of id lists)",
                  {Field::String("column").def("input_ids").doc("column holding the ids")}),
        Component(
            "alpaca",
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
                   Field::String("new_system_prompt").doc("system prompt added to each sample")})},
       ""});

  // dataset_val (validation during training) takes the same components as dataset.
  ComponentTable val = t.back();
  val.section = "dataset_val";
  t.push_back(std::move(val));

  auto log_dir = [] {
    return Field::String("log_dir").def("${output_dir}/logs").doc("where log files go");
  };
  t.push_back({"metric_logger",
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
               "stdout"});
  return t;
}

// Keys every map of a section has, whatever its component.
std::vector<Field> common_fields(const std::string& section) {
  if (section == "optimizer")
    return {Field::Float("lr").req().min(0).doc("learning rate"),
            Field::Bool("fused").doc("accepted for torchtune configs; fusetune's optimizer step "
                                     "is always one fused loop")};
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
    f.check([](const Config& tok, const Config& root, Problems& p) {
      const Component* hf = nullptr;
      for (const auto& c : component_table("tokenizer")->components)
        if (c.name == "hf") hf = &c;
      if (tok.has("_component_") && !tok.is_map("_component_") && !tok.is_list("_component_") &&
          hf->matches(tok.str("_component_")))
        check_hf_tokenizer_path(tok, root, p);
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
