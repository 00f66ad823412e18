#pragma once
// The knowledge-distillation step (knowledge_distillation_single_device, docs/design.md §7).
// Per micro-batch:
//   1. the teacher's forward (a frozen model, no gradients): its logits [B*T, V], from the
//      logits graph (models/training_graph.h: build_logits_graph), compiled as the step is;
//   2. the student's joint graph: model + (1 - kd_ratio) CE + kd_ratio KD against the
//      teacher's logits (losses/distillation.h) + backward.
// Metrics, as torchtune logs them: class_loss and kd_loss, each the mean over the step's
// unmasked labels.
#include <memory>

#include "fusetune/losses/distillation.h"
#include "fusetune/recipes/sft_step.h"

namespace fusetune {

struct KdStepOptions {
  ModelStepOptions student;  // the trained model (its params, hooks, passes)
  DistillationLoss loss;
  double kd_ratio = 0.5;
  const ModelConfig* teacher = nullptr;  // its vocabulary must be the student's
  const TensorMap* teacher_params = nullptr;
};

std::unique_ptr<TrainingStep> make_kd_step(KdStepOptions opts);

// Whether a KD step runs both LM heads inside the fused divergence (docs/design.md §3): under
// `compile: true`, fp32 or bf16 weights, the student's head a plain weight (no LoRA on
// lm_head, no NF4 head) and neither model soft-capping its logits (Gemma 2: the fused op has
// no cap). The step and `fusetune plan` both ask this.
bool kd_fuses_heads(CompileMode mode, const LlamaOptions& student, const ModelConfig& student_model,
                    const ModelConfig& teacher);

}  // namespace fusetune
