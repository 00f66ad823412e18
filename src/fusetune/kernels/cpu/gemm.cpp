// GEMM through OpenBLAS (cblas, row-major). The OpenMP build of OpenBLAS threads each call on
// our OpenMP pool; inside an OpenMP parallel region it runs single-threaded.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <string>

#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/parallel.h"
#include "fusetune/util/error.h"

namespace fusetune::kernels {
namespace {

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, double alpha,
               const double* A, int lda, const double* B, int ldb, double beta, double* C,
               int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// y = op(A) x for a row-major A [rows, cols]; y has unit stride.
void blas_gemv(CBLAS_TRANSPOSE t, int rows, int cols, float alpha, const float* A, int lda,
               const float* x, int incx, float beta, float* y) {
  cblas_sgemv(CblasRowMajor, t, rows, cols, alpha, A, lda, x, incx, beta, y, 1);
}
void blas_gemv(CBLAS_TRANSPOSE t, int rows, int cols, double alpha, const double* A, int lda,
               const double* x, int incx, double beta, double* y) {
  cblas_dgemv(CblasRowMajor, t, rows, cols, alpha, A, lda, x, incx, beta, y, 1);
}

std::string dims(int64_t M, int64_t N, int64_t K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

// BLAS takes 32-bit ints and reports bad arguments by printing, so we check first.
void check_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                int64_t ldb, int64_t ldc) {
  FT_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size " + dims(M, N, K));
  FT_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
               ldc <= INT_MAX,
           "gemm: size " + dims(M, N, K) + " exceeds the 32-bit BLAS interface");
  const int64_t a_cols = trans_a ? M : K;  // A is stored [M,K], or [K,M] when transposed
  const int64_t b_cols = trans_b ? K : N;
  FT_CHECK(lda >= std::max<int64_t>(1, a_cols), "gemm: lda=" + std::to_string(lda) + " < " +
                                                    std::to_string(a_cols) + " for " +
                                                    dims(M, N, K));
  FT_CHECK(ldb >= std::max<int64_t>(1, b_cols), "gemm: ldb=" + std::to_string(ldb) + " < " +
                                                    std::to_string(b_cols) + " for " +
                                                    dims(M, N, K));
  FT_CHECK(ldc >= std::max<int64_t>(1, N), "gemm: ldc=" + std::to_string(ldc) + " < " +
                                               std::to_string(N) + " for " + dims(M, N, K));
}

// One GEMM, arguments already checked. K == 0 or alpha == 0 only scales C (beta == 0 writes
// zeros, so garbage or NaN in C does not survive, as in BLAS).
template <class T>
void gemm_unchecked(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
                    const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == T(0)) {
    for (int64_t i = 0; i < M; ++i) {
      T* c = C + i * ldc;
      if (beta == T(0)) {
        std::fill(c, c + N, T(0));
      } else {
        for (int64_t j = 0; j < N; ++j) c[j] *= beta;
      }
    }
    return;
  }
  if (M == 1) {
    // A row vector times B (batch-1 decode): GEMV streams B once, where GEMM would first pack
    // all of B into its tile layout, reading and writing it again. C^T = op(B)^T a.
    const int incx = trans_a ? static_cast<int>(lda) : 1;
    blas_gemv(trans_b ? CblasNoTrans : CblasTrans, static_cast<int>(trans_b ? N : K),
              static_cast<int>(trans_b ? K : N), alpha, B, static_cast<int>(ldb), A, incx, beta, C);
    return;
  }
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
            static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
            static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  check_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  gemm_unchecked(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Batched GEMM: two strategies.
//  - loop: one BLAS call per matrix, BLAS threads each call (a fork/join and barrier per call);
//  - by-batch: OpenMP over whole matrices, each BLAS call single-threaded (OpenBLAS runs
//    single-threaded inside a parallel region): one fork/join per batch, no barriers inside.
// bench/gemm on this 2-core machine (shared, so under load): at 1 thread both are equal; at 2
// threads by-batch reached 280-310 GFLOP/s on attention-sized matrices ([T,64]x[64,T], T=128-256)
// where the loop fell to 0.1-13 GFLOP/s, its per-call barriers stalling whenever another process
// held a core; with T=1024 (134 MFLOP per matrix) by-batch still won, 45-52 vs 7-10 GFLOP/s.
// So by-batch is used whenever it keeps every thread busy: small matrices with batch >= threads,
// large ones only when the batch divides evenly (otherwise the last round leaves threads idle
// while the loop would use them all).
template <class T>
void gemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                  T alpha, const T* A, int64_t stride_a, const T* B, int64_t stride_b, T beta, T* C,
                  int64_t stride_c) {
  FT_CHECK(batch >= 0, "gemm_batched: negative batch " + std::to_string(batch));
  FT_CHECK(stride_a >= 0 && stride_b >= 0 && stride_c >= 0,
           "gemm_batched: negative stride for " + dims(M, N, K));
  const int64_t lda = std::max<int64_t>(1, trans_a ? M : K);
  const int64_t ldb = std::max<int64_t>(1, trans_b ? K : N);
  const int64_t ldc = std::max<int64_t>(1, N);
  check_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  constexpr double kSmallFlops = 64.0 * 1024 * 1024;
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * K;
  const int threads = omp_get_max_threads();
  // stride_c == 0 accumulates into one C in batch order (meaningful with beta == 1): serial.
  const bool by_batch = stride_c != 0 && threads > 1 && batch >= threads &&
                        (flops < kSmallFlops || batch % threads == 0);
  if (by_batch) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < batch; ++b) {
      gemm_unchecked(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb,
                     beta, C + b * stride_c, ldc);
    }
  } else {
    for (int64_t b = 0; b < batch; ++b) {
      gemm_unchecked(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb,
                     beta, C + b * stride_c, ldc);
    }
  }
}

#define FT_INSTANTIATE(T)                                                                      \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, \
                        int64_t, T, T*, int64_t);                                              \
  template void gemm_batched<T>(int64_t, bool, bool, int64_t, int64_t, int64_t, T, const T*,   \
                                int64_t, const T*, int64_t, T, T*, int64_t);
FT_INSTANTIATE(float)
FT_INSTANTIATE(double)
#undef FT_INSTANTIATE

}  // namespace fusetune::kernels
