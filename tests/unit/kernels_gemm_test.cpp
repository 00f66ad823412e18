#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "fusetune/kernels/cpu/blas_info.h"
#include "fusetune/kernels/cpu/gemm_peak.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/error.h"
#include "kernels_test_util.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

// C = alpha op(A) op(B) + beta C with A stored [M,K] (or [K,M] when transposed), leading
// dimensions as given; double accumulation.
template <class T>
std::vector<double> ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                             const std::vector<T>& A, int64_t lda, const std::vector<T>& B,
                             int64_t ldb, double beta, const std::vector<T>& C, int64_t ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
      }
      const double c0 = beta == 0.0 ? 0.0 : beta * static_cast<double>(C[i * ldc + j]);
      out[i * ldc + j] = alpha * s + c0;
    }
  }
  return out;
}

template <class T>
void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, double alpha,
                double beta, double rtol) {
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  const auto A = random_vec<T>((ta ? K : M) * lda, 1);
  const auto B = random_vec<T>((tb ? N : K) * ldb, 2);
  auto C = random_vec<T>(M * ldc, 3);
  const auto want = ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  kernels::gemm<T>(ta, tb, M, N, K, static_cast<T>(alpha), A.data(), lda, B.data(), ldb,
                   static_cast<T>(beta), C.data(), ldc);
  const std::string what = "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                           " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K);
  expect_close(C, want, rtol, rtol * (1 + K), what.c_str());
}

}  // namespace

TEST(KernelsGemm, MatchesNaiveAllTransposesOddSizes) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                             {3, 17, 5},
                             {17, 3, 67},
                             {67, 33, 17},
                             {130, 67, 129}}) {
        check_gemm<double>(ta, tb, M, N, K, 0, 1.0, 0.0, 1e-12);
        check_gemm<float>(ta, tb, M, N, K, 0, 1.0, 0.0, 1e-5);
        // Padded leading dimensions, alpha and beta.
        check_gemm<double>(ta, tb, M, N, K, 3, -0.5, 0.75, 1e-12);
        check_gemm<float>(ta, tb, M, N, K, 5, 2.0, 1.0, 1e-5);
      }
    }
  }
}

TEST(KernelsGemm, LargeEnoughToThread) {
  check_gemm<float>(false, true, 300, 257, 190, 0, 1.0, 0.0, 1e-5);
  check_gemm<double>(true, false, 257, 300, 190, 0, 1.0, 1.0, 1e-12);
}

TEST(KernelsGemm, KZeroScalesCAndBetaZeroClearsNaN) {
  std::vector<float> C = {1.0f, 2.0f, 3.0f, 4.0f};
  kernels::gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
  std::vector<float> D = {std::nanf(""), 1.0f};
  kernels::gemm<float>(false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, D.data(), 2);
  EXPECT_EQ(D, (std::vector<float>{0.0f, 0.0f}));
}

TEST(KernelsGemm, RejectsBadLeadingDimension) {
  std::vector<float> A(12), B(12), C(9);
  try {
    kernels::gemm<float>(false, false, 3, 3, 4, 1.0f, A.data(), 3, B.data(), 3, 0.0f, C.data(), 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lda=3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernels::gemm<float>(false, false, -1, 3, 4, 1.0f, A.data(), 4, B.data(), 3, 0.0f,
                                    C.data(), 3),
               Error);
}

namespace {
// Batched against a loop of naive GEMMs, with strides (0 = broadcast).
template <class T>
void check_batched(int64_t batch, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   bool broadcast_b, double rtol) {
  const int64_t sa = M * K, sb = broadcast_b ? 0 : K * N, sc = M * N;
  const auto A = random_vec<T>(batch * sa, 11);
  const auto B = random_vec<T>(broadcast_b ? K * N : batch * sb, 12);
  auto C = random_vec<T>(batch * sc, 13);
  std::vector<double> want(C.begin(), C.end());
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<T> Ab(A.begin() + b * sa, A.begin() + (b + 1) * sa);
    std::vector<T> Bb(B.begin() + b * sb, B.begin() + b * sb + K * N);
    std::vector<T> Cb(C.begin() + b * sc, C.begin() + (b + 1) * sc);
    const auto r = ref_gemm(ta, tb, M, N, K, 0.5, Ab, ta ? M : K, Bb, tb ? K : N, 1.0, Cb, N);
    std::copy(r.begin(), r.end(), want.begin() + b * sc);
  }
  kernels::gemm_batched<T>(batch, ta, tb, M, N, K, T(0.5), A.data(), sa, B.data(), sb, T(1),
                           C.data(), sc);
  expect_close(C, want, rtol, rtol * (1 + K), "gemm_batched");
}
}  // namespace

TEST(KernelsGemm, BatchedSmallAndLargeMatrices) {
  // Small matrices take the batch-parallel path (with 2+ threads).
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_batched<double>(7, ta, tb, 17, 3, 5, false, 1e-12);
      check_batched<float>(5, ta, tb, 33, 17, 67, true, 1e-5);
    }
  }
  // 72 MFLOP per matrix: an odd batch loops over BLAS calls, an even one goes by batch.
  check_batched<float>(3, false, true, 400, 300, 300, false, 1e-5);
  check_batched<float>(4, true, false, 400, 300, 300, true, 1e-5);
  check_batched<double>(1, true, false, 1, 1, 1, false, 1e-12);
  check_batched<float>(0, false, false, 3, 3, 3, false, 1e-5);
}

TEST(KernelsGemm, BatchedZeroOutputStrideAccumulatesInOrder) {
  const int64_t batch = 4, M = 3, N = 2, K = 5;
  const auto A = random_vec<double>(batch * M * K, 21);
  const auto B = random_vec<double>(batch * K * N, 22);
  std::vector<double> C(M * N, 0.0), want(M * N, 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        for (int64_t k = 0; k < K; ++k) {
          want[i * N + j] += A[b * M * K + i * K + k] * B[b * K * N + k * N + j];
        }
      }
    }
  }
  kernels::gemm_batched<double>(batch, false, false, M, N, K, 1.0, A.data(), M * K, B.data(), K * N,
                                1.0, C.data(), 0);
  expect_close(C, want, 1e-12, 1e-12, "accumulated C");
}

TEST(KernelsGemm, DeterministicAcrossRuns) {
  const auto A = random_vec<float>(64 * 96 * 48, 31);
  const auto B = random_vec<float>(64 * 48 * 80, 32);
  auto run = [&] {
    std::vector<float> C(64 * 96 * 80);
    kernels::gemm_batched<float>(64, false, false, 96, 80, 48, 1.0f, A.data(), 96 * 48, B.data(),
                                 48 * 80, 0.0f, C.data(), 96 * 80);
    return C;
  };
  EXPECT_TRUE(bitwise_equal(run(), run()));
}

TEST(KernelsGemm, BlasDescriptionNamesTheCore) {
  EXPECT_NE(kernels::blas_description().find("core="), std::string::npos);
}

TEST(KernelsGemm, PeakMeasurementIsPositive) {
  EXPECT_GT(kernels::measure_peak_gemm_gflops(64), 0.0);
  EXPECT_THROW(kernels::measure_peak_gemm_gflops(0), Error);
}
