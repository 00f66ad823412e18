// optimizer_in_bwd at the graph level: each parameter updated from the executor's output
// callback as soon as its gradient is computed gives the same losses as the ordinary step (all
// gradients, then one optimizer step), in every compile mode, for full fine-tuning and LoRA;
// its measured peak drops by about the gradients' bytes, as the estimate predicts; and no
// parameter is read after its gradient is ready (else its update would wait).
#include <gtest/gtest.h>

#include <cmath>

#include "fusetune/compile/compiler.h"
#include "fusetune/compile/memory_estimate.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/core/memory.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/peft/lora.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct TrainRun {
  std::vector<double> losses;
  int64_t peak = 0;  // measured, the last step (optimizer state allocated)
  int64_t predicted = 0;
  int64_t gradient_bytes = 0;
};

TrainingGraph graph_for(const ModelConfig& cfg, bool lora, int64_t B, int64_t T) {
  TrainingGraphOptions o;
  o.batch_size = B;
  o.seq_len = T;
  if (lora) {
    peft::LoraConfig c;
    c.attn_modules = {"q_proj", "k_proj", "v_proj", "output_proj"};
    c.apply_to_mlp = true;
    c.rank = 4;
    c.alpha = 8;
    o.trainable = peft::is_adapter_param;
    o.llama = peft::lora_llama_options(c);
  }
  return build_training_graph(cfg, o);
}

TrainRun train(const ModelConfig& cfg, bool lora, CompileMode mode, bool in_bwd, int steps,
               int64_t B = 2, int64_t T = 32) {
  TrainingGraph tg = graph_for(cfg, lora, B, T);
  PassOptions po;
  po.mode = mode;
  po.ce_chunk_budget_bytes = 16 * cfg.vocab_size * 4;
  TrainRun r;
  {
    Graph g = run_passes(tg.graph, po, nullptr);
    MemoryPlan plan;
    if (mode != CompileMode::None) plan = plan_memory(g, mode == CompileMode::Model ? 1 : -1);
    const MemoryBreakdown m = estimate_step_memory(g, mode == CompileMode::None ? nullptr : &plan,
                                                   2.0, in_bwd ? all_gradients() : GradientFreed{});
    r.predicted = m.total();
  }
  const int64_t base = memory::current_bytes();
  {
    TensorMap params = init_parameters(graph_parameters(tg.graph), 3, DType::F32);
    AdamW opt;
    CompiledStep step = compile_graph(tg.graph, po);
    const std::vector<bool> early = early_update_outputs(step.executor->graph());
    const auto& outputs = step.executor->graph().outputs();
    for (const auto& [name, v] : outputs)
      if (name.rfind("grad:", 0) == 0)
        r.gradient_bytes += int64_t(step.executor->graph().type(v).nbytes());
    for (int s = 0; s < steps; ++s) {
      Batch batch = random_batch(B, T, cfg.vocab_size, 9 + uint64_t(s));
      TensorMap inputs = batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
      memory::reset_peak();
      const double lr = 1e-3 * (1.0 + 0.5 * s);
      std::vector<Tensor> out;
      if (in_bwd) {
        out = step.executor->run(inputs, params, [&](size_t k, const Tensor& t) {
          if (!early[k]) return false;
          Tensor g = t;
          const std::string name = outputs[k].first.substr(5);
          opt.step({{name, &params.at(name), &g}}, lr);
          return true;
        });
        for (size_t k = 0; k < out.size(); ++k)
          if (outputs[k].first.rfind("grad:", 0) == 0 && !early[k]) {
            const std::string name = outputs[k].first.substr(5);
            opt.step({{name, &params.at(name), &out[k]}}, lr);
            out[k] = Tensor();
          } else if (early[k]) {
            EXPECT_FALSE(out[k].defined()) << outputs[k].first << " was taken";
          }
      } else {
        out = step.executor->run(inputs, params);
        std::vector<ParamRef> refs;
        for (size_t k = 0; k < out.size(); ++k)
          if (outputs[k].first.rfind("grad:", 0) == 0) {
            const std::string name = outputs[k].first.substr(5);
            refs.push_back({name, &params.at(name), &out[k]});
          }
        opt.step(refs, lr);
      }
      r.losses.push_back(element_as_double(out[0], 0));
      r.peak = memory::peak_bytes() - base;
    }
  }
  return r;
}

}  // namespace

TEST(OptimizerInBwd, NoParameterIsReadAfterItsGradientInALlamaBackward) {
  for (bool tied : {false, true})
    for (bool lora : {false, true})
      for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
        TrainingGraph tg = graph_for(tiny_config(tied, false), lora, 2, 8);
        PassOptions po;
        po.mode = mode;
        Graph g = run_passes(tg.graph, po, nullptr);
        const std::vector<bool> early = early_update_outputs(g);
        int grads = 0;
        for (size_t k = 0; k < g.outputs().size(); ++k) {
          const bool grad = g.outputs()[k].first.rfind("grad:", 0) == 0;
          grads += grad;
          EXPECT_EQ(bool(early[k]), grad) << g.outputs()[k].first << " tied " << tied << " lora "
                                          << lora << " " << compile_mode_name(mode);
        }
        EXPECT_GT(grads, 0);
      }
}

TEST(OptimizerInBwd, ALaterReaderDefersTheUpdate) {
  TrainingGraph tg = graph_for(tiny_config(false, false), false, 2, 8);
  Graph g = tg.graph;
  const auto& [gname, gv] = g.outputs()[1];
  ASSERT_EQ(gname.rfind("grad:", 0), 0u);
  const std::string param = gname.substr(5);
  Value p;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i].op == Op::Param && g.nodes()[i].name == param) p = Value{int(i), 0};
  ASSERT_TRUE(p.valid());
  EXPECT_TRUE(early_update_outputs(g)[1]);
  // Read the parameter once more, after everything else: its update must wait to the end.
  g.mark_output("late_read", g.add1(Op::Add, {p, p}));
  EXPECT_FALSE(early_update_outputs(g)[1]) << param << " is read after its gradient";
}

// The receiver of an early gradient may change it in place (ZeRO-2 sums it over the ranks
// there): a gradient whose buffer a later node reads, itself or through a view, waits for the
// end of the run.
TEST(OptimizerInBwd, AGradientReadLaterIsNotHandedOverEarly) {
  const TrainingGraph tg = graph_for(tiny_config(false, false), false, 2, 8);
  for (const bool through_view : {false, true}) {
    Graph g = tg.graph;
    const Value grad = g.outputs()[1].second;
    ASSERT_TRUE(early_update_outputs(g)[1]);
    Value read = grad;
    if (through_view) {
      Attrs flat;
      flat.shape = {g.type(grad).numel()};
      read = g.add1(Op::Reshape, {grad}, flat);
    }
    g.mark_output("late_read", g.add1(Op::Add, {read, read}));
    EXPECT_FALSE(early_update_outputs(g)[1]) << "view " << through_view;
  }
}

TEST(OptimizerInBwd, SameLossesAsTheOrdinaryStepAndTheGradientsMemoryIsSaved) {
  // A shape where the weights outweigh the activations (one short row, a small vocabulary),
  // as in fine-tuning a large model on short sequences: the ordinary step peaks with all the
  // gradients alive at the end of the backward.
  ModelConfig cfg = tiny_config(false, false);
  cfg.hidden_size = 64;
  cfg.intermediate_size = 160;
  cfg.head_dim = 16;
  cfg.vocab_size = 256;
  for (bool lora : {false, true})
    for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
      const std::string what =
          std::string(lora ? "lora" : "full") + " compile " + compile_mode_name(mode);
      const TrainRun a = train(cfg, lora, mode, false, 3, 1, 8);
      const TrainRun b = train(cfg, lora, mode, true, 3, 1, 8);
      ASSERT_EQ(a.losses.size(), b.losses.size());
      for (size_t i = 0; i < a.losses.size(); ++i)
        EXPECT_NEAR(b.losses[i], a.losses[i], 1e-6 * std::abs(a.losses[i]))
            << what << " step " << i;
      const int64_t saved = a.peak - b.peak;
      if (!lora) {
        // Full fine-tuning: the gradients are as large as the weights; about all of them are
        // saved (the largest few may still be alive at the peak).
        EXPECT_GT(double(saved), 0.5 * double(a.gradient_bytes)) << what;
      } else {
        EXPECT_GE(saved, 0) << what;
      }
      EXPECT_LE(saved, a.gradient_bytes + 4096) << what;
      EXPECT_NEAR(double(b.predicted) / double(b.peak), 1.0, 0.03)
          << what << ": predicted " << b.predicted << " measured " << b.peak;
      std::printf("%s: peak %lld -> %lld (gradients %lld), predicted %lld\n", what.c_str(),
                  (long long)a.peak, (long long)b.peak, (long long)a.gradient_bytes,
                  (long long)b.predicted);
    }
}
