// fusetune generate --config CONFIG [--adapter DIR] [key=value | ~key ...]
#include <cstdio>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/recipes/generate.h"
#include "fusetune/util/error.h"

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
  Args a = parse_args(argv, {{"config", "adapter"}, {}, true});
  FT_CHECK(a.positional.empty(), "unexpected argument '" + a.positional[0] +
                                     "': overrides are key=value, deletions ~key");
  if (a.options.count("adapter")) a.overrides.push_back("adapter=" + a.option("adapter"));
  Config cfg = prepare_recipe_config("generate", a, "fusetune generate --config CONFIG");
  return generate_recipe(cfg);
}

}  // namespace fusetune::cli
