// fusetune report: run directories read back (metrics.jsonl, the log header), the HTML page
// with one SVG chart per metric and one <circle class="pt"> per logged value, errors that name
// the path and line, escaping, self-containment, and the CLI command.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checks.h"
#include "cli_runner.h"
#include "files.h"
#include "fusetune/metrics/report.h"
#include "fusetune/metrics/report_runs.h"
#include "fusetune/metrics/step_logger.h"
#include "fusetune/metrics/svg_chart.h"
#include "fusetune/util/error.h"
#include "report_support.h"
#include "test_support.h"

using namespace fusetune;
using fusetune::testing::CliResult;
using fusetune::testing::error_of;
using fusetune::testing::occurrences;
using fusetune::testing::read_text;
using fusetune::testing::run_fusetune;
using fusetune::testing::TempDir;
using fusetune::testing::write_synthetic_run;
using fusetune::testing::write_text;
namespace fs = std::filesystem;

namespace {

// The page's charts: metric -> run -> number of <circle class="pt"> in that run's group.
std::map<std::string, std::map<int, size_t>> plotted_points(const std::string& html) {
  std::map<std::string, std::map<int, size_t>> out;
  const std::string chart_tag = "<svg class=\"chart\" data-metric=\"";
  for (size_t at = html.find(chart_tag); at != std::string::npos;
       at = html.find(chart_tag, at + 1)) {
    const size_t name_end = html.find('"', at + chart_tag.size());
    const std::string metric = html.substr(at + chart_tag.size(), name_end - at - chart_tag.size());
    const std::string svg = html.substr(at, html.find("</svg>", at) - at);
    auto& runs = out[metric];
    const std::string group_tag = "<g class=\"series\" data-run=\"";
    for (size_t g = svg.find(group_tag); g != std::string::npos; g = svg.find(group_tag, g + 1)) {
      const int run = std::stoi(svg.substr(g + group_tag.size()));
      const std::string group = svg.substr(g, svg.find("</g>", g) - g);
      runs[run] = occurrences(group, "<circle class=\"pt\"");
    }
  }
  return out;
}

}  // namespace

TEST(MetricsReport, ReadsWhatTheStepLoggerWrote) {
  TempDir tmp;
  write_synthetic_run(tmp / "r1", 10, true, 5, "true");
  const RunRecord r = read_run(tmp / "r1");
  EXPECT_EQ(r.name, "r1");
  EXPECT_EQ(r.metrics_path, tmp / "r1" / "logs" / "metrics.jsonl");
  EXPECT_EQ(r.lines, 12);  // 10 steps, 2 validations
  ASSERT_EQ(r.series.at("loss").size(), 10u);
  EXPECT_DOUBLE_EQ(r.series.at("loss")[3].step, 4);
  EXPECT_DOUBLE_EQ(r.series.at("loss")[3].value, 1.25);
  ASSERT_EQ(r.series.at("val_loss").size(), 2u);
  EXPECT_DOUBLE_EQ(r.series.at("val_loss")[1].step, 10);
  EXPECT_EQ(r.series.at("peak_memory_alloc_bytes").size(), 10u);
  EXPECT_EQ(r.series.at("mfu").size(), 10u);
  EXPECT_EQ(r.series.count("grad_norm"), 0u);  // null in every line
  EXPECT_EQ(r.series.count("step"), 0u);
  ASSERT_FALSE(r.log_path.empty());
  ASSERT_GE(r.header.size(), 6u);
  EXPECT_EQ(r.header[0],
            (std::pair<std::string, std::string>{"recipe", "full_finetune_single_device"}));
  bool has_compile = false;
  for (const auto& [k, v] : r.header) has_compile = has_compile || (k == "compile" && v == "true");
  EXPECT_TRUE(has_compile);

  // The log directory itself (metric_logger.log_dir) works too, named after its run.
  const RunRecord l = read_run(tmp / "r1" / "logs");
  EXPECT_EQ(l.name, "r1");
  EXPECT_EQ(l.series.at("loss").size(), 10u);
}

TEST(MetricsReport, HeaderBlockParsesBack) {
  RunHeader h;
  h.recipe = "lora_finetune_single_device";
  h.model = "llama (a: b)";
  h.compile_mode = "model";
  const std::string text = "noise: before\n" + format_run_header(h) + "Step 1 | loss:1.0\n";
  const auto rows = parse_run_header(text);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1], (std::pair<std::string, std::string>{"model", "llama (a: b)"}));
  EXPECT_EQ(rows[2], (std::pair<std::string, std::string>{"compile", "model"}));
  EXPECT_TRUE(parse_run_header("Step 1 | loss:1.0\n").empty());
}

TEST(MetricsReport, OnePointPerLoggedValuePerChartAndRun) {
  TempDir tmp;
  write_synthetic_run(tmp / "eager", 10, true, 5, "false");
  write_synthetic_run(tmp / "model", 8, true, 4, "model");
  write_synthetic_run(tmp / "fused", 6, false, 0, "true");
  const Report rep =
      render_report({read_run(tmp / "eager"), read_run(tmp / "model"), read_run(tmp / "fused")});
  const auto pts = plotted_points(rep.html);
  ASSERT_EQ(pts.size(), 5u) << rep.html;
  using Counts = std::map<int, size_t>;
  EXPECT_EQ(pts.at("loss"), (Counts{{0, 10}, {1, 8}, {2, 6}}));
  EXPECT_EQ(pts.at("val_loss"), (Counts{{0, 2}, {1, 2}, {2, 0}}));
  EXPECT_EQ(pts.at("lr"), (Counts{{0, 10}, {1, 8}, {2, 6}}));
  EXPECT_EQ(pts.at("tokens_per_second_per_gpu"), (Counts{{0, 10}, {1, 8}, {2, 6}}));
  EXPECT_EQ(pts.at("peak_memory_alloc_bytes"), (Counts{{0, 10}, {1, 8}, {2, 0}}));
  EXPECT_EQ(rep.charts, 5u);
  EXPECT_EQ(rep.points, 24u + 4 + 24 + 24 + 18);
  EXPECT_EQ(occurrences(rep.html, "<circle class=\"pt\""), rep.points);
  // The counts are in the markup too, for anyone reading the page's source.
  EXPECT_NE(rep.html.find("data-metric=\"loss\" data-points=\"24\""), std::string::npos);
  EXPECT_NE(rep.html.find("data-run=\"2\" data-points=\"6\""), std::string::npos);
  // Legends name the compile mode when the runs differ in it; headers side by side.
  EXPECT_NE(rep.html.find("eager (compile false)"), std::string::npos);
  EXPECT_NE(rep.html.find("fused (compile true)"), std::string::npos);
  EXPECT_NE(rep.html.find("<th scope=\"row\">compile</th><td class=\"differs\">false</td>"
                          "<td class=\"differs\">model</td><td class=\"differs\">true</td>"),
            std::string::npos)
      << rep.html;
  EXPECT_NE(rep.html.find("<th scope=\"row\">dtype</th><td>fp32</td><td>fp32</td><td>fp32</td>"),
            std::string::npos);
  EXPECT_NE(rep.html.find(">Peak memory allocated (GiB)<"), std::string::npos);
}

TEST(MetricsReport, ChartsNoRunHasAreLeftOut) {
  TempDir tmp;
  write_synthetic_run(tmp / "a", 4, false, 0, "true");
  const Report rep = render_report({read_run(tmp / "a")});
  const auto pts = plotted_points(rep.html);
  EXPECT_EQ(pts.size(), 3u);
  EXPECT_EQ(pts.count("val_loss"), 0u);
  EXPECT_EQ(pts.count("peak_memory_alloc_bytes"), 0u);
  EXPECT_EQ(rep.charts, 3u);
  EXPECT_EQ(rep.points, 12u);
  EXPECT_EQ(rep.html.find("(compile "), std::string::npos);  // one mode: not repeated
}

TEST(MetricsReport, SelfContained) {
  TempDir tmp;
  write_synthetic_run(tmp / "a", 5, true, 1, "false");
  const std::string html = render_report({read_run(tmp / "a")}).html;
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  // No URL of any scheme, nothing loaded from elsewhere.
  for (const char* ref : {"://", "src=", "href=", "url(", "@import", "<link", "<img", "<iframe"})
    EXPECT_EQ(html.find(ref), std::string::npos) << ref;
  EXPECT_EQ(occurrences(html, "<svg"), occurrences(html, "</svg>"));
  EXPECT_EQ(occurrences(html, "<g "), occurrences(html, "</g>"));
}

TEST(MetricsReport, EscapesNamesAndHeaders) {
  TempDir tmp;
  const std::string odd = "a<b>&\"c'";
  write_synthetic_run(tmp / odd, 3, false, 0, "false", "<script>alert(1)</script>");
  const std::string html = render_report({read_run(tmp / odd)}).html;
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_EQ(html.find(odd), std::string::npos);
  EXPECT_NE(html.find("a&lt;b&gt;&amp;&quot;c&#39;"), std::string::npos);
  EXPECT_EQ(html_escape("x&y<z>\"'"), "x&amp;y&lt;z&gt;&quot;&#39;");
}

TEST(MetricsReport, ClearErrors) {
  TempDir tmp;
  std::string e = error_of([&] { read_run(tmp / "nope"); });
  EXPECT_NE(e.find((tmp / "nope").string()), std::string::npos) << e;
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;

  fs::create_directories(tmp / "empty");
  e = error_of([&] { read_run(tmp / "empty"); });
  EXPECT_NE(e.find("no metrics.jsonl"), std::string::npos) << e;
  EXPECT_NE(e.find((tmp / "empty" / "logs" / "metrics.jsonl").string()), std::string::npos) << e;

  const fs::path bad = tmp / "bad" / "logs" / "metrics.jsonl";
  write_text(bad, "{\"step\": 1, \"loss\": 2.0}\n\n{\"step\": 2, \"loss\": 1.\n");
  e = error_of([&] { read_run(tmp / "bad"); });
  EXPECT_NE(e.find(bad.string() + ":3: not valid JSON"), std::string::npos) << e;

  // A number past double's range: nlohmann's out_of_range, not a parse_error; named the same.
  write_text(bad, "{\"step\": 1, \"loss\": 2e999999}\n");
  e = error_of([&] { read_run(tmp / "bad"); });
  EXPECT_NE(e.find(bad.string() + ":1: not valid JSON"), std::string::npos) << e;

  write_text(bad, "{\"step\": 1, \"loss\": 2.0}\n[1, 2]\n");
  e = error_of([&] { read_run(tmp / "bad"); });
  EXPECT_NE(e.find(bad.string() + ":2: expected a JSON object, got array"), std::string::npos) << e;

  write_text(bad, "{\"loss\": 2.0}\n");
  e = error_of([&] { read_run(tmp / "bad"); });
  EXPECT_NE(e.find(bad.string() + ":1: expected an integer \"step\""), std::string::npos) << e;

  // Null and non-finite values are gaps, not errors (the logger writes null for nan).
  write_text(bad, "{\"step\": 1, \"loss\": null, \"lr\": 0.1}\n{\"step\": 2, \"loss\": 1.5}\n");
  const RunRecord r = read_run(tmp / "bad");
  EXPECT_EQ(r.series.at("loss").size(), 1u);
  EXPECT_EQ(r.series.at("lr").size(), 1u);
  EXPECT_TRUE(r.header.empty());  // no log file: no header, not an error
  EXPECT_EQ(plotted_points(render_report({r}).html).at("loss").at(0), 1u);
}

TEST(MetricsReport, NiceTicksAndLabels) {
  EXPECT_EQ(nice_ticks(1, 30, 6, 1), (std::vector<double>{0, 5, 10, 15, 20, 25, 30}));
  EXPECT_EQ(nice_ticks(2.1, 5.6, 5), (std::vector<double>{2, 3, 4, 5, 6}));
  // Steps are whole numbers: 2.5 is no step for them.
  EXPECT_EQ(nice_ticks(5, 20, 6), (std::vector<double>{5, 7.5, 10, 12.5, 15, 17.5, 20}));
  EXPECT_EQ(nice_ticks(5, 20, 6, 1), (std::vector<double>{5, 10, 15, 20}));
  const auto one = nice_ticks(3, 3, 5);  // a single value gets a range around it
  EXPECT_LE(one.front(), 3);
  EXPECT_GE(one.back(), 3);
  EXPECT_GT(one.back(), one.front());
  const auto lr = nice_ticks(0, 3e-3, 5);
  EXPECT_EQ(lr.front(), 0);
  EXPECT_NEAR(lr.back(), 3e-3, 1e-12);
  EXPECT_EQ(tick_label(0.001, 0.0005), "0.0010");
  EXPECT_EQ(tick_label(2.5, 2.5), "2.5");
  EXPECT_EQ(tick_label(15000, 5000), "15000");
  EXPECT_EQ(tick_label(3e-5, 1e-5), "3e-05");
  EXPECT_EQ(tick_label(1e-20, 1e-5), "0");
}

TEST(MetricsReport, CommandWritesThePage) {
  TempDir tmp;
  write_synthetic_run(tmp / "r1", 4, true, 2, "false");
  write_synthetic_run(tmp / "r2", 4, true, 2, "true");
  CliResult r = run_fusetune("report r1 r2 -o out/cmp.html", tmp.path());
  EXPECT_NE(r.code, 0);  // out/ does not exist
  EXPECT_NE(r.out.find("cannot write the report to 'out/cmp.html': directory 'out' does not exist"),
            std::string::npos)
      << r.out;
  fs::create_directories(tmp / "out");
  r = run_fusetune("report r1 r2 -o out/cmp.html", tmp.path());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("wrote out/cmp.html: 2 runs, 5 charts, 36 points"), std::string::npos)
      << r.out;
  EXPECT_EQ(plotted_points(read_text(tmp / "out" / "cmp.html")).at("val_loss").at(1), 2u);

  r = run_fusetune("report r1", tmp.path());  // default: report.html here
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(tmp / "report.html"));

  r = run_fusetune("report", tmp.path());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("missing RUN_DIR"), std::string::npos) << r.out;
  r = run_fusetune("report r1 missing", tmp.path());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("run directory 'missing' does not exist"), std::string::npos) << r.out;
  r = run_fusetune("report --help", tmp.path());
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: fusetune report RUN_DIR... [-o FILE]"), std::string::npos);
  r = run_fusetune("--help", tmp.path());
  EXPECT_NE(r.out.find("report"), std::string::npos);
}
