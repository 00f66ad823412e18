#pragma once
// `fusetune report`: one self-contained HTML page comparing training runs. One chart per
// metric (loss, validation loss, learning rate, tokens/s, peak memory; a chart no run has is
// left out) with the runs overlaid, and the run headers side by side. Inline SVG and CSS, no
// external resource; a short inline script, run by a browser after layout, counts the drawn
// points into <pre id="render-counts"> (tests read it back from headless Chromium).
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "fusetune/metrics/report_runs.h"

namespace fusetune {

// A chart of the report: the metrics.jsonl key it plots, its title, and the factor its values
// are multiplied by (bytes to GiB).
struct ReportMetric {
  const char* key;
  const char* title;
  double scale = 1;
};
// loss, val_loss, lr, tokens_per_second_per_gpu, peak_memory_alloc_bytes, in page order.
const std::vector<ReportMetric>& report_metrics();

struct Report {
  std::string html;
  size_t charts = 0;  // charts drawn
  size_t points = 0;  // points drawn, over all charts and runs
};

// The page for `runs` (at least one), drawn in their order: run i gets colour i.
Report render_report(const std::vector<RunRecord>& runs);

}  // namespace fusetune
