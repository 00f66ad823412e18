// fusetune generate --config CONFIG [--adapter DIR] [key=value | ~key ...]
#include "fusetune/cli/command.h"
#include "fusetune/recipes/generate.h"

namespace fusetune::cli {

const char* const kGenerateHelp =
    "usage: fusetune generate --config CONFIG [--adapter DIR] [key=value | ~key ...]\n"
    "\n"
    "Generates an answer to the config's prompt (torchtune's generate recipe and keys:\n"
    "checkpointer, tokenizer, prompt.system / prompt.user, max_new_tokens, temperature,\n"
    "top_k, top_p, seed, enable_kv_cache). The prompt is rendered with the chat template the\n"
    "datasets use (key template, default auto); a plain-text prompt is continued as it is.\n"
    "The answer streams to stdout; prefill and decode tokens/s go to stderr. A list of user\n"
    "messages is generated as one left-padded batch.\n"
    "\n"
    "  --adapter DIR  apply a PEFT LoRA/DoRA adapter (a fine-tune's epoch_N directory)\n"
    "                 without merging it (same as adapter=DIR)\n"
    "\n"
    "Example: fusetune generate --config stories260K/generation prompt=\"Once upon a time\"\n";

int cmd_generate(const std::vector<std::string>& argv) {
  return generate_recipe(
      prepare_inference_config("generate", argv, "fusetune generate --config CONFIG"));
}

}  // namespace fusetune::cli
