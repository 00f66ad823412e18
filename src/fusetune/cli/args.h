#pragma once
// Argument parsing shared by the subcommands: positionals, `--name value` / `--name=value`
// options, `--flag` switches, and config overrides (`key=value`, `~key`).
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fusetune::cli {

struct ArgSpec {
  std::vector<std::string> options;  // take a value: "config", "recipe"
  std::vector<std::string> flags;    // switches: "force"
  bool overrides = false;            // collect key=value / ~key (else they are positionals)
};

struct Args {
  std::vector<std::string> positional;
  std::vector<std::string> overrides;
  std::map<std::string, std::string> options;
  std::set<std::string> flags;
  bool help = false;  // -h / --help anywhere

  bool flag(const std::string& name) const { return flags.count(name) > 0; }
  // The option's value, or "" when absent.
  std::string option(const std::string& name) const;
};

// `--nproc_per_node N`: N (a whole number >= 1, else an Error), or 0 when absent.
int nproc_per_node(const Args& a);
// --nproc_per_node applies to *_distributed recipes only; `what` is the verb ("runs", "plans").
void check_distributed_recipe(const std::string& recipe, const std::string& what);

// Parses `args` (the words after the subcommand). Unknown `--options` are an Error naming the
// closest known one.
Args parse_args(const std::vector<std::string>& args, const ArgSpec& spec);

}  // namespace fusetune::cli
