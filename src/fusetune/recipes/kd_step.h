#pragma once
// The knowledge-distillation step (knowledge_distillation_single_device, docs/design.md §7).
// Per micro-batch:
//   1. the teacher's forward (a frozen model, no gradients): its logits [B*T, V], from the
//      logits graph (models/training_graph.h: build_logits_graph), compiled as the step is;
//   2. the student's joint graph: model + (1 - kd_ratio) CE + kd_ratio KD against the
//      teacher's logits (losses/distillation.h) + backward.
// With a top-k teacher (teacher_top_k), step 1 keeps each position's top-k (or they come from
// the precomputed file) and the divergence sees the teacher restricted to them.
// Metrics, as torchtune logs them: class_loss and kd_loss, each the mean over the step's
// unmasked labels.
#include <functional>
#include <memory>
#include <optional>

#include "fusetune/losses/distillation.h"
#include "fusetune/recipes/kd_teacher_topk.h"
#include "fusetune/recipes/sft_step.h"

namespace fusetune {

struct KdStepOptions {
  ModelStepOptions student;  // the trained model (its params, hooks, passes)
  DistillationLoss loss;
  double kd_ratio = 0.5;
  const ModelConfig* teacher = nullptr;  // its vocabulary must be the student's
  const TensorMap* teacher_params = nullptr;
  // ZeRO-3: the teacher's weights come from here instead (sharded like the student's, each
  // gathered when used; the step graphs are compiled with params_at_use).
  std::optional<ParamSource> teacher_source;
  // > 0: the teacher's distribution restricted to its top-k tokens (teacher_logits.top_k,
  // docs/distillation.md), computed each step from the teacher, or read from `precomputed`
  // (then no teacher runs: `teacher` and `teacher_params` may be null).
  int64_t teacher_top_k = 0;
  std::shared_ptr<const TeacherTopK> precomputed;
  // With `precomputed` and validation data (dataset_val): that data's own file.
  std::shared_ptr<const TeacherTopK> precomputed_val;
  // For a student whose head is a hook (LoRA on lm_head, an NF4 head): a head hook that records
  // the head's parts (peft/head_parts.h), so that `compile: true` still fuses both heads.
  std::function<LinearFn(std::shared_ptr<KdStudentHead>)> head_parts;
  // The same for validation (no lora_dropout); empty: head_parts.
  std::function<LinearFn(std::shared_ptr<KdStudentHead>)> eval_head_parts;
};

std::unique_ptr<TrainingStep> make_kd_step(KdStepOptions opts);

// The teacher's top-k of a batch from its forward, as a top-k KD step computes it each step
// (its final hidden states, then its head a [64, V] block of logits at a time): what
// precomputing the file runs over the dataset.
TopKOfBatch teacher_top_k_of(const ModelConfig& teacher, const TensorMap& params, int64_t top_k,
                             DType dtype, const PassOptions& passes);

// Whether a KD step runs both LM heads inside the fused divergence (docs/design.md §3): under
// `compile: true`, fp32 or bf16 weights, the student's head a plain weight or a head hook that
// can hand its parts (`head_parts`: LoRA on lm_head, DoRA and dropout included, an NF4 head), and
// neither model soft-capping its logits (Gemma 2: the fused op has no cap). A top-k teacher
// (`teacher_top_k`) has no head in the step: its cap is in its top-k log-probs. The step and
// `fusetune plan` both ask this.
bool kd_fuses_heads(CompileMode mode, const LlamaOptions& student, const ModelConfig& student_model,
                    const ModelConfig& teacher, bool head_parts, bool teacher_top_k = false);

}  // namespace fusetune
