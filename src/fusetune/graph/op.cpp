#include "fusetune/graph/op.h"

namespace fusetune {

const char* op_name(Op op) {
  switch (op) {
    case Op::Input:
      return "input";
    case Op::Param:
      return "param";
    case Op::Constant:
      return "constant";
    case Op::Fill:
      return "fill";
    case Op::MatMul:
      return "matmul";
    case Op::Add:
      return "add";
    case Op::Mul:
      return "mul";
    case Op::Scale:
      return "scale";
    case Op::Silu:
      return "silu";
    case Op::SiluBackward:
      return "silu_backward";
    case Op::SumAll:
      return "sum_all";
    case Op::Expand:
      return "expand";
    case Op::SumToShape:
      return "sum_to_shape";
    case Op::RMSNorm:
      return "rmsnorm";
    case Op::RMSNormBackward:
      return "rmsnorm_backward";
    case Op::Rope:
      return "rope";
    case Op::Softmax:
      return "softmax";
    case Op::SoftmaxBackward:
      return "softmax_backward";
    case Op::LogSoftmax:
      return "log_softmax";
    case Op::LogSoftmaxBackward:
      return "log_softmax_backward";
    case Op::Nll:
      return "nll";
    case Op::NllBackward:
      return "nll_backward";
    case Op::Embedding:
      return "embedding";
    case Op::EmbeddingBackward:
      return "embedding_backward";
    case Op::CausalMask:
      return "causal_mask";
    case Op::CausalMaskBackward:
      return "causal_mask_backward";
    case Op::RepeatHeads:
      return "repeat_heads";
    case Op::RepeatHeadsBackward:
      return "repeat_heads_backward";
    case Op::Reshape:
      return "reshape";
    case Op::Transpose:
      return "transpose";
    case Op::Slice:
      return "slice";
    case Op::SliceBackward:
      return "slice_backward";
    case Op::FusedLinearCrossEntropy:
      return "fused_linear_cross_entropy";
    case Op::SwiGLU:
      return "swiglu";
    case Op::SwiGLUBackward:
      return "swiglu_backward";
    case Op::AddRMSNorm:
      return "add_rmsnorm";
    case Op::RMSNormBackwardAdd:
      return "rmsnorm_backward_add";
    case Op::Elementwise:
      return "elementwise";
    case Op::FlashAttention:
      return "flash_attention";
    case Op::FlashAttentionBackward:
      return "flash_attention_backward";
    case Op::Dropout:
      return "dropout";
    case Op::RowInvNorm:
      return "row_inv_norm";
    case Op::NF4MatMul:
      return "nf4_matmul";
    case Op::NF4MatMulBackward:
      return "nf4_matmul_backward";
    case Op::NF4Embedding:
      return "nf4_embedding";
    case Op::FusedNF4LinearCrossEntropy:
      return "fused_nf4_linear_cross_entropy";
    case Op::kCount:
      break;
  }
  return "?";
}

}  // namespace fusetune
