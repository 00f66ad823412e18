#include "fusetune/config/inference_schemas.h"

#include "fusetune/config/components.h"
#include "fusetune/config/recipe_schemas.h"

#include <string>

namespace fusetune {
namespace {

// What both recipes read: where the weights come from, and how they run.
Schema base_schema(const char* recipe) {
  Schema s;
  s.recipe = recipe;
  s.add(Field::Int("seed").def("1234").doc("random seed (sampling)"));
  s.add(Field::Enum("compile", {"false", "true", "model", "model+loss"})
            .def("true")
            .doc("false: eager; true/model: the step graphs go through the compiler"));
  s.add(Field::Enum("dtype", {"fp32", "bf16"}).def("fp32").doc("parameter dtype"));
  s.add(Field::Enum("device", {"cpu", "cuda"}).def("cpu").doc("where to run"));
  s.add(Field::Int("num_threads").min(1).doc("CPU threads (default: OMP_NUM_THREADS or all)"));
  s.add(model_field(false));
  s.add(component_section("checkpointer").doc("where the weights are read from"));
  s.add(component_section("tokenizer").req().doc("text to token ids"));
  s.add(Field::String("adapter").doc(
      "a PEFT LoRA/DoRA adapter directory applied on top of the weights, unmerged"));
  if (std::string(recipe) == "eval")  // the QAT schemes (quant/qat.h), fake-quantized
    s.add(component_section("quantizer")
              .doc("evaluate the model fake-quantized as this scheme would quantize it "
                   "(quant/qat.h: Int8DynActInt4WeightQATQuantizer, Int4WeightOnlyQATQuantizer, "
                   "gguf_q4_0, gguf_q8_0); absent: as stored"));
  else
    s.add(Field::Map("quantizer")
              .doc("torchtune's quantizer: must be null (not supported)")
              .check([](const Config& q, const Config&, Problems& p) {
                p.errors.push_back(
                    "config key 'quantizer': quantized generation is not supported; the model "
                    "runs in its dtype (set quantizer: null) (" +
                    q.where("") + ")");
              }));
  s.add(Field::String("output_dir").doc("when set, results are also written here as JSON"));
  s.add(Field::String("log_level").ignore("fusetune has one log level"));
  return s;
}

Schema build_generate() {
  Schema s = base_schema("generate");
  s.add(Field::Map("prompt", {Field::String("system").doc("system prompt (optional)"),
                              Field::String("user").also(kList).req().doc(
                                  "the user message; a list of messages is a batch")})
            .also(kString)
            .req()
            .doc("what to answer: {system, user}, or a plain text continued as it is"));
  s.add(Field::String("template")
            .def("auto")
            .doc("chat template around the prompt: auto (by model family and tokenizer), llama3, "
                 "chatml, "
                 "llama2, mistral, gemma, plain"));
  s.add(Field::Int("max_new_tokens").def("300").min(1).doc("tokens to generate at most"));
  s.add(Field::Float("temperature").def("0.6").min(0).doc("sampling temperature; 0: greedy"));
  s.add(Field::Int("top_k").min(0).doc("sample among the k most likely tokens (null/0: all)"));
  s.add(Field::Float("top_p").def("1.0").min(0).max(1).doc(
      "nucleus sampling: the fewest most likely tokens whose probability reaches p"));
  s.add(
      Field::Bool("enable_kv_cache")
          .def("true")
          .doc(
              "keep keys and values between steps; false recomputes the whole sequence per token"));
  s.add(Field::List("stop_tokens")
            .items(kString)
            .doc("extra tokens (as text, e.g. \"<|eot_id|>\") that end the answer, besides EOS and "
                 "the "
                 "template's end of turn"));
  return s;
}

Schema build_eval() {
  Schema s = base_schema("eval");
  s.add(Field::Enum("task", {"perplexity", "multiple_choice"})
            .req()
            .doc("perplexity: of a dataset the recipes read; multiple_choice: accuracy on a JSONL "
                 "task"));
  s.add(component_section("dataset").doc("task perplexity: the data (any training dataset)"));
  s.add(Field::String("task_file")
            .doc("task multiple_choice: a JSONL file in lm-evaluation-harness's HellaSwag or ARC "
                 "layout, "
                 "or {context, choices, gold}"));
  s.add(Field::Int("batch_size")
            .def("8")
            .min(1)
            .doc("rows per forward pass (samples, or a question's choices)"));
  s.add(Field::Int("limit").min(1).doc("evaluate only the first n samples or questions"));
  return s;
}

}  // namespace

const Schema& generate_schema() {
  static const Schema s = build_generate();
  return s;
}

const Schema& eval_schema() {
  static const Schema s = build_eval();
  return s;
}

}  // namespace fusetune
