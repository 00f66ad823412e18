#pragma once
// The subcommand table. To add one (plan, bench, merge, generate ...): write
// cli/cmd_<name>.cpp defining `int cmd_<name>(const std::vector<std::string>& args)` and its
// help text, declare both here, and add a row to commands() in commands.cpp.
#include <string>
#include <vector>

#include "fusetune/config/config.h"

namespace fusetune::cli {

struct Command {
  const char* name;
  const char* summary;                               // one line for `fusetune --help`
  const char* help;                                  // the full `fusetune <name> --help` text
  int (*run)(const std::vector<std::string>& args);  // args: the words after the name
};

const std::vector<Command>& commands();

int cmd_run(const std::vector<std::string>& args);
int cmd_ls(const std::vector<std::string>& args);
int cmd_cp(const std::vector<std::string>& args);
int cmd_validate(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
int cmd_merge(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);
int cmd_init_checkpoint(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_quantize(const std::vector<std::string>& args);
extern const char* const kRunHelp;
extern const char* const kLsHelp;
extern const char* const kCpHelp;
extern const char* const kValidateHelp;
extern const char* const kPlanHelp;

struct Args;
// Loads CONFIG, applies the overrides, resolves ${...}, validates against the recipe's schema
// (warnings to stderr) and fills defaults: the config a recipe (or `plan`) receives.
Config prepare_recipe_config(const std::string& recipe_name, const Args& a, const char* usage);
// The same for the inference commands (generate, eval): `--config CONFIG [--adapter DIR]
// [key=value | ~key ...]`, --adapter DIR being the override adapter=DIR.
Config prepare_inference_config(const std::string& recipe_name,
                                const std::vector<std::string>& argv, const char* usage);
extern const char* const kMergeHelp;
extern const char* const kGenerateHelp;
extern const char* const kEvalHelp;
extern const char* const kReportHelp;
extern const char* const kInitCheckpointHelp;
extern const char* const kExportHelp;
extern const char* const kQuantizeHelp;

// Prints warnings from validation to stderr, one "fusetune: warning: ..." line each.
void print_warnings(const std::vector<std::string>& warnings);

}  // namespace fusetune::cli
