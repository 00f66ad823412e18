#pragma once
// CPU kernels. They know nothing of graphs: raw pointers, sizes, row-major contiguous data.
// Each is a template instantiated for float (training) and double (gradient checks).
// Elementwise kernels and reductions are OpenMP-parallel; GEMM goes to OpenBLAS (OpenMP build,
// same thread pool). Reductions are deterministic: the same inputs and thread count give
// bitwise-identical results (per-thread partials are combined in a fixed order).
#include <cstdint>
#include <vector>

namespace fusetune::kernels {

// ---- GEMM ----------------------------------------------------------------------------------
// C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T. Leading dimensions as in BLAS
// row-major (lda = row stride of A as stored).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// `batch` independent GEMMs on contiguous [M,K]/[K,N]-shaped blocks (shapes before the
// transpose flags apply). stride_* = elements between consecutive matrices; 0 broadcasts.
template <class T>
void gemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                  T alpha, const T* A, int64_t stride_a, const T* B, int64_t stride_b, T beta, T* C,
                  int64_t stride_c);

// ---- elementwise (n elements; b/bias repeats every nb elements: nb == n is same-shape,
//      nb == 1 is a scalar, otherwise b is a suffix-broadcast row of length nb) ---------------
template <class T>
void add(const T* a, const T* b, T* out, int64_t n, int64_t nb);
template <class T>
void mul(const T* a, const T* b, T* out, int64_t n, int64_t nb);
template <class T>
void scale(const T* a, T s, T* out, int64_t n);
// out[j] = sum over i of x[i * nb + j] (reduce the leading dims of a suffix broadcast).
template <class T>
void sum_to_suffix(const T* x, T* out, int64_t n, int64_t nb);
// Sum of all n elements, accumulated in double. Deterministic.
template <class T>
double sum_all(const T* x, int64_t n);
template <class T>
void silu(const T* x, T* out, int64_t n);
// dx = dy * silu'(x), silu'(x) = s(x) * (1 + x * (1 - s(x))), s = sigmoid.
template <class T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n);
// PyTorch's gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
void gelu_tanh(const T* x, T* out, int64_t n);
template <class T>
void gelu_tanh_backward(const T* x, const T* dy, T* dx, int64_t n);
// out = cap * tanh(x / cap); the backward reads the output: dx = dy (1 - (y / cap)^2).
template <class T>
void softcap(const T* x, T cap, T* out, int64_t n);
template <class T>
void softcap_backward(const T* y, const T* dy, T cap, T* dx, int64_t n);

// ---- normalization: rows of length D --------------------------------------------------------
// y = x / sqrt(mean(x^2) + eps) * w
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t D, double eps);
// dx (always) and dw (when dw != nullptr; overwritten, not accumulated).
template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t rows, int64_t D,
                      double eps);

// ---- rotary embedding, Hugging Face rotate-half convention ---------------------------------
// x, out: [B, T, H, Dh]; positions: [B, T]; cos, sin: [max_pos, Dh/2] (frequency i applies to
// lanes i and i + Dh/2). out[..., i] = x_i cos - x_{i+Dh/2} sin; out[..., i+Dh/2] =
// x_{i+Dh/2} cos + x_i sin. inverse = true rotates by -angle (the VJP).
template <class T>
void rope(const T* x, const T* cos, const T* sin, const int32_t* positions, T* out, int64_t B,
          int64_t Tn, int64_t H, int64_t Dh, bool inverse);
// rope() is not given the table length, so it only rejects negative positions. Callers that
// know max_pos call this first: throws fusetune::Error naming the first position outside
// [0, max_pos) and its index.
void check_rope_positions(const int32_t* positions, int64_t n, int64_t max_pos);

// ---- softmax family over rows of length cols ------------------------------------------------
template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t cols);
// dx = y * (dy - sum(dy * y))
template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols);
template <class T>
void log_softmax_rows(const T* x, T* y, int64_t rows, int64_t cols);
// dx = dy - exp(y) * sum(dy)   (y = log-probabilities)
template <class T>
void log_softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t cols);

// ---- negative log-likelihood, labels == -100 ignored ---------------------------------------
// Returns sum over valid rows of -logp[r, label[r]] (double accumulation).
template <class T>
double nll_sum(const T* logp, const int32_t* labels, int64_t rows, int64_t V);
// dx[r, label[r]] = -dloss for valid rows, 0 elsewhere (dense, as PyTorch materializes it).
template <class T>
void nll_backward(T dloss, const int32_t* labels, T* dx, int64_t rows, int64_t V);

// ---- embedding -------------------------------------------------------------------------------
// out[i, :] = table[ids[i], :]; ids out of [0, V) throw fusetune::Error naming the id.
// Also instantiated for uint16_t (bf16 rows copied as bits).
template <class T>
void embedding_forward(const T* table, const int32_t* ids, T* out, int64_t n, int64_t D, int64_t V);
// dtable = zeros; dtable[ids[i], :] += dy[i, :]. Deterministic (no atomics). With
// `clear_rows`, only those rows of dtable may be non-zero on entry: only they are zeroed
// (a reused gradient buffer: core/tensor.h's row sets), not the whole [V, D] table.
template <class T>
void embedding_backward(const T* dy, const int32_t* ids, T* dtable, int64_t n, int64_t D, int64_t V,
                        const std::vector<int32_t>* clear_rows = nullptr);
// The rows an embedding backward writes: the ids, sorted, each once.
std::vector<int32_t> embedding_touched_rows(const int32_t* ids, int64_t n);
// Whether embedding gradients carry their row sets (FUSETUNE_SPARSE_EMBEDDING_GRAD, "1" by
// default; "0" keeps every gradient dense, for before/after measurements). Read once.
bool sparse_embedding_grad_enabled();

// ---- attention helpers ----------------------------------------------------------------------
// scores: [B, H, T, T]. Sets out[b,h,i,j] = -inf where j > i, or where doc_ids (optional,
// [B, T]) differ between i and j; copies the rest. Backward: zero the same positions of dy.
// window > 0 also masks keys j <= i - window (a sliding window of `window` keys, Gemma 2).
template <class T>
void causal_mask(const T* scores, const int32_t* doc_ids, T* out, int64_t B, int64_t H, int64_t Tn,
                 int64_t window = 0);
template <class T>
void causal_mask_backward(const T* dy, const int32_t* doc_ids, T* dx, int64_t B, int64_t H,
                          int64_t Tn, int64_t window = 0);

// ---- layout ---------------------------------------------------------------------------------
// Swaps two axes of a tensor viewed as [outer, d0, mid, d1, inner] -> [outer, d1, mid, d0, inner].
template <class T>
void transpose(const T* x, T* out, int64_t outer, int64_t d0, int64_t mid, int64_t d1,
               int64_t inner);
// x: [outer, kv, inner] -> out: [outer, kv * groups, inner], head h reads kv head h / groups
// (Hugging Face repeat_kv on [B, KVH, T, D] with outer = B, inner = T*D).
template <class T>
void repeat_heads(const T* x, T* out, int64_t outer, int64_t kv, int64_t groups, int64_t inner);
// Backward of repeat_heads: out[o, k, :] = sum over g of dy[o, k*groups + g, :].
template <class T>
void repeat_heads_backward(const T* dy, T* dx, int64_t outer, int64_t kv, int64_t groups,
                           int64_t inner);
// x viewed as [outer, len, inner]: out = x[:, start:start+n, :] (and the zero-padded backward).
template <class T>
void slice(const T* x, T* out, int64_t outer, int64_t len, int64_t inner, int64_t start, int64_t n);
template <class T>
void slice_backward(const T* dy, T* dx, int64_t outer, int64_t len, int64_t inner, int64_t start,
                    int64_t n);

}  // namespace fusetune::kernels
