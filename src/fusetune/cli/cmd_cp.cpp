// fusetune cp CONFIG DEST: writes a built-in config, comments included, to a file to edit.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/config/builtin_configs.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::cli {

namespace fs = std::filesystem;

const char* const kCpHelp =
    "usage: fusetune cp CONFIG DEST [--force] [--make-parents]\n"
    "\n"
    "Copies the built-in config CONFIG (see `fusetune ls`) to DEST. DEST may be a directory\n"
    "(the file keeps its name); without an extension, .yaml is added. An existing file is\n"
    "not overwritten unless --force is given; --make-parents creates missing directories.\n";

int cmd_cp(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {{}, {"force", "make-parents"}, false});
  FT_CHECK(a.positional.size() == 2, "usage: fusetune cp CONFIG DEST [--force] [--make-parents]");
  const std::string& name = a.positional[0];
  std::string stem = name;
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".yaml") == 0)
    stem.resize(stem.size() - 5);
  const BuiltinConfig* cfg = find_builtin_config(stem);
  if (!cfg) {
    std::vector<std::string> names;
    for (const auto& c : builtin_configs()) names.push_back(c.name);
    std::string msg = "no built-in config '" + name + "'";
    std::string near = closest_match(stem, names);
    if (!near.empty()) msg += " (did you mean '" + near + "'?)";
    throw Error(msg + "; `fusetune ls` lists them");
  }

  fs::path dest = a.positional[1];
  std::error_code ec;
  if (fs::is_directory(dest, ec))
    dest /= fs::path(cfg->name).filename().string() + ".yaml";
  else if (!dest.has_extension())
    dest += ".yaml";
  FT_CHECK(!fs::is_directory(dest, ec),
           "cannot copy to '" + dest.string() + "': it is a directory");
  if (fs::exists(dest, ec) && !a.flag("force"))
    throw Error("'" + dest.string() + "' already exists; pass --force to overwrite it");
  fs::path parent = dest.parent_path();
  if (!parent.empty() && !fs::exists(parent, ec)) {
    FT_CHECK(a.flag("make-parents"), "cannot copy to '" + dest.string() + "': directory '" +
                                         parent.string() +
                                         "' does not exist (pass --make-parents to create it)");
    fs::create_directories(parent, ec);
    FT_CHECK(!ec, "cannot create directory '" + parent.string() + "': " + ec.message());
  }
  std::ofstream out(dest, std::ios::binary | std::ios::trunc);
  FT_CHECK(out, "cannot write '" + dest.string() + "'");
  out.write(cfg->text.data(), static_cast<std::streamsize>(cfg->text.size()));
  out.close();
  FT_CHECK(out, "cannot write '" + dest.string() + "'");
  std::printf("Copied file to %s\n", dest.string().c_str());
  return 0;
}

}  // namespace fusetune::cli
