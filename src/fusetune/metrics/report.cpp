#include "fusetune/metrics/report.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "fusetune/metrics/svg_chart.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Tableau 10: distinct to most eyes, readable on white.
const char* run_color(size_t i) {
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1",
                                  "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"};
  return palette[i % 10];
}

std::string fmt(double v, const char* format = "%.4g") {
  char buf[48];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

const std::vector<MetricPoint>* find_series(const RunRecord& r, const std::string& key) {
  auto it = r.series.find(key);
  return it == r.series.end() || it->second.empty() ? nullptr : &it->second;
}

std::string header_value(const RunRecord& r, const std::string& key) {
  for (const auto& [k, v] : r.header)
    if (k == key) return v;
  return "";
}

// Legend labels: the directory names, the paths as given where two names collide, and the
// compile mode when the runs differ in it (the usual comparison) and the name does not say it.
std::vector<std::string> run_labels(const std::vector<RunRecord>& runs) {
  std::map<std::string, int> seen;
  std::set<std::string> modes;
  for (const RunRecord& r : runs) {
    ++seen[r.name];
    modes.insert(header_value(r, "compile"));
  }
  std::vector<std::string> labels;
  for (const RunRecord& r : runs) {
    std::string l = seen[r.name] > 1 ? r.dir.string() : r.name;
    const std::string mode = header_value(r, "compile");
    if (modes.size() > 1 && !mode.empty() && l.find(mode) == std::string::npos)
      l += " (compile " + mode + ")";
    labels.push_back(l);
  }
  return labels;
}

// A few numbers to compare at a glance, computed from the metrics.
std::vector<std::pair<std::string, std::vector<std::string>>> summary_rows(
    const std::vector<RunRecord>& runs) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto add = [&](const std::string& name, auto cell) {
    std::vector<std::string> cells;
    bool any = false;
    for (const RunRecord& r : runs) {
      cells.push_back(cell(r));
      any = any || !cells.back().empty();
    }
    if (any) rows.emplace_back(name, cells);
  };
  add("metrics", [](const RunRecord& r) { return r.metrics_path.string(); });
  add("log", [](const RunRecord& r) { return r.log_path.string(); });
  add("logged steps", [](const RunRecord& r) {
    const auto* s = find_series(r, "loss");
    return s ? std::to_string(s->size()) + " (last: step " + fmt(s->back().step, "%.0f") + ")"
             : std::string();
  });
  add("final loss", [](const RunRecord& r) {
    const auto* s = find_series(r, "loss");
    return s ? fmt(s->back().value) : std::string();
  });
  add("final val_loss", [](const RunRecord& r) {
    const auto* s = find_series(r, "val_loss");
    return s ? fmt(s->back().value) : std::string();
  });
  add("median tokens/s", [](const RunRecord& r) {
    const auto* s = find_series(r, "tokens_per_second_per_gpu");
    if (!s) return std::string();
    std::vector<double> v;
    for (const MetricPoint& p : *s) v.push_back(p.value);
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return fmt(n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, "%.1f");
  });
  add("max peak memory", [](const RunRecord& r) {
    const auto* s = find_series(r, "peak_memory_alloc_bytes");
    if (!s) return std::string();
    double m = 0;
    for (const MetricPoint& p : *s) m = std::max(m, p.value);
    return fmt(m / double(int64_t(1) << 30), "%.3f") + " GiB";
  });
  return rows;
}

const char* kStyle = R"(
body { font-family: system-ui, "DejaVu Sans", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 24px 0 8px; }
p.sub { color: #666; margin: 0; }
table.runs { border-collapse: collapse; font-size: 13px; }
table.runs th, table.runs td { border: 1px solid #ddd; padding: 4px 8px; text-align: left;
  vertical-align: top; }
table.runs th[scope=row] { background: #f6f6f6; font-weight: 600; white-space: nowrap; }
table.runs td.differs { background: #fff6d6; }
table.runs td.missing { color: #aaa; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  margin-right: 6px; vertical-align: -1px; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
svg.chart { border: 1px solid #e2e2e2; border-radius: 4px; background: #fff; max-width: 100%;
  height: auto; }
svg.chart text { font-size: 11px; fill: #444; }
svg.chart text.title { font-size: 14px; font-weight: 600; fill: #222; }
svg.chart .legend text { font-size: 12px; fill: #222; }
svg.chart text.ytick { text-anchor: end; }
svg.chart text.xtick, svg.chart text.xlabel, svg.chart text.empty { text-anchor: middle; }
svg.chart line.grid { stroke: #ececec; }
svg.chart rect.frame { fill: none; stroke: #aaa; }
footer { margin-top: 24px; color: #888; font-size: 12px; }
)";

// After layout, counts per chart and run the points with a real box inside their chart.
const char* kRenderCheck = R"(
(function () {
  var counts = {}, total = 0, charts = 0;
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var box = svg.getBoundingClientRect(), perRun = {};
    charts++;
    svg.querySelectorAll('g.series').forEach(function (g) {
      var n = 0;
      g.querySelectorAll('circle.pt').forEach(function (c) {
        var b = c.getBBox(), r = c.getBoundingClientRect();
        if (b.width > 0 && b.height > 0 && r.left >= box.left - 0.5 && r.right <= box.right + 0.5 &&
            r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5) n++;
      });
      perRun[g.getAttribute('data-run')] = n;
      total += n;
    });
    counts[svg.getAttribute('data-metric')] = perRun;
  });
  document.getElementById('render-counts').textContent = JSON.stringify(counts);
  document.getElementById('render-check').textContent =
      'Checked in this browser after layout: ' + total + ' points drawn in ' + charts + ' charts.';
})();
)";

}  // namespace

const std::vector<ReportMetric>& report_metrics() {
  static const std::vector<ReportMetric> metrics = {
      {"loss", "Training loss"},
      {"val_loss", "Validation loss"},
      {"lr", "Learning rate"},
      {"tokens_per_second_per_gpu", "Tokens/s per GPU"},
      {"peak_memory_alloc_bytes", "Peak memory allocated (GiB)", 1.0 / double(int64_t(1) << 30)},
  };
  return metrics;
}

Report render_report(const std::vector<RunRecord>& runs) {
  FT_CHECK(!runs.empty(), "a report needs at least one run");
  const std::vector<std::string> labels = run_labels(runs);
  Report rep;
  std::string& o = rep.html;
  o += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  const std::string what =
      runs.size() == 1 ? html_escape(labels[0]) : std::to_string(runs.size()) + " runs";
  o += "<title>fusetune report: " + what + "</title>\n";
  o += "<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  o += "<h1>fusetune report</h1>\n<p class=\"sub\">" + std::to_string(runs.size()) +
       (runs.size() == 1 ? " run" : " runs") + ": ";
  for (size_t i = 0; i < runs.size(); ++i)
    o += std::string(i ? ", " : "") + "<span class=\"swatch\" style=\"background:" + run_color(i) +
         "\"></span>" + html_escape(labels[i]);
  o += "</p>\n";

  // The run headers side by side: one column per run, one row per key (in order of first
  // appearance); a row whose values differ between runs is highlighted.
  std::vector<std::pair<std::string, std::vector<std::string>>> rows = summary_rows(runs);
  std::vector<std::string> keys;
  for (const RunRecord& r : runs)
    for (const auto& kv : r.header)
      if (std::find(keys.begin(), keys.end(), kv.first) == keys.end()) keys.push_back(kv.first);
  for (const std::string& k : keys) {
    std::vector<std::string> cells;
    for (const RunRecord& r : runs) cells.push_back(header_value(r, k));
    rows.emplace_back(k, cells);
  }
  o += "<h2>Runs</h2>\n<table class=\"runs\">\n<tr><th></th>";
  for (size_t i = 0; i < runs.size(); ++i)
    o += "<th><span class=\"swatch\" style=\"background:" + std::string(run_color(i)) +
         "\"></span>" + html_escape(labels[i]) + "</th>";
  o += "</tr>\n";
  for (const auto& [key, cells] : rows) {
    const bool differs = runs.size() > 1 && key != "metrics" && key != "log" &&
                         std::set<std::string>(cells.begin(), cells.end()).size() > 1;
    o += "<tr><th scope=\"row\">" + html_escape(key) + "</th>";
    for (const std::string& c : cells) {
      const char* cls = c.empty() ? " class=\"missing\"" : differs ? " class=\"differs\"" : "";
      o += "<td" + std::string(cls) + ">" + (c.empty() ? "&ndash;" : html_escape(c)) + "</td>";
    }
    o += "</tr>\n";
  }
  o += "</table>\n";

  // One x axis for every chart: the steps of all runs and metrics.
  double first_step = std::numeric_limits<double>::infinity(), last_step = -first_step;
  for (const RunRecord& r : runs)
    for (const ReportMetric& m : report_metrics())
      if (const auto* pts = find_series(r, m.key))
        for (const MetricPoint& p : *pts)
          first_step = std::min(first_step, p.step), last_step = std::max(last_step, p.step);

  o += "<h2>Curves</h2>\n<div class=\"charts\">\n";
  for (const ReportMetric& m : report_metrics()) {
    std::vector<ChartSeries> series;
    bool any = false;
    for (size_t i = 0; i < runs.size(); ++i) {
      ChartSeries s;
      s.label = labels[i];
      s.color = run_color(i);
      s.index = int(i);
      if (const auto* pts = find_series(runs[i], m.key)) {
        for (const MetricPoint& p : *pts) s.points.push_back({p.step, p.value * m.scale});
        any = true;
      }
      series.push_back(std::move(s));
    }
    if (!any) continue;  // no run logged it: no chart
    ChartSpec spec;
    spec.id = m.key;
    spec.title = m.title;
    spec.x_min = first_step;
    spec.x_max = last_step;
    o += svg_line_chart(spec, series);
    ++rep.charts;
    for (const ChartSeries& s : series) rep.points += s.points.size();
  }
  o += "</div>\n";
  o += "<footer>\n<p>Written by <code>fusetune report</code>; a self-contained page (inline SVG, "
       "no network).</p>\n<p id=\"render-check\"></p>\n<pre id=\"render-counts\" hidden></pre>\n"
       "</footer>\n";
  o += "<script>" + std::string(kRenderCheck) + "</script>\n</body>\n</html>\n";
  return rep;
}

}  // namespace fusetune
