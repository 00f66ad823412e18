// eval: perplexity (task: perplexity) or multiple-choice accuracy (task: multiple_choice).
#include "fusetune/recipes/evaluate.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "fusetune/compile/compiler.h"
#include "fusetune/data/collate.h"
#include "fusetune/data/multiple_choice.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"

namespace fusetune {
namespace {

// Collates `samples` into batches of at most `batch_size` and returns
// every row's summed label log-prob.
std::vector<double> score_samples(SequenceScorer& scorer, const std::vector<const Sample*>& samples,
                                  int64_t batch_size, const CollateOptions& opts) {
  std::vector<double> out;
  for (size_t i = 0; i < samples.size(); i += size_t(batch_size)) {
    const size_t end = std::min(samples.size(), i + size_t(batch_size));
    std::vector<const Sample*> items(samples.begin() + long(i), samples.begin() + long(end));
    const std::vector<double> l = scorer.logps(collate(items, opts));
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Context and continuation as one sample whose labels are the continuation's tokens (as
// lm-evaluation-harness splits them: the continuation is what the whole text has beyond the
// context's own encoding). Cut from the left to max_len.
Sample choice_sample(const Tokenizer& tok, const std::string& context, const std::string& choice,
                     int64_t max_len, const std::string& where) {
  const bool bos = tok.default_add_bos();
  std::vector<int32_t> ctx = tok.encode(context, bos, false);
  std::vector<int32_t> whole = tok.encode(context + " " + choice, bos, false);
  size_t split = ctx.size();
  if (split > whole.size() || !std::equal(ctx.begin(), ctx.end(), whole.begin()))
    split = std::min(split, whole.size() - 1);  // the boundary merged: keep the count
  FT_CHECK(split < whole.size(), where + ": the choice '" + choice + "' encodes to no tokens");
  Sample s;
  s.tokens = whole;
  s.labels.assign(whole.size(), kIgnoreIndex);
  for (size_t i = split; i < whole.size(); ++i) s.labels[i] = whole[i];
  if (max_len > 0 && int64_t(s.tokens.size()) > max_len) {
    const int64_t cut = int64_t(s.tokens.size()) - max_len;
    FT_CHECK(int64_t(split) >= cut, where + ": a choice alone is longer than max_seq_len");
    s.tokens.erase(s.tokens.begin(), s.tokens.begin() + cut);
    s.labels.erase(s.labels.begin(), s.labels.begin() + cut);
  }
  return s;
}

}  // namespace

std::vector<double> SequenceScorer::logps(const Batch& batch) {
  const int64_t B = batch.batch_size, T = batch.seq_len;
  const bool packed = !batch.doc_ids.empty();
  auto& ex = graphs_[{B, T, packed}];
  if (!ex) {
    PassOptions po;
    po.mode = m_.mode;
    ex = compile_graph(
             build_sequence_log_probs_graph(m_.model.config, B, T, m_.dtype, m_.llama, packed), po,
             arena_)
             .executor;
  }
  Tensor mask = Tensor::empty({B * T}, compute_dtype(m_.dtype));
  for (int64_t i = 0; i < B * T; ++i) {
    const double v = batch.labels[size_t(i)] != kIgnoreIndex ? 1.0 : 0.0;
    if (m_.dtype == DType::F64)
      mask.data<double>()[i] = v;
    else
      mask.data<float>()[i] = float(v);
  }
  TensorMap in = batch_inputs(batch);
  in["response_mask"] = mask;
  Tensor logps = ex->run(in, m_.model.params)[0];
  std::vector<double> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) out[size_t(b)] = element_as_double(logps, b);
  return out;
}

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

PerplexityResult evaluate_perplexity(const Config& cfg, const InferenceModel& m,
                                     const Tokenizer& tok) {
  FT_CHECK(cfg.has("dataset"), "task: perplexity needs a dataset section (the data to score)");
  auto ds = build_dataset_from_config(cfg, tok, m.model.config, "dataset");
  const int64_t n = std::min(ds->size(), cfg.i64("limit", ds->size()));
  std::vector<const Sample*> samples;
  for (int64_t i = 0; i < n; ++i) samples.push_back(&ds->get(i));
  const CollateOptions opts = loader_options_from(cfg, tok).collate;
  SequenceScorer scorer(m);
  PerplexityResult r;
  r.samples = n;
  const std::vector<double> l = score_samples(scorer, samples, cfg.i64("batch_size", 8), opts);
  for (int64_t i = 0; i < n; ++i) {
    const Batch one = collate({samples[size_t(i)]}, opts);
    r.tokens += one.num_valid_labels();
    r.nll_sum -= l[size_t(i)];
  }
  FT_CHECK(r.tokens > 0, "the dataset has no labelled tokens to score");
  return r;
}

MultipleChoiceResult evaluate_multiple_choice(const Config& cfg, const InferenceModel& m,
                                              const Tokenizer& tok) {
  FT_CHECK(cfg.has("task_file"), "task: multiple_choice needs task_file (a JSONL task)");
  std::vector<MultipleChoiceQuestion> qs = load_multiple_choice(cfg.str("task_file"));
  if (cfg.has("limit") && int64_t(qs.size()) > cfg.i64("limit"))
    qs.resize(size_t(cfg.i64("limit")));
  const CollateOptions opts = loader_options_from(cfg, tok).collate;
  std::vector<Sample> rows;
  for (const auto& q : qs)
    for (const auto& c : q.choices)
      rows.push_back(choice_sample(tok, q.context, c, opts.max_seq_len, q.where));
  std::vector<const Sample*> ptrs;
  for (const auto& s : rows) ptrs.push_back(&s);
  SequenceScorer scorer(m);
  const std::vector<double> l = score_samples(scorer, ptrs, cfg.i64("batch_size", 8), opts);
  MultipleChoiceResult r;
  size_t at = 0;
  for (const auto& q : qs) {
    // acc: the highest summed log-prob; acc_norm: the highest per character of the choice.
    size_t best = 0, best_norm = 0;
    std::vector<double> norm;
    for (size_t c = 0; c < q.choices.size(); ++c)
      norm.push_back(l[at + c] / double(std::max<int64_t>(1, utf8_length(q.choices[c]))));
    for (size_t c = 1; c < q.choices.size(); ++c) {
      if (l[at + c] > l[at + best]) best = c;
      if (norm[c] > norm[best_norm]) best_norm = c;
    }
    at += q.choices.size();
    ++r.questions;
    r.correct += int(best) == q.gold;
    r.correct_norm += int(best_norm) == q.gold;
  }
  return r;
}

int eval_recipe(const Config& cfg) {
  InferenceModel m = load_inference_model(cfg);
  auto tok = build_inference_tokenizer(cfg, m.model.config);
  nlohmann::json j;
  j["model"] = m.description;
  if (cfg.str("task") == "perplexity") {
    const PerplexityResult r = evaluate_perplexity(cfg, m, *tok);
    std::printf("perplexity: %.6g (mean NLL %.6f over %lld tokens, %lld samples) | %s\n",
                r.perplexity(), r.mean_nll(), (long long)r.tokens, (long long)r.samples,
                m.description.c_str());
    j.update({{"task", "perplexity"},
              {"perplexity", r.perplexity()},
              {"mean_nll", r.mean_nll()},
              {"tokens", r.tokens},
              {"samples", r.samples}});
  } else {
    const MultipleChoiceResult r = evaluate_multiple_choice(cfg, m, *tok);
    std::printf("%s: acc %.4f, acc_norm %.4f (%lld questions) | %s\n", cfg.str("task_file").c_str(),
                r.acc(), r.acc_norm(), (long long)r.questions, m.description.c_str());
    j.update({{"task", "multiple_choice"},
              {"task_file", cfg.str("task_file")},
              {"acc", r.acc()},
              {"acc_norm", r.acc_norm()},
              {"questions", r.questions}});
  }
  if (cfg.has("output_dir")) {
    const std::filesystem::path dir = cfg.str("output_dir");
    std::filesystem::create_directories(dir);
    write_file_atomic(dir / "eval.json", j.dump(2) + "\n");
    std::printf("wrote %s\n", (dir / "eval.json").c_str());
  }
  return 0;
}

}  // namespace fusetune
