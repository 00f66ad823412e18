// The fused linear + divergence kernel (fused_linear_divergence.h). Rows of a chunk run in
// parallel, each summed in double; the row values are added in row order, so results do not
// depend on the thread count.
#include "fusetune/kernels/cpu/fused_linear_divergence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
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
  T *zs = zs_buf.data<T>(), *zt = zt_buf.data<T>();
  T *hs = hs_buf.data<T>(), *ht = ht_buf.data<T>(), *dhc = dh_buf.data<T>();
  std::vector<int64_t> rows;
  rows.reserve(size_t(C));
  std::vector<std::array<double, 2>> row_loss(static_cast<size_t>(C));
  if (g) {
    std::memset(g->dh, 0, sizeof(T) * size_t(N * D));
    if (g->dW) std::memset(g->dW, 0, sizeof(T) * size_t(V * D));
  }
  std::array<double, 2> total{0.0, 0.0};
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t c =
        detail::gather_labelled_rows(in.h, in.labels, r0, std::min(N, r0 + C), D, V, rows, hs);
    if (c == 0) continue;
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(ht + i * Dt, in.teacher_h + rows[size_t(i)] * Dt, sizeof(T) * size_t(Dt));
    student.logits(hs, c, zs);
    teacher.logits(ht, c, zt);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < c; ++i)
      row_loss[size_t(i)] =
          row_losses<T>(zs + i * V, zt + i * V, in.labels[rows[size_t(i)]], V, in.divergence, g);
    for (int64_t i = 0; i < c; ++i) {
      total[0] += row_loss[size_t(i)][0];
      total[1] += row_loss[size_t(i)][1];
    }
    if (!g) continue;
    student.grad_h(zs, c, dhc);
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(g->dh + rows[size_t(i)] * D, dhc + i * D, sizeof(T) * size_t(D));
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

// Float: each head dense or bf16.
std::array<double, 2> fused_float(const LinearDivergenceInputs<float>& in,
                                  const LinearDivergenceGrads<float>* g) {
  const auto with_teacher = [&](const auto& student) {
    if (!in.teacher_W_bf16)
      return fused_divergence(in, student,
                              detail::DenseHead<float>{in.teacher_W, in.teacher_D, in.V}, g);
    return with_bf16_head(in.teacher_W_bf16, in.teacher_D, in.V, [&](const auto& teacher) {
      return fused_divergence(in, student, teacher, g);
    });
  };
  if (!in.W_bf16) return with_teacher(detail::DenseHead<float>{in.W, in.D, in.V});
  return with_bf16_head(in.W_bf16, in.D, in.V, with_teacher);
}

}  // namespace

int64_t fused_divergence_scratch_bytes(const DivergenceScratchShape& s) {
  const int64_t C = s.chunk_rows;
  int64_t elems = 2 * C * s.V + C * (s.D + s.teacher_D) + (s.grads ? C * s.D : 0);
  if (s.student_bf16) elems += bf16_tile_rows(s.V, s.D) * s.D;
  if (s.teacher_bf16) elems += bf16_tile_rows(s.V, s.teacher_D) * s.teacher_D;
  return elems * s.elem_bytes;
}

template <class T>
std::array<double, 2> fused_linear_divergence(const LinearDivergenceInputs<T>& in,
                                              const LinearDivergenceGrads<T>* g) {
  if constexpr (std::is_same_v<T, float>) {
    return fused_float(in, g);
  } else {
    FT_CHECK(!in.W_bf16 && !in.teacher_W_bf16, "fused_linear_divergence: bf16 heads need float");
    return fused_divergence(in, detail::DenseHead<T>{in.W, in.D, in.V},
                            detail::DenseHead<T>{in.teacher_W, in.teacher_D, in.V}, g);
  }
}

template std::array<double, 2> fused_linear_divergence<float>(const LinearDivergenceInputs<float>&,
                                                              const LinearDivergenceGrads<float>*);
template std::array<double, 2> fused_linear_divergence<double>(
    const LinearDivergenceInputs<double>&, const LinearDivergenceGrads<double>*);

}  // namespace fusetune::kernels
