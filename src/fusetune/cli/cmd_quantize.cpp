// fusetune quantize --type q4_0|q8_0|f16 --output OUT CHECKPOINT_DIR: torchtune's `quantize`
// step for llama.cpp's schemes. OUT ending in .gguf: the quantized GGUF (as `export`). Else a
// Hugging Face checkpoint directory whose fp32 weights are exactly the values llama.cpp will
// compute with (dequantize(quantize(W)) per tensor, with export's per-tensor type choice), so
// `fusetune eval` / generate / further training see the quantized model.
#include <cstdio>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/io/gguf_export.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

const char* const kQuantizeHelp =
    "usage: fusetune quantize --type q4_0|q8_0|f16 --output OUT CHECKPOINT_DIR\n"
    "\n"
    "Quantizes the Hugging Face checkpoint in CHECKPOINT_DIR (an ordinary or a QAT fine-tune)\n"
    "with llama.cpp's schemes, per tensor as `fusetune export --format gguf --type T` chooses\n"
    "(norms stay f32; q4_0 keeps the output head / tied embedding q8_0; matrices whose rows\n"
    "are not a multiple of 32 become f16).\n"
    "\n"
    "  OUT ending in .gguf  writes the quantized GGUF file (the same as `fusetune export`).\n"
    "  any other OUT        writes a Hugging Face checkpoint directory (fp32 safetensors,\n"
    "                       config.json, the tokenizer files) holding dequantize(quantize(W)):\n"
    "                       the exact weights llama.cpp computes with, so `fusetune eval` on\n"
    "                       it measures the quantized model. (llama.cpp's CPU matmul also\n"
    "                       rounds activations to Q8_0 blocks for q4_0/q8_0 weights and to\n"
    "                       fp16 for f16 weights; that is not in the weights.)\n";

int cmd_quantize(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"type", "output"}, {}, false});
  FT_CHECK(a.positional.size() == 1,
           "usage: fusetune quantize --type q4_0|q8_0|f16 --output OUT CHECKPOINT_DIR");
  const std::string output = a.option("output");
  FT_CHECK(!output.empty(), "--output is required (a directory, or FILE.gguf)");
  FT_CHECK(!a.option("type").empty(), "--type is required (q4_0, q8_0 or f16)");
  const gguf::FileType type = gguf::parse_file_type(a.option("type"));
  FT_CHECK(type != gguf::FileType::F32, "--type f32 is not a quantization (use q4_0, q8_0, f16)");
  const std::string dir = a.positional[0];
  if (output.ends_with(".gguf")) {
    const auto r = gguf::export_gguf(dir, output, type);
    print_warnings(r.warnings);
    std::printf("wrote %s: %zu tensors, %s of tensor data\n", output.c_str(), r.tensors.size(),
                format_bytes(double(r.bytes)).c_str());
    return 0;
  }
  const HFCheckpoint ck = load_hf_checkpoint(dir, {}, DType::F32);
  std::vector<TensorSource> sources;
  int quantized = 0;
  for (const auto& [name, shape] : expected_parameters(ck.config)) {
    const gguf::TensorType t =
        gguf::tensor_type_for(type, name, shape, ck.config.tie_word_embeddings);
    if (t != gguf::TensorType::F32) ++quantized;
    sources.push_back({name, shape, DType::F32, [&ck, name = name, t] {
                         const Tensor& src = ck.tensors.at(name);
                         Tensor out = Tensor::empty(src.shape(), DType::F32);
                         std::copy(src.data<float>(), src.data<float>() + src.numel(),
                                   out.data<float>());
                         gguf::fake_quantize(t, out.data<float>(), out.numel());
                         return out;
                       }});
  }
  SaveOptions so;
  so.copy_files_from = dir;
  save_hf_checkpoint(output, ck.config, sources, so);
  std::printf("wrote %s: %d of %zu tensors quantized as %s (stored dequantized, fp32)\n",
              output.c_str(), quantized, sources.size(), gguf::file_type_name(type));
  return 0;
}

}  // namespace fusetune::cli
