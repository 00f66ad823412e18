// The gradient streamer's layout and its packing, without MPI (one rank: every sum is the value
// itself, so what comes back must be exactly what went in, wherever it was packed): buckets
// filled in arrival order, large fp32 gradients in place, large bf16 ones in pieces, gradients
// handed over out of layout order, and what a step without all its gradients says.
#include <gtest/gtest.h>

#include "fusetune/core/dtype.h"
#include "fusetune/core/memory.h"
#include "fusetune/distributed/grad_stream.h"
#include "fusetune/util/error.h"

using namespace fusetune;
using namespace fusetune::dist;

namespace {

Tensor filled(int64_t n, DType dtype, float base) {
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) {
    const float v = base + 0.25f * float(i);
    if (dtype == DType::F32)
      t.data<float>()[i] = v;
    else
      t.data<uint16_t>()[i] = f32_to_bf16(v);
  }
  return t;
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> v;
  for (int64_t i = 0; i < t.numel(); ++i)
    v.push_back(t.dtype() == DType::F32 ? t.data<float>()[i] : bf16_to_f32(t.data<uint16_t>()[i]));
  return v;
}

}  // namespace

TEST(GradStream, PacksEveryKindOfGradientAndGivesBackTheSumsInAnyArrivalOrder) {
  auto comm = Communicator::from_environment(30);
  ASSERT_EQ(comm->size(), 1);
  // Buckets of 8: {a, b} (3 + 4), c in place (fp32, 10), d in pieces (bf16, 9), {e} (5: a
  // second bucket, so two buffers).
  const std::vector<std::string> names = {"a", "b", "c", "d", "e"};
  const std::vector<int64_t> numels = {3, 4, 10, 9, 5};
  const std::vector<DType> dtypes = {DType::F32, DType::BF16, DType::F32, DType::BF16, DType::F32};
  EXPECT_EQ(allreduce_buffer_elements(numels, dtypes, 8), 8);
  EXPECT_EQ(stream_buffer_elements(numels, dtypes, 8), 16);
  // One bucket and nothing else that needs one: a single buffer.
  EXPECT_EQ(stream_buffer_elements({3, 4, 10}, {DType::F32, DType::BF16, DType::F32}, 8), 7);
  GradientStreamer s(*comm, names, numels, dtypes, 8);
  EXPECT_EQ(s.jobs(), 4u);
  for (int step = 0; step < 2; ++step) {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < names.size(); ++i)
      grads.push_back(filled(numels[i], dtypes[i], float(10 * i + step)));
    std::vector<std::vector<float>> want;
    for (const Tensor& g : grads) want.push_back(values(g));
    s.begin("the gradient all-reduce of step " + std::to_string(step + 1));
    const int64_t before = memory::current_bytes();
    // Out of layout order: e's bucket waits for a, b, c and d's collectives.
    for (size_t i : {size_t(4), size_t(2), size_t(0), size_t(3), size_t(1)})
      s.add(names[i], grads[i]);
    EXPECT_LE(memory::current_bytes() - before, int64_t(16 * sizeof(float)));
    s.finish();
    EXPECT_EQ(memory::current_bytes(), before) << "the bucket space is freed by finish()";
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(values(grads[i]), want[i]) << names[i];
  }
}

TEST(GradStream, AStepWithoutAllItsGradientsOrWithAnUnknownOneIsAnError) {
  auto comm = Communicator::from_environment(30);
  GradientStreamer s(*comm, {"a", "b"}, {3, 4}, {DType::F32, DType::F32}, 8);
  s.begin("step 1");
  Tensor a = filled(3, DType::F32, 1);
  s.add("a", a);
  EXPECT_THROW(s.add("a", a), Error);
  EXPECT_THROW(s.add("z", a), Error);
  try {
    s.finish();
    FAIL() << "b was never handed over";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no gradient for 'b'"), std::string::npos) << e.what();
  }
}
