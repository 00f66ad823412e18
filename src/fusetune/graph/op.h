#pragma once
// The operations of the graph IR. Forward ops are what models and losses are written with;
// *Backward ops are emitted by autodiff's VJP rules; Fused* ops are produced by compile passes.
#include <cstdint>

namespace fusetune {

enum class Op : uint8_t {
  // leaves
  Input,     // fed per step (tokens, labels, positions, scalars)
  Param,     // a named parameter (trainable or frozen), bound by name at run time
  Constant,  // a tensor owned by the graph (RoPE tables)
  Fill,      // a tensor filled with attrs.scalar
  // linear algebra
  MatMul,  // [.., M, K] x [.., K, N] with transpose flags; batch dims must match
  // elementwise (b may be a suffix-broadcast of a)
  Add,
  Mul,
  Scale,  // a * attrs.scalar
  Silu,
  SiluBackward,  // (x, dy) -> dx
  // reductions and broadcasts
  SumAll,      // -> scalar []
  Expand,      // scalar [] -> attrs.shape
  SumToShape,  // reduce leading dims down to attrs.shape (a suffix of the input shape)
  // normalization and position
  RMSNorm,          // (x, w) -> y                 attrs.eps
  RMSNormBackward,  // (x, w, dy) -> (dx, dw)      attrs.eps
  Rope,             // (x [B,T,H,Dh], cos, sin, positions [B,T]) attrs.inverse
  // softmax family, over the last dim
  Softmax,
  SoftmaxBackward,  // (y, dy)
  LogSoftmax,
  LogSoftmaxBackward,  // (y, dy)
  // loss
  Nll,          // (logp [N,V], labels [N] I32) -> scalar sum of -logp over labels != -100
  NllBackward,  // (dloss [], labels) -> dense [N, V]
  // embeddings and attention helpers
  Embedding,          // (table [V,D], ids [...] I32) -> [..., D]
  EmbeddingBackward,  // (dy, ids) -> [V, D]   attrs.dim0 = V
  CausalMask,         // (scores [B,H,T,T] [, doc_ids [B,T]]) -> masked scores  attrs.window
  CausalMaskBackward,
  RepeatHeads,          // [B, KV, T, D] -> [B, KV*groups, T, D]   attrs.groups
  RepeatHeadsBackward,  // sum over groups
  // layout
  Reshape,    // a view: no data movement
  Transpose,  // swap attrs.dim0 and attrs.dim1 (materialized in eager)
  Slice,      // along attrs.dim0: [start, start + len)
  SliceBackward,
  // fused ops created by compile passes
  FusedLinearCrossEntropy,  // (h [N,D], W [V,D], labels [N], scale []) -> (loss [], dh, dW)
                            // attrs.chunk_rows; attrs.no_weight_grad: W frozen, (loss, dh) only;
                            // attrs.softcap: the logits soft-capped (Gemma 2)
  SwiGLU,                   // (g, u) -> silu(g) * u            (compile/fuse_swiglu)
  SwiGLUBackward,           // (g, u, dy) -> (dg, du); recomputes silu(g), reads no saved one
  AddRMSNorm,               // (h, x, w) -> (s = h + x, y = rmsnorm(s, w))   attrs.eps
  RMSNormBackwardAdd,       // (x, w, dy, dres) -> (dx + dres, dw)   attrs.eps: RMSNormBackward
                            // with the residual-stream gradient added into dx in the same pass
                            // (compile/fuse_rmsnorm_residual)
  Elementwise,  // (x0, x1, ...) -> attrs.shape: attrs.program run per element (fuse_elementwise);
                // input i repeats every numel(x_i) elements (same-size or suffix broadcast)
  // Causal attention, tiled with an online softmax (kernels/cpu/flash_attention.h); GQA reads
  // k/v heads in place. attrs.scalar = softmax scale; attrs.softcap caps the scaled scores,
  // attrs.window limits a query to its last keys (Gemma 2).
  FlashAttention,  // (q [B,T,H,hd], k, v [B,T,KV,hd] [, doc_ids [B,T]]) -> (o [B,T,H,hd], lse
                   // [B,H,T])
  FlashAttentionBackward,  // (q, k, v, o, lse, do [, doc_ids]) -> (dq, dk, dv)
  // PEFT adapters (peft/): LoRA dropout, DoRA's detached norm, QLoRA's NF4 base weights
  Dropout,            // (x, seed [] I32) attrs.scalar = p, attrs.start = salt; seeded mask
  RowInvNorm,         // W [O, K] (, A [r, K], Bs [O, r]) -> 1 / ||(W + Bs A)[o, :]|| [O];
                      // no gradient (DoRA detaches the norm)
  NF4MatMul,          // (x [N, K], codes, absmax_codes, absmax_scales) -> x W^T [N, O]; W NF4
                      // attrs.shape = [O, K], attrs.scalar = absmax offset (kernels/cpu/nf4.h)
  NF4MatMulBackward,  // (dy [N, O], codes, absmax_codes, absmax_scales) -> dy W [N, K]
  NF4Embedding,       // (ids [...] I32, codes, absmax_codes, absmax_scales) -> [..., D]: rows of
                      // an NF4 table dequantized on gather; attrs.shape = [V, D]; no gradient
  FusedNF4LinearCrossEntropy,  // (h [N,D], labels [N], scale [], codes, absmax_codes,
                               // absmax_scales) -> (loss [], dh): FusedLinearCrossEntropy with a
                               // frozen NF4 head; attrs.shape = [V, D], scalar, chunk_rows
  // Per-token label log-probabilities (preference losses, losses/preference.h)
  LabelLogProbs,          // (logp [N,V], labels [N] I32) -> [N]: logp[i, y_i], 0 where y = -100
  LabelLogProbsBackward,  // (dy [N], labels [N]) -> dense [N, V]   attrs.dim0 = V
  RowSum,                 // x [.., C] -> [..]: the sum over the last dim
  LogSigmoid,             // log(1 / (1 + exp(-x))), computed without overflow
  LogSigmoidBackward,     // (x, dy) -> dy * sigmoid(-x)
  Relu,                   // max(x, 0)
  ReluBackward,           // (x, dy) -> dy where x > 0, else 0
  Log1mExp,               // log(1 - exp(x)) for x < 0: ORPO's odds of a mean log-prob
  Log1mExpBackward,       // (x, dy) -> -dy / expm1(-x)
  Sigmoid,                // 1 / (1 + exp(-x)): KTO's per-example losses
  SigmoidBackward,        // (y, dy) -> dy * y * (1 - y)
  Exp,                    // e^x (GRPO: the policy ratio and the k3 KL estimator, losses/grpo.h)
  // Knowledge distillation (ops/distillation.h, kernels/cpu/divergence.h)
  Divergence,          // (student [N,V], teacher [N,V], labels [N] I32) -> [] summed over rows
                       // whose label is not -100; attrs.groups = kind, scalar = beta, eps = T
  DivergenceBackward,  // (dloss [], student, teacher, labels) -> dstudent [N, V]
  // Both LM heads fused with CE and the divergence, chunked over the tokens
  // (kernels/cpu/fused_linear_divergence.h; attrs as Divergence's, attrs.chunk_rows):
  FusedLinearDivergence,  // (h [N,D], W [V,D], teacher_h [N,Dt], teacher_W [V,Dt], labels [N])
                          // -> [2] {ce_sum, kd_sum}
  FusedLinearDivergenceBackward,  // (dy [2], h, W, teacher_h, teacher_W, labels) -> ({ce_sum,
                                  // kd_sum} [2], dh [N,D], dW [V,D]; attrs.no_weight_grad: no dW)
  // The LM head + log_softmax + LabelLogProbs fused and chunked (compile/fuse_linear_log_probs):
  // the head is W [V, D] (one input) or a frozen NF4 table (codes, absmax_codes, absmax_scales;
  // attrs.shape = [V, D], attrs.scalar). attrs.chunk_rows; attrs.softcap caps the logits.
  FusedLinearLogProbs,  // (h [N,D], labels [N], head...) -> (logp [N], lse [N], zsum [N]):
                        // label log-prob, logsumexp and sum of logits of each row (0 at y = -100);
                        // attrs.no_weight_grad (a frozen head with a backward): also E_p[W] [N,D];
                        // attrs.keep_logits (a dense trained head, N <= chunk_rows): also the
                        // one chunk's logits [N,V], which the backward takes instead of a GEMM
  FusedLinearLogProbsBackward,  // (x, labels, lse, dlogp [N], head...): x = h -> (dh [N,D],
                                // dW [V,D]; no dW for an NF4 head), or with attrs.no_weight_grad
                                // x = the forward's E_p[W] -> (dh) without recomputing logits;
                                // attrs.keep_logits: (..., W, the forward's logits), which it
                                // overwrites (its only reader)
  // Generation (generation/): attention of new queries against a KV cache that the op itself
  // extends. The caches are graph inputs bound to the same tensors on every run (the decode
  // session's state); writing into them is the only in-place effect of any op.
  KVCacheAttention,  // (q [B,T,H,hd], k, v [B,T,KV,hd], k_cache, v_cache [B,S,KV,hd],
                     // cache_pos [] I32, cache_start [B] I32) -> o [B,T,H,hd]: writes k, v at
                     // slots [cache_pos, cache_pos + T), then query t attends to slots
                     // [cache_start[b], cache_pos + t]. attrs.scalar = softmax scale;
                     // attrs.softcap, attrs.window as FlashAttention's.
  // Quantization-aware training (kernels/cpu/fake_quant.h): attrs.groups = the
  // kernels::FakeQuant scheme, attrs.len = the group length along the last dim; `enable` []
  // I32: 0 computes without fake quantization (fake_quant_after_n_steps); attrs.inverse: the
  // scheme's straight-through gradient is masked (FakeQuantizeBackward), else it is dy.
  FakeQuantize,             // (x [.., C], enable) -> fq(x), groups along the last dim
  FakeQuantizeBackward,     // (x, dy, enable) -> the straight-through gradient of x
  FakeQuantMatMul,          // (x [N, K], W [O, K], enable) -> x fq(W)^T [N, O]: fq(W) formed
                            // a tile of rows at a time inside the GEMM, never whole
  FakeQuantMatMulBackward,  // (dy [N, O], W [O, K], enable) -> dy fq(W) [N, K], tile by tile
  // Gemma (models/model_family.h)
  GeluTanh,          // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): PyTorch's gelu(tanh)
  GeluTanhBackward,  // (x, dy) -> dx
  Softcap,           // cap * tanh(x / cap), attrs.scalar = cap (Gemma 2's logit soft-capping)
  SoftcapBackward,   // (y, dy) -> dy (1 - (y / cap)^2): from the output, attrs.scalar = cap
  kCount
};

const char* op_name(Op op);

}  // namespace fusetune
