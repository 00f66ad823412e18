// fusetune merge --base DIR --adapter DIR --output DIR: a PEFT LoRA/DoRA adapter merged into
// its base checkpoint, written as a Hugging Face model directory.
#include <cstdio>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/peft/adapter.h"
#include "fusetune/util/error.h"

namespace fusetune::cli {

const char* const kMergeHelp =
    "usage: fusetune merge --base DIR --adapter DIR --output DIR [--dtype fp32|bf16]\n"
    "\n"
    "Merges a PEFT adapter (adapter_config.json + adapter_model.safetensors, LoRA or DoRA)\n"
    "into the Hugging Face checkpoint in --base: W += (lora_alpha / r) B A (DoRA: rescaled to\n"
    "the learned row magnitudes). Writes config.json, the weights and the base's tokenizer\n"
    "files to --output (replacing a checkpoint there). --dtype defaults to fp32.\n";

int cmd_merge(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"base", "adapter", "output", "dtype"}, {}, false});
  FT_CHECK(a.positional.empty(), "fusetune merge takes no positional arguments (got '" +
                                     (a.positional.empty() ? "" : a.positional[0]) +
                                     "'); see --help");
  const std::string base = a.option("base"), adapter = a.option("adapter"),
                    output = a.option("output");
  FT_CHECK(!base.empty() && !adapter.empty() && !output.empty(),
           "usage: fusetune merge --base DIR --adapter DIR --output DIR");
  const std::string dtype = a.option("dtype").empty() ? "fp32" : a.option("dtype");
  FT_CHECK(dtype == "fp32" || dtype == "bf16", "--dtype must be fp32 or bf16, got '" + dtype + "'");

  HFCheckpoint ck = load_hf_checkpoint(base, {}, DType::F32);
  peft::Adapter ad = peft::load_peft_adapter(adapter, ck.config);
  TensorMap params;
  for (auto& [name, t] : ck.tensors) params[name] = t;
  for (auto& [name, t] : ad.tensors) params[name] = t;
  peft::merge_adapters(params, ck.config, ad.config);
  NamedTensors out;
  for (const auto& [name, shape] : expected_parameters(ck.config))
    out.push_back({name, params.at(name)});
  SaveOptions so;
  so.dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
  so.copy_files_from = base;
  save_hf_checkpoint(output, ck.config, out, so);
  std::printf("merged %zu adapter tensors (r=%lld, alpha=%g%s) into %s\n", ad.tensors.size(),
              static_cast<long long>(ad.config.rank), ad.config.alpha,
              ad.config.use_dora ? ", DoRA" : "", output.c_str());
  return 0;
}

}  // namespace fusetune::cli
