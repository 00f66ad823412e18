#include "fusetune/recipes/inference_setup.h"

#include <cstdio>

#include "fusetune/compile/compiler.h"
#include "fusetune/peft/adapter.h"
#include "fusetune/util/error.h"

namespace fusetune {

InferenceModel load_inference_model(const Config& cfg) {
  InferenceModel m;
  m.dtype = parse_dtype(cfg.str("dtype", "fp32"));
  for (const std::string& w : cpu_notes(cfg)) std::fprintf(stderr, "%s\n", w.c_str());
  configure_threads(cfg);
  m.mode = parse_compile_mode(cfg.str("compile", "true"));
  m.model = load_model(cfg, m.dtype);
  m.description = m.model.description;
  if (cfg.has("adapter")) {
    const std::string dir = cfg.str("adapter");
    peft::Adapter a = peft::load_peft_adapter(dir, m.model.config);
    a.config.dropout = 0.0;  // inference: the adapter as trained, without dropout
    for (auto& [name, t] : a.tensors)
      m.model.params[name] = t.dtype() == m.dtype ? t : t.to(m.dtype);
    m.llama = peft::lora_llama_options(a.config);
    m.description += " + adapter " + dir;
  }
  return m;
}

std::unique_ptr<Tokenizer> build_inference_tokenizer(const Config& cfg, const ModelConfig& model) {
  auto tok = build_tokenizer(cfg);
  FT_CHECK(tok->vocab_size() <= model.vocab_size,
           "the tokenizer has " + std::to_string(tok->vocab_size()) +
               " tokens but the model's vocab_size is " + std::to_string(model.vocab_size));
  return tok;
}

}  // namespace fusetune
