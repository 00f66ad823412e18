// Attention alone, forward + backward: the unfused eager ops (transpose, repeat_heads, matmul,
// scale, causal_mask, softmax, matmul, transpose and their backward) against the graph after
// the fuse_attention pass (FlashAttention + FlashAttentionBackward), side by side.
//   bench_attention [--batch 4] [--seq 256] [--heads 8] [--kv 4] [--hd 64] [--reps 10] [--docs N]
// Prints milliseconds per forward+backward (median and min of reps, and process CPU time, which
// a loaded machine disturbs less) and the peak bytes of each.
// Nothing here asserts a timing.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>

#include "fusetune/compile/fuse_attention.h"
#include "fusetune/core/memory.h"
#include "fusetune/graph/autodiff.h"
#include "fusetune/graph/builder.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/error.h"

using namespace fusetune;

namespace {

Tensor random_tensor(Shape s, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(s), DType::F32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t B = 4, T = 256, H = 8, KV = 4, hd = 64, docs = 0;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    FT_CHECK(i + 1 < argc, "missing value after " + a);
    const int64_t v = std::stoll(argv[++i]);
    if (a == "--batch")
      B = v;
    else if (a == "--seq")
      T = v;
    else if (a == "--heads")
      H = v;
    else if (a == "--kv")
      KV = v;
    else if (a == "--hd")
      hd = v;
    else if (a == "--reps")
      reps = int(v);
    else if (a == "--docs")
      docs = v;
    else
      throw Error("unknown argument '" + a + "'");
  }
  Graph g(DType::F32);
  Builder b(g);
  const Shape qs{B, T, H, hd}, ks{B, T, KV, hd};
  Value q = g.param("q", qs, true), k = g.param("k", ks, true), v = g.param("v", ks, true);
  Value dout = g.input("dout", qs, DType::F32);
  Value doc = docs > 0 ? g.input("doc_ids", {B, T}, DType::I32) : Value{};
  Value qt = b.transpose(q, 1, 2);
  Value kt = b.repeat_heads(b.transpose(k, 1, 2), H / KV);
  Value vt = b.repeat_heads(b.transpose(v, 1, 2), H / KV);
  Value probs =
      b.softmax(b.causal_mask(b.scale(b.matmul(qt, kt, false, true), 1 / std::sqrt(hd)), doc));
  Value o = b.transpose(b.matmul(probs, vt), 1, 2);
  append_backward(g, b.sum(b.mul(o, dout)));
  Graph fused = g;
  const std::string line = passes::fuse_attention::run(fused, PassOptions{});

  TensorMap params{
      {"q", random_tensor(qs, 1)}, {"k", random_tensor(ks, 2)}, {"v", random_tensor(ks, 3)}};
  TensorMap inputs{{"dout", random_tensor(qs, 4)}};
  if (docs > 0) {
    Tensor d = Tensor::empty({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i) d.data<int32_t>()[i] = int32_t((i % T) * docs / T);
    inputs["doc_ids"] = d;
  }
  std::printf("attention B=%lld T=%lld H=%lld KV=%lld hd=%lld docs=%lld, %d threads; %s\n",
              (long long)B, (long long)T, (long long)H, (long long)KV, (long long)hd,
              (long long)docs, omp_get_max_threads(), line.c_str());
  std::printf("%-8s %10s %10s %12s %12s\n", "graph", "median ms", "min ms", "min cpu ms",
              "peak MiB");
  EagerExecutor unfused_ex(g), fused_ex(fused);
  for (auto [name, ex] :
       {std::pair<const char*, EagerExecutor*>{"unfused", &unfused_ex}, {"fused", &fused_ex}}) {
    ex->run(inputs, params);  // warm-up
    op_profile::reset();
    std::vector<double> ms, cpu;
    const int64_t base = memory::current_bytes();
    memory::reset_peak();
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::clock_t c0 = std::clock();
      ex->run(inputs, params);
      cpu.push_back(1000.0 * double(std::clock() - c0) / CLOCKS_PER_SEC);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-8s %10.2f %10.2f %12.2f %12.1f\n", name, ms[ms.size() / 2], ms.front(),
                *std::min_element(cpu.begin(), cpu.end()),
                double(memory::peak_bytes() - base) / (1 << 20));
    if (op_profile::enabled()) std::printf("%s\n", op_profile::report().c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_attention: error: %s\n", e.what());
  return 1;
}
