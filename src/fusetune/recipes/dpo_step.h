#pragma once
// The preference-optimization step (lora_dpo_single_device, full_dpo_single_device). A batch
// holds B pairs as 2B rows, chosen then rejected (collate_preference). Per micro-batch:
//   1. the reference model's summed response log-probs [2B], without gradients: a forward-only
//      graph (models/training_graph.h: build_sequence_log_probs_graph), or, with
//      precompute_ref_log_probs, looked up from a pass over the dataset made before training;
//      SimPO and ORPO have no reference at all; KTO also scores mismatched prompt-completion
//      rows with the policy and the reference (its KL reference point, kto_kl.h);
//   2. the policy's joint graph: model + sequence log-probs + the preference loss + backward.
// Under compile: true both graphs fuse the head with log_softmax and the label gather
// (compile/fuse_linear_log_probs), so no [tokens x vocab] tensor exists in either pass.
// Metrics, as torchtune logs them: rewards/{chosen,rejected,accuracies,margins},
// log_probs/{chosen,rejected} (summed per sequence, or under SimPO the per-token mean the
// loss uses, as torchtune's recipe and TRL log it; averaged over pairs) and
// logits/{chosen,rejected} (mean logit over the response tokens and the vocabulary, as TRL);
// each as a sum and a count, so the logged value is over the step's pairs on all ranks.
#include <functional>
#include <memory>
#include <string>

#include <optional>
#include "fusetune/config/config.h"

#include "fusetune/data/datasets/preference.h"
#include "fusetune/data/loader.h"
#include "fusetune/distributed/communicator.h"
#include "fusetune/losses/preference.h"
#include "fusetune/recipes/sft_step.h"

namespace fusetune {

struct DpoStepOptions {
  ModelStepOptions policy;  // the trained model (its params, hooks, passes)
  PreferenceLoss loss;
  // The reference model: its params (full DPO: a frozen copy; LoRA: the policy's own, read
  // through hooks without the adapters) and hooks. Unused by SimPO.
  const TensorMap* ref_params = nullptr;
  // ZeRO-3 full DPO: the frozen reference copy sharded as the policy is
  // (distributed/sharded_params.h), each tensor gathered from its owner at use; read instead of
  // ref_params.
  std::optional<ParamSource> ref_source;
  LlamaOptions ref_llama;
  // precompute_ref_log_probs: one reference pass over `pairs` before training; with ranks,
  // each computes a share of its batches and all end with the whole table.
  bool precompute_ref = false;
  const PreferenceDataset* pairs = nullptr;
  LoaderOptions loader;                         // batch size and padding of the pass
  std::function<void(const std::string&)> log;  // where the precompute pass reports
  dist::Communicator* comm = nullptr;           // the ranks; null: one process
};

std::unique_ptr<TrainingStep> make_dpo_step(DpoStepOptions opts);

// Adds what a DPO step graph reads beside the batch's tensors: `response_mask` (1 on each
// row's response tokens) and `inv_response_len` (1 / their count per row). A row without a
// response token is an error unless !require_response (then its 1 / count is 0).
void add_response_inputs(const Batch& b, TensorMap& in, bool require_response = true);

// The loss component the config names under `loss` (DPOLoss, RSOLoss, IPOLoss, SimPOLoss,
// ORPOLoss, KTOLoss and their aliases), with its keys.
PreferenceLoss preference_loss_from(const Config& cfg);

}  // namespace fusetune
