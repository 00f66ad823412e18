// GEMM throughput on this machine: sgemm GFLOP/s for square and training-like shapes at 1 and
// 2 OpenMP threads, plus the batched-GEMM strategy comparison behind kernels::gemm_batched.
// Prints tables; asserts nothing. Timings are the best of repeated calls (least disturbed by
// other processes), each config running for about --seconds.
//
//   bench_gemm [--seconds S] [--threads 1,2] [--big] [--bf16]
//
// --bf16 prints only the bf16 tables: a linear layer's products at Llama 3.2 1B's shapes
// (512 tokens) with the weight stored fp32 (one sgemm) and bf16 (kernels::gemm_bf16_weight,
// which widens the weight a tile of rows at a time), the cost a bf16 LoRA base adds; then
// matmuls of two bf16 operands (a bf16 graph's MatMul) in GF/s: fp32 sgemm, the widening
// path and oneDNN's bf16 dot products side by side, with their ratios to fp32.
//
// --decode prints only the decode table: y = x W^T for the few rows of a decode step (M = 1, 4
// and 8) at TinyLlama / Llama 3.2 1B layer shapes, as GB/s of weight read: W fp32 through
// sgemm, W bf16 through the widening path, oneDNN (x bf16) and kernels::decode_gemv_bf16_weight,
// and W NF4 through the tiled dequantize + sgemm it took before and decode_gemv_nf4_weight
// (GB/s of its ~0.53 bytes per element).
//
// --big adds N=128256 (Llama 3 vocabulary; ~0.8 GB of buffers). OpenBLAS picks its kernels
// from the CPU unless OPENBLAS_CORETYPE forces them; the header line says which ran.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/blas_info.h"
#include "fusetune/kernels/cpu/decode_gemv.h"
#include "fusetune/kernels/cpu/gemm_peak.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/util/strings.h"

namespace k = fusetune::kernels;
using Clock = std::chrono::steady_clock;

namespace {

double g_seconds = 0.3;

// Best wall time of fn in ms: one warm-up call, then calls until g_seconds (at least 3).
double best_ms(const std::function<void()>& fn) {
  fn();
  double best = 1e300;
  const auto start = Clock::now();
  for (int i = 0;; ++i) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (i >= 2 && std::chrono::duration<double>(Clock::now() - start).count() >= g_seconds) break;
  }
  return best;
}

std::vector<float> filled(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 13) - 6);
  return v;
}

struct Shape {
  const char* what;
  int64_t M, N, K;
  bool ta, tb;
};

void gemm_table(const std::vector<Shape>& shapes, const std::vector<int>& threads) {
  std::printf("%-28s %6s %6s %6s %3s %7s %10s %9s\n", "shape", "M", "N", "K", "op", "threads", "ms",
              "GFLOP/s");
  for (const Shape& s : shapes) {
    const auto A = filled(static_cast<size_t>(s.M * s.K), 1e-2f);
    const auto B = filled(static_cast<size_t>(s.K * s.N), 1e-2f);
    std::vector<float> C(static_cast<size_t>(s.M * s.N));
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    for (int th : threads) {
      omp_set_num_threads(th);
      const double ms = best_ms([&] {
        k::gemm<float>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f,
                       C.data(), s.N);
      });
      const double gflops = 2.0 * s.M * s.N * s.K / (ms * 1e-3) * 1e-9;
      const std::string op = std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N");
      std::printf("%-28s %6lld %6lld %6lld %3s %7d %10.3f %9.1f\n", s.what,
                  static_cast<long long>(s.M), static_cast<long long>(s.N),
                  static_cast<long long>(s.K), op.c_str(), th, ms, gflops);
      std::fflush(stdout);
    }
  }
}

// Attention-like batches: per head scores = Q K^T ([T,Dh]x[Dh,T]) and out = P V ([T,T]x[T,Dh]).
void batched_table(const std::vector<int>& threads) {
  std::printf("\nbatched sgemm, %s\n",
              "loop = one BLAS call per matrix (BLAS threads), by-batch = OpenMP over matrices "
              "(BLAS single-threaded inside); chosen = what kernels::gemm_batched does");
  std::printf("%-8s %5s %5s %5s %5s %7s %12s %12s %12s %9s\n", "what", "batch", "M", "N", "K",
              "threads", "loop GF/s", "by-batch GF/s", "chosen GF/s", "MFLOP/mat");
  const int64_t Dh = 64, heads = 32;
  for (int64_t T : {128, 256, 512, 1024}) {
    for (int which = 0; which < 2; ++which) {
      const bool qk = which == 0;
      const int64_t M = T, N = qk ? T : Dh, K = qk ? Dh : T;
      const auto A = filled(static_cast<size_t>(heads * M * K), 1e-2f);
      const auto B = filled(static_cast<size_t>(heads * K * N), 1e-2f);
      std::vector<float> C(static_cast<size_t>(heads * M * N));
      const int64_t lda = K, ldb = qk ? K : N;  // QK^T: B is K stored [T,Dh], transposed
      const double flops = 2.0 * M * N * K * heads;
      for (int th : threads) {
        omp_set_num_threads(th);
        const double loop = best_ms([&] {
          for (int64_t b = 0; b < heads; ++b) {
            k::gemm<float>(false, qk, M, N, K, 1.0f, A.data() + b * M * K, lda,
                           B.data() + b * K * N, ldb, 0.0f, C.data() + b * M * N, N);
          }
        });
        const double by_batch = best_ms([&] {
#pragma omp parallel for schedule(static)
          for (int64_t b = 0; b < heads; ++b) {
            k::gemm<float>(false, qk, M, N, K, 1.0f, A.data() + b * M * K, lda,
                           B.data() + b * K * N, ldb, 0.0f, C.data() + b * M * N, N);
          }
        });
        const double chosen = best_ms([&] {
          k::gemm_batched<float>(heads, false, qk, M, N, K, 1.0f, A.data(), M * K, B.data(), K * N,
                                 0.0f, C.data(), M * N);
        });
        auto gf = [&](double ms) { return flops / (ms * 1e-3) * 1e-9; };
        std::printf("%-8s %5lld %5lld %5lld %5lld %7d %12.1f %12.1f %12.1f %9.1f\n",
                    qk ? "QK^T" : "PV", static_cast<long long>(heads), static_cast<long long>(M),
                    static_cast<long long>(N), static_cast<long long>(K), th, gf(loop),
                    gf(by_batch), gf(chosen), 2.0 * M * N * K * 1e-6);
        std::fflush(stdout);
      }
    }
  }
}

// A frozen linear layer's two products, y = x W^T and dx = dy W, with W fp32 and bf16.
void bf16_weight_table(const std::vector<int>& threads) {
  struct Layer {
    const char* what;
    int64_t out, in;  // W stored [out, in]
  };
  const int64_t M = 512;
  const std::vector<Layer> layers = {{"q/o proj", 2048, 2048},
                                     {"k/v proj", 512, 2048},
                                     {"gate/up", 8192, 2048},
                                     {"down", 2048, 8192}};
  std::printf("%-10s %-8s %6s %6s %6s %7s %10s %10s %7s\n", "layer", "product", "M", "N", "K",
              "threads", "fp32 ms", "bf16 ms", "ratio");
  for (const Layer& l : layers) {
    const auto W = filled(static_cast<size_t>(l.out * l.in), 1e-2f);
    std::vector<uint16_t> W16(W.size());
    k::f32_to_bf16_array(W.data(), W16.data(), static_cast<int64_t>(W.size()));
    for (int fwd = 1; fwd >= 0; --fwd) {
      // Forward: y [M, out] = x [M, in] W^T; backward: dx [M, in] = dy [M, out] W.
      const int64_t N = fwd ? l.out : l.in, K = fwd ? l.in : l.out;
      const auto A = filled(static_cast<size_t>(M * K), 1e-2f);
      std::vector<float> C(static_cast<size_t>(M * N));
      // The tile a compiled step takes from its arena's scratch slice, reused call after call.
      const int64_t rows = fwd ? N : K, cols = fwd ? K : N;
      std::vector<float> tile(
          static_cast<size_t>(k::bf16_weight_tile_rows(fwd, rows, cols) * cols));
      for (int th : threads) {
        omp_set_num_threads(th);
        const double f32 = best_ms([&] {
          k::gemm<float>(false, fwd, M, N, K, 1.0f, A.data(), K, W.data(), fwd ? K : N, 0.0f,
                         C.data(), N);
        });
        const double b16 = best_ms([&] {
          k::gemm_bf16_weight(fwd, M, N, K, A.data(), W16.data(), C.data(), tile.data());
        });
        std::printf("%-10s %-8s %6lld %6lld %6lld %7d %10.3f %10.3f %7.2f\n", l.what,
                    fwd ? "x W^T" : "dy W", static_cast<long long>(M), static_cast<long long>(N),
                    static_cast<long long>(K), th, f32, b16, b16 / f32);
        std::fflush(stdout);
      }
    }
  }
}

// Matmuls of bf16 operands (a bf16 graph's MatMul node): fp32 OpenBLAS on fp32 copies of the
// operands for reference, then bf16 by the widening path (operands widened to fp32 as the
// runtime does, one sgemm, the output rounded to bf16) and by oneDNN's bf16 dot products
// (kernels::matmul_bf16_onednn, bf16 out). GF/s count the GEMM's 2MNK flops for every column.
void bf16_operand_table(const std::vector<int>& threads) {
  const bool native = k::cpu_has_bf16_dot_products();
  std::printf(
      "\nbf16 operands: fp32 = OpenBLAS sgemm on fp32 operands; widening = bf16 widened "
      "to fp32 + sgemm + rounding; oneDNN = %s\n",
      native ? "bf16 dot products, fp32 accumulation" : "not run (no bf16 dot products)");
  std::printf("%-26s %6s %6s %6s %3s %7s %10s %10s %10s %10s %10s\n", "shape", "M", "N", "K", "op",
              "threads", "fp32 GF/s", "widen GF/s", "oneDNN", "oneDNN/f32", "widen/f32");
  const std::vector<Shape> shapes = {{"square", 1024, 1024, 1024, false, false},
                                     {"square", 2048, 2048, 2048, false, false},
                                     {"mid fwd x W^T (ffn)", 1024, 1408, 512, false, true},
                                     {"mid bwd dX = dY W (ffn)", 1024, 512, 1408, false, false},
                                     {"mid bwd dW = dY^T X (ffn)", 1408, 512, 1024, true, false},
                                     {"mid fwd x W^T (attn)", 1024, 512, 512, false, true},
                                     {"mid head x W^T", 1024, 32000, 512, false, true},
                                     {"mid head dW = dY^T X", 32000, 512, 1024, true, false},
                                     {"1B fwd x W^T (gate/up)", 512, 8192, 2048, false, true},
                                     {"1B bwd dX = dY W (down)", 512, 2048, 8192, false, false},
                                     {"1B bwd dW = dY^T X (down)", 2048, 8192, 512, true, false},
                                     {"LoRA A x A^T (r=16)", 1024, 16, 512, false, true},
                                     {"LoRA dA = dY^T X (r=16)", 16, 512, 1024, true, false}};
  for (const Shape& s : shapes) {
    const auto A = filled(static_cast<size_t>(s.M * s.K), 1e-2f);
    const auto B = filled(static_cast<size_t>(s.K * s.N), 1e-2f);
    std::vector<uint16_t> A16(A.size()), B16(B.size()), C16(static_cast<size_t>(s.M * s.N));
    k::f32_to_bf16_array(A.data(), A16.data(), static_cast<int64_t>(A.size()));
    k::f32_to_bf16_array(B.data(), B16.data(), static_cast<int64_t>(B.size()));
    std::vector<float> A32(A.size()), B32(B.size()), C(C16.size());
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const int64_t rows = s.tb ? s.N : s.K, cols = s.tb ? s.K : s.N;
    std::vector<float> tile(static_cast<size_t>(k::bf16_weight_tile_rows(s.tb, rows, cols) * cols));
    for (int th : threads) {
      omp_set_num_threads(th);
      const double f32 = best_ms([&] {
        k::gemm<float>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f,
                       C.data(), s.N);
      });
      const double widen = best_ms([&] {  // runtime/bf16_node_kernels.cpp's matmul, unbatched
        k::bf16_to_f32_array(A16.data(), A32.data(), static_cast<int64_t>(A16.size()));
        if (s.ta) {
          k::bf16_to_f32_array(B16.data(), B32.data(), static_cast<int64_t>(B16.size()));
          k::gemm<float>(true, s.tb, s.M, s.N, s.K, 1.0f, A32.data(), lda, B32.data(), ldb, 0.0f,
                         C.data(), s.N);
        } else {
          k::gemm_bf16_weight(s.tb, s.M, s.N, s.K, A32.data(), B16.data(), C.data(), tile.data());
        }
        k::f32_to_bf16_array(C.data(), C16.data(), static_cast<int64_t>(C.size()));
      });
      const double onednn = native ? best_ms([&] {
        k::matmul_bf16_onednn(s.ta, s.tb, s.M, s.N, s.K, A16.data(), B16.data(), C16.data(), true);
      })
                                   : 0.0;
      auto gf = [&](double ms) {
        return ms > 0 ? 2.0 * s.M * s.N * s.K / (ms * 1e-3) * 1e-9 : 0.0;
      };
      const std::string op = std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N");
      std::printf("%-26s %6lld %6lld %6lld %3s %7d %10.1f %10.1f %10.1f %10.2f %10.2f\n", s.what,
                  static_cast<long long>(s.M), static_cast<long long>(s.N),
                  static_cast<long long>(s.K), op.c_str(), th, gf(f32), gf(widen), gf(onednn),
                  gf(onednn) / gf(f32), gf(widen) / gf(f32));
      std::fflush(stdout);
    }
  }
}

// Decode-step products: few rows of x against a whole weight, bound by reading W. GB/s count
// W's bytes in its stored type (fp32: 4 per element, bf16: 2) per call.
void decode_table(const std::vector<int>& threads) {
  const bool native = k::cpu_has_bf16_dot_products();
  std::printf(
      "\ndecode y = x W^T, GB/s of W read: fp32 = W fp32, sgemm; widening = W bf16 "
      "widened by tiles + sgemm; oneDNN = x, W bf16 (%s); gemv = decode_gemv_bf16_weight; amx = "
      "decode_gemv_bf16_amx (x bf16, AMX tiles)\n",
      native ? "bf16 dot products" : "not run");
  std::printf("%-24s %3s %6s %6s %7s %9s %9s %9s %9s %9s %10s %9s %9s\n", "shape", "M", "N", "K",
              "threads", "fp32", "widening", "oneDNN", "gemv", "amx", "gemv/fp32", "nf4 tiled",
              "nf4 gemv");
  struct DecodeShape {
    const char* what;
    int64_t N, K;
  };
  const std::vector<DecodeShape> shapes = {
      {"mid q/o (512^2)", 512, 512},     {"mid gate/up", 1408, 512},
      {"mid head", 32000, 512},          {"TinyLlama q/o (2048^2)", 2048, 2048},
      {"TinyLlama gate/up", 5632, 2048}, {"TinyLlama down", 2048, 5632},
      {"TinyLlama head", 32000, 2048},   {"1B gate/up", 8192, 2048}};
  for (const DecodeShape& s : shapes)
    for (int64_t M : {1, 4, 8, 16}) {
      const auto X = filled(static_cast<size_t>(M * s.K), 1e-2f);
      const auto W = filled(static_cast<size_t>(s.N * s.K), 1e-2f);
      std::vector<uint16_t> X16(X.size()), W16(W.size()), Y16(static_cast<size_t>(M * s.N));
      k::f32_to_bf16_array(X.data(), X16.data(), static_cast<int64_t>(X.size()));
      k::f32_to_bf16_array(W.data(), W16.data(), static_cast<int64_t>(W.size()));
      std::vector<float> Y(Y16.size());
      std::vector<float> tile(static_cast<size_t>(k::bf16_weight_tile_rows(true, s.N, s.K) * s.K));
      const k::NF4Sizes q = k::nf4_sizes(s.N * s.K);
      std::vector<int32_t> codes(size_t(q.code_words)), absmax_codes(size_t(q.absmax_words));
      std::vector<float> scales(size_t(q.scales));
      float offset = 0;
      k::nf4_quantize(W.data(), s.N * s.K, codes.data(), absmax_codes.data(), scales.data(),
                      &offset);
      const k::NF4View nf4{codes.data(), absmax_codes.data(), scales.data(), offset, s.N, s.K};
      const double nf4_bytes = 4.0 * double(q.code_words + q.absmax_words + q.scales);
      for (int th : threads) {
        omp_set_num_threads(th);
        const double f32 = best_ms([&] {
          k::gemm<float>(false, true, M, s.N, s.K, 1.0f, X.data(), s.K, W.data(), s.K, 0.0f,
                         Y.data(), s.N);
        });
        const double widen = best_ms([&] {
          k::gemm_bf16_weight(true, M, s.N, s.K, X.data(), W16.data(), Y.data(), tile.data());
        });
        const double onednn = native ? best_ms([&] {
          k::matmul_bf16_onednn(false, true, M, s.N, s.K, X16.data(), W16.data(), Y16.data(), true);
        })
                                     : 0.0;
        const double gemv = best_ms([&] {
          k::decode_gemv_bf16_weight(M, s.N, s.K, X.data(), false, W16.data(), Y.data(), false);
        });
        const double amx = k::amx_tiles_usable() ? best_ms([&] {
          k::decode_gemv_bf16_amx(M, s.N, s.K, X16.data(), W16.data(), Y16.data(), true);
        })
                                                 : 0.0;
        const double nf4_tiled = best_ms([&] {  // nf4_matmul's path for more rows
          std::vector<float> t(size_t(k::nf4_tile_rows(s.N, s.K) * s.K));
          for (int64_t r0 = 0; r0 < s.N; r0 += k::nf4_tile_rows(s.N, s.K)) {
            const int64_t r1 = std::min(s.N, r0 + k::nf4_tile_rows(s.N, s.K));
            k::nf4_dequantize_rows(nf4, r0, r1, t.data());
            k::gemm<float>(false, true, M, r1 - r0, s.K, 1.0f, X.data(), s.K, t.data(), s.K, 0.0f,
                           Y.data() + r0, s.N);
          }
        });
        const double nf4_gemv =
            best_ms([&] { k::decode_gemv_nf4_weight(M, nf4, X.data(), Y.data()); });
        const double w32 = 4.0 * double(s.N * s.K), w16 = 2.0 * double(s.N * s.K);
        auto gbs = [](double bytes, double ms) {
          return ms > 0 ? bytes / (ms * 1e-3) * 1e-9 : 0.0;
        };
        std::printf(
            "%-24s %3lld %6lld %6lld %7d %9.1f %9.1f %9.1f %9.1f %9.1f %9.2fx %9.1f %9.1f\n",
            s.what, static_cast<long long>(M), static_cast<long long>(s.N),
            static_cast<long long>(s.K), th, gbs(w32, f32), gbs(w16, widen), gbs(w16, onednn),
            gbs(w16, gemv), gbs(w16, amx), f32 / gemv, gbs(nf4_bytes, nf4_tiled),
            gbs(nf4_bytes, nf4_gemv));
        std::fflush(stdout);
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  bool big = false, bf16 = false, decode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      g_seconds = std::atof(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      for (const std::string& t : fusetune::split(argv[++i], ',')) threads.push_back(std::stoi(t));
    } else if (a == "--big") {
      big = true;
    } else if (a == "--decode") {
      decode = true;
    } else if (a == "--bf16") {
      bf16 = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_gemm [--seconds S] [--threads 1,2] [--big] [--bf16] [--decode]\n");
      return 2;
    }
  }
  std::printf("%s, OpenMP max threads %d\n\n", k::blas_description().c_str(),
              omp_get_max_threads());
  if (decode) {
    decode_table(threads);
    return 0;
  }
  if (bf16) {
    bf16_weight_table(threads);
    bf16_operand_table(threads);
    std::printf("\nbf16 matmuls in a run: %s\n", k::bf16_matmul_description().c_str());
    return 0;
  }

  std::vector<Shape> shapes;
  for (int64_t n : {256, 512, 1024, 2048}) shapes.push_back({"square", n, n, n, false, false});
  // Training-like: 1024 tokens through a linear layer y = x W^T (W stored [N,K]).
  for (int64_t K : {256, 512}) {
    for (int64_t N : {768, 1408, 32000})
      shapes.push_back({"linear fwd x W^T", 1024, N, K, false, true});
    if (big) shapes.push_back({"linear fwd x W^T", 1024, 128256, K, false, true});
  }
  // The backward GEMMs of one layer: dX = dY W and dW = dY^T X.
  shapes.push_back({"linear bwd dX = dY W", 1024, 512, 1408, false, false});
  shapes.push_back({"linear bwd dW = dY^T X", 1408, 512, 1024, true, false});
  shapes.push_back({"lm head bwd dX = dY W", 1024, 512, 32000, false, false});
  shapes.push_back({"lm head bwd dW = dY^T X", 32000, 512, 1024, true, false});
  gemm_table(shapes, threads);
  batched_table(threads);

  std::printf("\nmeasure_peak_gemm_gflops(1024):");
  for (int th : threads) {
    omp_set_num_threads(th);
    std::printf("  %d thread(s) %.1f GFLOP/s", th, k::measure_peak_gemm_gflops(1024));
  }
  std::printf("\n");
  return 0;
}
