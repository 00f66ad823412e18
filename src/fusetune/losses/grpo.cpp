#include "fusetune/losses/grpo.h"

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

Value grpo_sub(Builder& b, Value x, Value y) { return b.add(x, b.scale(y, -1.0)); }

Value grpo_add_const(Builder& b, Value x, double c) {
  return b.add(x, b.graph().fill(b.shape(x), c));
}

Value grpo_relu(Builder& b, Value x) { return b.graph().add1(Op::Relu, {x}); }

Value grpo_exp(Builder& b, Value x) { return b.graph().add1(Op::Exp, {x}); }

// clamp(x, lo, hi) = lo + relu(x - lo) - relu(x - hi), for lo <= hi: slope 1 inside.
Value grpo_clamp(Builder& b, Value x, double lo, double hi) {
  return grpo_sub(b, grpo_add_const(b, grpo_relu(b, grpo_add_const(b, x, -lo)), lo),
                  grpo_relu(b, grpo_add_const(b, x, -hi)));
}

// min(x, y) = x - relu(x - y): x's gradient where x <= y, y's where y < x.
Value grpo_min(Builder& b, Value x, Value y) {
  return grpo_sub(b, x, grpo_relu(b, grpo_sub(b, x, y)));
}

}  // namespace

const char* grpo_loss_type_name(GrpoLossType type) {
  switch (type) {
    case GrpoLossType::GRPO:
      return "grpo";
    case GrpoLossType::BNPO:
      return "bnpo";
    case GrpoLossType::DrGRPO:
      return "dr_grpo";
    case GrpoLossType::DAPO:
      return "dapo";
  }
  return "?";
}

GrpoLossType grpo_loss_type_from(const std::string& name, const std::string& key) {
  for (GrpoLossType t :
       {GrpoLossType::GRPO, GrpoLossType::BNPO, GrpoLossType::DrGRPO, GrpoLossType::DAPO})
    if (name == grpo_loss_type_name(t)) return t;
  const std::string near = closest_match(name, {"grpo", "bnpo", "dr_grpo", "dapo"});
  throw Error("config key '" + key + "' is '" + name + "'" +
              (near.empty() ? "" : "; did you mean '" + near + "'?") +
              " Choices: grpo, bnpo, dr_grpo, dapo");
}

Value build_token_log_probs(Builder& b, Value hidden, Value head, Value logits, Value labels,
                            double temperature) {
  FT_CHECK(temperature > 0,
           "GRPO scores completions at a temperature > 0, got " + std::to_string(temperature));
  Graph& g = b.graph();
  g.set_region(0);
  if (!logits.valid()) {
    if (temperature != 1.0) hidden = b.scale(hidden, 1.0 / temperature);
    logits = b.matmul(hidden, head, false, true);  // [N, V]
  } else if (temperature != 1.0) {
    logits = b.scale(logits, 1.0 / temperature);
  }
  g.set_region(1);
  Value logps = g.add1(Op::LabelLogProbs, {b.log_softmax(logits), labels});
  g.set_region(0);
  return logps;
}

GrpoLossOutputs build_grpo_loss(Builder& b, const GrpoLoss& loss, const GrpoLossInputs& in) {
  FT_CHECK(loss.epsilon >= 0 && loss.epsilon < 1 && loss.epsilon_high >= 0,
           "GRPO's clipping needs 0 <= epsilon < 1 and epsilon_high >= 0");
  Graph& g = b.graph();
  g.set_region(1);
  GrpoLossOutputs out;
  out.ratio = grpo_exp(b, grpo_sub(b, in.logps, in.old_logps));
  Value unclipped = b.mul(out.ratio, in.advantages);
  Value clipped =
      b.mul(grpo_clamp(b, out.ratio, 1.0 - loss.epsilon, 1.0 + loss.epsilon_high), in.advantages);
  Value per_token = b.scale(grpo_min(b, unclipped, clipped), -1.0);
  if (loss.needs_reference()) {
    FT_CHECK(in.ref_logps.valid(), "a GRPO loss with beta != 0 needs the reference log-probs");
    Value d = grpo_sub(b, in.ref_logps, in.logps);
    out.kl = grpo_add_const(b, grpo_sub(b, grpo_exp(b, d), d), -1.0);
    per_token = b.add(per_token, b.scale(out.kl, loss.beta));
  }
  out.loss = b.sum(b.mul(per_token, in.weights));
  g.set_region(0);
  return out;
}

}  // namespace fusetune
