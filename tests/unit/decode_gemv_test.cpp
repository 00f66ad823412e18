// The decode GEMV (kernels/cpu/decode_gemv.h): y = x W^T for a decode step's few rows against a
// bf16 weight, against an fp64 reference with the rounding bound written out; x and y in fp32
// and bf16; sizes around its 16-lane pieces and 4-row blocks; the same bits on 1 and 2
// threads; and the routes that reach it (a bf16 graph's MatMul and the widening GEMM) give its
// bits whatever FUSETUNE_BF16_MATMUL says. The NF4 variant against the dequantized weight, and
// nf4_matmul's route to it.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "fusetune/core/dtype.h"
#include "fusetune/core/tensor.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/decode_gemv.h"
#include "fusetune/kernels/cpu/nf4.h"

using namespace fusetune;

namespace {

std::vector<uint16_t> random_bf16_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (uint16_t& x : v) x = f32_to_bf16(d(rng));
  return v;
}

std::vector<float> widened(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

// u = 2^-24, fp32's unit roundoff: K products (exact in fp32: bf16 x bf16 has 16 significant
// bits) summed in fp32 in any order are within K u sum|x w| of the exact sum. A bf16 output is
// that sum rounded once more, by at most 2^-8 of its value.
constexpr double kUnitRoundoff = 0x1p-24, kBf16HalfUlp = 0x1p-8;

struct GemvCase {
  int64_t M, N, K;
};

// Rows 1..16 (every block split), weight rows around the 4-row block, K around 16-lane pieces.
std::vector<GemvCase> gemv_cases() {
  std::vector<GemvCase> out;
  for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 13, 16})
    for (int64_t N : {1, 3, 4, 5, 9})
      for (int64_t K : {1, 15, 16, 17, 48, 129}) out.push_back({M, N, K});
  out.push_back({1, 301, 1001});
  out.push_back({8, 64, 2048});
  return out;
}

void expect_matches_reference(const GemvCase& c, bool x_bf16, bool y_bf16) {
  const auto X = random_bf16_values(c.M * c.K, 11 + c.M), W = random_bf16_values(c.N * c.K, 7);
  const std::vector<float> x32 = widened(X);
  std::vector<float> y32(size_t(c.M * c.N));
  std::vector<uint16_t> y16(y32.size());
  kernels::decode_gemv_bf16_weight(c.M, c.N, c.K, x_bf16 ? (const void*)X.data() : x32.data(),
                                   x_bf16, W.data(), y_bf16 ? (void*)y16.data() : y32.data(),
                                   y_bf16);
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      double exact = 0, scale = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = double(x32[size_t(m * c.K + k)]) * bf16_to_f32(W[size_t(n * c.K + k)]);
        exact += p;
        scale += std::abs(p);
      }
      const double sum_tol = double(c.K) * kUnitRoundoff * scale;
      const size_t i = size_t(m * c.N + n);
      const double got = y_bf16 ? double(bf16_to_f32(y16[i])) : double(y32[i]);
      const double tol =
          y_bf16 ? sum_tol * (1 + kBf16HalfUlp) + kBf16HalfUlp * std::abs(exact) : sum_tol;
      ASSERT_NEAR(got, exact, tol)
          << "M=" << c.M << " N=" << c.N << " K=" << c.K << " at (" << m << ", " << n << "), x "
          << (x_bf16 ? "bf16" : "fp32") << ", y " << (y_bf16 ? "bf16" : "fp32");
    }
}

// Sets FUSETUNE_BF16_MATMUL for one scope, then restores what was there (the Bf16Paths CTest
// entries run these tests with it set).
class GemvPathOverride {
 public:
  explicit GemvPathOverride(const char* value) {
    if (const char* old = std::getenv("FUSETUNE_BF16_MATMUL")) old_ = old, had_ = true;
    setenv("FUSETUNE_BF16_MATMUL", value, 1);
  }
  ~GemvPathOverride() {
    if (had_)
      setenv("FUSETUNE_BF16_MATMUL", old_.c_str(), 1);
    else
      unsetenv("FUSETUNE_BF16_MATMUL");
  }

 private:
  std::string old_;
  bool had_ = false;
};

// x W^T through a bf16 graph's MatMul route (kernels::matmul_bf16_native), x and W bf16, y fp32;
// empty when the route declines.
std::vector<float> native_route_product(const std::vector<uint16_t>& X,
                                        const std::vector<uint16_t>& W, int64_t M, int64_t N,
                                        int64_t K) {
  Tensor a = Tensor::empty({M, K}, DType::BF16), b = Tensor::empty({N, K}, DType::BF16);
  Tensor c = Tensor::empty({M, N}, DType::F32);
  std::copy(X.begin(), X.end(), a.data<uint16_t>());
  std::copy(W.begin(), W.end(), b.data<uint16_t>());
  if (!kernels::matmul_bf16_native(false, true, a, b, c)) return {};
  return std::vector<float>(c.data<float>(), c.data<float>() + M * N);
}

}  // namespace

TEST(Bf16DecodeGemv, MatchesTheFp64ReferenceForEveryOperandType) {
  for (const GemvCase& c : gemv_cases())
    for (bool x_bf16 : {false, true})
      for (bool y_bf16 : {false, true}) expect_matches_reference(c, x_bf16, y_bf16);
}

TEST(Bf16DecodeGemv, TheSameBitsOnOneAndTwoThreads) {
  const int64_t M = 5, N = 1027, K = 2048;  // big enough to go parallel
  const auto X = widened(random_bf16_values(M * K, 3));
  const auto W = random_bf16_values(N * K, 4);
  std::vector<float> one(size_t(M * N)), two(one.size());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  kernels::decode_gemv_bf16_weight(M, N, K, X.data(), false, W.data(), one.data(), false);
  omp_set_num_threads(2);
  kernels::decode_gemv_bf16_weight(M, N, K, X.data(), false, W.data(), two.data(), false);
  omp_set_num_threads(threads);
  EXPECT_EQ(one, two);
}

TEST(Bf16DecodeGemv, MoreRowsThanADecodeStepIsRefused) {
  std::vector<float> x(17 * 4), y(17 * 2);
  std::vector<uint16_t> w(2 * 4);
  EXPECT_ANY_THROW(
      kernels::decode_gemv_bf16_weight(17, 2, 4, x.data(), false, w.data(), y.data(), false));
}

// The two ways a decode step's x W^T reaches the kernel: a MatMul node of two bf16 operands
// (kernels::matmul_bf16_native, on any CPU and either FUSETUNE_BF16_MATMUL path, up to 4 rows)
// and a bf16 weight under fp32 activations (kernels::gemm_bf16_weight). Both give the GEMV's
// bits; more rows than a decode step take the GEMM paths.
TEST(Bf16DecodeGemv, DecodeShapedMatmulsReachIt) {
  const int64_t M = 3, N = 70, K = 96;
  const auto X = random_bf16_values(M * K, 5), W = random_bf16_values(N * K, 6);
  const std::vector<float> x32 = widened(X);
  std::vector<float> want(size_t(M * N)), got(want.size());
  kernels::decode_gemv_bf16_weight(M, N, K, x32.data(), false, W.data(), want.data(), false);
  kernels::gemm_bf16_weight(true, M, N, K, x32.data(), W.data(), got.data());
  EXPECT_EQ(got, want) << "gemm_bf16_weight";
  for (const char* path : {"widening", "auto"}) {
    const GemvPathOverride scoped(path);
    EXPECT_EQ(native_route_product(X, W, M, N, K), want) << path;
  }
  const GemvPathOverride scoped("widening");
  EXPECT_TRUE(native_route_product(random_bf16_values(17 * K, 7), W, 17, N, K).empty())
      << "17 rows: a GEMM";
}

namespace {

// An NF4 weight [rows, cols] quantized from uniform values, owning its buffers.
struct Nf4Matrix {
  std::vector<int32_t> codes, absmax_codes;
  std::vector<float> scales;
  float offset = 0;
  int64_t rows, cols;
  Nf4Matrix(int64_t r, int64_t c, uint64_t seed) : rows(r), cols(c) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> w(size_t(r * c));
    for (float& v : w) v = d(rng);
    const kernels::NF4Sizes s = kernels::nf4_sizes(r * c);
    codes.resize(size_t(s.code_words));
    absmax_codes.resize(size_t(s.absmax_words));
    scales.resize(size_t(s.scales));
    kernels::nf4_quantize(w.data(), r * c, codes.data(), absmax_codes.data(), scales.data(),
                          &offset);
  }
  kernels::NF4View view() const {
    return {codes.data(), absmax_codes.data(), scales.data(), offset, rows, cols};
  }
};

}  // namespace

// The NF4 GEMV multiplies by exactly the weight nf4_dequantize_rows makes (table value times
// the block's dequantized absmax, in fp32), summed in fp32 within the classical bound.
TEST(Nf4DecodeGemv, MatchesTheDequantizedWeightInFp64) {
  for (const GemvCase& c : std::vector<GemvCase>{
           {1, 1, 16}, {1, 5, 64}, {3, 9, 48}, {4, 4, 128}, {8, 37, 320}, {16, 6, 80}}) {
    const Nf4Matrix q(c.N, c.K, 21 + c.K);
    std::vector<float> wd(size_t(c.N * c.K));
    kernels::nf4_dequantize_rows(q.view(), 0, c.N, wd.data());
    const auto x = widened(random_bf16_values(c.M * c.K, 9));
    std::vector<float> y(size_t(c.M * c.N));
    ASSERT_TRUE(kernels::decode_gemv_nf4_weight(c.M, q.view(), x.data(), y.data()));
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double exact = 0, scale = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = double(x[size_t(m * c.K + k)]) * wd[size_t(n * c.K + k)];
          exact += p;
          scale += std::abs(p);
        }
        // Products of fp32 values are not exact in fp32 here: (K + 1) u per term.
        ASSERT_NEAR(y[size_t(m * c.N + n)], exact, double(c.K + 1) * kUnitRoundoff * scale)
            << "M=" << c.M << " N=" << c.N << " K=" << c.K << " at (" << m << ", " << n << ")";
      }
  }
}

// nf4_matmul takes the GEMV for a decode step's rows (its bits) and the tiled GEMM otherwise;
// rows that are not whole 16-element pieces are left to the GEMM.
TEST(Nf4DecodeGemv, Nf4MatmulTakesItForDecodeRowsOnly) {
  const Nf4Matrix q(40, 96, 5);
  const auto x = widened(random_bf16_values(20 * 96, 8));
  std::vector<float> want(size_t(3 * 40)), got(want.size());
  ASSERT_TRUE(kernels::decode_gemv_nf4_weight(3, q.view(), x.data(), want.data()));
  kernels::nf4_matmul(q.view(), x.data(), 3, got.data());
  EXPECT_EQ(got, want);
  const Nf4Matrix odd(4, 24, 6);
  std::vector<float> y(4);
  EXPECT_FALSE(kernels::decode_gemv_nf4_weight(1, odd.view(), x.data(), y.data()));
  std::vector<float> many(size_t(17 * 40));
  EXPECT_FALSE(kernels::decode_gemv_nf4_weight(17, q.view(), x.data(), many.data()));
}

namespace {

// y = x W^T on AMX tiles for x, W bf16 (decode_gemv_bf16_amx), y fp32 or bf16.
std::vector<float> amx_product(const std::vector<uint16_t>& X, const std::vector<uint16_t>& W,
                               int64_t M, int64_t N, int64_t K, bool y_bf16) {
  std::vector<float> y(size_t(M * N));
  std::vector<uint16_t> y16(y.size());
  kernels::decode_gemv_bf16_amx(M, N, K, X.data(), W.data(), y_bf16 ? (void*)y16.data() : y.data(),
                                y_bf16);
  if (y_bf16)
    for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_to_f32(y16[i]);
  return y;
}

}  // namespace

// Rows 1..16, weight rows around the 16-row tile and the 64-row step, K around the 32-element
// piece: every output within the fp32 summation bound of the fp64 sum (bf16 x bf16 products
// are exact in fp32; a bf16 output is rounded once more).
TEST(Bf16DecodeAmx, MatchesTheFp64Reference) {
  if (!kernels::amx_tiles_usable()) GTEST_SKIP() << "no AMX tiles on this CPU";
  for (int64_t M : {1, 3, 4, 8, 13, 16})
    for (int64_t N : {1, 15, 16, 17, 64, 65, 130})
      for (int64_t K : {1, 31, 32, 33, 96, 100}) {
        const auto X = random_bf16_values(M * K, 31 + M), W = random_bf16_values(N * K, 37 + K);
        const std::vector<float> x32 = widened(X), w32 = widened(W);
        for (bool y_bf16 : {false, true}) {
          const std::vector<float> y = amx_product(X, W, M, N, K, y_bf16);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double exact = 0, scale = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = double(x32[size_t(m * K + k)]) * w32[size_t(n * K + k)];
                exact += p;
                scale += std::abs(p);
              }
              const double sum_tol = double(K) * kUnitRoundoff * scale;
              const double tol =
                  y_bf16 ? sum_tol * (1 + kBf16HalfUlp) + kBf16HalfUlp * std::abs(exact) : sum_tol;
              ASSERT_NEAR(y[size_t(m * N + n)], exact, tol)
                  << "M=" << M << " N=" << N << " K=" << K << " at (" << m << ", " << n << ")";
            }
        }
      }
}

TEST(Bf16DecodeAmx, MoreRowsThanADecodeStepIsRefused) {
  if (!kernels::amx_tiles_usable()) GTEST_SKIP() << "no AMX tiles on this CPU";
  std::vector<uint16_t> x(17 * 32), w(2 * 32);
  std::vector<float> y(17 * 2);
  EXPECT_ANY_THROW(kernels::decode_gemv_bf16_amx(17, 2, 32, x.data(), w.data(), y.data(), false));
}

// A row's outputs are the same bits whichever rows share its batch and on any thread count,
// so a sequence's logits do not depend on the other sequences being decoded beside it.
TEST(Bf16DecodeAmx, ARowsBitsDependOnNeitherTheBatchNorTheThreads) {
  if (!kernels::amx_tiles_usable()) GTEST_SKIP() << "no AMX tiles on this CPU";
  const int64_t M = 16, N = 1000, K = 2080;  // big enough to go parallel; a 64-row step split
  const auto X = random_bf16_values(M * K, 41), W = random_bf16_values(N * K, 43);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  const std::vector<float> all = amx_product(X, W, M, N, K, false);
  omp_set_num_threads(1);
  const std::vector<float> all_one_thread = amx_product(X, W, M, N, K, false);
  omp_set_num_threads(threads);
  EXPECT_EQ(all, all_one_thread);
  for (int64_t m : {0, 5, 15}) {
    const std::vector<uint16_t> row(X.begin() + m * K, X.begin() + (m + 1) * K);
    const std::vector<float> alone = amx_product(row, W, 1, N, K, false);
    EXPECT_EQ(alone, std::vector<float>(all.begin() + m * N, all.begin() + (m + 1) * N))
        << "row " << m;
  }
}

// A bf16 graph's decode product of 4 to 16 rows reaches the tiles where the CPU has them on the
// oneDNN path; the widening path keeps the FMA loop.
TEST(Bf16DecodeAmx, DecodeShapedMatmulsReachIt) {
  if (!kernels::amx_tiles_usable()) GTEST_SKIP() << "no AMX tiles on this CPU";
  const int64_t M = 8, N = 70, K = 96;
  const auto X = random_bf16_values(M * K, 45), W = random_bf16_values(N * K, 46);
  const std::vector<float> want = amx_product(X, W, M, N, K, false);
  std::vector<float> fma(want.size());
  kernels::decode_gemv_bf16_weight(M, N, K, X.data(), true, W.data(), fma.data(), false);
  for (const char* path : {"auto", "widening"}) {
    const GemvPathOverride scoped(path);
    // "auto" is the oneDNN path unless oneDNN is told to see no bf16 (Bf16Paths.*).
    const bool tiles = kernels::bf16_matmul_path() == kernels::Bf16MatmulPath::OneDnn;
    EXPECT_EQ(native_route_product(X, W, M, N, K), tiles ? want : fma) << path;
  }
}
