#pragma once
// The config schemas of the inference recipes: `generate` (torchtune's generate recipe and
// its keys) and `eval` (perplexity and multiple-choice accuracy). They share the model,
// checkpointer and tokenizer sections of the training recipes.
#include "fusetune/config/schema.h"

namespace fusetune {

const Schema& generate_schema();
const Schema& eval_schema();

}  // namespace fusetune
