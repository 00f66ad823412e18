// ZeRO-2's reduce during the backward (distributed/owned_gradients.h), without MPI: one rank owns
// every gradient and each sum is the value itself, so what matters is the order. Gradients are
// reduced in the agreed order whatever order the backward hands them over in (an early one is
// held until its turn); a backward that misses a gradient, hands one over twice or hands over
// one the order lacks is an error naming it.
#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/distributed/owned_gradients.h"
#include "fusetune/util/error.h"

using namespace fusetune;
using namespace fusetune::dist;
using fusetune::testing::error_of;

namespace {

Tensor ramp(int64_t n, float v) {
  Tensor t = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = v + float(i);
  return t;
}

}  // namespace

TEST(OwnedGradients, ReducesInTheAgreedOrderHoldingGradientsHandedOverBeforeTheirTurn) {
  auto comm = Communicator::from_environment(30);
  ASSERT_EQ(comm->size(), 1);
  OwnedGradients owned(*comm, {"a", "b", "c"}, {2, 3, 4});
  EXPECT_FALSE(owned.has_order());
  owned.set_order({"c", "a", "b"});
  EXPECT_TRUE(owned.has_order());
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> kept;
    std::vector<float> first;
    const OwnedGradients::Keep keep = [&](const std::string& name, Tensor sum) {
      kept.push_back(name);
      first.push_back(sum.data<float>()[0]);
    };
    owned.hand_over("b", ramp(3, 20), keep, "test");  // before its turn: held
    EXPECT_TRUE(kept.empty());
    owned.hand_over("frozen", ramp(5, 99), keep, "test");  // not trained: ignored
    owned.hand_over("c", ramp(4, 30), keep, "test");
    EXPECT_EQ(kept, std::vector<std::string>({"c"}));
    owned.hand_over("a", ramp(2, 10), keep, "test");  // a, then the held b
    EXPECT_EQ(kept, std::vector<std::string>({"c", "a", "b"}));
    EXPECT_EQ(first, std::vector<float>({30, 10, 20}));
    owned.end_of_backward();
  }
}

TEST(OwnedGradients, AMissingDoubledOrUnorderedGradientIsAnErrorNamingIt) {
  auto comm = Communicator::from_environment(30);
  const OwnedGradients::Keep drop = [](const std::string&, Tensor) {};
  {
    OwnedGradients owned(*comm, {"a", "b"}, {2, 2});
    owned.set_order({"a", "b"});
    owned.hand_over("a", ramp(2, 1), drop, "test");
    EXPECT_NE(error_of([&] { owned.end_of_backward(); }).find("gradient of 'b'"),
              std::string::npos);
  }
  {
    OwnedGradients owned(*comm, {"a", "b"}, {2, 2});
    owned.set_order({"a", "b"});
    owned.hand_over("b", ramp(2, 1), drop, "test");
    EXPECT_NE(error_of([&] {
                owned.hand_over("b", ramp(2, 1), drop, "test");
              }).find("gradient of 'b' twice"),
              std::string::npos);
  }
  {
    OwnedGradients owned(*comm, {"a", "b"}, {2, 2});
    owned.set_order({"a"});  // rank 0's backward produces no gradient of b
    owned.hand_over("b", ramp(2, 1), drop, "test");
    owned.hand_over("a", ramp(2, 1), drop, "test");
    EXPECT_NE(error_of([&] { owned.end_of_backward(); })
                  .find("gradient of 'b' that rank 0's "
                        "does not"),
              std::string::npos);
  }
  {
    OwnedGradients owned(*comm, {"a"}, {2});
    EXPECT_NE(error_of([&] { owned.set_order({"z"}); }).find("'z'"), std::string::npos);
  }
}
