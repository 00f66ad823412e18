#include "fusetune/recipes/dpo_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fusetune/config/schema.h"
#include "fusetune/models/flops.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/kto_kl.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

template <typename T>
double sum(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]);
  return s;
}

// ORPO's terms as TRL's ORPOTrainer logs them, from the mean log-probs `lp` (chosen, then
// rejected): nll_loss (the chosen answers' mean token NLL), log_odds_chosen (the log odds ratio)
// and log_odds_ratio (its log sigmoid).
void add_orpo_metrics(const std::vector<double>& lp, int64_t B, std::vector<StepMetric>& m) {
  auto log_odds = [](double logp) { return logp - std::log(-std::expm1(logp)); };
  double nll = 0, chosen = 0, ratio = 0;
  for (int64_t i = 0; i < B; ++i) {
    const double lo = log_odds(lp[size_t(i)]) - log_odds(lp[size_t(B + i)]);
    nll -= lp[size_t(i)];
    chosen += lo;
    ratio += lo < 0 ? lo - std::log1p(std::exp(lo)) : -std::log1p(std::exp(-lo));
  }
  m.push_back({"nll_loss", nll, double(B)});
  m.push_back({"log_odds_chosen", chosen, double(B)});
  m.push_back({"log_odds_ratio", ratio, double(B)});
}

// KTO's metrics on unpaired rows, as TRL's KTOTrainer logs them: rewards, log-probs and mean
// logits over the rows of each kind (a kind absent from the whole step logs 0), the margin as
// the difference of the two mean rewards, no accuracy (there are no pairs to compare).
std::vector<StepMetric> unpaired_metrics(const Batch& b, const float* rewards, const float* logps,
                                         const float* logit_sums, double vocab) {
  double reward[2] = {0, 0}, lp[2] = {0, 0}, logit[2] = {0, 0}, rows[2] = {0, 0},
         tokens[2] = {0, 0};
  for (int64_t i = 0; i < b.batch_size; ++i) {
    const int k = b.desirable[size_t(i)] ? 0 : 1;
    reward[k] += double(rewards[i]);
    lp[k] += double(logps[i]);
    logit[k] += double(logit_sums[i]);
    rows[k] += 1;
    for (int64_t t = 0; t < b.seq_len; ++t)
      tokens[k] += b.labels[size_t(i * b.seq_len + t)] != kIgnoreIndex;
  }
  std::vector<StepMetric> m = {{"rewards/chosen", reward[0], rows[0]},
                               {"rewards/rejected", reward[1], rows[1]},
                               {"rewards/margins", 0, 0},
                               {"log_probs/chosen", lp[0], rows[0]},
                               {"log_probs/rejected", lp[1], rows[1]},
                               {"logits/chosen", logit[0], vocab * tokens[0]},
                               {"logits/rejected", logit[1], vocab * tokens[1]}};
  m[2].difference_of = {"rewards/chosen", "rewards/rejected"};
  return m;
}

// The values of a per-row report output, which must be fp32.
const float* f32_data(const Tensor& t) {
  FT_CHECK(t.dtype() == DType::F32,
           std::string("DPO report output is ") + dtype_name(t.dtype()) + ", expected F32");
  return t.data<float>();
}

class DpoStep final : public TrainingStep {
 public:
  explicit DpoStep(DpoStepOptions o)
      : o_(std::move(o)),
        policy_(
            [this](int64_t rows, int64_t T, bool packed) { return policy_graph(rows, T, packed); },
            o_.policy.passes, arena_),
        reference_(
            [this](int64_t rows, int64_t T, bool) {
              return build_sequence_log_probs_graph(*o_.policy.model, rows, T, o_.policy.dtype,
                                                    o_.ref_llama);
            },
            o_.policy.passes, arena_),
        eval_([this](int64_t rows, int64_t T,
                     bool packed) { return policy_graph(rows, T, packed, /*eval=*/true); },
              o_.policy.passes, arena_),
        policy_logps_(
            [this](int64_t rows, int64_t T, bool) {
              return build_sequence_log_probs_graph(*o_.policy.model, rows, T, o_.policy.dtype,
                                                    o_.policy.eval_llama.value_or(o_.policy.llama));
            },
            o_.policy.passes, arena_) {
    FT_CHECK(!o_.loss.needs_reference() || o_.ref_params,
             std::string(o_.loss.name()) + " needs a reference model");
    FT_CHECK(!o_.loss.unpaired || kto(),
             std::string(o_.loss.name()) +
                 " compares pairs: only KTOLoss trains on unpaired rows (dataset "
                 "unpaired_preference); use preference pairs (_component_: preference)");
    FT_CHECK(!(o_.precompute_ref && kto()),
             "precompute_ref_log_probs: KTOLoss's KL rows pair each prompt with another row's "
             "completion, different in every batch, so the reference runs every step: set it "
             "to false");
    if (o_.precompute_ref && o_.loss.needs_reference()) precompute();
  }

  // Pairs, or unpaired KTO's rows (each one example, as TRL averages its loss over examples).
  int64_t loss_units(const Batch& b) const override {
    return b.unpaired ? b.batch_size : b.batch_size / 2;
  }

  StepOutputs run(const Batch& b, double loss_scale, int64_t step, int64_t micro) override {
    check_layout(b);
    const int64_t rows = b.batch_size, B = rows / 2;
    TensorMap in = inputs(b);
    in["loss_scale"] = scalar_input(loss_scale, DType::F32);
    if (o_.loss.needs_reference()) in["ref_logps"] = reference_logps(b, in);
    const double kl = kto() ? kl_reference_point(b) : 0.0;
    if (kto()) in["kto_kl"] = scalar_input(kl, DType::F32);
    if (o_.policy.add_inputs) o_.policy.add_inputs(in, step, micro);
    TensorMap out = policy_.run(b, in, policy_params(), &compile_s_);

    StepOutputs r;
    r.loss = element_as_double(out.at("loss"), 0);
    r.grads = gradients_of(out);
    if (b.unpaired) {
      r.metrics = unpaired_metrics(
          b, f32_data(out.at("report:rewards")), f32_data(out.at("report:policy_logps")),
          f32_data(out.at("report:logit_sums")), double(o_.policy.model->vocab_size));
      r.metrics.push_back({"kl", kl, 1.0});
      return r;
    }
    // fp32 in an fp32 step, and in a bf16 one (sequence-level values stay fp32, graph.h).
    const float* cr = f32_data(out.at("report:chosen_rewards"));
    const float* rr = f32_data(out.at("report:rejected_rewards"));
    const float* lp_sum = f32_data(out.at("report:policy_logps"));
    const float* ls = f32_data(out.at("report:logit_sums"));
    // The logged log-probs are what the loss compares: per sequence the sum, or under SimPO
    // (length-normalized) the mean over the response tokens, as torchtune's recipe and TRL log.
    const float* inv_len = in.at("inv_response_len").data<float>();
    std::vector<double> lp(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i)
      lp[size_t(i)] =
          o_.loss.length_normalized() ? double(lp_sum[i]) * double(inv_len[i]) : double(lp_sum[i]);
    double acc = 0, margin = 0;
    for (int64_t i = 0; i < B; ++i) {
      acc += cr[i] > rr[i] ? 1.0 : 0.0;
      margin += double(cr[i]) - double(rr[i]);
    }
    // Response tokens of each side, for the mean logit.
    int64_t tokens[2] = {0, 0};
    for (int64_t i = 0; i < rows * b.seq_len; ++i)
      tokens[i / b.seq_len >= B] += b.labels[size_t(i)] != kIgnoreIndex;
    const double V = double(o_.policy.model->vocab_size), pairs = double(B);
    r.metrics = {{"rewards/chosen", sum(cr, B), pairs},
                 {"rewards/rejected", sum(rr, B), pairs},
                 {"rewards/accuracies", acc, pairs},
                 {"rewards/margins", margin, pairs},
                 {"log_probs/chosen", sum(lp.data(), B), pairs},
                 {"log_probs/rejected", sum(lp.data() + B, B), pairs},
                 {"logits/chosen", sum(ls, B), V * double(tokens[0])},
                 {"logits/rejected", sum(ls + B, B), V * double(tokens[1])}};
    if (o_.loss.kind == PreferenceLossKind::ORPO) add_orpo_metrics(lp, B, r.metrics);
    if (kto()) r.metrics.push_back({"kl", kl, 1.0});
    return r;
  }

  // The preference loss of `b`'s pairs summed (loss_scale 1), no gradients, no dropout; the
  // reference computed for the batch (precomputed log-probs cover the training pairs only).
  double evaluate(const Batch& b) override {
    check_layout(b);
    TensorMap in = inputs(b);
    in["loss_scale"] = scalar_input(1.0, DType::F32);
    if (o_.loss.needs_reference())
      in["ref_logps"] = reference_.run(b, in, ref_params(), &compile_s_).at("logps");
    if (kto()) in["kto_kl"] = scalar_input(kl_reference_point(b), DType::F32);
    return element_as_double(eval_.run(b, in, policy_params(), &compile_s_).at("loss"), 0);
  }

  double flops(const Batch& b) const override {
    const ModelConfig& m = *o_.policy.model;
    double per_token = training_flops_per_token(m, b.seq_len, o_.policy.trainable);
    // The reference forward: half of what a frozen model's forward + input gradients cost.
    // KTO's KL rows: a policy and a reference forward more (rows of about the same length).
    const double passes =
        (o_.loss.needs_reference() && !o_.precompute_ref ? 1.0 : 0.0) + (kto() ? 2.0 : 0.0);
    per_token += passes * 0.5 *
                 training_flops_per_token(m, b.seq_len, [](const std::string&) { return false; });
    return per_token * double(b.batch_size * b.seq_len);
  }

 private:
  // eval: the loss alone (nothing trains, so no backward) with the validation hooks.
  Graph policy_graph(int64_t rows, int64_t T, bool packed, bool eval = false) {
    TrainingGraphOptions g;
    g.batch_size = rows;
    g.seq_len = T;
    g.packed = packed;
    g.trainable = o_.policy.trainable;
    g.llama = o_.policy.llama;
    if (eval) {
      g.trainable = [](const std::string&) { return false; };
      if (o_.policy.eval_llama) g.llama = *o_.policy.eval_llama;
    }
    g.loss = preference_loss_builder(o_.loss);
    g.dtype = o_.policy.dtype;
    return build_training_graph(*o_.policy.model, g).graph;
  }

  bool kto() const { return o_.loss.kind == PreferenceLossKind::KTO; }

  // The graphs are built for the loss's layout: pairs (2B rows, chosen then rejected) or
  // unpaired KTO rows with their desirable mask.
  void check_layout(const Batch& b) const {
    FT_CHECK(b.doc_ids.empty(), "a preference batch has unpacked rows");
    FT_CHECK(b.unpaired == o_.loss.unpaired,
             std::string("a batch of ") + (b.unpaired ? "unpaired rows" : "preference pairs") +
                 " reached a step built for " +
                 (o_.loss.unpaired ? "unpaired rows" : "preference pairs") +
                 ": dataset and dataset_val must be of one kind");
    FT_CHECK(b.unpaired || b.batch_size % 2 == 0,
             "a preference batch has 2B unpacked rows (chosen, then rejected)");
    FT_CHECK(!b.unpaired || int64_t(b.desirable.size()) == b.batch_size,
             "an unpaired preference batch without its rows' labels");
  }

  // KTO's KL reference point for `b` (kto_kl.h): the mean over its mismatched rows (and over
  // the ranks, as TRL gathers it) of the policy's minus the reference's summed log-probs,
  // clamped at 0. Forward passes only: it reaches the loss as an input, detached.
  double kl_reference_point(const Batch& b) {
    const Batch m = mismatched_completions(b, o_.loader.collate);
    TensorMap in = batch_inputs(m);
    add_response_inputs(m, in, /*require_response=*/false);
    const Tensor pol = policy_logps_.run(m, in, policy_params(), &compile_s_).at("logps");
    const Tensor ref = reference_.run(m, in, ref_params(), &compile_s_).at("logps");
    double sums[2] = {0, double(m.batch_size)};
    for (int64_t i = 0; i < m.batch_size; ++i)
      sums[0] += double(f32_data(pol)[i]) - double(f32_data(ref)[i]);
    if (o_.comm && o_.comm->size() > 1)
      o_.comm->allreduce_sum(sums, 2, "the KTO KL reference point");
    return std::max(0.0, sums[0] / sums[1]);
  }

  // The batch's tensors plus the response mask and 1 / response length of each row.
  // Unpaired rows: also `desirable` [rows], 1 or 0.
  static TensorMap inputs(const Batch& b) {
    TensorMap in = batch_inputs(b);
    add_response_inputs(b, in);
    if (b.unpaired) {
      Tensor d = Tensor::empty({b.batch_size}, DType::F32);
      for (int64_t i = 0; i < b.batch_size; ++i) d.data<float>()[i] = b.desirable[size_t(i)];
      in["desirable"] = d;
    }
    return in;
  }

  // [2B]: chosen then rejected, as the batch's rows.
  Tensor reference_logps(const Batch& b, const TensorMap& in) {
    if (!precomputed_.empty()) {
      const int64_t B = b.batch_size / 2;
      FT_CHECK(int64_t(b.items.size()) == B, "a preference batch without its pair indices");
      Tensor t = Tensor::empty({2 * B}, DType::F32);
      for (int64_t i = 0; i < B; ++i) {
        const auto& lp = precomputed_.at(size_t(b.items[size_t(i)]));
        t.data<float>()[i] = lp.first;
        t.data<float>()[B + i] = lp.second;
      }
      return t;
    }
    return reference_.run(b, in, ref_params(), &compile_s_).at("logps");
  }

  // One reference pass over the dataset in order, batched and padded as training batches.
  // Ranks: batch c is computed by rank c % world, then each rank's values are broadcast to
  // the others, so every rank holds the whole table (a resume with another rank count reads
  // other samples), each value bitwise the one a single process computes.
  void precompute() {
    FT_CHECK(o_.pairs, "precompute_ref_log_probs needs the preference dataset");
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = o_.pairs->size(), bs = o_.loader.batch_size;
    FT_CHECK(bs >= 1, "precompute_ref_log_probs: batch_size must be >= 1");
    // A reference that reads ZeRO-3's sharded parameters gathers them in every pass, a
    // collective: then every rank runs every batch (the same bits everywhere) and nothing is
    // sent.
    const bool gathered = ref_gathered();
    const int world = o_.comm && !gathered ? o_.comm->size() : 1;
    const int rank = o_.comm && !gathered ? o_.comm->rank() : 0;
    // Each rank's batches in order, packed: chosen and rejected of each pair.
    std::vector<std::vector<float>> packed(static_cast<size_t>(world));
    for (int64_t start = 0, c = 0; start < n; start += bs, ++c) {
      const int owner = int(c % world);
      std::vector<float>& out = packed[size_t(owner)];
      if (owner != rank) {
        out.resize(out.size() + 2 * size_t(std::min(n, start + bs) - start));
        continue;
      }
      std::vector<const PreferencePair*> pairs;
      std::vector<int64_t> items;
      for (int64_t i = start; i < std::min(n, start + bs); ++i) {
        pairs.push_back(&o_.pairs->get(i));
        items.push_back(i);
      }
      Batch b = collate_preference(pairs, o_.loader.collate);
      b.items = items;
      Tensor lp = reference_.run(b, inputs(b), ref_params(), &compile_s_).at("logps");
      const int64_t B = int64_t(items.size());
      for (int64_t i = 0; i < B; ++i) {
        out.push_back(lp.data<float>()[i]);
        out.push_back(lp.data<float>()[B + i]);
      }
    }
    for (int r = 0; r < world && world > 1; ++r)
      o_.comm->broadcast(packed[size_t(r)].data(),
                         int64_t(packed[size_t(r)].size() * sizeof(float)), r,
                         "the precomputed reference log-probs of rank " + std::to_string(r));
    precomputed_.assign(size_t(n), {});
    std::vector<size_t> at(size_t(world), 0);
    for (int64_t i = 0; i < n; ++i) {
      const auto owner = size_t(i / bs % world);
      precomputed_[size_t(i)] = {packed[owner][at[owner]], packed[owner][at[owner] + 1]};
      at[owner] += 2;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o_.log)
      o_.log("Precomputed reference log-probs of " + std::to_string(n) + " pairs" +
             (world > 1  ? " over " + std::to_string(world) + " ranks"
              : gathered ? " on every rank (ZeRO-3 gathers the parameters)"
                         : std::string()) +
             " in " + std::to_string(s).substr(0, std::to_string(s).find('.') + 3) +
             " s (checksum " + checksum() + ")");
    compile_s_ = 0;  // that pass's compile time is not the first step's
  }

  // The policy's parameters: ZeRO-3's source (gathered at use) or the map.
  ParamSource policy_params() const { return o_.policy.source(); }
  // LoRA's reference reads the policy's own (base) parameters, so through the same source;
  // full DPO's frozen reference copy is whole on every rank, or at ZeRO-3 sharded too.
  bool ref_reads_sharded_params() const {
    return o_.policy.param_source && o_.ref_params == o_.policy.params;
  }
  // Whether a reference pass gathers parameters (a collective: every rank runs it).
  bool ref_gathered() const { return ref_reads_sharded_params() || o_.ref_source.has_value(); }
  ParamSource ref_params() const {
    if (o_.ref_source) return *o_.ref_source;
    return ref_reads_sharded_params() ? *o_.policy.param_source : ParamSource(*o_.ref_params);
  }

  // FNV-1a over the table's bits in dataset order: runs whose checksums agree used the same
  // reference values (up to hash collisions).
  std::string checksum() const {
    uint64_t h = 1469598103934665603ull;
    for (const auto& [c, r] : precomputed_)
      for (float v : {c, r}) {
        uint32_t bits = 0;
        std::memcpy(&bits, &v, sizeof bits);
        for (int k = 0; k < 4; ++k) h = (h ^ ((bits >> (8 * k)) & 0xffu)) * 1099511628211ull;
      }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }

  DpoStepOptions o_;
  // Declared before the caches that share it: the reference pass and the policy step run one
  // after the other, so one arena serves both.
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  CompiledGraphs policy_, reference_, eval_;
  CompiledGraphs policy_logps_;  // KTO: the policy's log-probs of the KL rows, no backward
  std::vector<std::pair<float, float>> precomputed_;  // by dataset index
};

}  // namespace

std::unique_ptr<TrainingStep> make_dpo_step(DpoStepOptions opts) {
  return std::make_unique<DpoStep>(std::move(opts));
}

PreferenceLoss preference_loss_from(const Config& cfg) {
  const std::string kind = canonical_component(cfg, "loss");
  PreferenceLoss l;
  const Config c = cfg.sub("loss");
  if (kind == "DPOLoss") {
    l.kind = PreferenceLossKind::DPO;
    l.beta = c.f64("beta", 0.1);
    l.label_smoothing = c.f64("label_smoothing", 0.0);
  } else if (kind == "RSOLoss") {
    l.kind = PreferenceLossKind::RSO;
    l.gamma = c.f64("gamma", 0.1);
  } else if (kind == "IPOLoss") {
    l.kind = PreferenceLossKind::IPO;
    l.tau = c.f64("tau", 0.1);
  } else if (kind == "SimPOLoss") {
    l.kind = PreferenceLossKind::SimPO;
    l.beta = c.f64("beta", 2.0);
    l.gamma = c.f64("gamma", 0.5);
    l.label_smoothing = c.f64("label_smoothing", 0.0);
  } else if (kind == "ORPOLoss") {
    l.kind = PreferenceLossKind::ORPO;
    l.beta = c.f64("beta", 0.1);
  } else if (kind == "KTOLoss") {
    l.kind = PreferenceLossKind::KTO;
    l.beta = c.f64("beta", 0.1);
    l.desirable_weight = c.f64("desirable_weight", 1.0);
    l.undesirable_weight = c.f64("undesirable_weight", 1.0);
    FT_CHECK(!cfg.boolean("dataset.train_on_input", false),
             "KTOLoss needs dataset.train_on_input: false: its KL reference point pairs each "
             "prompt with another row's completion, so the prompt must be told apart");
    l.unpaired = cfg.has("dataset._component_") &&
                 canonical_component(cfg, "dataset") == "unpaired_preference";
  } else {
    throw Error("config key 'loss._component_' is " + kind +
                ": the DPO recipes train with DPOLoss, RSOLoss, IPOLoss, SimPOLoss, ORPOLoss or "
                "KTOLoss");
  }
  FT_CHECK(l.kind != PreferenceLossKind::IPO || l.tau > 0, "config key 'loss.tau' must be > 0");
  FT_CHECK(l.kind != PreferenceLossKind::SimPO || l.beta > 0, "config key 'loss.beta' must be > 0");
  return l;
}

void add_response_inputs(const Batch& b, TensorMap& in, bool require_response) {
  const int64_t rows = b.batch_size, T = b.seq_len;
  Tensor mask = Tensor::empty({rows * T}, DType::F32);
  Tensor inv = Tensor::empty({rows}, DType::F32);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t n = 0;
    for (int64_t t = 0; t < T; ++t) {
      const bool on = b.labels[size_t(r * T + t)] != kIgnoreIndex;
      mask.data<float>()[r * T + t] = on ? 1.0f : 0.0f;
      n += on;
    }
    FT_CHECK(n > 0 || !require_response, "a preference row has no response token to score");
    inv.data<float>()[r] = n > 0 ? float(1.0 / double(n)) : 0.0f;
  }
  in["response_mask"] = mask;
  in["inv_response_len"] = inv;
}

}  // namespace fusetune
