// The run's shared arena (runtime/shared_arena.h) is only a place: compiled step graphs of
// several batch shapes (small -> large -> small: the arena grows under the small step's
// executor, which must not keep the old buffer), and a DPO step's reference and policy graphs
// run one after the other, compute bitwise what each graph computes on an arena of its own.
// The shared arena is filled with NaN bit patterns before every run, so a kernel that reads an
// arena buffer before writing it (or an output left pointing into the arena) cannot agree by
// luck with the previous step's leftovers. fp32 and bf16 (bf16 steps also place their conversion
// scratch in the arena).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fusetune/compile/compiler.h"
#include "fusetune/losses/preference.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/shared_arena.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct Shape3 {
  int64_t rows, seq_len;
  bool packed;
};

// Every byte of the arena set to 0xFF (a NaN in fp32 and bf16), between runs.
void poison(SharedArena& arena) {
  if (arena.capacity() <= 0) return;
  std::memset(arena.reserve(arena.capacity()), 0xFF, size_t(arena.capacity()));
}

// Outputs by name, bitwise: same dtype, shape and bytes.
void expect_bitwise(const TensorMap& got, const TensorMap& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << where << ": no output " << name;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.dtype(), w.dtype()) << where << " " << name;
    ASSERT_EQ(g.shape(), w.shape()) << where << " " << name;
    EXPECT_EQ(std::memcmp(g.raw(), w.raw(), w.nbytes()), 0)
        << where << ": " << name << " differs from the run on a private arena";
  }
}

// One batch per shape: a shape that comes back runs on the same tokens.
uint64_t seed(const Shape3& s) { return uint64_t(100 + 1000 * s.rows + 10 * s.seq_len + s.packed); }

ModelConfig arena_model() {
  ModelConfig cfg = tiny_config(false, true, 2);
  cfg.vocab_size = 37;
  return cfg;
}

}  // namespace

TEST(SharedArena, SmallLargeSmallShapesMatchPrivateArenasBitwise) {
  const ModelConfig cfg = arena_model();
  // Unpacked shapes grow and shrink, a packed one comes between; the last small step runs
  // after the arena grew for the large ones.
  const std::vector<Shape3> shapes = {{1, 8, false}, {4, 32, false}, {1, 8, false},
                                      {3, 16, true}, {2, 24, false}, {1, 8, false}};
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    PassOptions po;
    po.mode = CompileMode::Full;
    po.ce_chunk_budget_bytes = 5 * cfg.vocab_size * int64_t(dtype_size(dt));  // several chunks
    auto build = [&](int64_t rows, int64_t T, bool packed) {
      TrainingGraphOptions o;
      o.batch_size = rows;
      o.seq_len = T;
      o.packed = packed;
      o.dtype = dt;
      return build_training_graph(cfg, o).graph;
    };
    const TensorMap params = init_parameters(graph_parameters(build(1, 8, false)), 3, dt, 0.2);
    auto arena = std::make_shared<SharedArena>();
    CompiledGraphs shared(build, po, arena);
    double compile_s = 0;
    std::vector<TensorMap> got;  // kept: outputs must not live in the arena
    std::vector<int64_t> capacity;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto& s = shapes[i];
      const Batch b = random_batch(s.rows, s.seq_len, cfg.vocab_size, seed(s), s.packed);
      const TensorMap in = batch_inputs(b, DType::F32, 1.0 / double(b.num_valid_labels()));
      poison(*arena);
      got.push_back(shared.run(b, in, params, &compile_s));
      capacity.push_back(arena->capacity());
    }
    // The arena grew for the large shape and stayed (one buffer as large as the largest plan).
    EXPECT_LT(capacity[0], capacity[1]);
    EXPECT_EQ(capacity.back(), capacity[1]);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto& s = shapes[i];
      const Batch b = random_batch(s.rows, s.seq_len, cfg.vocab_size, seed(s), s.packed);
      const TensorMap in = batch_inputs(b, DType::F32, 1.0 / double(b.num_valid_labels()));
      CompiledGraphs alone(build, po);  // an arena of its own
      expect_bitwise(got[i], alone.run(b, in, params, &compile_s),
                     "step " + std::to_string(i + 1) + " (" + std::to_string(s.rows) + " x " +
                         std::to_string(s.seq_len) + (s.packed ? " packed" : "") + ")");
    }
    // The same small batch before and after the large steps.
    expect_bitwise(got[5], got[0], "small step after the large ones vs before");
  }
}

TEST(SharedArena, AlternatingDpoReferenceAndPolicyPlansMatchPrivateArenasBitwise) {
  const ModelConfig cfg = arena_model();
  PreferenceLoss loss;  // DPOLoss: needs the reference's log-probs
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    PassOptions po;
    po.mode = CompileMode::Full;
    auto policy_graph = [&](int64_t rows, int64_t T, bool packed) {
      TrainingGraphOptions o;
      o.batch_size = rows;
      o.seq_len = T;
      o.packed = packed;
      o.dtype = dt;
      o.loss = preference_loss_builder(loss);
      return build_training_graph(cfg, o).graph;
    };
    auto reference_graph = [&](int64_t rows, int64_t T, bool) {
      return build_sequence_log_probs_graph(cfg, rows, T, dt);
    };
    const auto infos = graph_parameters(policy_graph(2, 8, false));
    const TensorMap policy_params = init_parameters(infos, 5, dt, 0.2);
    const TensorMap ref_params = init_parameters(infos, 6, dt, 0.2);  // a frozen copy, moved

    auto arena = std::make_shared<SharedArena>();
    CompiledGraphs policy(policy_graph, po, arena), reference(reference_graph, po, arena);
    double compile_s = 0;
    // Pairs per batch (2 x pairs rows, chosen then rejected) and padded length.
    const std::vector<std::pair<int64_t, int64_t>> steps = {{1, 8}, {3, 32}, {1, 8}, {2, 16}};
    std::vector<TensorMap> ref_out, policy_out;
    auto inputs = [&](size_t i) {
      // The same batch for the same shape.
      const Batch b = random_batch(2 * steps[i].first, steps[i].second, cfg.vocab_size,
                                   uint64_t(40 + 100 * steps[i].first + steps[i].second));
      TensorMap in = batch_inputs(b, DType::F32, 1.0 / double(steps[i].first));  // fp32 scale
      add_response_inputs(b, in);
      return std::make_pair(b, in);
    };
    for (size_t i = 0; i < steps.size(); ++i) {
      auto [b, in] = inputs(i);
      poison(*arena);
      ref_out.push_back(reference.run(b, in, ref_params, &compile_s));
      in["ref_logps"] = ref_out.back().at("logps");
      poison(*arena);
      policy_out.push_back(policy.run(b, in, policy_params, &compile_s));
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      auto [b, in] = inputs(i);
      const std::string where = "step " + std::to_string(i + 1) + " (" +
                                std::to_string(2 * steps[i].first) + " x " +
                                std::to_string(steps[i].second) + ")";
      CompiledGraphs ref_alone(reference_graph, po), policy_alone(policy_graph, po);
      const TensorMap r = ref_alone.run(b, in, ref_params, &compile_s);
      expect_bitwise(ref_out[i], r, where + " reference");
      in["ref_logps"] = r.at("logps");
      expect_bitwise(policy_out[i], policy_alone.run(b, in, policy_params, &compile_s),
                     where + " policy");
    }
    expect_bitwise(policy_out[2], policy_out[0], "policy: the small step after the large one");
  }
}
