// fusetune report RUN_DIR... [-o FILE]: the runs' curves and headers as one HTML page.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fusetune/cli/args.h"
#include "fusetune/cli/command.h"
#include "fusetune/metrics/report.h"
#include "fusetune/util/error.h"

namespace fusetune::cli {

namespace fs = std::filesystem;

const char* const kReportHelp =
    "usage: fusetune report RUN_DIR... [-o FILE]\n"
    "\n"
    "Writes one self-contained HTML page (inline SVG, no network) comparing the runs: their\n"
    "loss, validation loss, learning rate, tokens/s and peak memory curves overlaid, one chart\n"
    "per metric (a metric no run logged has no chart), and their run headers side by side.\n"
    "RUN_DIR is a training run's output_dir (read: logs/metrics.jsonl and the header of the\n"
    "newest logs/log_<unix>.txt) or a log directory holding metrics.jsonl itself.\n"
    "\n"
    "  -o, --output FILE   where to write the page (default: report.html in the current\n"
    "                      directory; an existing file is replaced)\n";

int cmd_report(const std::vector<std::string>& argv) {
  std::vector<std::string> words;
  for (const std::string& w : argv) words.push_back(w == "-o" ? "--output" : w);
  Args a = parse_args(words, {{"output"}, {}, false});
  FT_CHECK(!a.positional.empty(), "missing RUN_DIR; usage: fusetune report RUN_DIR... [-o FILE]");
  std::vector<RunRecord> runs;
  for (const std::string& dir : a.positional) runs.push_back(read_run(dir));
  const Report report = render_report(runs);

  const fs::path out =
      a.option("output").empty() ? fs::path("report.html") : fs::path(a.option("output"));
  std::error_code ec;
  FT_CHECK(!fs::is_directory(out, ec),
           "cannot write the report to '" + out.string() + "': it is a directory");
  const fs::path parent = out.parent_path();
  FT_CHECK(parent.empty() || fs::is_directory(parent, ec),
           "cannot write the report to '" + out.string() + "': directory '" + parent.string() +
               "' does not exist");
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  FT_CHECK(f, "cannot write the report to '" + out.string() + "'");
  f.write(report.html.data(), static_cast<std::streamsize>(report.html.size()));
  f.close();
  FT_CHECK(f, "cannot write the report to '" + out.string() + "'");
  std::printf("wrote %s: %zu run%s, %zu chart%s, %zu points\n", out.string().c_str(), runs.size(),
              runs.size() == 1 ? "" : "s", report.charts, report.charts == 1 ? "" : "s",
              report.points);
  return 0;
}

}  // namespace fusetune::cli
