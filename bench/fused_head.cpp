// The fused LM head against the GEMMs it is made of (issue 31: "a fused head at GEMM speed").
// For each head shape, the same FLOPs three ways, side by side in one run:
//   gemms  - the head's three products alone on full [N, V] buffers (z = h W^T, dh = dz W,
//            dW = dz^T h), nothing else: the machine's large-GEMM rate for these FLOPs;
//   fused  - kernels::fused_linear_cross_entropy (loss, dh, dW) at the chunk the compiler picks;
//   frozen - the same with a frozen head (no dW: two products), as DPO's reference and QLoRA use.
// GF/s = the products' FLOPs / wall time; "vs gemms" is the fused kernel's share of that rate.
// Timings are the best of repeated calls (least disturbed by other processes).
//
//   bench_fused_head [--seconds S] [--threads 2] [--shapes L3-micro,mid,1B] [--budget-mb M]
//                    [--cpu-time]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench_clock.h"
#include "fusetune/compile/pass.h"
#include "fusetune/kernels/cpu/bf16.h"
#include "fusetune/kernels/cpu/bf16_matmul.h"
#include "fusetune/kernels/cpu/fused_linear_cross_entropy.h"
#include "fusetune/kernels/cpu/gemm_peak.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/util/strings.h"

namespace k = fusetune::kernels;
using Clock = std::chrono::steady_clock;

namespace {

double g_seconds = 1.0;
bool g_cpu_time = false;
std::vector<std::string> g_bf16_rows;  // the bf16 table, printed after the fp32 one

// Wall seconds, or with --cpu-time the process's CPU seconds (with one thread, the time it ran:
// a steadier figure on a machine that other work shares, though caches are still shared).
double now_seconds() { return fusetune::bench::bench_clock_seconds(g_cpu_time); }

double best_seconds(const std::function<void()>& fn) {
  fn();  // warm-up: first touch of the buffers and the scratch
  double best = 1e300;
  const auto start = Clock::now();
  for (int i = 0;; ++i) {
    const double t0 = now_seconds();
    fn();
    best = std::min(best, now_seconds() - t0);
    if (i >= 2 && std::chrono::duration<double>(Clock::now() - start).count() >= g_seconds) break;
  }
  return best;
}

struct HeadShape {
  const char* name;
  int64_t N, D, V;  // tokens, model dim, vocabulary
};

const HeadShape kShapes[] = {
    {"L3-micro", 1024, 256, 128256},
    {"mid", 1024, 512, 32000},
    {"1B", 512, 2048, 128256},
};

std::vector<float> filled(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 13) - 6);
  return v;
}

void run_shape(const HeadShape& s, int64_t budget_bytes, double peak) {
  const int64_t N = s.N, D = s.D, V = s.V;
  const auto h = filled(size_t(N * D), 0.01f), W = filled(size_t(V * D), 0.02f);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = int32_t((i * 7919) % V);
  std::vector<float> dh(size_t(N * D)), dW(size_t(V * D));
  const int64_t chunk = k::fused_ce_chunk_rows(N, V, 4, budget_bytes);

  std::vector<float> z(size_t(N * V));
  const double gemms = best_seconds([&] {
    k::gemm<float>(false, true, N, V, D, 1.f, h.data(), D, W.data(), D, 0.f, z.data(), V);
    k::gemm<float>(false, false, N, D, V, 1.f, z.data(), V, W.data(), D, 0.f, dh.data(), D);
    k::gemm<float>(true, false, V, D, N, 1.f, z.data(), V, h.data(), D, 0.f, dW.data(), D);
  });
  z = {};
  const double fused = best_seconds([&] {
    k::fused_linear_cross_entropy<float>(h.data(), W.data(), labels.data(), 1.f / float(N), N, D, V,
                                         chunk, dh.data(), dW.data());
  });
  const double frozen = best_seconds([&] {
    k::fused_linear_cross_entropy<float>(h.data(), W.data(), labels.data(), 1.f / float(N), N, D, V,
                                         chunk, dh.data(), nullptr);
  });
  // A bf16 graph's head (h holds bf16 values): W widened tile by tile for sgemm, or oneDNN.
  std::vector<uint16_t> Wb(W.size()), hb(h.size());
  k::f32_to_bf16_array(W.data(), Wb.data(), V * D);
  k::f32_to_bf16_array(h.data(), hb.data(), N * D);
  std::vector<float> h16(h.size());
  k::bf16_to_f32_array(hb.data(), h16.data(), N * D);
  auto bf16_fused = [&](const char* path) {
    setenv("FUSETUNE_BF16_MATMUL", path, 1);
    const double t = best_seconds([&] {
      k::fused_bf16_linear_cross_entropy(h16.data(), Wb.data(), labels.data(), 1.f / float(N), N, D,
                                         V, chunk, dh.data(), dW.data());
    });
    unsetenv("FUSETUNE_BF16_MATMUL");
    return t;
  };
  const double widening = bf16_fused("widening");
  const bool onednn = k::cpu_has_bf16_dot_products();
  const double native = onednn ? bf16_fused("onednn") : 0.0;
  const double gf3 = 3 * 2.0 * double(N) * double(D) * double(V) / 1e9;
  const double gf2 = gf3 * 2 / 3;
  char row[256];
  if (onednn) {
    std::snprintf(row, sizeof row, "| %s | %.1f | %.1f | %.1f | %.2f | %.2f |\n", s.name,
                  gf3 / fused, gf3 / widening, gf3 / native, fused / widening, fused / native);
  } else {
    std::snprintf(row, sizeof row, "| %s | %.1f | %.1f | - | %.2f | - |\n", s.name, gf3 / fused,
                  gf3 / widening, fused / widening);
  }
  g_bf16_rows.emplace_back(row);
  std::printf("| %s | %lld | %lld | %lld | %lld | %.1f | %.1f | %.1f | %.2f | %.2f | %.0f%% |\n",
              s.name, (long long)N, (long long)D, (long long)V, (long long)chunk, gf3 / gemms,
              gf3 / fused, gf2 / frozen, gemms / fused, (gf2 / frozen) / (gf3 / gemms),
              100 * gf3 / fused / peak);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::vector<std::string> shapes{"L3-micro", "mid", "1B"};
  int64_t budget = fusetune::PassOptions{}.ce_chunk_budget_bytes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      g_seconds = std::stod(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (a == "--shapes" && i + 1 < argc) {
      shapes = fusetune::split(argv[++i], ',');
    } else if (a == "--cpu-time") {
      g_cpu_time = true;
    } else if (a == "--budget-mb" && i + 1 < argc) {
      budget = std::stoll(argv[++i]) << 20;
    } else {
      std::fprintf(stderr,
                   "usage: bench_fused_head [--seconds S] [--threads N] [--shapes a,b] "
                   "[--budget-mb M] [--cpu-time]\n");
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const double peak = k::measure_peak_gemm_gflops();
  std::printf(
      "fused LM head vs its GEMMs, fp32, %d threads; sgemm peak %.1f GF/s; chunk budget "
      "%lld MiB\n\n",
      threads, peak, (long long)(budget >> 20));
  std::printf(
      "| shape | N | D | V | chunk | gemms GF/s | fused GF/s | frozen GF/s | fused / "
      "gemms | frozen / gemms | fused / peak |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& name : shapes) {
    bool found = false;
    for (const auto& s : kShapes)
      if (name == s.name) {
        run_shape(s, budget, peak);
        found = true;
      }
    if (!found) {
      std::fprintf(stderr, "bench_fused_head: unknown shape '%s' (L3-micro, mid, 1B)\n",
                   name.c_str());
      return 2;
    }
  }
  std::printf(
      "\nbf16 head and h (a bf16 graph), fused kernel: W widened tile by tile for sgemm, "
      "or oneDNN on the CPU's bf16 dot products (%s)\n\n",
      k::cpu_has_bf16_dot_products() ? "this CPU has bf16 dot products"
                                     : "no bf16 dot products here");
  std::printf(
      "| shape | fp32 fused GF/s | bf16 widening GF/s | bf16 oneDNN GF/s | widening / fp32 "
      "| oneDNN / fp32 |\n|---|---|---|---|---|---|\n");
  for (const std::string& row : g_bf16_rows) std::printf("%s", row.c_str());
  return 0;
}
