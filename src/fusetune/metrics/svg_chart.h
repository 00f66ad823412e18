#pragma once
// Line charts as inline SVG, for the HTML run report: several series overlaid on one pair of
// axes with tick labels, each data point one <circle class="pt"> (so a test, or a browser,
// can count what was plotted), a legend, no script and no external resource.
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace fusetune {

struct ChartPoint {
  double x = 0, y = 0;
};

struct ChartSeries {
  std::string label;  // legend text (escaped when drawn)
  std::string color;  // a CSS colour, e.g. "#4e79a7"
  int index = 0;      // the run's number: data-run, marker size and dash pattern
  std::vector<ChartPoint> points;
};

struct ChartSpec {
  std::string id;     // data-metric of the <svg>
  std::string title;  // drawn above the plot
  std::string x_label = "step";
  bool integer_x = true;  // x ticks at whole numbers (steps)
  // The x axis covers at least [x_min, x_max] when they are finite (charts of one page share
  // their x axis that way), and the points otherwise.
  double x_min = std::numeric_limits<double>::quiet_NaN();
  double x_max = std::numeric_limits<double>::quiet_NaN();
  int width = 640, height = 330;
};

// The chart: <svg class="chart" data-metric=ID data-points=TOTAL> holding one
// <g class="series" data-run=INDEX data-points=N> per series with a polyline and N
// <circle class="pt"> elements. Series without points get a legend entry and an empty group.
std::string svg_line_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series);

// "Nice" tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi] with
// about `target` intervals; the first tick is <= lo and the last >= hi. A single value gets
// a range around it. `min_step` bounds the step from below; at 1 or more the step is a whole
// number (integer axes: no 2.5).
std::vector<double> nice_ticks(double lo, double hi, int target, double min_step = 0);
// A tick value printed with as many decimals as the tick step needs: "0.5", "1500", "3e-05".
std::string tick_label(double value, double step);

// Text made safe for HTML and SVG text and attribute values: & < > " ' escaped.
std::string html_escape(std::string_view s);

}  // namespace fusetune
