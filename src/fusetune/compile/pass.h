#pragma once
// What every pass sees. A pass is one file with one entry point `run(Graph&, const PassOptions&)`
// returning a one-line summary for the compile report.
#include <cstdint>
#include <string>

#include "fusetune/graph/graph.h"

namespace fusetune {

enum class CompileMode { None, Model, Full };  // compile: false | model | true (model+loss)

struct PassOptions {
  CompileMode mode = CompileMode::Full;
  // Scratch for one [chunk, vocab] logits block of the fused head kernels. Sized for the GEMMs,
  // not the softmax: each chunk streams the whole head through z = h W^T and dh = dz W and reads
  // and writes all of dW += dz^T h (K = the chunk's rows), so small chunks make those GEMMs
  // memory-bound. L3-micro (vocab 128256, 1024 tokens, fp32; docs/benchmarks.md): 32 MiB (64
  // rows) ran the step at 727 tokens/s, 128 MiB (256 rows) at 1044, the same peak (1.095 GiB:
  // the larger block fits under the step's peak); eager 971.
  int64_t ce_chunk_budget_bytes = 128ll << 20;
  // The same for an LM head formed tile by tile (bf16, NF4, fake-quantized): the fused kernels
  // re-form the whole head for every chunk, in both of their GEMMs, so fewer, larger chunks pay
  // off. Llama 3.2 1B QLoRA bf16 (512 tokens): the fused head 40% faster and the step 21%
  // with 128 MiB instead of 32 (4 instead of 16 passes over the NF4 head), for 3% more peak.
  int64_t tiled_head_ce_chunk_budget_bytes = 128ll << 20;
  int64_t ce_budget(bool tiled_head) const {
    return tiled_head ? tiled_head_ce_chunk_budget_bytes : ce_chunk_budget_bytes;
  }
  // The fused log-prob head's forward hands its logits to the backward when every row fits one
  // chunk (compile/fuse_linear_log_probs.h): one GEMM of three spared, bitwise the same
  // (off: to measure or test the recomputing backward).
  bool keep_head_logits = true;
  bool activation_checkpointing = false;  // enable_activation_checkpointing (any mode)
  // Generic passes, on by default in compiled modes (off: to measure or test the others).
  bool eliminate_copies = true;
  bool fuse_elementwise = true;
  bool in_place = true;  // memory plan: an output may take over its input's buffer
  // ZeRO-3 (compile/params_at_use.h, any mode): parameters bound at first use; with
  // reshard_after_forward, bound again for the backward.
  bool params_at_use = false;
  bool reshard_after_forward = true;
  // Nodes of this region or lower may be rewritten (model-only compilation leaves the loss
  // region as it is).
  int max_region() const { return mode == CompileMode::Full ? 1 : 0; }
};

}  // namespace fusetune
