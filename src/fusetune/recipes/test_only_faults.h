#pragma once
// TEST-ONLY fault injection, for the training loop's non-finite guard (train_loop.cpp) and its
// test (tests/unit/nonfinite_guard_test.cpp); nothing else sets the variable, and unset (always,
// outside that test) nothing here runs.
//
// FUSETUNE_TEST_ONLY_INF_GRADIENT_AT_STEP=N: on the last rank, the first gradient that
// optimizer step N's first micro-batch hands over (through a gradient hook, else in its
// outputs) gets +inf as its first element; the loss is left as computed (finite). The guard
// must then stop the run with the weights untouched; to let the test check that, the loop first
// saves what it holds to output_dir/test_only_stopped (a name no resume or pruning considers).
#include <cstdint>
#include <memory>
#include <optional>

#include "fusetune/recipes/training_step.h"

namespace fusetune::test_only {

inline constexpr const char* kInfGradientAtStepEnv = "FUSETUNE_TEST_ONLY_INF_GRADIENT_AT_STEP";
inline constexpr const char* kStoppedCheckpoint = "test_only_stopped";

// N from the environment; nullopt when unset. Throws on anything but a positive integer.
std::optional<int64_t> inf_gradient_step();

// `step` injecting the fault at optimizer step `at` (1-based) when `this_rank` (the last
// rank); otherwise it only forwards.
std::unique_ptr<TrainingStep> with_inf_gradient(std::unique_ptr<TrainingStep> step, int64_t at,
                                                bool this_rank);

}  // namespace fusetune::test_only
