#include "fusetune/recipes/ppo_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "fusetune/losses/ppo_advantages.h"
#include "fusetune/models/flops.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/models/ppo_graph.h"
#include "fusetune/recipes/grad_sync.h"
#include "fusetune/recipes/grpo_rollout.h"
#include "fusetune/util/error.h"
#include "fusetune/util/mix64.h"

namespace fusetune {
namespace {

// Rows `rows` of b, in that order.
Batch ppo_select_rows(const Batch& b, const std::vector<int64_t>& rows) {
  Batch s;
  s.batch_size = int64_t(rows.size());
  s.seq_len = b.seq_len;
  const auto T = size_t(b.seq_len);
  for (int64_t r : rows) {
    const auto from = long(size_t(r) * T), to = long(size_t(r + 1) * T);
    s.tokens.insert(s.tokens.end(), b.tokens.begin() + from, b.tokens.begin() + to);
    s.labels.insert(s.labels.end(), b.labels.begin() + from, b.labels.begin() + to);
    s.positions.insert(s.positions.end(), b.positions.begin() + from, b.positions.begin() + to);
    s.items.push_back(r);
  }
  return s;
}

Tensor ppo_f32(const std::vector<double>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = float(v[i]);
  return t;
}

// A rollout and everything the updates read from it; per-token arrays are [rows * W] by
// response index (ppo_advantages.h), the graphs' inputs [rows * T] by position.
struct PpoTrajectory {
  std::vector<int64_t> key;  // the loop batch's dataset indices
  Batch batch;               // prompt + response rows (rollout_batch)
  int64_t W = 0;
  std::vector<int64_t> prompt_len, response_len, score_index;
  std::vector<bool> stopped;
  std::vector<double> logps, ref_logps, values, mask, value_mask, advantages, returns, scores;
  std::vector<StepMetric> metrics;
  int64_t response_tokens = 0;
  // Position of response index k in row i.
  int64_t pos(int64_t i, int64_t k) const {
    return i * batch.seq_len + prompt_len[size_t(i)] - 1 + k;
  }
};

// Update statistics over the mini-batches (torchtune's PPOStats, each micro-batch's divided by
// the accumulation steps and summed per update).
struct PpoStats {
  double loss = 0, policy_loss = 0, value_loss = 0, ratios = 0, clipfrac = 0, approx_kl = 0;
  int64_t updates = 0;
};

class PpoStep final : public TrainingStep {
 public:
  explicit PpoStep(PpoStepOptions o)
      : o_(std::move(o)),
        policy_([this](int64_t rows, int64_t T, bool) { return policy_graph(rows, T); },
                o_.policy.passes, arena_),
        value_([this](int64_t rows, int64_t T, bool) { return value_graph(rows, T); },
               o_.policy.passes, arena_),
        score_(
            [this](int64_t rows, int64_t T, bool) {
              return build_token_log_probs_graph(*o_.policy.model, rows, T, o_.policy.dtype, {},
                                                 temperature());
            },
            o_.policy.passes, arena_),
        values_fwd_(
            [this](int64_t rows, int64_t T, bool) {
              return build_token_values_graph(*o_.value_model, rows, T, o_.policy.dtype);
            },
            o_.policy.passes, arena_),
        reward_fwd_(
            [this](int64_t rows, int64_t T, bool) {
              return build_sequence_scores_graph(*o_.reward_model, rows, T, o_.policy.dtype);
            },
            o_.policy.passes, arena_) {
    FT_CHECK(o_.ref_params && o_.value_model && o_.reward_model && o_.reward_params,
             "the PPO step needs a reference, a value model and a reward model");
    FT_CHECK(!o_.policy.param_source, "PPO does not run on ZeRO-3 sharded parameters");
    FT_CHECK(o_.ppo_epochs >= 1 && o_.ppo_batch_size >= 1 && o_.gradient_accumulation_steps >= 1,
             "ppo_epochs, ppo_batch_size and gradient_accumulation_steps must be >= 1");
    FT_CHECK(o_.ppo_batch_size % o_.gradient_accumulation_steps == 0,
             "ppo_batch_size (" + std::to_string(o_.ppo_batch_size) +
                 ") must be exactly divisible by gradient_accumulation_steps (" +
                 std::to_string(o_.gradient_accumulation_steps) + ")");
  }

  void begin_step(const std::vector<Batch>& micro, int64_t step) override {
    FT_CHECK(micro.size() == 1, "the PPO step takes one batch of prompts per step");
    trajectory_ = prepare(micro[0], step);
  }

  int64_t loss_units(const Batch&) const override { return 1; }
  int64_t trained_tokens(const Batch& b) const override { return find(b).response_tokens; }
  bool updates_itself() const override { return true; }

  StepOutputs run(const Batch& b, double, int64_t step, int64_t) override {
    const PpoTrajectory& t = find(b);
    const int64_t rows = t.batch.batch_size;
    FT_CHECK(rows % o_.ppo_batch_size == 0, "batch_size (" + std::to_string(rows) +
                                                ") must be exactly divisible by ppo_batch_size (" +
                                                std::to_string(o_.ppo_batch_size) + ")");
    PpoStats st;
    for (int64_t epoch = 0; epoch < o_.ppo_epochs; ++epoch) {
      const std::vector<int64_t> order = shuffled_rows(rows, step, epoch);
      for (int64_t m0 = 0; m0 < rows; m0 += o_.ppo_batch_size) {
        std::vector<int64_t> mini(order.begin() + m0, order.begin() + m0 + o_.ppo_batch_size);
        update(t, mini, st);
      }
    }
    StepOutputs r;
    // Each rank's statistics are its share of the global ones (global counts): the loop sums
    // sums and counts over the ranks, so each rank counts 1 / world of the updates.
    const double n = double(st.updates) / world();
    r.loss = st.loss / double(st.updates);
    r.metrics = t.metrics;
    r.metrics.push_back({"policy_loss", st.policy_loss, n});
    r.metrics.push_back({"value_loss", st.value_loss, n});
    r.metrics.push_back({"ratios", st.ratios, n});
    r.metrics.push_back({"clipfrac", st.clipfrac, n});
    r.metrics.push_back({"approx_policy_kl", st.approx_kl, n});
    return r;
  }

  bool stream_gradients(GradientHook hook) override {
    if (!o_.optimizer_in_bwd) return false;
    hook_ = std::move(hook);
    return true;
  }

  // Per epoch, the policy's and the value model's training steps over the rollout's rows;
  // before them the rollout's forwards (half what a frozen model's forward and input
  // gradients cost: policy, reference, values, reward); generation is not counted.
  double flops(const Batch& b) const override {
    const Batch& rb = find(b).batch;
    const int64_t T = rb.seq_len;
    auto frozen = [T](const ModelConfig& m) {
      return 0.5 * training_flops_per_token(m, T, [](const std::string&) { return false; });
    };
    const double per_token =
        double(o_.ppo_epochs) *
            (training_flops_per_token(*o_.policy.model, T, o_.policy.trainable) +
             training_flops_per_token(*o_.value_model, T, o_.policy.trainable)) +
        2 * frozen(*o_.policy.model) + frozen(*o_.value_model) + frozen(*o_.reward_model);
    return per_token * double(rb.batch_size * T);
  }

 private:
  double world() const { return o_.comm ? double(o_.comm->size()) : 1.0; }

  // Sums `v` over the ranks in place (nothing on one process).
  void sum_over_ranks(std::vector<double>& v, const std::string& what) const {
    if (o_.comm && o_.comm->size() > 1) o_.comm->allreduce_sum(v.data(), int64_t(v.size()), what);
  }

  double temperature() const {
    const double t = o_.generation.sampling.temperature;
    return t > 0 ? t : 1.0;  // greedy rollouts are scored at temperature 1
  }

  Graph policy_graph(int64_t rows, int64_t T) const {
    GrpoLoss l;
    l.epsilon = l.epsilon_high = o_.loss.epsilon;
    l.temperature = temperature();
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.trainable = o_.policy.trainable;
    g.dtype = o_.policy.dtype;
    g.loss = grpo_loss_builder(l);
    return build_training_graph(*o_.policy.model, g).graph;
  }

  Graph value_graph(int64_t rows, int64_t T) const {
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.dtype = o_.policy.dtype;
    g.loss = ppo_value_loss_builder(o_.loss);
    return build_training_graph(*o_.value_model, g).graph;
  }

  // The policy's parameters and the value model's (without the prefix), sharing storage.
  std::pair<TensorMap, TensorMap> split_params() const {
    std::pair<TensorMap, TensorMap> out;
    const std::string& pre = o_.value_prefix;
    for (const auto& [name, t] : *o_.policy.params) {
      if (name.compare(0, pre.size(), pre) == 0)
        out.second[name.substr(pre.size())] = t;
      else
        out.first[name] = t;
    }
    return out;
  }

  const PpoTrajectory& find(const Batch& b) const {
    FT_CHECK(trajectory_ && trajectory_->key == b.items,
             "PPO: no trajectory was prepared for this batch (begin_step was not called)");
    return *trajectory_;
  }

  std::vector<int64_t> shuffled_rows(int64_t rows, int64_t step, int64_t epoch) const {
    std::vector<int64_t> order(static_cast<size_t>(rows));
    std::iota(order.begin(), order.end(), 0);
    uint64_t s = mix64(mix64(o_.generation.seed ^ 0x5050u) + uint64_t(step) * kMix64Gamma) +
                 uint64_t(epoch + 1) * kMix64Gamma;
    for (int64_t i = rows - 1; i > 0; --i) {  // Fisher-Yates
      s = mix64(s + kMix64Gamma);
      std::swap(order[size_t(i)], order[size_t(s % uint64_t(i + 1))]);
    }
    return order;
  }

  Generator& generator() {
    if (!generator_) {
      generator_params_ = split_params().first;
      generator_ = std::make_unique<Generator>(*o_.policy.model, generator_params_, LlamaOptions{},
                                               o_.policy.passes.mode, o_.policy.dtype, arena_);
    }
    return *generator_;
  }

  // `graphs`' output `name` [rows * T] over rb, forward_batch_size rows at a time.
  std::vector<double> forward(CompiledGraphs& graphs, const std::string& name, const Batch& rb,
                              const TensorMap& params,
                              const std::function<void(TensorMap&, const Batch&)>& extra = {}) {
    const int64_t rows = rb.batch_size;
    const int64_t chunk = o_.forward_batch_size > 0 ? o_.forward_batch_size : rows;
    std::vector<double> out;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      std::vector<int64_t> idx;
      for (int64_t r = r0; r < std::min(rows, r0 + chunk); ++r) idx.push_back(r);
      const Batch part = ppo_select_rows(rb, idx);
      TensorMap in = batch_inputs(part);
      if (extra) extra(in, part);
      const Tensor t = graphs.run(part, in, params, &compile_s_).at(name);
      for (int64_t i = 0; i < t.numel(); ++i) out.push_back(element_as_double(t, i));
    }
    return out;
  }

  std::unique_ptr<PpoTrajectory> prepare(const Batch& prompts, int64_t step);
  void generate(PpoTrajectory& t, const Batch& prompts, int64_t step);
  void score(PpoTrajectory& t);
  void rollout_metrics(PpoTrajectory& t, const std::vector<double>& kl,
                       const std::vector<double>& kl_reward, double gen_s);
  void update(const PpoTrajectory& t, const std::vector<int64_t>& mini, PpoStats& st);
  void micro_step(const PpoTrajectory& t, const std::vector<int64_t>& rows, PpoStats& st,
                  TensorMap& grads, bool first, const double* counts);

  PpoStepOptions o_;
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  CompiledGraphs policy_, value_, score_, values_fwd_, reward_fwd_;
  TensorMap generator_params_;
  std::unique_ptr<Generator> generator_;
  std::unique_ptr<PpoTrajectory> trajectory_;
  GradientHook hook_;
};

// Step 1: the responses, forward_batch_size prompts at a time, each prompt seeded by the run's
// seed, the step and its dataset index (the same response whatever the chunking).
void PpoStep::generate(PpoTrajectory& t, const Batch& prompts, int64_t step) {
  FT_CHECK(int64_t(prompts.lengths.size()) == prompts.batch_size,
           "PPO's prompts need each row's length (collate sets Batch::lengths)");
  std::vector<std::vector<int32_t>> ids;
  std::vector<uint64_t> seeds;
  for (int64_t i = 0; i < prompts.batch_size; ++i) {
    const auto from = prompts.tokens.begin() + long(i * prompts.seq_len);
    FT_CHECK(prompts.lengths[size_t(i)] >= 1, "PPO: a prompt has no tokens");
    ids.emplace_back(from, from + prompts.lengths[size_t(i)]);
    seeds.push_back(mix64(mix64(o_.generation.seed + kMix64Gamma) ^ uint64_t(step)) +
                    uint64_t(prompts.items.at(size_t(i))) * kMix64Gamma);
  }
  const int64_t rows = int64_t(ids.size());
  const int64_t chunk = o_.forward_batch_size > 0 ? o_.forward_batch_size : rows;
  GrpoRollout all;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const auto r1 = size_t(std::min(rows, r0 + chunk));
    const std::vector<std::vector<int32_t>> part(ids.begin() + r0, ids.begin() + long(r1));
    const std::vector<uint64_t> part_seeds(seeds.begin() + r0, seeds.begin() + long(r1));
    GrpoRollout r = generate_rollout(generator(), part, 1, o_.generation, part_seeds);
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      all.prompts.push_back(std::move(r.prompts[i]));
      all.completions.push_back(std::move(r.completions[i]));
      all.stopped.push_back(r.stopped[i]);
    }
  }
  t.batch = rollout_batch(all, o_.pad_id, o_.pad_to);
  t.W = o_.generation.max_new_tokens;
  for (size_t i = 0; i < all.prompts.size(); ++i) {
    t.prompt_len.push_back(int64_t(all.prompts[i].size()));
    t.response_len.push_back(int64_t(all.completions[i].size()));
    t.stopped.push_back(all.stopped[i]);
    t.response_tokens += int64_t(all.completions[i].size());
  }
}

// Steps 2 and 3: log-probs, reference log-probs, values and scores.
void PpoStep::score(PpoTrajectory& t) {
  const Batch& rb = t.batch;
  const int64_t rows = rb.batch_size, W = t.W;
  const auto [policy, value] = split_params();
  const std::vector<double> lp = forward(score_, "token_logps", rb, policy);
  const std::vector<double> ref = forward(score_, "token_logps", rb, *o_.ref_params);
  const std::vector<double> v = forward(values_fwd_, "values", rb, value);
  // The reward model reads each (prompt, response) at its last token.
  const std::vector<double> scores =
      forward(reward_fwd_, "scores", rb, *o_.reward_params, [&t](TensorMap& in, const Batch& part) {
        Tensor m = Tensor::zeros({part.batch_size * part.seq_len}, DType::F32);
        for (int64_t j = 0; j < part.batch_size; ++j) {
          const auto i = size_t(part.items[size_t(j)]);
          m.data<float>()[j * part.seq_len + t.prompt_len[i] + t.response_len[i] - 1] = 1.0f;
        }
        in["last_token_mask"] = m;
      });
  const size_t n = size_t(rows * W);
  t.logps.assign(n, 0.0);
  t.ref_logps.assign(n, 0.0);
  t.values.assign(n, 0.0);
  t.mask.assign(n, 0.0);
  t.value_mask.assign(n, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t L = t.response_len[size_t(i)];
    double s = scores[size_t(i)];
    const bool no_eos = o_.penalise_no_eos && !t.stopped[size_t(i)];
    const bool too_short = o_.min_response_length && L < *o_.min_response_length;
    if (no_eos || too_short) s = o_.reward_penalty;
    t.scores.push_back(s);
    t.score_index.push_back(ppo_score_index(L, W));
    for (int64_t k = 0; k < W; ++k) {
      const size_t e = size_t(i * W + k);
      const bool valid = k < L, value_pos = valid || k == t.score_index.back();
      if (valid) {
        t.mask[e] = 1.0;
        t.logps[e] = lp[size_t(t.pos(i, k))];
        t.ref_logps[e] = ref[size_t(t.pos(i, k))];
      }
      if (value_pos) {
        t.value_mask[e] = 1.0;
        t.values[e] = v[size_t(t.pos(i, k))];
      }
    }
  }
}

std::unique_ptr<PpoTrajectory> PpoStep::prepare(const Batch& prompts, int64_t step) {
  auto t = std::make_unique<PpoTrajectory>();
  t->key = prompts.items;
  const auto t0 = std::chrono::steady_clock::now();
  generate(*t, prompts, step);
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  score(*t);
  // Step 4: rewards, advantages and returns.
  const PpoRewards r =
      ppo_rewards(t->scores, t->logps, t->ref_logps, o_.kl_coeff, t->score_index, t->W);
  const std::string what = "the advantage whitening all-reduce at step " + std::to_string(step + 1);
  const PpoAdvantages a =
      ppo_advantages(t->values, r.rewards, o_.gamma, o_.lmbda, t->mask, t->W,
                     [this, &what](std::vector<double>& v) { sum_over_ranks(v, what); });
  t->advantages = a.advantages;
  t->returns = a.returns;
  rollout_metrics(*t, r.kl, r.kl_reward, gen_s);
  return t;
}

void PpoStep::rollout_metrics(PpoTrajectory& t, const std::vector<double>& kl,
                              const std::vector<double>& kl_reward, double gen_s) {
  const double rows = double(t.batch.batch_size);
  double scores = 0, kl_sum = 0, klr_sum = 0, padded = 0;
  for (double s : t.scores) scores += s;
  for (double x : kl) kl_sum += x;
  for (double x : kl_reward) klr_sum += x;
  for (int64_t L : t.response_len) padded += L < t.W ? 1.0 : 0.0;
  t.metrics = {{"scores", scores, rows},
               {"rlhf_reward", scores + klr_sum, rows},
               {"kl", kl_sum, rows},
               {"kl_reward", klr_sum, rows},
               {"num_stop_tokens", padded, 1.0 / world()},  // a count over every rank's rows
               {"response_lengths", double(t.response_tokens), rows},
               {"gen_tokens_per_s", double(t.response_tokens), gen_s}};
}

// One optimizer update over the mini-batch's rows, gradient_accumulation_steps micro-batches.
void PpoStep::update(const PpoTrajectory& t, const std::vector<int64_t>& mini, PpoStats& st) {
  const int64_t micro = o_.ppo_batch_size / o_.gradient_accumulation_steps;
  // Per micro-batch: its response tokens, value positions and cells, over every rank's k-th
  // micro-batch (the masked means' denominators).
  std::vector<double> counts;
  for (int64_t j = 0; j < o_.ppo_batch_size; j += micro) {
    double valid = 0, value_valid = 0;
    for (int64_t r = j; r < j + micro; ++r)
      for (int64_t k = 0; k < t.W; ++k) {
        valid += t.mask[size_t(mini[size_t(r)] * t.W + k)];
        value_valid += t.value_mask[size_t(mini[size_t(r)] * t.W + k)];
      }
    counts.insert(counts.end(), {valid, value_valid, double(micro * t.W)});
  }
  sum_over_ranks(counts, "the PPO micro-batch token counts all-reduce");
  TensorMap grads;
  for (int64_t j = 0; j < o_.ppo_batch_size; j += micro) {
    const std::vector<int64_t> rows(mini.begin() + j, mini.begin() + j + micro);
    micro_step(t, rows, st, grads, j == 0, &counts[size_t(3 * (j / micro))]);
  }
  ++st.updates;
  if (hook_) return;  // optimizer_in_bwd: already applied during the backward
  FT_CHECK(bool(o_.apply_update), "the PPO step has no way to apply its updates");
  std::vector<std::pair<std::string, Tensor>> list(grads.begin(), grads.end());
  o_.apply_update(std::move(list));
}

// `counts`: the global micro-batch's response tokens, value positions and cells (update()).
void PpoStep::micro_step(const PpoTrajectory& t, const std::vector<int64_t>& rows, PpoStats& st,
                         TensorMap& grads, bool first, const double* counts) {
  const Batch mb = ppo_select_rows(t.batch, rows);
  const int64_t T = mb.seq_len, W = t.W, n = mb.batch_size;
  const double ga = double(o_.gradient_accumulation_steps);
  const double valid = counts[0], value_valid = counts[1], cells = counts[2];
  // Per-position inputs.
  std::vector<double> old_lp(size_t(n * T), 0.0), adv(old_lp), tw(old_lp), old_v(old_lp),
      ret(old_lp), vw(old_lp);
  double local_valid = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = rows[size_t(j)];
    for (int64_t k = 0; k < W; ++k) {
      const size_t e = size_t(i * W + k);
      const auto p = size_t(t.pos(i, k) - i * t.batch.seq_len + j * T);
      if (t.mask[e] != 0) {
        local_valid += 1;
        old_lp[p] = t.logps[e];
        adv[p] = t.advantages[e];
        tw[p] = 1.0 / (valid + 1e-8) / ga;
      }
      if (t.value_mask[e] != 0) {
        old_v[p] = t.values[e];
        ret[p] = t.returns[e];
        vw[p] = 1.0 / (value_valid + 1e-8) / ga;
      }
    }
  }
  auto [policy, value] = split_params();
  TensorMap in = batch_inputs(mb);
  in["loss_scale"] = scalar_input(1.0, DType::F32);
  in["old_logps"] = ppo_f32(old_lp);
  in["advantages"] = ppo_f32(adv);
  in["token_weights"] = ppo_f32(tw);
  const TensorMap p_out = policy_.run(mb, in, policy, &compile_s_, hook_);
  TensorMap vin = batch_inputs(mb);
  vin["loss_scale"] = scalar_input(1.0, DType::F32);
  vin["old_values"] = ppo_f32(old_v);
  vin["returns"] = ppo_f32(ret);
  vin["value_weights"] = ppo_f32(vw);
  const std::string& pre = o_.value_prefix;
  GradientHook value_hook;
  if (hook_) value_hook = [this, &pre](const std::string& name, Tensor g) { hook_(pre + name, g); };
  const TensorMap v_out = value_.run(mb, vin, value, &compile_s_, value_hook);
  for (auto& [name, g] : gradients_of(p_out)) accumulate_gradient(grads, name, g, first);
  for (auto& [name, g] : gradients_of(v_out)) accumulate_gradient(grads, pre + name, g, first);
  // Statistics (torchtune's PPOStats divided by the accumulation steps).
  const double policy_loss = element_as_double(p_out.at("loss"), 0);
  const double value_loss = element_as_double(v_out.at("report:value_loss"), 0);
  st.policy_loss += policy_loss;
  st.value_loss += value_loss;
  st.loss += policy_loss + o_.loss.value_coeff * value_loss;
  const Tensor& ratio = p_out.at("report:ratio");
  const Tensor& lp = p_out.at("report:token_logps");
  double ratio_sum = 0, clipped = 0, kl = 0;
  for (size_t p = 0; p < tw.size(); ++p) {
    if (tw[p] == 0) continue;
    const double r = element_as_double(ratio, int64_t(p));
    ratio_sum += r;
    clipped += o_.loss.clipped(r, adv[p]) ? 1.0 : 0.0;
    const double d = element_as_double(lp, int64_t(p)) - old_lp[p];
    kl += 0.5 * d * d;
  }
  // torchtune's padded log-probs are 1.0 in both: a ratio of 1 and no KL there (this rank's
  // padded cells, over the global micro-batch's).
  st.ratios += (ratio_sum + (double(n * W) - local_valid)) / cells / ga;
  st.clipfrac += clipped / (valid + 1e-8) / ga;
  st.approx_kl += kl / cells / ga;
}

}  // namespace

int64_t ppo_score_index(int64_t length, int64_t W) {
  FT_CHECK(length >= 1 && length <= W, "ppo_score_index: a response of " + std::to_string(length) +
                                           " tokens in a width of " + std::to_string(W));
  const int64_t last = length - 1;
  return last > 0 && last < W - 1 ? last + 1 : last;
}

std::unique_ptr<TrainingStep> make_ppo_step(PpoStepOptions opts) {
  return std::make_unique<PpoStep>(std::move(opts));
}

}  // namespace fusetune
