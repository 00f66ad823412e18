// Row-sparse embedding gradients (core/tensor.h's RowSet, docs/design.md §5, §7, §8): the
// backward zeroes only the rows a reused buffer held and records the rows it wrote; the
// accumulation, the norm, clipping, the packing for the sum over ranks and AdamW read those rows
// only. Each is checked bitwise against the dense formulation written out here (a scatter-add
// into a zeroed table) or the dense path (the same tensor without its row set), over steps whose
// rows change, so a row written in step 1 and not in step 2 must be zero again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fusetune/compile/memory_plan.h"
#include "fusetune/core/memory.h"
#include "fusetune/distributed/communicator.h"
#include "fusetune/distributed/row_sparse_allreduce.h"
#include "fusetune/graph/graph.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/optim/grad_clip.h"
#include "fusetune/recipes/grad_sync.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/plan_executor.h"

using namespace fusetune;

namespace {

bool same_bits_sparse_test(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<int32_t> sorted_unique_ids(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// Step s's ids: disjoint row ranges on steps 0 and 1, then a mix with repeats (a row summed
// twice), all within [0, V).
std::vector<int32_t> ids_of_step(int s, int64_t n, int64_t V) {
  std::mt19937 rng(uint32_t(11 + s));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = s == 0 ? 0 : s == 1 ? V / 2 : 0;
    ids[size_t(i)] = int32_t(lo + int64_t(rng() % uint32_t(s < 2 ? V / 2 : V)));
  }
  ids[1] = ids[0];
  return ids;
}

Tensor random_grad_tensor(Shape shape, DType dt, uint32_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::BF16)
      t.data<uint16_t>()[i] = f32_to_bf16(nd(rng));
    else
      t.data<float>()[i] = nd(rng);
  }
  return t;
}

// The dense backward: a zeroed [V, D] table, each position's row of dy added in position order
// in fp32 (rounded to bf16 once at the end for a bf16 table).
Tensor dense_scatter(const Tensor& dy, const std::vector<int32_t>& ids, int64_t V, DType dt) {
  const int64_t D = dy.dim(1);
  std::vector<float> sum(size_t(V * D), 0.0f);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t j = 0; j < D; ++j) {
      const int64_t at = int64_t(i) * D + j;
      sum[size_t(ids[i] * D + j)] +=
          dt == DType::BF16 ? bf16_to_f32(dy.data<uint16_t>()[at]) : dy.data<float>()[at];
    }
  Tensor want = Tensor::empty({V, D}, dt);
  for (int64_t k = 0; k < V * D; ++k) {
    if (dt == DType::BF16)
      want.data<uint16_t>()[k] = f32_to_bf16(sum[size_t(k)]);
    else
      want.data<float>()[k] = sum[size_t(k)];
  }
  return want;
}

// A [rows, cols] gradient with random values in `touched` rows and +0 elsewhere, carrying that
// row set when `with_rows`.
Tensor gradient_on_rows(int64_t rows, int64_t cols, DType dt, const std::vector<int32_t>& touched,
                        uint32_t seed, bool with_rows = true) {
  Tensor g = Tensor::zeros({rows, cols}, dt);
  const Tensor r = random_grad_tensor({rows, cols}, dt, seed);
  const size_t row_bytes = size_t(cols) * dtype_size(dt);
  for (int32_t row : touched)
    std::memcpy(static_cast<char*>(g.raw()) + row * row_bytes,
                static_cast<const char*>(r.raw()) + row * row_bytes, row_bytes);
  if (with_rows) {
    auto set = std::make_shared<RowSet>();
    set->row_bytes = int64_t(row_bytes);
    set->rows = touched;
    g.storage()->set_nonzero_rows(set);
  }
  return g;
}

// Each element times a random power of two in [2^-4, 2^4] (exact, in fp32 and bf16): sums of
// squares that span 16 binades more round at most additions, so two orders differ in the bits.
void spread_magnitudes(Tensor& g) {
  std::mt19937 rng(17);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const float scale = std::ldexp(1.0f, int(rng() % 9) - 4);
    if (g.dtype() == DType::BF16)
      g.data<uint16_t>()[i] = f32_to_bf16(bf16_to_f32(g.data<uint16_t>()[i]) * scale);
    else
      g.data<float>()[i] *= scale;
  }
}

class SparseEmbeddingBackward : public ::testing::TestWithParam<DType> {};

}  // namespace

// Tables of exactly 2 MiB, so that a freed gradient waits in the block cache with its row set
// and the next step's backward reuses it, clearing only the rows the last step wrote.
TEST_P(SparseEmbeddingBackward, ReusedBuffersHoldBitwiseTheDenseScatterEveryStep) {
  const DType dt = GetParam();
  const int64_t D = 128, V = (int64_t(2) << 20) / (D * int64_t(dtype_size(dt))), n = 48;
  Graph g(dt);
  Value dy = g.input("dy", {n, D}, dt), ids = g.input("ids", {n}, DType::I32);
  Attrs at;
  at.dim0 = int(V);
  g.mark_output("grad", g.add1(Op::EmbeddingBackward, {dy, ids}, at));
  EagerExecutor eager(g);
  PlanExecutor compiled(g, plan_memory(g));
  for (Executor* ex : {static_cast<Executor*>(&eager), static_cast<Executor*>(&compiled)}) {
    for (int s = 0; s < 4; ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      const std::vector<int32_t> step_ids = ids_of_step(s, n, V);
      Tensor ids_t = Tensor::empty({n}, DType::I32);
      std::copy(step_ids.begin(), step_ids.end(), ids_t.data<int32_t>());
      const Tensor dy_t = random_grad_tensor({n, D}, dt, uint32_t(100 + s));
      if (s == 3) {  // the freed buffer taken by someone else and dirtied: its row set is gone
        Tensor other = Tensor::empty({V, D}, dt);
        std::memset(other.raw(), 0x3f, other.nbytes());
      }
      const Tensor got = ex->run({{"dy", dy_t}, {"ids", ids_t}}, {})[0];
      EXPECT_TRUE(same_bits_sparse_test(got, dense_scatter(dy_t, step_ids, V, dt)));
      ASSERT_TRUE(got.nonzero_rows());
      EXPECT_EQ(got.nonzero_rows()->rows, sorted_unique_ids(step_ids));
      EXPECT_EQ(got.nonzero_rows()->row_bytes, D * int64_t(dtype_size(dt)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SparseEmbeddingBackward,
                         ::testing::Values(DType::F32, DType::BF16), [](const auto& dtype_info) {
                           return std::string(dtype_name(dtype_info.param));
                         });

TEST(SparseEmbeddingGrad, AFreedBufferKeepsItsRowSetForTheNextReuseOnly) {
  const Shape shape = {1024, 1024};  // 4 MiB of fp32
  const void* where = nullptr;
  {
    Tensor t = Tensor::reusing_rows(shape, DType::F32);
    auto set = std::make_shared<RowSet>();
    set->row_bytes = 1024 * 4;
    set->rows = {3, 700};
    t.storage()->set_nonzero_rows(set);
    where = t.raw();
  }
  Tensor again = Tensor::reusing_rows(shape, DType::F32);
  if (memory::cached_bytes() == 0 && again.raw() != where) GTEST_SKIP() << "block cache off";
  ASSERT_EQ(again.raw(), where);
  ASSERT_TRUE(again.nonzero_rows());
  EXPECT_EQ(again.nonzero_rows()->rows, (std::vector<int32_t>{3, 700}));
  again.drop_nonzero_rows();
  again = Tensor();
  // Dropped before the free: the next reuse knows nothing about the contents.
  EXPECT_FALSE(Tensor::reusing_rows(shape, DType::F32).nonzero_rows());
}

// Rows of 40 elements straddle the norm's blocks of 8192 elements (a block is skipped only when
// no listed row reaches into it); rows of 13 in a table of 13013 elements end on a short block
// whose last 5 elements the dense loop adds into its first lane, after the others.
TEST(SparseEmbeddingGrad, NormAndClippingOfARowSetAreBitwiseTheDenseOnes) {
  struct Shape2 {
    int64_t rows, cols;
    std::vector<int32_t> touched;
  };
  for (const Shape2& sh : {Shape2{1024, 40, {0, 204, 205, 409, 1000, 1023}},
                           Shape2{1001, 13, {3, 4, 629, 630, 999, 1000}}})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows of " + std::to_string(sh.cols));
      Tensor sparse = gradient_on_rows(sh.rows, sh.cols, dt, sh.touched, 5);
      spread_magnitudes(sparse);  // so that the order of the additions shows in the bits
      Tensor dense = sparse.clone();
      ASSERT_FALSE(dense.nonzero_rows());
      Tensor value = Tensor::zeros({sh.rows, sh.cols}, dt);
      const std::vector<ParamRef> s = {{"tok", &value, &sparse}}, d = {{"tok", &value, &dense}};
      // The sum of squares: its square root would hide a last-bit difference.
      const double ns = grad_sum_squares(s), nd = grad_sum_squares(d);
      EXPECT_EQ(std::memcmp(&ns, &nd, sizeof ns), 0) << ns << " vs " << nd;
      EXPECT_EQ(grad_norm(s), grad_norm(d));
      // An independent sum: every element squared in double.
      double want = 0;
      for (int64_t i = 0; i < dense.numel(); ++i) {
        const double x = element_as_double(dense, i);
        want += x * x;
      }
      EXPECT_NEAR(ns, want, 1e-12 * want);
      const double cs = clip_grad_norm(s, 0.5), cd = clip_grad_norm(d, 0.5);
      EXPECT_EQ(cs, cd);
      EXPECT_TRUE(same_bits_sparse_test(sparse, dense));
      EXPECT_NEAR(grad_norm(d), 0.5, dt == DType::BF16 ? 1e-2 : 1e-5);  // bf16: rounded once
    }
}

TEST(SparseEmbeddingGrad, AccumulatedMicroBatchesAddTheUnionOfRowsBitwise) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    TensorMap sparse, dense;
    const std::vector<std::vector<int32_t>> micro = {{1, 5, 9}, {5, 60}, {2}};
    for (size_t k = 0; k < micro.size(); ++k) {
      Tensor g = gradient_on_rows(64, 24, dt, micro[k], uint32_t(20 + k));
      Tensor plain = g.clone();
      accumulate_gradient(sparse, "tok", g, k == 0);
      accumulate_gradient(dense, "tok", plain, k == 0);
    }
    EXPECT_TRUE(same_bits_sparse_test(sparse.at("tok"), dense.at("tok")));
    ASSERT_TRUE(sparse.at("tok").nonzero_rows());
    EXPECT_EQ(sparse.at("tok").nonzero_rows()->rows, (std::vector<int32_t>{1, 2, 5, 9, 60}));
    EXPECT_FALSE(dense.at("tok").nonzero_rows());
    // A dense micro-batch makes the sum dense.
    accumulate_gradient(sparse, "tok", gradient_on_rows(64, 24, dt, {3}, 30, false), false);
    EXPECT_FALSE(sparse.at("tok").nonzero_rows());
  }
}

// AdamW reads the row set instead of testing each row's bits: parameters and moments end
// bitwise as with the dense gradient, over steps whose rows change (rows of step 0 keep decaying
// moments while later steps touch other rows), with and without weight decay.
TEST(SparseEmbeddingGrad, AdamWWithRowSetsIsBitwiseTheDenseUpdateOverSteps) {
  for (double wd : {0.0, 0.01}) {
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    AdamWOptions o;
    o.weight_decay = wd;
    AdamW sparse_opt(o), dense_opt(o);
    Tensor ps = random_grad_tensor({96, 16}, DType::F32, 1), pd = ps.clone();
    const std::vector<std::vector<int32_t>> steps = {{0, 1, 2, 40}, {50, 51}, {1, 95}, {}};
    for (size_t s = 0; s < steps.size(); ++s) {
      Tensor gs = gradient_on_rows(96, 16, DType::F32, steps[s], uint32_t(40 + s));
      Tensor gd = gs.clone();
      sparse_opt.step({{"tok", &ps, &gs}}, 1e-2);
      dense_opt.step({{"tok", &pd, &gd}}, 1e-2);
      EXPECT_TRUE(same_bits_sparse_test(ps, pd)) << "step " << s;
    }
    NamedTensors ss, sd;
    sparse_opt.save_state(ss);
    dense_opt.save_state(sd);
    ASSERT_EQ(ss.size(), sd.size());
    for (size_t i = 0; i < ss.size(); ++i)
      EXPECT_TRUE(same_bits_sparse_test(ss[i].second, sd[i].second)) << ss[i].first;
  }
}

// The packing behind the sum over ranks, on one rank (each sum is the value itself): the union's
// rows move to the front of the buffer in order, and back, the front rows they passed through
// zero again; a gradient without a row set is summed whole.
TEST(SparseEmbeddingGrad, PackedRowsGoToTheFrontAndBackBitwise) {
  auto comm = dist::Communicator::from_environment(30);
  ASSERT_EQ(comm->size(), 1);
  const std::vector<int32_t> rows = {2, 5, 9, 100};
  Tensor a = gradient_on_rows(128, 8, DType::F32, rows, 7);
  Tensor b = gradient_on_rows(16, 8, DType::F32, {1}, 8, false);
  Tensor c = gradient_on_rows(32, 8, DType::BF16, {0, 31}, 9);
  const Tensor a0 = a.clone(), b0 = b.clone(), c0 = c.clone();
  std::vector<dist::PackedRows> packed = dist::pack_row_sets(*comm, {&a, &b, &c}, "test");
  ASSERT_EQ(packed.size(), 3u);
  ASSERT_EQ(packed[0].packed.numel(), 4 * 8);
  for (size_t k = 0; k < rows.size(); ++k)
    EXPECT_EQ(std::memcmp(a.data<float>() + k * 8, a0.data<float>() + rows[k] * 8, 32), 0) << k;
  EXPECT_EQ(packed[1].packed.numel(), b.numel());
  EXPECT_FALSE(packed[1].rows);
  EXPECT_EQ(packed[2].packed.numel(), 2 * 8);
  dist::unpack_row_sets(packed);
  EXPECT_TRUE(same_bits_sparse_test(a, a0));
  EXPECT_TRUE(same_bits_sparse_test(b, b0));
  EXPECT_TRUE(same_bits_sparse_test(c, c0));
  ASSERT_TRUE(a.nonzero_rows());
  EXPECT_EQ(a.nonzero_rows()->rows, rows);
}
