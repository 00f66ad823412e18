#include "fusetune/losses/distillation.h"

namespace fusetune {

const char* DistillationLoss::name() const {
  switch (kind) {
    case KdDivergence::ForwardKL:
      return "ForwardKLLoss";
    case KdDivergence::ReverseKL:
      return "ReverseKLLoss";
    case KdDivergence::GeneralizedJSD:
      return "GeneralizedJSDLoss";
  }
  return "?";
}

Value build_divergence(Builder& b, const DistillationLoss& loss, Value student_logits,
                       Value teacher_logits, Value labels) {
  Graph& g = b.graph();
  g.set_region(1);
  Attrs a;
  a.groups = int64_t(loss.kind);
  a.scalar = loss.beta;
  a.eps = loss.temperature;
  Value d = g.add1(Op::Divergence, {student_logits, teacher_logits, labels}, a);
  g.set_region(0);
  return d;
}

KdLossOutputs build_kd_loss(Builder& b, const DistillationLoss& loss, double kd_ratio, Value hidden,
                            Value head, Value logits, Value teacher_logits, Value labels,
                            Value scale) {
  Graph& g = b.graph();
  g.set_region(0);
  if (!logits.valid()) logits = b.matmul(hidden, head, false, true);  // [N, V]
  KdLossOutputs out;
  out.kd_sum = build_divergence(b, loss, logits, teacher_logits, labels);
  g.set_region(1);
  out.ce_sum = b.nll_sum(b.log_softmax(logits), labels);
  Value mixed = b.add(b.scale(out.ce_sum, 1.0 - kd_ratio), b.scale(out.kd_sum, kd_ratio));
  out.loss = b.mul(mixed, scale);
  g.set_region(0);
  return out;
}

KdLossOutputs build_fused_kd_loss(Builder& b, const DistillationLoss& loss, double kd_ratio,
                                  Value hidden, Value head, Value teacher_hidden,
                                  Value teacher_head, Value labels, Value scale) {
  Graph& g = b.graph();
  g.set_region(1);
  Attrs a;
  a.groups = int64_t(loss.kind);
  a.scalar = loss.beta;
  a.eps = loss.temperature;
  // compile/fuse_linear_divergence sizes the chunk from its budget; this one serves graphs
  // run without that pass (tests).
  a.chunk_rows = 64;
  Value sums =
      g.add1(Op::FusedLinearDivergence, {hidden, head, teacher_hidden, teacher_head, labels}, a);
  KdLossOutputs out;
  out.ce_sum = b.reshape(b.slice(sums, 0, 0, 1), {});
  out.kd_sum = b.reshape(b.slice(sums, 0, 1, 1), {});
  Value mixed = b.add(b.scale(out.ce_sum, 1.0 - kd_ratio), b.scale(out.kd_sum, kd_ratio));
  out.loss = b.mul(mixed, scale);
  g.set_region(0);
  return out;
}

}  // namespace fusetune
