// fusetune eval --config CONFIG [--adapter DIR] [key=value | ~key ...]
#include "fusetune/cli/command.h"
#include "fusetune/recipes/evaluate.h"

namespace fusetune::cli {

const char* const kEvalHelp =
    "usage: fusetune eval --config CONFIG [--adapter DIR] [key=value | ~key ...]\n"
    "\n"
    "Evaluates a model (a base checkpoint, a fine-tuned one, or either with an adapter):\n"
    "  task: perplexity       over `dataset` (any dataset the training recipes read: text,\n"
    "                         instruct, chat); prints the perplexity and mean NLL per token\n"
    "  task: multiple_choice  over `task_file`, a JSONL in lm-evaluation-harness's HellaSwag\n"
    "                         or ARC layout, or {context, choices, gold}; prints acc (highest\n"
    "                         summed log-prob) and acc_norm (highest per character)\n"
    "Scores come from the fused head + log-softmax kernels under compile: true (the default).\n"
    "limit=N scores only the first N samples or questions; output_dir=DIR writes eval.json.\n"
    "\n"
    "  --adapter DIR  apply a PEFT LoRA/DoRA adapter without merging it (same as adapter=DIR)\n";

int cmd_eval(const std::vector<std::string>& argv) {
  return eval_recipe(prepare_inference_config("eval", argv, "fusetune eval --config CONFIG"));
}

}  // namespace fusetune::cli
