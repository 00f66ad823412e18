#include "fusetune/recipes/inference_setup.h"

#include <cstdio>
#include <optional>

#include "fusetune/compile/compiler.h"
#include "fusetune/peft/adapter.h"
#include "fusetune/peft/lora.h"
#include "fusetune/quant/qat.h"
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
  std::optional<peft::LoraConfig> adapter;
  if (cfg.has("adapter")) {
    const std::string dir = cfg.str("adapter");
    peft::Adapter a = peft::load_peft_adapter(dir, m.model.config);
    a.config.dropout = 0.0;  // inference: the adapter as trained, without dropout
    for (auto& [name, t] : a.tensors)
      m.model.params[name] = t.dtype() == m.dtype ? t : t.to(m.dtype);
    adapter = a.config;
    m.llama = peft::lora_llama_options(a.config);
    m.description += " + adapter " + dir;
  }
  if (cfg.has("quantizer") && cfg.is_map("quantizer")) {
    // eval: the model fake-quantized as the scheme quantizes it (quant/qat.h), always on.
    const quant::QatConfig q = quant::qat_config_from(cfg);
    auto model = std::make_shared<ModelConfig>(m.model.config);
    for (const std::string& site : quant::check_model(q, *model))
      std::fprintf(stderr, "note: quantizer %s: %s is not a whole number of groups: float\n",
                   quant::scheme_name(q.scheme), site.c_str());
    const LlamaOptions fq = quant::qat_llama_options(q, model, false);
    m.llama = adapter ? peft::lora_llama_options(*adapter, nullptr, &fq) : fq;
    m.description += std::string(" fake-quantized as ") + quant::scheme_name(q.scheme);
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
