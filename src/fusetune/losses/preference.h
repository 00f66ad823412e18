#pragma once
// Preference losses (DPO and its relatives) over per-sequence log-probabilities, written the
// way eager PyTorch runs them: logits = h W^T (materialized), log_softmax, the labels'
// log-probs gathered, summed per sequence. `compile: true` fuses the head, log_softmax and
// gather into one chunked kernel (compile/fuse_linear_log_probs); the rest is a few ops on
// [B] vectors.
//
// A batch holds 2B rows: the B chosen answers, then the B rejected ones (torchtune's
// padded_collate_dpo). With pc, pr the policy's and rc, rr the reference's summed response
// log-probs, and d = (pc - pr) - (rc - rr):
//   DPO   (Rafailov et al. 2023; label_smoothing e = the conservative/robust variant)
//         loss = -(1 - e) log sigmoid(beta d) - e log sigmoid(-beta d); rewards beta (p - r)
//   RSO   (Liu et al. 2023, hinge)   loss = relu(1 - gamma d);            rewards gamma (p - r)
//   IPO   (Azar et al. 2023)         loss = (d - 1 / (2 tau))^2;          rewards tau (p - r)
//   SimPO (Meng et al. 2024, no reference): with pc, pr the *mean* response log-probs,
//         d = pc - pr - gamma / beta; loss as DPO's;                      rewards beta p
//   ORPO  (Hong et al. 2024, no reference; TRL's ORPOTrainer): with pc, pr the mean response
//         log-probs, log odds(p) = p - log(1 - exp(p)) and lo = odds(pc) - odds(pr),
//         loss = -pc - beta log sigmoid(lo): the chosen answer's mean token NLL plus the
//         odds-ratio term;                                                rewards beta p
//         (TRL averages the NLL over all chosen tokens of a batch, prompts included; here it is
//         each pair's over its response, the paper's L_SFT, so pairs add up across micro-batches.)
//   KTO   (Ethayarajh et al. 2024; TRL's KTOTrainer on paired data split into a desirable and
//         an undesirable example): with z the KL reference point (an input: the policy's and
//         reference's summed log-prob difference on mismatched prompt-completion rows, averaged,
//         detached and clamped at 0; recipes/dpo_step.cpp), the examples' losses are
//         w_d (1 - sigmoid(beta ((pc - rc) - z))) and w_u (1 - sigmoid(beta (z - (pr - rr)))),
//         a pair's loss their mean (TRL: the mean over examples);      rewards beta (p - r)
//         Unpaired (TRL's prompt / completion / label rows, `unpaired`): each of the R rows is
//         one example, its kind given by the input `desirable` [R] (1 or 0), its loss
//         w_d (1 - sigmoid(beta ((p - r) - z))) when desirable, else
//         w_u (1 - sigmoid(beta (z - (p - r)))); the loss is their sum, so with `scale` = 1 /
//         the optimizer step's rows it is TRL's mean over examples;       rewards beta (p - r)
// The step's loss is the sum over pairs times `scale` (1 / pairs in the optimizer step).
#include <string>

#include "fusetune/graph/builder.h"

namespace fusetune {

enum class PreferenceLossKind { DPO, RSO, IPO, SimPO, ORPO, KTO };

struct PreferenceLoss {
  PreferenceLossKind kind = PreferenceLossKind::DPO;
  double beta = 0.1;                // DPO, SimPO, ORPO (the odds-ratio weight, the paper's lambda)
  double label_smoothing = 0.0;     // DPO, SimPO
  double gamma = 0.1;               // RSO (hinge), SimPO (target margin)
  double tau = 0.1;                 // IPO
  double desirable_weight = 1.0;    // KTO: the chosen (desirable) examples' weight
  double undesirable_weight = 1.0;  // KTO: the rejected (undesirable) examples'
  // KTO on unpaired rows (the batch's per-row desirable mask) instead of B chosen + B rejected.
  bool unpaired = false;
  bool needs_reference() const {
    return kind != PreferenceLossKind::SimPO && kind != PreferenceLossKind::ORPO;
  }
  bool length_normalized() const {
    return kind == PreferenceLossKind::SimPO || kind == PreferenceLossKind::ORPO;
  }
  const char* name() const;  // "DPOLoss", ...
};

// Per-row label log-probs of the model's output, summed per sequence: hidden [N, D] and head
// W [V, D] (or logits [N, V] when the model computed them itself), labels [N] (-100 ignored),
// response_mask [N] (1 where a label is trained on). Returns logps [rows] and logit_sums
// [rows] (the sum of the response tokens' logits over the vocabulary, for the logits/*
// metrics); rows = N / seq_len.
struct SequenceLogProbs {
  Value logps;
  Value logit_sums;
};
SequenceLogProbs build_sequence_log_probs(Builder& b, Value hidden, Value head, Value logits,
                                          Value labels, Value response_mask, int64_t rows);

// The loss of `policy_logps` [2B] against `ref_logps` [2B] (invalid without a reference);
// inv_lengths [2B] = 1 / response tokens per row (SimPO's mean log-probs); scale []; kl [] KTO's
// reference point. Unpaired KTO: [R] rows of either kind, `desirable` [R] 1 or 0 per row.
struct PreferenceLossOutputs {
  Value loss;              // []
  Value chosen_rewards;    // [B] (paired)
  Value rejected_rewards;  // [B] (paired)
  Value rewards;           // [R] (unpaired KTO: each row's, its kind in `desirable`)
};
PreferenceLossOutputs build_preference_loss(Builder& b, const PreferenceLoss& loss,
                                            Value policy_logps, Value ref_logps, Value inv_lengths,
                                            Value scale, Value kl = {}, Value desirable = {});

}  // namespace fusetune
