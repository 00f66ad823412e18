// PPO's step (recipes/ppo_step.h) broken into its parts, per shape and compile mode, on seeded
// random weights and prompts:
//   rollout   the responses: one per prompt, sampled (temperature 1) with the KV cache on the
//             training weights, each prompt from its own seed (recipes/grpo_rollout.h);
//             generated tokens/s end to end ("gen"), beside bench_decode's batch-1 and batched
//             decode figures for the same shape and lengths ("dec1", "decB": greedy
//             Generator::generate over 1 row and over the prompts' rows, decode steps only) and
//             the batched greedy generate end to end ("genB": what the rollout adds to it is
//             sampling with per-row seeds; like PpoStep it records no log-probs, its old
//             log-probs coming from the scoring forward), measured here, in the same program,
//             the rollout and the batched greedy generate in turn (the same load on both);
//   scoring   the forwards over the rollout's rows: the policy's (and the reference's: the same
//             graph on a copy) log-probs, the value model's values, the reward model's scores;
//   train     one PPO update over the rows: the policy's graph (forward, clipped policy loss,
//             backward; the fused head under compile: true) and the value model's (forward,
//             clipped value loss, backward), then AdamW over both (PpoStep::micro_step);
//   peak      the process's peak over all of it, against `fusetune plan`'s PPO estimate
//             (recipes/ppo_plan.h) for the same shapes and mode.
//   bench_ppo --shapes tiny,L3-micro [--prompts 4] [--prompt-tokens 16] [--new-tokens 32]
//   [--steps 3] [--modes false,model,true] [--cpu-time 1] [--keep-logits 0]
// Prints a table ("vs model": the train part's speed against compile: model on the same
// shape), the train part's own parts (the policy's graph, the value model's, AdamW), then one
// JSON line. `--cpu-time 1` times with the process's CPU seconds instead of wall seconds (with
// `--threads 1`, the time it ran: steadier on a machine that other work shares);
// `--keep-logits 0` makes the fused head's backward recompute the logits (PassOptions::
// keep_head_logits: the before of that change); FUSETUNE_PROFILE=1 prints the op profile of each
// mode's timed train steps. Nothing here asserts a timing.
#include <iostream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "bench_args.h"
#include "fusetune/compile/plan_report.h"
#include "fusetune/generation/generator.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/models/ppo_graph.h"
#include "fusetune/recipes/grpo_rollout.h"
#include "fusetune/recipes/ppo_plan.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/mix64.h"
#include "fusetune/util/strings.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

struct PpoBenchOptions {  // main()'s BenchArgs hold the defaults
  int64_t prompts = 0, prompt_tokens = 0, new_tokens = 0;
  int steps = 0;
  bool keep_head_logits = true;  // --keep-logits 0: the fused head's backward recomputes them
};

struct PpoBenchResult {
  std::string shape, mode;
  int64_t rows = 0, seq = 0, generated = 0;
  double gen_tps = 0, decode1_tps = 0, decodeB_tps = 0, generateB_tps = 0;
  double policy_s = 0, value_s = 0, reward_s = 0, train_s = 0;
  double train_policy_s = 0, train_value_s = 0, train_adamw_s = 0;  // the train part's parts
  int64_t peak_bytes = 0, planned_bytes = 0;
};

bool g_ppo_cpu_time = false;  // --cpu-time 1

// Wall seconds, or with --cpu-time the process's CPU seconds.
double ppo_now() { return bench_clock_seconds(g_ppo_cpu_time); }

double ppo_seconds_since(double t0) { return ppo_now() - t0; }

// One greedy generate over the first `rows` prompts: bench_decode's figures, decode tokens/s
// (decode steps only, as bench_decode prints) and end to end (prefill included, as a rollout
// is timed).
std::pair<double, double> ppo_greedy_tps(Generator& gen,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         int64_t rows, const PpoBenchOptions& o) {
  const std::vector<std::vector<int32_t>> part(prompts.begin(), prompts.begin() + rows);
  GenerationOptions g;
  g.max_new_tokens = o.new_tokens;
  g.sampling.temperature = 0;
  const GenerationStats st = gen.generate(part, g).stats;
  return {double(st.decode_steps) / st.decode_seconds * double(rows),
          double(st.generated_tokens) / (st.prefill_seconds + st.decode_seconds)};
}

// The rollout and the batched greedy generate over the same prompts, timed in turn (after a
// warm-up of each that compiles the decode graphs), so that both see the same load: medians
// of steps - 1 runs each; then the 1-row decode.
GrpoRollout ppo_timed_rollout(const ModelConfig& c, const TensorMap& params, CompileMode mode,
                              const PpoBenchOptions& o, PpoBenchResult& r) {
  const auto prompts = random_prompts(o.prompts, o.prompt_tokens, c.vocab_size);
  Generator gen(c, params, {}, mode, DType::F32);
  GenerationOptions g;
  g.max_new_tokens = o.new_tokens;
  g.sampling = {1.0, 0, 1.0};
  g.seed = 11;
  std::vector<uint64_t> seeds;
  for (int64_t i = 0; i < o.prompts; ++i) seeds.push_back(mix64(uint64_t(i) + 1));
  GrpoRollout roll = generate_rollout(gen, prompts, 1, g, seeds);
  ppo_greedy_tps(gen, prompts, o.prompts, o);
  std::vector<double> tps, decode, whole;
  for (int s = 1; s < o.steps; ++s) {
    const double t0 = ppo_now();
    roll = generate_rollout(gen, prompts, 1, g, seeds);
    const double secs = ppo_seconds_since(t0);
    r.generated = 0;
    for (const auto& comp : roll.completions) r.generated += int64_t(comp.size());
    tps.push_back(double(r.generated) / secs);
    const auto [d, w] = ppo_greedy_tps(gen, prompts, o.prompts, o);
    decode.push_back(d);
    whole.push_back(w);
  }
  r.gen_tps = median(tps);
  r.decodeB_tps = median(decode);
  r.generateB_tps = median(whole);
  ppo_greedy_tps(gen, prompts, 1, o);
  std::vector<double> one;
  for (int s = 1; s < o.steps; ++s) one.push_back(ppo_greedy_tps(gen, prompts, 1, o).first);
  r.decode1_tps = median(one);
  return roll;
}

// Seconds of a run of `graphs` on b: the median of steps - 1 runs after one that compiles and
// allocates.
double ppo_timed_forward(CompiledGraphs& graphs, const Batch& b, const TensorMap& in,
                         const TensorMap& params, const PpoBenchOptions& o,
                         TensorMap* out = nullptr) {
  double compile_s = 0;
  TensorMap first = graphs.run(b, in, params, &compile_s);
  std::vector<double> secs;
  for (int s = 1; s < o.steps; ++s) {
    const double t0 = ppo_now();
    graphs.run(b, in, params, &compile_s);
    secs.push_back(ppo_seconds_since(t0));
  }
  if (out) *out = std::move(first);
  return median(secs);
}

struct PpoBenchModels {
  ModelConfig policy, value;
  TensorMap policy_params, ref_params, value_params, reward_params;
};

PpoBenchModels ppo_bench_models(const ModelConfig& c) {
  PpoBenchModels m;
  m.policy = c;
  m.value = c;
  m.value.num_labels = 1;
  m.policy_params =
      init_parameters(graph_parameters(build_logits_graph(c, 1, 4, DType::F32)), 1234, DType::F32);
  for (const auto& [name, t] : m.policy_params) m.ref_params[name] = t.clone();
  const auto value_names = graph_parameters(build_token_values_graph(m.value, 1, 4, DType::F32));
  m.value_params = init_parameters(value_names, 99, DType::F32);
  m.reward_params = init_parameters(value_names, 98, DType::F32);
  return m;
}

// The train part: one update over every row (policy graph, value graph, AdamW), median of
// steps - 1 runs; returns the policy graph's options for the plan.
TrainingGraphOptions ppo_bench_train(PpoBenchModels& m, const Batch& b, const TensorMap& bin,
                                     const Tensor& logps, const Tensor& values,
                                     const PassOptions& po, const PpoBenchOptions& o,
                                     PpoBenchResult& r) {
  const PpoLoss loss{0.2, 0.2, 0.1};
  TrainingGraphOptions go;
  go.batch_size = b.batch_size;
  go.seq_len = b.seq_len;
  go.loss = grpo_loss_builder(GrpoLoss{GrpoLossType::GRPO, 0.2, 0.2, 0.0, 1.0});
  TrainingGraphOptions vo = go;
  vo.loss = ppo_value_loss_builder(loss);
  auto arena = std::make_shared<SharedArena>();
  CompiledGraphs policy(
      [&](int64_t, int64_t, bool) { return build_training_graph(m.policy, go).graph; }, po, arena);
  CompiledGraphs value(
      [&](int64_t, int64_t, bool) { return build_training_graph(m.value, vo).graph; }, po, arena);
  const int64_t N = b.batch_size * b.seq_len;
  const std::vector<float> mask = completion_mask(b);
  double valid = 0;
  for (float x : mask) valid += x;
  std::vector<float> adv(static_cast<size_t>(N)), w(adv), ret(adv);
  for (int64_t i = 0; i < N; ++i) {
    adv[size_t(i)] = (i / b.seq_len) % 2 ? 0.7f : -0.7f;
    w[size_t(i)] = float(mask[size_t(i)] / valid);
    ret[size_t(i)] = 0.5f;
  }
  TensorMap pin = bin, vin = bin;
  pin["loss_scale"] = vin["loss_scale"] = scalar_input(1.0, DType::F32);
  pin["old_logps"] = logps;
  pin["advantages"] = f32_tensor(adv);
  pin["token_weights"] = f32_tensor(w);
  vin["old_values"] = values;
  vin["returns"] = f32_tensor(ret);
  vin["value_weights"] = f32_tensor(w);
  AdamW opt(AdamWOptions{});
  std::vector<double> step_s, policy_s, value_s, adamw_s;
  double compile_s = 0;
  for (int s = 0; s < o.steps; ++s) {
    if (s == 1) op_profile::reset();  // the first step compiles and allocates
    const double t0 = ppo_now();
    std::vector<std::pair<std::string, Tensor>> grads =
        gradients_of(policy.run(b, pin, m.policy_params, &compile_s));
    const double t1 = ppo_now();
    std::vector<ParamRef> refs;
    for (auto& [name, g] : grads) refs.push_back({name, &m.policy_params.at(name), &g});
    std::vector<std::pair<std::string, Tensor>> vgrads =
        gradients_of(value.run(b, vin, m.value_params, &compile_s));
    const double t2 = ppo_now();
    for (auto& [name, g] : vgrads) refs.push_back({"value." + name, &m.value_params.at(name), &g});
    opt.step(refs, 1e-5);
    const double t3 = ppo_now();
    step_s.push_back(t3 - t0);
    grads.clear();  // freed here, as the recipe frees them after its update
    vgrads.clear();
    policy_s.push_back(t1 - t0);
    value_s.push_back(t2 - t1);
    adamw_s.push_back(t3 - t2);
  }
  if (op_profile::enabled())  // FUSETUNE_PROFILE=1: where the timed train steps' time went
    std::printf("%s %s, train steps 2-%d:\n%s\n", r.shape.c_str(), r.mode.c_str(), o.steps,
                op_profile::report().c_str());
  for (auto* v : {&step_s, &policy_s, &value_s, &adamw_s})
    v->erase(v->begin());  // the first step compiles and allocates
  r.train_s = median(step_s);
  r.train_policy_s = median(policy_s);
  r.train_value_s = median(value_s);
  r.train_adamw_s = median(adamw_s);
  return go;
}

PpoBenchResult ppo_bench_run(const BenchShape& shape, CompileMode mode, const PpoBenchOptions& o) {
  PpoBenchResult r;
  r.shape = shape.name;
  r.mode = compile_mode_name(mode);
  const int64_t base = memory::current_bytes();
  PassOptions po;
  po.mode = mode;
  po.keep_head_logits = o.keep_head_logits;
  memory::reset_peak();
  PpoBenchModels m = ppo_bench_models(shape.config);
  const Batch b = rollout_batch(ppo_timed_rollout(m.policy, m.policy_params, mode, o, r), 0, 8);
  r.rows = b.batch_size;
  r.seq = b.seq_len;
  const TensorMap bin = batch_inputs(b);
  auto arena = std::make_shared<SharedArena>();
  CompiledGraphs score(
      [&](int64_t rows, int64_t T, bool) {
        return build_token_log_probs_graph(m.policy, rows, T, DType::F32, {}, 1.0);
      },
      po, arena);
  CompiledGraphs values(
      [&](int64_t rows, int64_t T, bool) {
        return build_token_values_graph(m.value, rows, T, DType::F32);
      },
      po, arena);
  CompiledGraphs scores(
      [&](int64_t rows, int64_t T, bool) {
        return build_sequence_scores_graph(m.value, rows, T, DType::F32);
      },
      po, arena);
  TensorMap lp, v;
  r.policy_s = ppo_timed_forward(score, b, bin, m.ref_params, o, &lp);
  r.value_s = ppo_timed_forward(values, b, bin, m.value_params, o, &v);
  TensorMap rin = bin;
  Tensor last = Tensor::zeros({b.batch_size * b.seq_len}, DType::F32);
  // Each row's last position (the time does not depend on which position is read).
  for (int64_t i = 0; i < b.batch_size; ++i) last.data<float>()[(i + 1) * b.seq_len - 1] = 1.0f;
  rin["last_token_mask"] = last;
  r.reward_s = ppo_timed_forward(scores, b, rin, m.reward_params, o);
  const TrainingGraphOptions go =
      ppo_bench_train(m, b, bin, lp.at("token_logps"), v.at("values"), po, o, r);
  r.peak_bytes = memory::peak_bytes() - base;
  // The plan of the same step (fusetune plan's PPO estimate, ppo_plan.h).
  PpoPlan g;
  g.value = g.reward = m.value;
  g.prompts = g.forward_rows = o.prompts;
  g.prompt_len = o.prompt_tokens;
  g.seq_len = b.seq_len;
  g.epsilon = 0.2;
  ModePlan p = plan_mode(build_training_graph(m.policy, go).graph, po, OptimizerStateSize(2.0));
  add_ppo_models(g, m.policy, go, po, OptimizerStateSize(2.0), false, p);
  r.planned_bytes = p.memory.total();
  return r;
}

void ppo_print_table(const std::vector<PpoBenchResult>& results) {
  std::printf("%-9s %-7s %8s %9s %9s %9s %9s %8s %8s %8s %8s %8s %9s %9s\n", "shape", "compile",
              "rows x T", "gen t/s", "dec1 t/s", "decB t/s", "genB t/s", "logp s", "value s",
              "reward s", "train s", "vs model", "peak MiB", "plan MiB");
  for (const PpoBenchResult& r : results) {
    std::string ratio = "-";
    for (const PpoBenchResult& m : results)
      if (m.shape == r.shape && m.mode == "model") {
        char buf[32];
        std::snprintf(buf, sizeof buf, "x%.2f", m.train_s / r.train_s);
        ratio = buf;
      }
    const std::string rows = std::to_string(r.rows) + " x " + std::to_string(r.seq);
    std::printf("%-9s %-7s %8s %9.1f %9.1f %9.1f %9.1f %8.4f %8.4f %8.4f %8.4f %8s %9.1f %9.1f\n",
                r.shape.c_str(), r.mode.c_str(), rows.c_str(), r.gen_tps, r.decode1_tps,
                r.decodeB_tps, r.generateB_tps, r.policy_s, r.value_s, r.reward_s, r.train_s,
                ratio.c_str(), double(r.peak_bytes) / double(1 << 20),
                double(r.planned_bytes) / double(1 << 20));
  }
  std::printf("\n%-9s %-7s %9s %9s %9s %9s\n", "shape", "compile", "train s", "policy s", "value s",
              "adamw s");
  for (const PpoBenchResult& r : results)
    std::printf("%-9s %-7s %9.4f %9.4f %9.4f %9.4f\n", r.shape.c_str(), r.mode.c_str(), r.train_s,
                r.train_policy_s, r.train_value_s, r.train_adamw_s);
}

}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv,
                       {{"shapes", "tiny,L3-micro"},
                        {"modes", "false,model,true"},
                        {"prompts", "4"},
                        {"prompt-tokens", "16"},
                        {"new-tokens", "32"},
                        {"steps", "3"},
                        {"cpu-time", "0"},
                        {"keep-logits", "1"}});
  PpoBenchOptions o;
  o.prompts = args.i64("prompts");
  o.prompt_tokens = args.i64("prompt-tokens");
  o.new_tokens = args.i64("new-tokens");
  o.steps = int(args.i64("steps"));
  FT_CHECK(args.str("cpu-time") == "0" || args.str("cpu-time") == "1",
           "--cpu-time must be 0 (wall seconds) or 1 (the process's CPU seconds)");
  g_ppo_cpu_time = args.str("cpu-time") == "1";
  o.keep_head_logits = args.i64("keep-logits") != 0;
  FT_CHECK(o.steps >= 2, "--steps must be >= 2 (the first step is not timed)");
  FT_CHECK(o.prompts >= 1 && o.new_tokens >= 2, "--prompts >= 1 and --new-tokens >= 2");
  std::printf("%lld prompts, %lld prompt + up to %lld new tokens; %d threads; %s seconds\n\n",
              (long long)o.prompts, (long long)o.prompt_tokens, (long long)o.new_tokens,
              omp_get_max_threads(), g_ppo_cpu_time ? "CPU" : "wall");
  std::vector<PpoBenchResult> results;
  for (const std::string& s : args.list("shapes"))
    for (const std::string& c : args.list("modes")) {
      results.push_back(ppo_bench_run(find_shape(s), parse_compile_mode(c), o));
      std::fflush(stdout);
    }
  ppo_print_table(results);
  nlohmann::json j;
  for (const PpoBenchResult& r : results)
    j["runs"].push_back({{"shape", r.shape},
                         {"compile", r.mode},
                         {"rows", r.rows},
                         {"seq", r.seq},
                         {"generated_tokens", r.generated},
                         {"gen_tokens_per_s", r.gen_tps},
                         {"decode_batch1_tokens_per_s", r.decode1_tps},
                         {"decode_batched_tokens_per_s", r.decodeB_tps},
                         {"generate_batched_tokens_per_s", r.generateB_tps},
                         {"policy_logps_s", r.policy_s},
                         {"value_forward_s", r.value_s},
                         {"reward_forward_s", r.reward_s},
                         {"train_s", r.train_s},
                         {"train_policy_s", r.train_policy_s},
                         {"train_value_s", r.train_value_s},
                         {"train_adamw_s", r.train_adamw_s},
                         {"peak_bytes", r.peak_bytes},
                         {"planned_bytes", r.planned_bytes}});
  std::printf("%s\n", j.dump().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_ppo: error: %s\n", e.what());
  return 1;
}
