#pragma once
// A Hugging Face Llama-family checkpoint as a GGUF file llama.cpp runs (`fusetune export
// --format gguf`), and the per-tensor quantization llama.cpp's tools would choose, shared with
// `fusetune quantize` and QAT so that all three agree on what each weight becomes.
//
// Architectures: model_type llama / mistral -> "llama" (q and k rows permuted from HF's
// rotate-half RoPE to llama.cpp's interleaved pairs, as convert_hf_to_gguf.py's
// LlamaModel.permute); qwen2 -> "qwen2" (NEOX RoPE, no permutation, q/k/v biases); qwen3 ->
// "qwen3" (NEOX RoPE, q/k norms as attn_q_norm / attn_k_norm). Each family's name and RoPE
// layout come from models/model_family.h. Llama with attention or MLP biases is refused.
//
// Types (what convert_hf_to_gguf.py --outtype and llama-quantize pick by default):
//   - 1-D tensors (norms, biases) stay F32 whatever the type;
//   - f32 / f16: every matrix F32 / F16;
//   - q8_0: every matrix Q8_0 (token_embd and output included);
//   - q4_0: every matrix Q4_0 except the output head (output.weight, or token_embd.weight when
//     the embeddings are tied), which is Q6_K when its rows (the hidden size) are a multiple of
//     256 and Q8_0 otherwise, as llama-quantize's llama_tensor_get_type decides;
//   - a matrix whose rows (its last dimension) are not a multiple of 32 cannot be Q4_0/Q8_0:
//     it is F16, as convert_hf_to_gguf.py falls back (llama-quantize would refuse Q4_0).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "fusetune/io/gguf_writer.h"
#include "fusetune/models/model_config.h"

namespace fusetune::gguf {

enum class FileType { F32, F16, Q8_0, Q4_0 };
// "f32" | "f16" | "q8_0" | "q4_0"; throws naming `what` otherwise.
FileType parse_file_type(const std::string& s, const std::string& what = "--type");
const char* file_type_name(FileType t);

// The GGUF tensor type of the HF parameter `hf_name` with `shape` (row-major).
TensorType tensor_type_for(FileType ft, const std::string& hf_name,
                           const std::vector<int64_t>& shape, bool tie_word_embeddings);

// In place: x = what llama.cpp computes with after storing x as `t` (dequantize(quantize(x))
// per block of each row for Q4_0/Q8_0/Q6_K, fp16 rounding for F16, nothing for F32).
void fake_quantize(TensorType t, float* x, int64_t numel);

// llama.cpp's name for an HF parameter ("model.layers.3.self_attn.q_proj.weight" ->
// "blk.3.attn_q.weight"); throws for a name it has no tensor for.
// post_norms (Gemma 2's sandwich norms, models/model_family.h): post_attention_layernorm is
// the attention output's norm (post_attention_norm), pre_/post_feedforward_layernorm the MLP's
// (ffn_norm, post_ffw_norm).
std::string gguf_tensor_name(const std::string& hf_name, bool post_norms = false);

// In place: HF q/k rows [n_head * head_dim, cols] reordered for interleaved RoPE: within each
// head, row 2i + s takes HF row s * head_dim / 2 + i.
void permute_rope_rows(float* w, int64_t n_head, int64_t head_dim, int64_t cols);

// Checks that llama.cpp can express `c` (throws naming the key otherwise) and returns its
// GGUF architecture name.
std::string gguf_architecture(const ModelConfig& c);

struct ExportResult {
  std::vector<std::pair<std::string, TensorType>> tensors;  // in file order
  uint64_t bytes = 0;
  std::vector<std::string> warnings;  // what llama.cpp will not do with the file (tokenizer)
};

// Writes `checkpoint_dir` (config.json, weights, tokenizer files) to `output` as GGUF.
ExportResult export_gguf(const std::filesystem::path& checkpoint_dir,
                         const std::filesystem::path& output, FileType type);

}  // namespace fusetune::gguf
