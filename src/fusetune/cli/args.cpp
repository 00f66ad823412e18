#include "fusetune/cli/args.h"

#include <exception>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

std::string Args::option(const std::string& name) const {
  auto it = options.find(name);
  return it == options.end() ? "" : it->second;
}

int nproc_per_node(const Args& a) {
  if (!a.options.count("nproc_per_node")) return 0;
  const std::string n = a.option("nproc_per_node");
  int nproc = 0;
  try {
    size_t used = 0;
    nproc = std::stoi(n, &used);
    if (used != n.size()) nproc = 0;
  } catch (const std::exception&) {
    nproc = 0;
  }
  FT_CHECK(nproc >= 1, "--nproc_per_node must be a whole number >= 1, got '" + n + "'");
  return nproc;
}

void check_distributed_recipe(const std::string& recipe, const std::string& what) {
  const std::string suffix = "_distributed";
  FT_CHECK(recipe.size() > suffix.size() &&
               recipe.compare(recipe.size() - suffix.size(), suffix.size(), suffix) == 0,
           "--nproc_per_node " + what + " a *_distributed recipe as ranks; " + recipe +
               " trains in one process (its distributed counterpart, if fusetune has it, is "
               "listed by `fusetune ls`)");
}

namespace {
bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}
}  // namespace

Args parse_args(const std::vector<std::string>& args, const ArgSpec& spec) {
  Args out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      out.help = true;
    } else if (starts_with(a, "--") && a.size() > 2) {
      std::string name = a.substr(2), value;
      size_t eq = name.find('=');
      bool inline_value = eq != std::string::npos;
      if (inline_value) {
        value = name.substr(eq + 1);
        name.resize(eq);
      }
      if (contains(spec.options, name)) {
        if (!inline_value) {
          FT_CHECK(i + 1 < args.size(), "option --" + name + " needs a value");
          value = args[++i];
        }
        FT_CHECK(!out.options.count(name), "option --" + name + " given twice");
        out.options[name] = value;
      } else if (contains(spec.flags, name)) {
        FT_CHECK(!inline_value, "option --" + name + " takes no value");
        out.flags.insert(name);
      } else {
        std::vector<std::string> known = spec.options;
        known.insert(known.end(), spec.flags.begin(), spec.flags.end());
        known.push_back("help");
        std::string msg = "unknown option '--" + name + "'";
        std::string near = closest_match(name, known);
        if (!near.empty()) msg += " (did you mean '--" + near + "'?)";
        throw Error(msg);
      }
    } else if (spec.overrides && (a.find('=') != std::string::npos || starts_with(a, "~"))) {
      out.overrides.push_back(a);
    } else {
      out.positional.push_back(a);
    }
  }
  return out;
}

}  // namespace fusetune::cli
