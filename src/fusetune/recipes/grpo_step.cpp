#include "fusetune/recipes/grpo_step.h"

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "fusetune/data/datasets/prompts.h"
#include "fusetune/losses/grpo_normalization.h"
#include "fusetune/models/flops.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/recipes/grpo_rollout.h"
#include "fusetune/util/error.h"
#include "fusetune/util/mix64.h"

namespace fusetune {
namespace {

// Rows [r0, r1) of b.
Batch rows_of(const Batch& b, int64_t r0, int64_t r1) {
  Batch s;
  s.batch_size = r1 - r0;
  s.seq_len = b.seq_len;
  const auto from = size_t(r0 * b.seq_len), to = size_t(r1 * b.seq_len);
  s.tokens.assign(b.tokens.begin() + long(from), b.tokens.begin() + long(to));
  s.labels.assign(b.labels.begin() + long(from), b.labels.begin() + long(to));
  s.positions.assign(b.positions.begin() + long(from), b.positions.begin() + long(to));
  return s;
}

Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// One micro-batch's rollout and everything the update reads from it.
struct Prepared {
  std::vector<int64_t> items;  // the dataset indices of the prompts the rollout was made from
  std::vector<int64_t> key;    // those of the batch the loop hands this micro-batch now
  Batch batch;                 // prompt + completion rows (grpo_rollout.h: rollout_batch)
  std::vector<float> mask;     // 1 on completion labels
  Tensor old_logps, ref_logps, advantages;
  int64_t completion_tokens = 0;
  std::vector<StepMetric> rollout_metrics;
};

class GrpoStep final : public TrainingStep {
 public:
  explicit GrpoStep(GrpoStepOptions o)
      : o_(std::move(o)),
        policy_([this](int64_t rows, int64_t T, bool) { return train_graph(rows, T); },
                o_.policy.passes, arena_),
        score_(
            [this](int64_t rows, int64_t T, bool) {
              return build_token_log_probs_graph(*o_.policy.model, rows, T, o_.policy.dtype,
                                                 o_.policy.eval_llama.value_or(o_.policy.llama),
                                                 o_.loss.temperature);
            },
            o_.policy.passes, arena_),
        reference_(
            [this](int64_t rows, int64_t T, bool) {
              return build_token_log_probs_graph(*o_.policy.model, rows, T, o_.policy.dtype,
                                                 o_.ref_llama, o_.loss.temperature);
            },
            o_.policy.passes, arena_) {
    FT_CHECK(o_.prompts && o_.tokenizer && o_.rewards,
             "the GRPO step needs a prompt dataset (dataset._component_: gsm8k), a tokenizer "
             "and rewards");
    FT_CHECK(!o_.loss.needs_reference() || o_.ref_params, "GRPO with beta != 0 needs a reference");
    FT_CHECK(!o_.policy.param_source, "GRPO does not run on ZeRO-3 sharded parameters yet");
    FT_CHECK(o_.samples >= 2, "grpo_samples must be >= 2 (advantages compare a prompt's samples)");
    FT_CHECK(o_.num_iterations >= 1, "num_iterations must be >= 1");
  }

  void begin_step(const std::vector<Batch>& micro, int64_t step) override {
    const bool keep = step % o_.num_iterations != 0 && prepared_.size() == micro.size();
    if (!keep) {
      prepared_.clear();
      for (size_t k = 0; k < micro.size(); ++k) prepared_.push_back(prepare(micro[k], step));
    }
    // A kept rollout trains in place of the batch the loop hands its micro-batch now.
    for (size_t k = 0; k < micro.size(); ++k) prepared_[k].key = micro[k].items;
  }

  // dapo normalizes by the step's completion tokens, the others count micro-batches.
  int64_t loss_units(const Batch& b) const override {
    return o_.loss.type == GrpoLossType::DAPO ? find(b).completion_tokens : 1;
  }

  int64_t trained_tokens(const Batch& b) const override { return find(b).completion_tokens; }

  StepOutputs run(const Batch& b, double loss_scale, int64_t step, int64_t micro) override {
    const Prepared& p = find(b);
    const Batch& rb = p.batch;
    const int64_t rows = rb.batch_size, T = rb.seq_len;
    const auto units = int64_t(std::llround(loss_scale > 0 ? 1.0 / loss_scale : 1.0));
    GrpoStepCounts counts;
    counts.micro_batches = units;
    counts.step_tokens = units;
    counts.max_completion_length = o_.generation.max_new_tokens;
    TensorMap in = batch_inputs(rb);
    in["loss_scale"] = scalar_input(loss_scale, DType::F32);
    in["old_logps"] = p.old_logps;
    in["advantages"] = p.advantages;
    in["token_weights"] = f32_tensor(grpo_token_weights(o_.loss.type, p.mask, rows, T, counts));
    if (o_.loss.needs_reference()) in["ref_logps"] = p.ref_logps;
    if (o_.policy.add_inputs) o_.policy.add_inputs(in, step, micro);
    TensorMap out = policy_.run(rb, in, *o_.policy.params, &compile_s_, hook_);
    StepOutputs r;
    r.loss = element_as_double(out.at("loss"), 0);
    r.grads = gradients_of(out);
    r.metrics = p.rollout_metrics;
    double clipped = 0, kl = 0;
    for (int64_t i = 0; i < rows * T; ++i) {
      if (p.mask[size_t(i)] == 0) continue;
      clipped += o_.loss.clipped(element_as_double(out.at("report:ratio"), i),
                                 double(p.advantages.data<float>()[i]));
      if (o_.loss.needs_reference()) kl += element_as_double(out.at("report:kl"), i);
    }
    const double tokens = double(p.completion_tokens);
    r.metrics.push_back({"clip_fraction", clipped, tokens});
    if (o_.loss.needs_reference()) r.metrics.push_back({"kl", kl, tokens});
    return r;
  }

  bool stream_gradients(GradientHook hook) override {
    hook_ = std::move(hook);
    return true;
  }

  // The update's order over the micro-batch's rollout rows (ZeRO-2 reduces each gradient as
  // the backward hands it over, in the order rank 0 broadcasts).
  std::vector<std::string> gradient_order(const Batch& b) override {
    return policy_.gradient_order(find(b).batch, &compile_s_);
  }

  // The update's training step and the scoring forwards (half of what a frozen model's
  // forward and input gradients cost), over the rollout's rows; generation is not counted.
  double flops(const Batch& b) const override {
    const Batch& rb = find(b).batch;
    const ModelConfig& m = *o_.policy.model;
    const double passes = 1.0 + (o_.loss.needs_reference() ? 1.0 : 0.0);
    const double per_token =
        training_flops_per_token(m, rb.seq_len, o_.policy.trainable) +
        passes * 0.5 *
            training_flops_per_token(m, rb.seq_len, [](const std::string&) { return false; });
    return per_token * double(rb.batch_size * rb.seq_len);
  }

 private:
  Graph train_graph(int64_t rows, int64_t T) const {
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.trainable = o_.policy.trainable;
    g.llama = o_.policy.llama;
    g.dtype = o_.policy.dtype;
    g.loss = grpo_loss_builder(o_.loss);
    return build_training_graph(*o_.policy.model, g).graph;
  }

  const Prepared& find(const Batch& b) const {
    for (const Prepared& p : prepared_)
      if (p.key == b.items) return p;
    throw Error("GRPO: no rollout was prepared for this batch (begin_step was not called)");
  }

  // The label log-probs of rb's rows [rows * T] from `graphs`, forward_batch_size rows at a time.
  Tensor score(CompiledGraphs& graphs, const Batch& rb, const TensorMap& params) {
    const int64_t rows = rb.batch_size, T = rb.seq_len;
    const int64_t chunk = o_.forward_batch_size > 0 ? o_.forward_batch_size : rows;
    Tensor lp = Tensor::empty({rows * T}, DType::F32);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const Batch part = rows_of(rb, r0, std::min(rows, r0 + chunk));
      const Tensor t = graphs.run(part, batch_inputs(part), params, &compile_s_).at("token_logps");
      for (int64_t i = 0; i < part.batch_size * T; ++i)
        lp.data<float>()[r0 * T + i] = float(element_as_double(t, i));
    }
    return lp;
  }

  Generator& generator() {
    if (!generator_)
      generator_ = std::make_unique<Generator>(*o_.policy.model, *o_.policy.params,
                                               o_.policy.eval_llama.value_or(o_.policy.llama),
                                               o_.policy.passes.mode, o_.policy.dtype, arena_);
    return *generator_;
  }

  Prepared prepare(const Batch& prompts, int64_t step);
  std::vector<ScoredCompletion> completions(const GrpoRollout& r, const Prepared& p) const;

  GrpoStepOptions o_;
  // The update's, the scoring forwards' and the rollout's graphs run one after the other: one
  // arena serves them all.
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  CompiledGraphs policy_, score_, reference_;
  std::unique_ptr<Generator> generator_;
  std::vector<Prepared> prepared_;  // the current rollout, per micro-batch
  GradientHook hook_;
};

std::vector<ScoredCompletion> GrpoStep::completions(const GrpoRollout& r, const Prepared& p) const {
  std::vector<ScoredCompletion> out;
  for (size_t i = 0; i < r.completions.size(); ++i) {
    const datasets::PromptRow& row = o_.prompts->row(p.items[i / size_t(o_.samples)]);
    std::vector<int32_t> text = r.completions[i];
    if (r.stopped[i] && !text.empty()) text.pop_back();  // the stop token is not text
    ScoredCompletion c;
    c.prompt = row.text;
    c.completion = o_.tokenizer->decode(text, /*skip_special_tokens=*/true);
    c.tokens = int64_t(r.completions[i].size());
    c.stopped = r.stopped[i];
    c.columns = row.columns;
    out.push_back(std::move(c));
  }
  return out;
}

Prepared GrpoStep::prepare(const Batch& prompts, int64_t step) {
  Prepared p;
  p.items = prompts.items;
  std::vector<std::vector<int32_t>> ids;
  for (int64_t i : p.items) ids.push_back(o_.prompts->get(i).tokens);
  // Each prompt's completions are seeded by the run's seed, the step and the prompt's dataset
  // index: the same whichever micro-batch or rank holds it, or how many ranks there are.
  std::vector<uint64_t> seeds;
  for (int64_t i : p.items)
    seeds.push_back(mix64(mix64(o_.generation.seed + kMix64Gamma) ^ uint64_t(step)) +
                    uint64_t(i) * kMix64Gamma);
  const auto t0 = std::chrono::steady_clock::now();
  const GrpoRollout r = generate_rollout(generator(), ids, o_.samples, o_.generation, seeds);
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.batch = rollout_batch(r, int32_t(o_.tokenizer->pad_id()), o_.pad_to);
  p.mask = completion_mask(p.batch);
  p.old_logps = score(score_, p.batch, *o_.policy.params);
  if (o_.loss.needs_reference()) p.ref_logps = score(reference_, p.batch, *o_.ref_params);
  const RewardSet::Scores s = o_.rewards->score(completions(r, p));
  const std::vector<double> adv = group_advantages(s.total, o_.samples, o_.scale_rewards);
  const int64_t rows = p.batch.batch_size, T = p.batch.seq_len;
  p.advantages = Tensor::empty({rows * T}, DType::F32);
  for (int64_t i = 0; i < rows * T; ++i) p.advantages.data<float>()[i] = float(adv[size_t(i / T)]);
  // Metrics of the rollout, as sums and counts.
  double reward = 0, group_std = 0, stopped = 0;
  for (double v : s.total) reward += v;
  for (int64_t g0 = 0; g0 < rows; g0 += o_.samples) {
    double mean = 0, ss = 0;
    for (int64_t i = g0; i < g0 + o_.samples; ++i) mean += s.total[size_t(i)];
    mean /= double(o_.samples);
    for (int64_t i = g0; i < g0 + o_.samples; ++i)
      ss += (s.total[size_t(i)] - mean) * (s.total[size_t(i)] - mean);
    group_std += std::sqrt(ss / double(o_.samples - 1));
  }
  for (size_t i = 0; i < r.completions.size(); ++i) {
    p.completion_tokens += int64_t(r.completions[i].size());
    stopped += r.stopped[i] ? 1.0 : 0.0;
  }
  const double n = double(rows);
  p.rollout_metrics = {{"reward", reward, n}, {"reward_std", group_std, n / double(o_.samples)}};
  for (const auto& [kind, v] : s.by_kind) {
    double sum = 0;
    for (double x : v) sum += x;
    p.rollout_metrics.push_back({"rewards/" + kind, sum, n});
  }
  p.rollout_metrics.push_back({"completion_length", double(p.completion_tokens), n});
  p.rollout_metrics.push_back({"stopped", stopped, n});
  p.rollout_metrics.push_back({"gen_tokens_per_s", double(p.completion_tokens), gen_s});
  return p;
}

}  // namespace

std::unique_ptr<TrainingStep> make_grpo_step(GrpoStepOptions opts) {
  return std::make_unique<GrpoStep>(std::move(opts));
}

}  // namespace fusetune
