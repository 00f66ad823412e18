#pragma once
// Multiple-choice tasks from a local JSON/JSONL file, in the layouts lm-evaluation-harness reads
// (its doc_to_text / doc_to_choice / doc_to_target, reproduced so scores are comparable):
//   HellaSwag  {ctx_a, ctx_b, activity_label, endings, label} (or ctx instead of ctx_a/ctx_b):
//              context = preprocess(activity_label + ": " + ctx_a + " " + capitalize(ctx_b)),
//              choices = preprocess(endings), where preprocess strips, turns " [title]" into
//              ". ", drops "[...]" and collapses double spaces
//   ARC        {question, choices: {text, label}, answerKey}: context = "Question: " +
//              question + "\nAnswer:", gold = the index of answerKey among the labels
//   generic    {context (or query), choices, gold}
// Each choice is scored as the continuation " " + choice (the harness's target delimiter).
#include <string>
#include <vector>

namespace fusetune {

struct MultipleChoiceQuestion {
  std::string context;
  std::vector<std::string> choices;  // without the leading delimiter
  int gold = 0;
  std::string where;  // "task.jsonl line 3"
};

// Throws fusetune::Error naming the file and line of a row it cannot read.
std::vector<MultipleChoiceQuestion> load_multiple_choice(const std::string& path);

// The harness's HellaSwag text cleanup (see above).
std::string hellaswag_preprocess(const std::string& text);

}  // namespace fusetune
