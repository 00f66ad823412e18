// Optimizer-side cost per training step: AdamW and 8-bit AdamW updates and grad-norm clipping
// over n fp32 parameters. Memory-bound; reported as bytes moved per second. Nothing here asserts a
// time.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <vector>

#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw8bit.h"
#include "fusetune/optim/grad_clip.h"

using namespace fusetune;

namespace {

struct Params {
  Tensor p, g;
  std::vector<ParamRef> refs;
  explicit Params(int64_t n)
      : p(Tensor::empty({n}, DType::F32)), g(Tensor::empty({n}, DType::F32)) {
    for (int64_t i = 0; i < n; ++i) {
      p.data<float>()[i] = std::sin(float(i));
      g.data<float>()[i] = 1e-3f * std::cos(float(i));
    }
    refs = {{"w", &p, &g}};
  }
};

void BM_AdamWStep(benchmark::State& state) {
  Params ps(state.range(0));
  AdamW opt;
  for (auto _ : state) opt.step(ps.refs, 1e-4);
  // Reads p, g, m, v; writes p, m, v: 7 x 4 bytes per element.
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 28);
}
BENCHMARK(BM_AdamWStep)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond);

// An L3-micro embedding table [128256, 256] whose gradient touches range(0) rows (a batch of 4 x
// 256 tokens touches a few hundred): AdamW's lazy rows (optim/adamw.cpp) read only those rows and
// decay the others' values (weight_decay 0.01) or skip them (range(1) = 1: weight_decay 0).
// range(0) = 128256 is the dense update of the same table, in the same run.
// The gradient of an L3-micro embedding table with `touched` rows set; with `row_set`, the rows
// are recorded on it as the embedding backward records them (core/tensor.h's RowSet), so that
// the readers skip the rest without testing it.
Tensor embedding_gradient_for_bench(int64_t touched, bool row_set) {
  const int64_t V = 128256, D = 256;
  Tensor g = Tensor::zeros({V, D}, DType::F32);
  auto rows = std::make_shared<RowSet>();
  rows->row_bytes = D * int64_t(sizeof(float));
  for (int64_t k = 0; k < touched; ++k) {
    const int64_t row = k * (V / touched);
    rows->rows.push_back(int32_t(row));
    for (int64_t j = 0; j < D; ++j) g.data<float>()[row * D + j] = 1e-3f * std::cos(float(j + k));
  }
  if (row_set) g.storage()->set_nonzero_rows(std::move(rows));
  return g;
}

// A [128256, 256] embedding table (Llama 3's vocabulary at L3-micro's width; a batch of 4 x
// 256 tokens touches a few hundred): AdamW's lazy rows (optim/adamw.cpp) read only those rows and
// decay the others' values (weight_decay 0.01) or skip them (range(1) = 1: weight_decay 0).
// range(0) = 128256 is the dense update of the same table, in the same run; range(2) = 1: the
// gradient carries its row set, so the untouched rows' gradient is not read either.
void BM_AdamWEmbeddingRows(benchmark::State& state) {
  const int64_t V = 128256, D = 256, touched = state.range(0);
  Tensor p = Tensor::empty({V, D}, DType::F32);
  Tensor g = embedding_gradient_for_bench(touched, state.range(2) != 0);
  for (int64_t i = 0; i < V * D; ++i) p.data<float>()[i] = std::sin(float(i));
  AdamWOptions o;
  if (state.range(1)) o.weight_decay = 0;
  AdamW opt(o);
  std::vector<ParamRef> refs = {{"tok_embeddings.weight", &p, &g}};
  for (auto _ : state) opt.step(refs, 1e-4);
  state.counters["touched_rows"] = double(touched);
}
BENCHMARK(BM_AdamWEmbeddingRows)
    ->Args({128256, 0, 0})
    ->Args({1024, 0, 0})
    ->Args({1024, 0, 1})
    ->Args({1024, 1, 0})
    ->Args({1024, 1, 1})
    ->Unit(benchmark::kMillisecond);

// The gradient norm (clip_grad_norm's sum of squares) of that embedding gradient, dense
// (range(1) = 0) or with its row set (1): blocks that hold no touched row are skipped.
void BM_GradNormEmbeddingRows(benchmark::State& state) {
  Tensor value = Tensor::empty({128256, 256}, DType::F32);  // only its shape is read
  Tensor g = embedding_gradient_for_bench(state.range(0), state.range(1) != 0);
  std::vector<ParamRef> refs = {{"tok_embeddings.weight", &value, &g}};
  for (auto _ : state) benchmark::DoNotOptimize(grad_norm(refs));
}
BENCHMARK(BM_GradNormEmbeddingRows)
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Unit(benchmark::kMillisecond);

void BM_AdamW8bitStep(benchmark::State& state) {
  Params ps(state.range(0));
  AdamW8bit opt;
  for (auto _ : state) opt.step(ps.refs, 1e-4);
  // Reads p, g and the 8-bit codes; writes p and the codes: 4 x 4 + 4 x 1 bytes per element.
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 20);
}
BENCHMARK(BM_AdamW8bitStep)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond);

void BM_ClipGradNorm(benchmark::State& state) {
  Params ps(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(clip_grad_norm(ps.refs, 1e9));  // no scaling
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 4);
}
BENCHMARK(BM_ClipGradNorm)->Arg(1 << 20)->Arg(1 << 24)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
