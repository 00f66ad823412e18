// ZeRO-3's schedule pass (compile/params_at_use.h) and the executors' ParamSource callback:
// every parameter leaf sits right before its first reader, the backward reads its own leaf of
// the same name (unless reshard_after_forward is off), the callback is asked for exactly those
// leaves in that order, and the step computes bitwise what it computes from a TensorMap, in all
// three compile modes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/rewrite.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "tensor_checks.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

TEST(ParamsAtUse, ParametersBoundAtFirstUseAgainForTheBackwardAndStepsUnchanged) {
  ModelConfig cfg = tiny_config(true, true);  // tied: the table read by embedding and head
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  const TrainingGraph tg = build_training_graph(cfg, o);
  const TensorMap params = init_parameters(graph_parameters(tg.graph), 11, DType::F32, 0.2);
  const Batch batch = random_batch(2, 8, cfg.vocab_size, 5);
  const TensorMap inputs = batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    for (bool reshard : {true, false}) {
      const std::string what = std::string(compile_mode_name(mode)) + (reshard ? "" : " keep");
      PassOptions po;
      po.mode = mode;
      const std::vector<Tensor> want = compile_graph(tg.graph, po).executor->run(inputs, params);
      po.params_at_use = true;
      po.reshard_after_forward = reshard;
      CompiledStep step = compile_graph(tg.graph, po);
      const Graph& g = step.executor->graph();
      // The schedule: a leaf is followed (after other leaves) by one of its readers; forward
      // and backward leaves of the same name.
      const auto readers = readers_of(g);
      std::vector<std::string> leaves;
      std::map<std::string, std::set<bool>> directions;  // per name: leaves' reader directions
      for (size_t i = 0; i < g.nodes().size(); ++i) {
        if (g.nodes()[i].op != Op::Param) continue;
        leaves.push_back(g.nodes()[i].name);
        ASSERT_FALSE(readers[i].empty()) << what << " " << g.nodes()[i].name;
        size_t next = i + 1;
        while (g.nodes()[next].op == Op::Param) ++next;
        EXPECT_EQ(readers[i].front(), int(next)) << what << " " << g.nodes()[i].name;
        std::set<bool> dirs;
        for (int r : readers[i]) dirs.insert(g.nodes()[size_t(r)].backward);
        if (reshard) {
          EXPECT_EQ(dirs.size(), 1u) << what << " " << g.nodes()[i].name;
        }
        for (bool d : dirs) directions[g.nodes()[i].name].insert(d);
      }
      size_t both = 0;
      for (const auto& [name, d] : directions) both += d.size() == 2;
      EXPECT_GT(both, 10u) << what << ": trained weights are read forward and backward";
      EXPECT_EQ(leaves.size(), directions.size() + (reshard ? both : 0)) << what;
      // The callback hands out copies (as a rank that does not own them gets them) in exactly
      // the leaves' order, and the outputs are bitwise those of the TensorMap run.
      std::vector<std::string> asked;
      const ParamSource source([&](const std::string& name) {
        asked.push_back(name);
        return params.at(name).clone();
      });
      const std::vector<Tensor> got = step.executor->run(inputs, source);
      EXPECT_EQ(asked, leaves) << what;
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_TRUE(same_bits(got[k], want[k])) << what << " " << g.outputs()[k].first;
    }
  }
}
