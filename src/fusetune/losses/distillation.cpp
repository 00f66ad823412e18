#include "fusetune/losses/distillation.h"

#include <bit>

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

namespace {

// The divergence's attrs, shared by Divergence and FusedLinearDivergence: the kind, beta and
// the temperature.
Attrs divergence_attrs(const DistillationLoss& loss) {
  Attrs a;
  a.groups = int64_t(loss.kind);
  a.scalar = loss.beta;
  a.eps = loss.temperature;
  return a;
}

// (1 - kd_ratio) CE + kd_ratio KD, times the step's scale.
Value mixed_kd_loss(Builder& b, const KdLossOutputs& sums, double kd_ratio, Value scale) {
  return b.mul(b.add(b.scale(sums.ce_sum, 1.0 - kd_ratio), b.scale(sums.kd_sum, kd_ratio)), scale);
}

}  // namespace

Value build_divergence(Builder& b, const DistillationLoss& loss, Value student_logits,
                       Value teacher_logits, Value labels) {
  Graph& g = b.graph();
  g.set_region(1);
  Value d =
      g.add1(Op::Divergence, {student_logits, teacher_logits, labels}, divergence_attrs(loss));
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
  out.loss = mixed_kd_loss(b, out, kd_ratio, scale);
  g.set_region(0);
  return out;
}

KdLossOutputs build_fused_kd_loss(Builder& b, const DistillationLoss& loss, double kd_ratio,
                                  Value hidden, const KdStudentHead& head, const KdTeacher& teacher,
                                  Value labels, Value scale) {
  Graph& g = b.graph();
  g.set_region(1);
  Attrs a = divergence_attrs(loss);
  // compile/fuse_linear_divergence sizes the chunk from its budget; this one serves graphs
  // run without that pass (tests).
  a.chunk_rows = 64;
  std::vector<Value> in{hidden};
  if (head.nf4.empty()) {
    in.push_back(head.weight);
  } else {  // the NF4 head's parts; its offset's float bits in attrs.start (beta is scalar)
    in.insert(in.end(), head.nf4.begin(), head.nf4.end());
    a.shape = head.nf4_shape;
    a.start = std::bit_cast<int32_t>(head.nf4_offset);
  }
  if (teacher.top_k > 0) {  // no teacher head: its top-k (attrs.len = k)
    a.len = teacher.top_k;
    in.insert(in.end(), {teacher.topk_ids, teacher.topk_logprobs, labels});
  } else {
    in.insert(in.end(), {teacher.hidden, teacher.head, labels});
  }
  if (head.lora_A.valid()) in.insert(in.end(), {head.lora_A, head.lora_B_scaled});
  if (head.lora_x.valid()) {
    a.dim0 = 1;
    in.push_back(head.lora_x);
  }
  if (head.col_scale.valid()) {
    a.dim1 = 1;
    in.push_back(head.col_scale);
  }
  Value sums = g.add1(Op::FusedLinearDivergence, in, a);
  KdLossOutputs out;
  out.ce_sum = b.reshape(b.slice(sums, 0, 0, 1), {});
  out.kd_sum = b.reshape(b.slice(sums, 0, 1, 1), {});
  out.loss = mixed_kd_loss(b, out, kd_ratio, scale);
  g.set_region(0);
  return out;
}

}  // namespace fusetune
