#include "fusetune/losses/preference.h"

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

Value sub(Builder& b, Value x, Value y) { return b.add(x, b.scale(y, -1.0)); }

Value add_const(Builder& b, Value x, double c) { return b.add(x, b.graph().fill(b.shape(x), c)); }

Value log_sigmoid(Builder& b, Value x) { return b.graph().add1(Op::LogSigmoid, {x}); }

// log(p / (1 - p)) of a log-probability log p.
Value log_odds(Builder& b, Value logp) {
  return sub(b, logp, b.graph().add1(Op::Log1mExp, {logp}));
}

// -(1 - e) log sigmoid(beta d) - e log sigmoid(-beta d)
Value sigmoid_loss(Builder& b, Value d, double beta, double e) {
  Value z = b.scale(d, beta);
  Value loss = b.scale(log_sigmoid(b, z), -(1.0 - e));
  if (e != 0.0) loss = b.add(loss, b.scale(log_sigmoid(b, b.scale(z, -1.0)), -e));
  return loss;
}

// KTO on unpaired rows (losses/preference.h): each row's loss by its kind, summed.
PreferenceLossOutputs unpaired_kto_loss(Builder& b, const PreferenceLoss& loss, Value p, Value r,
                                        Value scale, Value kl, Value desirable) {
  Graph& g = b.graph();
  FT_CHECK(r.valid() && kl.valid() && desirable.valid(),
           "unpaired KTOLoss needs the reference log-probs, the KL reference point and the "
           "rows' desirable mask");
  Attrs at;
  at.shape = b.shape(p);
  Value logratio = sub(b, p, r);
  Value d = sub(b, logratio, g.add1(Op::Expand, {kl}, at));  // [R]
  // 1 - sigmoid(beta d) for a desirable row, 1 - sigmoid(-beta d) for an undesirable one.
  Value desirable_loss =
      b.scale(g.add1(Op::Sigmoid, {b.scale(d, -loss.beta)}), loss.desirable_weight);
  Value undesirable_loss =
      b.scale(g.add1(Op::Sigmoid, {b.scale(d, loss.beta)}), loss.undesirable_weight);
  Value undesirable = add_const(b, b.scale(desirable, -1.0), 1.0);
  Value losses = b.add(b.mul(desirable_loss, desirable), b.mul(undesirable_loss, undesirable));
  PreferenceLossOutputs out;
  out.loss = b.mul(b.sum(losses), scale);
  out.rewards = b.scale(logratio, loss.beta);
  return out;
}

}  // namespace

const char* PreferenceLoss::name() const {
  switch (kind) {
    case PreferenceLossKind::DPO:
      return "DPOLoss";
    case PreferenceLossKind::RSO:
      return "RSOLoss";
    case PreferenceLossKind::IPO:
      return "IPOLoss";
    case PreferenceLossKind::SimPO:
      return "SimPOLoss";
    case PreferenceLossKind::ORPO:
      return "ORPOLoss";
    case PreferenceLossKind::KTO:
      return "KTOLoss";
  }
  return "?";
}

SequenceLogProbs build_sequence_log_probs(Builder& b, Value hidden, Value head, Value logits,
                                          Value labels, Value response_mask, int64_t rows) {
  Graph& g = b.graph();
  g.set_region(0);
  if (!logits.valid()) logits = b.matmul(hidden, head, false, true);  // [N, V]
  g.set_region(1);
  const int64_t N = g.shape(logits)[0];
  FT_CHECK(rows > 0 && N % rows == 0, "build_sequence_log_probs: " + std::to_string(N) +
                                          " tokens do not split into " + std::to_string(rows) +
                                          " rows");
  Value token_logps = g.add1(Op::LabelLogProbs, {b.log_softmax(logits), labels});  // [N]
  Value token_logit_sums = b.mul(g.add1(Op::RowSum, {logits}), response_mask);     // [N]
  SequenceLogProbs out;
  out.logps = g.add1(Op::RowSum, {b.reshape(token_logps, {rows, N / rows})});
  out.logit_sums = g.add1(Op::RowSum, {b.reshape(token_logit_sums, {rows, N / rows})});
  g.set_region(0);
  return out;
}

PreferenceLossOutputs build_preference_loss(Builder& b, const PreferenceLoss& loss,
                                            Value policy_logps, Value ref_logps, Value inv_lengths,
                                            Value scale, Value kl, Value desirable) {
  Graph& g = b.graph();
  g.set_region(1);
  if (loss.unpaired) {
    FT_CHECK(loss.kind == PreferenceLossKind::KTO,
             std::string(loss.name()) + " compares pairs: only KTOLoss trains on unpaired rows");
    PreferenceLossOutputs out =
        unpaired_kto_loss(b, loss, policy_logps, ref_logps, scale, kl, desirable);
    g.set_region(0);
    return out;
  }
  const int64_t rows = b.shape(policy_logps)[0];
  FT_CHECK(rows % 2 == 0,
           "a preference batch has an even number of rows, got " + std::to_string(rows));
  const int64_t B = rows / 2;
  Value p = policy_logps;
  if (loss.length_normalized()) p = b.mul(p, inv_lengths);
  Value pc = b.slice(p, 0, 0, B), pr = b.slice(p, 0, B, B);
  PreferenceLossOutputs out;
  Value losses;
  if (loss.kind == PreferenceLossKind::SimPO) {
    Value d = add_const(b, sub(b, pc, pr), -loss.gamma / loss.beta);
    losses = sigmoid_loss(b, d, loss.beta, loss.label_smoothing);
    out.chosen_rewards = b.scale(pc, loss.beta);
    out.rejected_rewards = b.scale(pr, loss.beta);
  } else if (loss.kind == PreferenceLossKind::ORPO) {
    Value ratio = log_sigmoid(b, sub(b, log_odds(b, pc), log_odds(b, pr)));
    losses = b.add(b.scale(pc, -1.0), b.scale(ratio, -loss.beta));
    out.chosen_rewards = b.scale(pc, loss.beta);
    out.rejected_rewards = b.scale(pr, loss.beta);
  } else {
    FT_CHECK(ref_logps.valid(), std::string(loss.name()) + " needs the reference log-probs");
    Value rc = b.slice(ref_logps, 0, 0, B), rr = b.slice(ref_logps, 0, B, B);
    Value chosen = sub(b, pc, rc), rejected = sub(b, pr, rr);  // log-ratios to the reference
    Value d = sub(b, chosen, rejected);
    double reward_scale = loss.beta;
    switch (loss.kind) {
      case PreferenceLossKind::DPO:
        losses = sigmoid_loss(b, d, loss.beta, loss.label_smoothing);
        break;
      case PreferenceLossKind::RSO:
        losses = g.add1(Op::Relu, {add_const(b, b.scale(d, -loss.gamma), 1.0)});
        reward_scale = loss.gamma;
        break;
      case PreferenceLossKind::IPO: {
        Value m = add_const(b, d, -1.0 / (2.0 * loss.tau));
        losses = b.mul(m, m);
        reward_scale = loss.tau;
        break;
      }
      case PreferenceLossKind::KTO: {
        FT_CHECK(kl.valid(), "KTOLoss needs its KL reference point");
        Attrs at;
        at.shape = {B};
        Value z = g.add1(Op::Expand, {kl}, at);
        Value lc = g.add1(Op::Sigmoid, {b.scale(sub(b, chosen, z), -loss.beta)});
        Value lr = g.add1(Op::Sigmoid, {b.scale(sub(b, z, rejected), -loss.beta)});
        losses = b.add(b.scale(lc, 0.5 * loss.desirable_weight),
                       b.scale(lr, 0.5 * loss.undesirable_weight));
        break;
      }
      case PreferenceLossKind::SimPO:
      case PreferenceLossKind::ORPO:
        break;
    }
    out.chosen_rewards = b.scale(chosen, reward_scale);
    out.rejected_rewards = b.scale(rejected, reward_scale);
  }
  out.loss = b.mul(b.sum(losses), scale);
  g.set_region(0);
  return out;
}

}  // namespace fusetune
