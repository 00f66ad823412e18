// `fusetune report` in a real browser: headless Chromium (Debian's `chromium`) loads the page
// the binary wrote; the page's own script, run after layout, counts per chart and run the
// point markers that have a box inside their chart, and the test reads those counts back from
// the DOM Chromium dumps and compares them with what the runs logged. Skipped (failed under
// FUSETUNE_REQUIRE_ASSETS=1) when chromium is absent: `scripts/install_deps.sh
// --with-reference` installs it. $FUSETUNE_CHROMIUM names another binary.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "files.h"
#include "report_support.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::read_text;
using fusetune::testing::TempDir;
using fusetune::testing::write_synthetic_run;

namespace {

std::string chromium() {
  const char* env = std::getenv("FUSETUNE_CHROMIUM");
  return env && *env ? env : "chromium";
}

// Runs `cmd` through the shell; its exit status, -1 when it did not exit.
int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The text of the element with id `id` in serialized HTML (no nested elements).
std::string element_text(const std::string& html, const std::string& id) {
  const size_t at = html.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t open_end = html.find('>', at);
  const size_t close = html.find("</", open_end);
  return html.substr(open_end + 1, close - open_end - 1);
}

}  // namespace

TEST(ReportChromium, CountsThePlottedPointsAfterLayout) {
  if (shell("'" + chromium() + "' --version >/dev/null 2>&1") != 0)
    FT_SKIP_UNLESS_REQUIRED(
        "chromium is not installed (scripts/install_deps.sh --with-reference installs it; "
        "$FUSETUNE_CHROMIUM names another binary)");
  TempDir tmp;
  // The three compile modes of one config, as a comparison would have them; the last logged
  // no memory and no validation, so it is absent from those charts.
  write_synthetic_run(tmp / "eager", 40, true, 10, "false");
  write_synthetic_run(tmp / "model", 40, true, 10, "model");
  write_synthetic_run(tmp / "fused", 25, false, 0, "true");
  const fs::path page = tmp / "report.html";
  const std::string report = "cd '" + tmp.path().string() + "' && '" +
                             ::fusetune::testing::binary_path() +
                             "' report eager model fused -o report.html >report.log 2>&1";
  ASSERT_EQ(shell(report), 0) << read_text(tmp / "report.log");

  // Headless, without the sandbox (it cannot start as root in a container), with a profile of
  // its own; --dump-dom prints the DOM once the page has loaded and its script has run.
  const fs::path dom = tmp / "dom.html", log = tmp / "chromium.log";
  const std::string cmd = "timeout 120 '" + chromium() +
                          "' --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
                          "--no-first-run --user-data-dir='" +
                          (tmp / "profile").string() +
                          "' --window-size=1400,2000 --dump-dom 'file://" + page.string() + "' >'" +
                          dom.string() + "' 2>'" + log.string() + "'";
  ASSERT_EQ(shell(cmd), 0) << cmd << "\n" << read_text(log);
  const std::string html = read_text(dom);
  const std::string counts_text = element_text(html, "render-counts");
  ASSERT_FALSE(counts_text.empty()) << "the page's script did not run:\n" << read_text(log);
  const nlohmann::json counts = nlohmann::json::parse(counts_text);

  const nlohmann::json expected = {
      {"loss", {{"0", 40}, {"1", 40}, {"2", 25}}},
      {"val_loss", {{"0", 4}, {"1", 4}, {"2", 0}}},
      {"lr", {{"0", 40}, {"1", 40}, {"2", 25}}},
      {"tokens_per_second_per_gpu", {{"0", 40}, {"1", 40}, {"2", 25}}},
      {"peak_memory_alloc_bytes", {{"0", 40}, {"1", 40}, {"2", 0}}},
  };
  EXPECT_EQ(counts, expected) << counts.dump();
  EXPECT_NE(element_text(html, "render-check").find("403 points drawn in 5 charts"),
            std::string::npos)
      << element_text(html, "render-check");
}
