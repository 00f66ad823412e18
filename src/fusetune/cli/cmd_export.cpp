// fusetune export --format gguf --output FILE.gguf [--type T] CHECKPOINT_DIR: a Hugging Face
// checkpoint as a GGUF file for llama.cpp.
#include <cstdio>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/io/gguf_export.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

const char* const kExportHelp =
    "usage: fusetune export --format gguf --output FILE.gguf [--type f32|f16|q8_0|q4_0]\n"
    "                       CHECKPOINT_DIR\n"
    "\n"
    "Writes the Hugging Face checkpoint in CHECKPOINT_DIR (config.json, safetensors, tokenizer\n"
    "files; e.g. a fine-tuned output or `fusetune merge`'s result) as a GGUF v3 file that\n"
    "llama.cpp (and everything built on it) runs: architecture llama (llama, mistral), qwen2,\n"
    "qwen3, gemma, gemma2, gemma3 or phi3, tensors named and q/k rows ordered as llama.cpp's\n"
    "converter does (gemma's norms as 1 + w; gemma2's soft-caps and window as metadata; phi3's\n"
    "fused qkv and gate_up as stored, LongRoPE factors as tensors), the tokenizer as\n"
    "tokenizer.ggml.* (SentencePiece -> \"llama\", byte-level BPE -> \"gpt2\").\n"
    "\n"
    "  --type  f32 (default), f16, q8_0 or q4_0. Norms stay f32. q8_0 quantizes every matrix;\n"
    "          q4_0 every matrix but the output head (or tied embedding), which is q6_k as\n"
    "          llama.cpp makes it (q8_0 when its rows are not a multiple of 256). A matrix\n"
    "          whose rows are not a multiple of 32 is f16 in q8_0/q4_0 files.\n"
    "          The values are exactly those `fusetune quantize --type T` writes.\n";

int cmd_export(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{"format", "output", "type"}, {}, false});
  FT_CHECK(a.positional.size() == 1,
           "usage: fusetune export --format gguf --output FILE.gguf [--type T] CHECKPOINT_DIR");
  FT_CHECK(
      a.option("format") == "gguf",
      (a.option("format").empty() ? std::string("--format is required (gguf)")
                                  : "--format must be gguf, got '" + a.option("format") + "'"));
  const std::string output = a.option("output");
  FT_CHECK(!output.empty(), "--output FILE.gguf is required");
  const gguf::FileType type =
      gguf::parse_file_type(a.option("type").empty() ? "f32" : a.option("type"));
  const auto r = gguf::export_gguf(a.positional[0], output, type);
  print_warnings(r.warnings);
  int counts[5] = {0, 0, 0, 0, 0};  // F32, F16, Q8_0, Q4_0, Q6_K
  for (const auto& [name, t] : r.tensors)
    ++counts[t == gguf::TensorType::F32    ? 0
             : t == gguf::TensorType::F16  ? 1
             : t == gguf::TensorType::Q8_0 ? 2
             : t == gguf::TensorType::Q4_0 ? 3
                                           : 4];
  std::printf(
      "wrote %s: %zu tensors (%d f32, %d f16, %d q8_0, %d q4_0, %d q6_k), %s of tensor data\n",
      output.c_str(), r.tensors.size(), counts[0], counts[1], counts[2], counts[3], counts[4],
      format_bytes(int64_t(r.bytes)).c_str());
  return 0;
}

}  // namespace fusetune::cli
