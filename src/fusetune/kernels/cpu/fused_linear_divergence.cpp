// The fused linear + divergence kernel (fused_linear_divergence.h). Rows of a chunk run in
// parallel, each summed in double; the row values are added in row order, so results do not
// depend on the thread count.
#include "fusetune/kernels/cpu/fused_linear_divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/head_gemm.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/row_softmax.h"
#include "fusetune/kernels/cpu/vexp.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

// logsumexp of x[0..V): in double for double rows; for float rows vexp in float lanes, summed
// as the fused cross-entropy sums (row_softmax.h).
double row_lse(const double* x, int64_t V) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, x[v]);
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - mx);
  return mx + std::log(s);
}
double row_lse(const float* x, int64_t V) {
  const float mx = detail::row_max(x, V);
  return double(mx) + std::log(detail::sum_exp(x, mx, static_cast<float*>(nullptr), V));
}

// One labelled row: returns {ce, kd}. With gradients, zs := dz, the row's gradient w.r.t. the
// student's logits (zt is overwritten: it receives the divergence's gradient first).
template <class T>
std::array<double, 2> row_losses(T* zs, T* zt, int32_t y, int64_t V, const DivergenceParams& p,
                                 const LinearDivergenceGrads<T>* g) {
  const double lse = row_lse(zs, V);
  const double ce = lse - double(zs[y]);
  if (!g) return {ce, divergence_row<T>(zs, zt, V, p)};
  // The divergence's gradient lands in zt: divergence_row reads each teacher logit before
  // it writes that slot (divergence.h).
  const double kd = divergence_row<T>(zs, zt, V, p, zt, g->dkd);
  const T dce = T(g->dce), l = T(lse);
#pragma omp simd
  for (int64_t v = 0; v < V; ++v) zs[v] = dce * detail::vexp(zs[v] - l) + zt[v];
  zs[y] = T(double(zs[y]) - g->dce);
  return {ce, kd};
}

// The student's LoRA term on a chunk: u = hs A^T [c, r], zs += u Bs^T.
template <class T>
void lora_logits(const LinearDivergenceInputs<T>& in, const T* hs, int64_t c, T* u, T* zs) {
  const int64_t r = in.lora_rank, D = in.D, V = in.V;
  gemm<T>(false, true, c, r, D, T(1), hs, D, in.lora_A, D, T(0), u, r);
  gemm<T>(false, true, c, V, r, T(1), u, r, in.lora_B, r, T(1), zs, V);
}

// Its gradients from the chunk's dz [c, V]: w = dz Bs [c, r], dx += w A (x: the term's
// input rows, hs or lora_x's; dx: dh_c, or beta 0 into lora_x's own gradient), dA += w^T x,
// dBs += dz^T u.
template <class T>
void lora_grads(const LinearDivergenceInputs<T>& in, const LinearDivergenceGrads<T>& g, const T* x,
                const T* u, const T* dz, int64_t c, T* w, T* dx, T dx_beta) {
  const int64_t r = in.lora_rank, D = in.D, V = in.V;
  gemm<T>(false, false, c, r, V, T(1), dz, V, in.lora_B, r, T(0), w, r);
  gemm<T>(false, false, c, D, r, T(1), w, r, in.lora_A, D, dx_beta, dx, D);
  gemm<T>(true, false, r, D, c, T(1), w, r, x, D, T(1), g.dA, D);
  gemm<T>(true, false, V, r, c, T(1), dz, V, u, r, T(1), g.dB, r);
}

// DoRA: zs := zs diag(c), keeping the unscaled block in `pre` when the gradient needs it.
template <class T>
void scale_columns(const T* col, int64_t c, int64_t V, T* zs, T* pre) {
  if (pre) std::memcpy(pre, zs, sizeof(T) * size_t(c * V));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < c; ++i)
    for (int64_t v = 0; v < V; ++v) zs[i * V + v] *= col[v];
}

// Its gradient: dc += sum_i dz_i * pre_i, then dz := dz diag(c) (the unscaled logits').
template <class T>
void scale_columns_grad(const T* col, const T* pre, int64_t c, int64_t V, T* dz, T* dcol) {
  // Blocks of columns, each summed over the rows in order: row-major reads, and the same sums
  // whatever the thread count.
  constexpr int64_t kCols = 512;
#pragma omp parallel for schedule(static)
  for (int64_t v0 = 0; v0 < V; v0 += kCols) {
    const int64_t n = std::min(kCols, V - v0);
    std::array<double, kCols> acc{};
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < n; ++j)
        acc[size_t(j)] += double(dz[i * V + v0 + j]) * double(pre[i * V + v0 + j]);
    for (int64_t j = 0; j < n; ++j) dcol[v0 + j] += T(acc[size_t(j)]);
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < c; ++i)
    for (int64_t v = 0; v < V; ++v) dz[i * V + v] *= col[v];
}

// The teacher's side of a chunk when it is its top-k: no head, its log-probs scattered.
template <class T>
struct SparseTopKTeacher {};

// The teacher's logits zt [c, V] for the chunk's rows: from its hidden states and head, or
// scattered from its top-k.
template <class T, class TeacherHead>
void teacher_chunk_logits(const LinearDivergenceInputs<T>& in, const TeacherHead& teacher,
                          const std::vector<int64_t>& rows, int64_t c, T* ht, T* zt) {
  const int64_t K = in.teacher_top_k, V = in.V, Dt = in.teacher_D;
  if constexpr (std::is_same_v<TeacherHead, SparseTopKTeacher<T>>) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i)
      scatter_top_k<T>(in.teacher_topk_ids + rows[size_t(i)] * K,
                       in.teacher_topk_logprobs + rows[size_t(i)] * K, K, V, zt + i * V);
  } else {
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(ht + i * Dt, in.teacher_h + rows[size_t(i)] * Dt, sizeof(T) * size_t(Dt));
    teacher.logits(ht, c, zt);
  }
}

// The sweep over chunks of labelled rows, for any pair of heads (head_gemm.h).
template <class T, class StudentHead, class TeacherHead>
std::array<double, 2> fused_divergence(const LinearDivergenceInputs<T>& in,
                                       const StudentHead& student, const TeacherHead& teacher,
                                       const LinearDivergenceGrads<T>* g) {
  const int64_t N = in.N, V = in.V, D = in.D, Dt = in.teacher_D;
  const int64_t C = std::max<int64_t>(1, std::min(in.chunk_rows, N));
  // Counted scratch, so the planner's and the run's peak both see it.
  Tensor zs_buf = Tensor::empty({C, V}, dtype_of<T>());
  Tensor zt_buf = Tensor::empty({C, V}, dtype_of<T>());
  Tensor hs_buf = Tensor::empty({C, D}, dtype_of<T>());
  Tensor ht_buf = Tensor::empty({C, Dt}, dtype_of<T>());
  Tensor dh_buf = Tensor::empty({g ? C : 0, D}, dtype_of<T>());
  const int64_t r = in.lora_A ? in.lora_rank : 0;
  // The LoRA term's products hs_c A^T and dz Bs, [C, r] each.
  Tensor u_buf = Tensor::empty({C, r}, dtype_of<T>());
  Tensor w_buf = Tensor::empty({g ? C : 0, r}, dtype_of<T>());
  // The LoRA term's own input rows (lora_dropout) and their gradient; DoRA's unscaled logits.
  const bool own_x = r && in.lora_x;
  Tensor x_buf = Tensor::empty({own_x ? C : 0, D}, dtype_of<T>());
  Tensor dx_buf = Tensor::empty({own_x && g ? C : 0, D}, dtype_of<T>());
  Tensor pre_buf = Tensor::empty({in.col_scale && g ? C : 0, V}, dtype_of<T>());
  T *xs = own_x ? x_buf.data<T>() : nullptr, *dxc = dx_buf.data<T>();
  T *zs = zs_buf.data<T>(), *zt = zt_buf.data<T>();
  T *hs = hs_buf.data<T>(), *ht = ht_buf.data<T>(), *dhc = dh_buf.data<T>();
  std::vector<int64_t> rows;
  rows.reserve(size_t(C));
  std::vector<std::array<double, 2>> row_loss(static_cast<size_t>(C));
  if (g) {
    std::memset(g->dh, 0, sizeof(T) * size_t(N * D));
    if (g->dW) std::memset(g->dW, 0, sizeof(T) * size_t(V * D));
    if (r) {
      std::memset(g->dA, 0, sizeof(T) * size_t(r * D));
      std::memset(g->dB, 0, sizeof(T) * size_t(V * r));
    }
    if (own_x) std::memset(g->d_lora_x, 0, sizeof(T) * size_t(N * D));
    if (in.col_scale) std::memset(g->d_col_scale, 0, sizeof(T) * size_t(V));
  }
  std::array<double, 2> total{0.0, 0.0};
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t c =
        detail::gather_labelled_rows(in.h, in.labels, r0, std::min(N, r0 + C), D, V, rows, hs);
    if (c == 0) continue;
    student.logits(hs, c, zs);
    if (own_x)
      for (int64_t i = 0; i < c; ++i)
        std::memcpy(xs + i * D, in.lora_x + rows[size_t(i)] * D, sizeof(T) * size_t(D));
    if (r) lora_logits(in, own_x ? xs : hs, c, u_buf.data<T>(), zs);
    if (in.col_scale) scale_columns(in.col_scale, c, V, zs, g ? pre_buf.data<T>() : nullptr);
    teacher_chunk_logits(in, teacher, rows, c, ht, zt);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i)
      row_loss[size_t(i)] =
          row_losses<T>(zs + i * V, zt + i * V, in.labels[rows[size_t(i)]], V, in.divergence, g);
    for (int64_t i = 0; i < c; ++i) {
      total[0] += row_loss[size_t(i)][0];
      total[1] += row_loss[size_t(i)][1];
    }
    if (!g) continue;
    if (in.col_scale) scale_columns_grad(in.col_scale, pre_buf.data<T>(), c, V, zs, g->d_col_scale);
    student.grad_h(zs, c, dhc);
    if (r)
      lora_grads(in, *g, own_x ? xs : hs, u_buf.data<T>(), zs, c, w_buf.data<T>(),
                 own_x ? dxc : dhc, T(own_x ? 0 : 1));
    for (int64_t i = 0; i < c; ++i) {
      std::memcpy(g->dh + rows[size_t(i)] * D, dhc + i * D, sizeof(T) * size_t(D));
      if (own_x) std::memcpy(g->d_lora_x + rows[size_t(i)] * D, dxc + i * D, sizeof(T) * size_t(D));
    }
    if (g->dW) gemm<T>(true, false, V, D, c, T(1), zs, V, hs, D, T(1), g->dW, D);
  }
  return total;
}

// A bf16 head widened a tile at a time into its own counted scratch; calls run(head).
template <class Run>
std::array<double, 2> with_bf16_head(const uint16_t* W, int64_t D, int64_t V, const Run& run) {
  const int64_t tr = bf16_tile_rows(V, D);
  Tensor tile = Tensor::empty({tr, D}, DType::F32);
  return run(detail::BF16Head<float>{{W, D}, D, V, tr, tile.data<float>()});
}

// An NF4 student head dequantized a tile at a time into its own counted scratch.
template <class T, class Run>
std::array<double, 2> with_nf4_head(const NF4View& W, const Run& run) {
  const int64_t tr = nf4_tile_rows(W.rows, W.cols);
  Tensor tile = Tensor::empty({tr, W.cols}, dtype_of<T>());
  return run(detail::NF4Head<T>{{W}, W.cols, W.rows, tr, tile.data<T>()});
}

// Float: each head dense or bf16, the student's also NF4.
std::array<double, 2> fused_float(const LinearDivergenceInputs<float>& in,
                                  const LinearDivergenceGrads<float>* g) {
  const auto with_teacher = [&](const auto& student) {
    if (in.teacher_top_k > 0) return fused_divergence(in, student, SparseTopKTeacher<float>{}, g);
    if (!in.teacher_W_bf16)
      return fused_divergence(in, student,
                              detail::DenseHead<float>{in.teacher_W, in.teacher_D, in.V}, g);
    // The teacher only forms logits: on the CPU's bf16 dot products its bf16 head is read as
    // stored when its hidden states hold bf16 values (fused_linear_cross_entropy.h's rule).
    if (bf16_matmul_path() == Bf16MatmulPath::OneDnn &&
        holds_bf16_values(in.teacher_h, in.N * in.teacher_D)) {
      const int64_t C = std::max<int64_t>(1, std::min(in.chunk_rows, in.N));
      Tensor ht_bf16 = Tensor::empty({C, in.teacher_D}, DType::BF16);
      return fused_divergence(
          in, student,
          detail::OneDnnBf16Head{in.teacher_W_bf16, in.teacher_D, in.V, ht_bf16.data<uint16_t>()},
          g);
    }
    return with_bf16_head(in.teacher_W_bf16, in.teacher_D, in.V, [&](const auto& teacher) {
      return fused_divergence(in, student, teacher, g);
    });
  };
  if (in.W_nf4) return with_nf4_head<float>(*in.W_nf4, with_teacher);
  if (!in.W_bf16) return with_teacher(detail::DenseHead<float>{in.W, in.D, in.V});
  return with_bf16_head(in.W_bf16, in.D, in.V, with_teacher);
}

}  // namespace

int64_t fused_divergence_scratch_bytes(const DivergenceScratchShape& s) {
  const int64_t C = s.chunk_rows;
  int64_t elems = 2 * C * s.V + C * (s.D + s.teacher_D) + (s.grads ? C * s.D : 0);
  if (s.student_bf16) elems += bf16_tile_rows(s.V, s.D) * s.D;
  int64_t teacher_bytes = 0;  // the teacher's tile, or its rows in bf16 on bf16 dot products
  if (s.teacher_bf16) {
    teacher_bytes = bf16_tile_rows(s.V, s.teacher_D) * s.teacher_D * s.elem_bytes;
    if (bf16_matmul_path() == Bf16MatmulPath::OneDnn)
      teacher_bytes =
          std::max(teacher_bytes, detail::OneDnnBf16Head::scratch_bytes(C, s.teacher_D, s.V));
  }
  if (s.student_nf4) elems += nf4_tile_rows(s.V, s.D) * s.D;
  elems += (s.grads ? 2 : 1) * C * s.lora_rank;
  if (s.lora_x) elems += (s.grads ? 2 : 1) * C * s.D;
  if (s.col_scale && s.grads) elems += C * s.V;
  return elems * s.elem_bytes + teacher_bytes;
}

template <class T>
void scatter_top_k(const int32_t* ids, const T* logprobs, int64_t K, int64_t V, T* z) {
  std::fill(z, z + V, T(kTopKFloorLogit));
  for (int64_t k = 0; k < K; ++k) {
    FT_CHECK(ids[k] >= 0 && ids[k] < V, "teacher top-k: token id " + std::to_string(ids[k]) +
                                            " is outside the vocabulary [0, " + std::to_string(V) +
                                            ")");
    z[ids[k]] = logprobs[k];
  }
}

// z := cap * tanh(z / cap), in T as the model's softcap op computes it.
template <class T>
void cap_teacher_row(T* z, int64_t V, double cap) {
  const T c = T(cap), inv = T(1) / c;
  for (int64_t v = 0; v < V; ++v) z[v] = std::tanh(z[v] * inv) * c;
}

template <class T>
void teacher_top_k(const T* h, const T* W, const uint16_t* W_bf16, int64_t N, int64_t D, int64_t V,
                   int64_t K, int64_t chunk_rows, int32_t* ids, T* logprobs, double softcap) {
  FT_CHECK(K >= 1 && K <= V, "teacher top-k: k = " + std::to_string(K) + " must be in [1, " +
                                 std::to_string(V) + "]");
  const int64_t C = std::max<int64_t>(1, std::min(chunk_rows, N));
  Tensor z_buf = Tensor::empty({C, V}, dtype_of<T>());
  T* z = z_buf.data<T>();
  const auto top_k_of_chunk = [&](const auto& head, int64_t r0, int64_t c) {
    head.logits(h + r0 * D, c, z);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i) {
      T* zi = z + i * V;
      std::vector<int32_t> order(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v) order[size_t(v)] = int32_t(v);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [zi](int32_t a, int32_t b) {
        return zi[a] > zi[b] || (zi[a] == zi[b] && a < b);
      });
      if (softcap > 0) cap_teacher_row(zi, V, softcap);
      const double lse = row_lse(zi, V);
      for (int64_t k = 0; k < K; ++k) {
        ids[(r0 + i) * K + k] = order[size_t(k)];
        logprobs[(r0 + i) * K + k] = T(double(zi[order[size_t(k)]]) - lse);
      }
    }
  };
  const auto sweep = [&](const auto& head) {
    for (int64_t r0 = 0; r0 < N; r0 += C) top_k_of_chunk(head, r0, std::min(C, N - r0));
  };
  if constexpr (std::is_same_v<T, float>) {
    if (W_bf16) {
      with_bf16_head(W_bf16, D, V, [&](const auto& head) {
        sweep(head);
        return std::array<double, 2>{};
      });
      return;
    }
  }
  FT_CHECK(!W_bf16, "teacher_top_k: a bf16 head needs float");
  sweep(detail::DenseHead<T>{W, D, V});
}

template <class T>
std::array<double, 2> fused_linear_divergence(const LinearDivergenceInputs<T>& in,
                                              const LinearDivergenceGrads<T>* g) {
  if constexpr (std::is_same_v<T, float>) {
    return fused_float(in, g);
  } else {
    FT_CHECK(!in.W_bf16 && !in.teacher_W_bf16, "fused_linear_divergence: bf16 heads need float");
    const auto with_teacher = [&](const auto& student) {
      if (in.teacher_top_k > 0) return fused_divergence(in, student, SparseTopKTeacher<T>{}, g);
      return fused_divergence(in, student, detail::DenseHead<T>{in.teacher_W, in.teacher_D, in.V},
                              g);
    };
    if (in.W_nf4) return with_nf4_head<T>(*in.W_nf4, with_teacher);
    return with_teacher(detail::DenseHead<T>{in.W, in.D, in.V});
  }
}

template void scatter_top_k<float>(const int32_t*, const float*, int64_t, int64_t, float*);
template void scatter_top_k<double>(const int32_t*, const double*, int64_t, int64_t, double*);
template void teacher_top_k<float>(const float*, const float*, const uint16_t*, int64_t, int64_t,
                                   int64_t, int64_t, int64_t, int32_t*, float*, double);
template void teacher_top_k<double>(const double*, const double*, const uint16_t*, int64_t, int64_t,
                                    int64_t, int64_t, int64_t, int32_t*, double*, double);
template std::array<double, 2> fused_linear_divergence<float>(const LinearDivergenceInputs<float>&,
                                                              const LinearDivergenceGrads<float>*);
template std::array<double, 2> fused_linear_divergence<double>(
    const LinearDivergenceInputs<double>&, const LinearDivergenceGrads<double>*);

}  // namespace fusetune::kernels
