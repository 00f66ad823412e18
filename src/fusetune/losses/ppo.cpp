#include "fusetune/losses/ppo.h"

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

Value ppo_sub(Builder& b, Value x, Value y) { return b.add(x, b.scale(y, -1.0)); }

Value ppo_relu(Builder& b, Value x) { return b.graph().add1(Op::Relu, {x}); }

// max(x, y) = x + relu(y - x): x's gradient where x >= y, y's where y > x.
Value ppo_max(Builder& b, Value x, Value y) { return b.add(x, ppo_relu(b, ppo_sub(b, y, x))); }

}  // namespace

PpoValueLossOutputs build_ppo_value_loss(Builder& b, const PpoLoss& loss,
                                         const PpoValueLossInputs& in) {
  FT_CHECK(loss.value_clip_range >= 0, "PPOLoss's value_clip_range must be >= 0");
  Graph& g = b.graph();
  g.set_region(1);
  // clamp(v, v_old - c, v_old + c) = lo + relu(v - lo) - relu(v - hi): slope 1 inside.
  const Shape s = b.shape(in.values);
  Value lo = b.add(in.old_values, g.fill(s, -loss.value_clip_range));
  Value hi = b.add(in.old_values, g.fill(s, loss.value_clip_range));
  Value clipped = ppo_sub(b, b.add(lo, ppo_relu(b, ppo_sub(b, in.values, lo))),
                          ppo_relu(b, ppo_sub(b, in.values, hi)));
  Value d = ppo_sub(b, in.values, in.returns), dc = ppo_sub(b, clipped, in.returns);
  Value per_token = ppo_max(b, b.mul(d, d), b.mul(dc, dc));
  PpoValueLossOutputs out;
  out.value_loss = b.scale(b.sum(b.mul(per_token, in.weights)), 0.5);
  out.loss = b.scale(out.value_loss, loss.value_coeff);
  g.set_region(0);
  return out;
}

}  // namespace fusetune
