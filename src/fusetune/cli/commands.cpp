#include "fusetune/cli/commands.h"

#include <cstdio>
#include <string>

#include "fusetune/cli/command.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"run", "Run a recipe with a config (and key=value overrides)", kRunHelp, cmd_run},
      {"ls", "List the recipes and their built-in configs", kLsHelp, cmd_ls},
      {"cp", "Copy a built-in config to a file you can edit", kCpHelp, cmd_cp},
      {"validate", "Check a config against a recipe's schema", kValidateHelp, cmd_validate},
      {"plan", "Show the compiled step and its peak memory for each compile mode, without training", kPlanHelp, cmd_plan},
      {"merge", "Merge a PEFT LoRA/DoRA adapter into its base checkpoint", kMergeHelp, cmd_merge},
      {"generate", "Generate text from a model (and adapter) with a KV cache", kGenerateHelp, cmd_generate},
      {"eval", "Perplexity or multiple-choice accuracy of a model (and adapter)", kEvalHelp, cmd_eval},
      {"report", "Compare runs' curves and headers in one HTML page", kReportHelp, cmd_report},
      {"init-checkpoint", "Write a randomly initialized model as a Hugging Face checkpoint", kInitCheckpointHelp, cmd_init_checkpoint},
      {"quantize", "Quantize a checkpoint with llama.cpp's schemes (q4_0, q8_0, f16)", kQuantizeHelp, cmd_quantize},
      {"export", "Export a checkpoint as a GGUF file for llama.cpp", kExportHelp, cmd_export},
  };
  return table;
}

void print_warnings(const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) std::fprintf(stderr, "fusetune: warning: %s\n", w.c_str());
}

namespace {

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: fusetune <command> [args]\n\n"
               "Fine-tunes Llama-family language models; the model, the loss and the backward\n"
               "compile together as one graph. Recipes and configs follow torchtune.\n\n"
               "commands:\n");
  for (const auto& c : commands()) std::fprintf(out, "  %-15s %s\n", c.name, c.summary);
  std::fprintf(out, "\nRun 'fusetune <command> --help' for a command's arguments.\n");
}

const Command* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 1;
  }
  std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (name == "-h" || name == "--help") {
    print_usage(stdout);
    return 0;
  }
  if (name == "help") {
    if (args.empty()) {
      print_usage(stdout);
      return 0;
    }
    name = args[0];
    args = {"--help"};
  }
  const Command* cmd = find_command(name);
  if (!cmd) {
    std::vector<std::string> names;
    for (const auto& c : commands()) names.push_back(c.name);
    std::string msg = "unknown command '" + name + "'";
    std::string near = closest_match(name, names);
    if (!near.empty()) msg += " (did you mean '" + near + "'?)";
    throw Error(msg + "; commands: " + join(names, ", ") + " (see fusetune --help)");
  }
  for (const auto& a : args) {
    if (a == "-h" || a == "--help") {
      std::fputs(cmd->help, stdout);
      return 0;
    }
  }
  return cmd->run(args);
}

}  // namespace fusetune::cli
