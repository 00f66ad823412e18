// Optimizer state save/load: resuming from saved state continues bitwise like an
// uninterrupted run, and bad state is rejected with a message naming the entry.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "fusetune/optim/adamw.h"
#include "fusetune/optim/sgd.h"
#include "fusetune/util/error.h"
#include "tensor_checks.h"

using namespace fusetune;
using fusetune::testing::same_bits;

namespace {

// Two parameters and their gradients; the gradient is a function of the value and the step,
// so a resumed run only matches if values and state were both restored exactly.
struct StateModel {
  Tensor a = Tensor::empty({3, 4}, DType::F32), ga = Tensor::empty({3, 4}, DType::F32);
  Tensor b = Tensor::empty({5}, DType::F32), gb = Tensor::empty({5}, DType::F32);
  StateModel() {
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = 0.1f * float(i) - 0.5f;
    for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = 1.0f - 0.3f * float(i);
  }
  StateModel(const StateModel& o)
      : a(o.a.clone()), ga(o.ga.clone()), b(o.b.clone()), gb(o.gb.clone()) {}
  std::vector<ParamRef> params() { return {{"layer.a", &a, &ga}, {"layer.b", &b, &gb}}; }
  void compute_grads(int step) {
    for (int64_t i = 0; i < a.numel(); ++i)
      ga.data<float>()[i] = std::sin(a.data<float>()[i] * float(step + 1)) + 0.01f * float(i);
    for (int64_t i = 0; i < b.numel(); ++i)
      gb.data<float>()[i] = std::cos(b.data<float>()[i]) * float(step % 3 - 1);
  }
};

// Copies saved state into a map, as writing it to a file and reading it back would.
StateMap through_file(const NamedTensors& saved) {
  StateMap m;
  for (const auto& [name, t] : saved) m[name] = t.clone();
  return m;
}

double lr_for(int step) { return 0.05 / (1 + step); }

template <class Opt, class Options>
void check_resume_is_bitwise(const Options& options, size_t expected_entries) {
  const int total = 7, split = 3;
  StateModel full;
  Opt uninterrupted(options);
  for (int k = 0; k < total; ++k) {
    full.compute_grads(k);
    auto p = full.params();
    uninterrupted.step(p, lr_for(k));
  }

  StateModel first;
  auto resumed_state = std::make_unique<Opt>(options);
  for (int k = 0; k < split; ++k) {
    first.compute_grads(k);
    auto p = first.params();
    resumed_state->step(p, lr_for(k));
  }
  NamedTensors saved;
  resumed_state->save_state(saved);
  EXPECT_EQ(saved.size(), expected_entries);
  StateMap file = through_file(saved);
  resumed_state.reset();  // the first process is gone

  StateModel second(first);
  Opt resumed(options);
  auto p2 = second.params();
  resumed.load_state(file, p2);
  EXPECT_EQ(resumed.state_bytes(), uninterrupted.state_bytes());
  for (int k = split; k < total; ++k) {
    second.compute_grads(k);
    auto p = second.params();
    resumed.step(p, lr_for(k));
  }
  EXPECT_TRUE(same_bits(second.a, full.a));
  EXPECT_TRUE(same_bits(second.b, full.b));
}

}  // namespace

TEST(OptimState, AdamWResumeIsBitwiseIdentical) {
  AdamWOptions o;
  o.weight_decay = 0.05;
  check_resume_is_bitwise<AdamW>(o, 6);
}

TEST(OptimState, SGDResumeIsBitwiseIdentical) {
  SGDOptions o;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  check_resume_is_bitwise<SGD>(o, 2);
}

TEST(OptimState, AdamWSavedNamesAndSteps) {
  StateModel m;
  AdamW opt;
  NamedTensors none;
  opt.save_state(none);
  EXPECT_TRUE(none.empty());
  for (int k = 0; k < 2; ++k) {
    m.compute_grads(k);
    auto p = m.params();
    opt.step(p, 1e-3);
  }
  NamedTensors saved;
  opt.save_state(saved);
  std::vector<std::string> names;
  for (const auto& kv : saved) names.push_back(kv.first);
  EXPECT_EQ(names,
            (std::vector<std::string>{"layer.a.exp_avg", "layer.a.exp_avg_sq", "layer.a.step",
                                      "layer.b.exp_avg", "layer.b.exp_avg_sq", "layer.b.step"}));
  EXPECT_EQ(saved[0].second.shape(), (Shape{3, 4}));
  EXPECT_EQ(saved[2].second.dtype(), DType::I64);
  EXPECT_EQ(saved[2].second.data<int64_t>()[0], 2);
}

TEST(OptimState, EmptyStateMeansFreshStart) {
  StateModel m;
  auto p = m.params();
  AdamW opt;
  m.compute_grads(0);
  opt.step(p, 1e-3);
  opt.load_state({}, p);
  EXPECT_EQ(opt.step_count("layer.a"), 0);
  EXPECT_EQ(opt.state_bytes(), 0);
}

TEST(OptimState, StepStoredAsFloatIsAccepted) {
  StateModel m;
  auto p = m.params();
  AdamW opt;
  m.compute_grads(0);
  opt.step(p, 1e-3);
  NamedTensors saved;
  opt.save_state(saved);
  StateMap file = through_file(saved);
  Tensor f = Tensor::empty({}, DType::F32);  // torch's encoding: a float32 scalar
  f.data<float>()[0] = 5.0f;
  file["layer.a.step"] = f;
  AdamW other;
  other.load_state(file, p);
  EXPECT_EQ(other.step_count("layer.a"), 5);
  EXPECT_EQ(other.step_count("layer.b"), 1);
}

namespace {

std::string load_error(Optimizer& opt, const StateMap& state, const std::vector<ParamRef>& p) {
  try {
    opt.load_state(state, p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(OptimState, BadStateIsRejectedAndLeavesStateUnchanged) {
  StateModel m;
  auto p = m.params();
  AdamW opt;
  m.compute_grads(0);
  opt.step(p, 1e-3);
  NamedTensors saved;
  opt.save_state(saved);
  const StateMap good = through_file(saved);

  AdamW target;
  target.step(p, 1e-3);
  target.step(p, 1e-3);
  ASSERT_EQ(target.step_count("layer.a"), 2);

  StateMap missing = good;
  missing.erase("layer.b.exp_avg_sq");
  std::string err = load_error(target, missing, p);
  EXPECT_NE(err.find("missing entry 'layer.b.exp_avg_sq'"), std::string::npos) << err;

  StateMap wrong_shape = good;
  wrong_shape["layer.a.exp_avg"] = Tensor::zeros({4, 3}, DType::F32);
  err = load_error(target, wrong_shape, p);
  EXPECT_NE(err.find("'layer.a.exp_avg' has shape [4, 3], expected [3, 4]"), std::string::npos)
      << err;

  StateMap wrong_dtype = good;
  wrong_dtype["layer.a.exp_avg"] = Tensor::zeros({3, 4}, DType::F64);
  err = load_error(target, wrong_dtype, p);
  EXPECT_NE(err.find("is F64, expected F32"), std::string::npos) << err;

  StateMap extra = good;
  extra["layer.c.exp_avg"] = Tensor::zeros({1}, DType::F32);
  err = load_error(target, extra, p);
  EXPECT_NE(err.find("unexpected entry 'layer.c.exp_avg'"), std::string::npos) << err;

  StateMap bad_step = good;
  Tensor neg = Tensor::empty({1}, DType::I64);
  neg.data<int64_t>()[0] = -3;
  bad_step["layer.a.step"] = neg;
  err = load_error(target, bad_step, p);
  EXPECT_NE(err.find("'layer.a.step' is not a step count"), std::string::npos) << err;
  bad_step["layer.a.step"] = Tensor::zeros({2}, DType::I64);
  err = load_error(target, bad_step, p);
  EXPECT_NE(err.find("'layer.a.step' must hold one step count"), std::string::npos) << err;

  EXPECT_EQ(target.step_count("layer.a"), 2);  // every failed load left the state alone
}

TEST(OptimState, StateFromAnotherOptimizerIsRejected) {
  StateModel m;
  auto p = m.params();
  m.compute_grads(0);
  SGDOptions so;
  so.momentum = 0.9;
  SGD sgd(so);
  sgd.step(p, 0.1);
  NamedTensors sgd_saved;
  sgd.save_state(sgd_saved);
  AdamW adam;
  std::string err = load_error(adam, through_file(sgd_saved), p);
  EXPECT_NE(err.find("AdamW state: missing entry 'layer.a.exp_avg'"), std::string::npos) << err;

  adam.step(p, 0.1);
  NamedTensors adam_saved;
  adam.save_state(adam_saved);
  SGD sgd2(so);
  err = load_error(sgd2, through_file(adam_saved), p);
  EXPECT_NE(err.find("SGD state: missing entry 'layer.a.momentum_buffer'"), std::string::npos)
      << err;
  SGD plain;  // no momentum: no state expected at all
  err = load_error(plain, through_file(sgd_saved), p);
  EXPECT_NE(err.find("unexpected entry"), std::string::npos) << err;
}

TEST(OptimState, ParseOptimizerKind) {
  EXPECT_EQ(parse_optimizer_kind("torch.optim.AdamW"), OptimizerKind::AdamW);
  EXPECT_EQ(parse_optimizer_kind("adamw"), OptimizerKind::AdamW);
  EXPECT_EQ(parse_optimizer_kind("torch.optim.SGD"), OptimizerKind::SGD);
  try {
    parse_optimizer_kind("torch.optim.AdamX");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'torch.optim.AdamW'"), std::string::npos)
        << e.what();
  }
}
