#include "fusetune/metrics/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace fusetune {
namespace {

// Plot area inside the <svg>: room for the title and legend above, tick labels left and below.
constexpr double kLeft = 72, kRight = 18, kTop = 56, kBottom = 46;
constexpr double kLegendRow = 18;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Markers shrink with the run's number and have a thin white rim, so points of runs that
// coincide (the same loss under every compile mode) show as concentric dots instead of hiding
// each other.
double marker_radius(int index) { return std::max(1.6, 4.2 - 1.1 * index); }

const char* dash_pattern(int index) {
  static const char* patterns[] = {"", "7 4", "2 3", "10 3 2 3"};
  return patterns[index % 4];
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target, double min_step) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (lo > hi) std::swap(lo, hi);
  if (!(hi > lo)) {  // one value: a range around it
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  double step = 10 * mag;
  for (double nice : {1.0, 2.0, 2.5, 5.0}) {
    const double candidate = nice * mag;
    if (f <= nice && !(min_step >= 1 && candidate != std::floor(candidate))) {
      step = candidate;
      break;
    }
  }
  if (step < min_step) step = min_step;
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double k = first; k <= last + 1e-9; k += 1) {
    double v = k * step;
    if (std::fabs(v) < step * 1e-9) v = 0;
    ticks.push_back(v);
  }
  if (ticks.size() < 2) ticks.push_back(ticks.empty() ? lo : ticks.back() + step);
  return ticks;
}

std::string tick_label(double value, double step) {
  if (std::fabs(value) < std::fabs(step) * 1e-6) value = 0;
  int decimals = std::max(0, int(-std::floor(std::log10(std::fabs(step)) + 1e-9)));
  const double scaled = std::fabs(step) * std::pow(10.0, decimals);
  if (std::fabs(scaled - std::round(scaled)) > 1e-6) ++decimals;  // 2.5, 0.25: one more digit
  char buf[48];
  if (decimals <= 4 && std::fabs(value) < 1e7) {
    std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  } else {
    const int magnitude = value == 0 ? 0 : int(std::floor(std::log10(std::fabs(value))));
    std::snprintf(buf, sizeof buf, "%.*g", std::max(1, decimals + magnitude + 1), value);
  }
  return buf;
}

std::string svg_line_chart(const ChartSpec& spec, const std::vector<ChartSeries>& series) {
  const double w = spec.width, h = spec.height;
  // Legend rows: entries wrap at the chart's width (about 6.3 px per character at 12 px).
  std::vector<std::pair<double, double>> legend_at;  // x, y of each entry
  double lx = kLeft, ly = 40;
  for (const ChartSeries& s : series) {
    const double entry_w = 32 + 6.3 * double(s.label.size());
    if (lx > kLeft && lx + entry_w > w - kRight) lx = kLeft, ly += kLegendRow;
    legend_at.push_back({lx, ly});
    lx += entry_w + 14;
  }
  const double top = kTop + (ly - 40);
  const double x0 = kLeft, x1 = w - kRight, y0 = h - kBottom, y1 = top;

  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  size_t total = 0;
  for (const ChartSeries& s : series)
    for (const ChartPoint& p : s.points) {
      xmin = std::min(xmin, p.x), xmax = std::max(xmax, p.x);
      ymin = std::min(ymin, p.y), ymax = std::max(ymax, p.y);
      ++total;
    }
  if (total == 0) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  if (std::isfinite(spec.x_min)) xmin = std::min(xmin, spec.x_min);
  if (std::isfinite(spec.x_max)) xmax = std::max(xmax, spec.x_max);
  const std::vector<double> xt = nice_ticks(xmin, xmax, 6, spec.integer_x ? 1 : 0);
  const std::vector<double> yt = nice_ticks(ymin, ymax, 5);
  const double xlo = xt.front(), xhi = xt.back(), ylo = yt.front(), yhi = yt.back();
  auto px = [&](double x) { return x0 + (x - xlo) / (xhi - xlo) * (x1 - x0); };
  auto py = [&](double y) { return y0 - (y - ylo) / (yhi - ylo) * (y0 - y1); };

  std::string o;
  o += "<svg class=\"chart\" data-metric=\"" + html_escape(spec.id) + "\" data-points=\"" +
       std::to_string(total) + "\" width=\"" + num(w) + "\" height=\"" + num(h) +
       "\" viewBox=\"0 0 " + num(w) + " " + num(h) + "\" role=\"img\" aria-label=\"" +
       html_escape(spec.title) + "\">\n";
  o += "<text class=\"title\" x=\"" + num(x0) + "\" y=\"20\">" + html_escape(spec.title) +
       "</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const ChartSeries& s = series[i];
    const auto [ex, ey] = legend_at[i];
    o += "<g class=\"legend\" style=\"color:" + html_escape(s.color) + "\"><line x1=\"" + num(ex) +
         "\" y1=\"" + num(ey - 4) + "\" x2=\"" + num(ex + 24) + "\" y2=\"" + num(ey - 4) +
         "\" stroke=\"currentColor\" stroke-width=\"2\" stroke-dasharray=\"" +
         dash_pattern(s.index) + "\"/><circle cx=\"" + num(ex + 12) + "\" cy=\"" + num(ey - 4) +
         "\" r=\"" + num(marker_radius(s.index)) + "\" fill=\"currentColor\"/><text x=\"" +
         num(ex + 30) + "\" y=\"" + num(ey) + "\">" + html_escape(s.label) + "</text></g>\n";
  }

  // Axes: grid lines at the ticks, tick labels, axis titles.
  o += "<g class=\"axes\">\n";
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double v : yt) {
    const std::string y = num(py(v));
    o += "<line class=\"grid\" x1=\"" + num(x0) + "\" y1=\"" + y + "\" x2=\"" + num(x1) +
         "\" y2=\"" + y + "\"/><text class=\"ytick\" x=\"" + num(x0 - 6) + "\" y=\"" + y +
         "\" dy=\"0.32em\">" + tick_label(v, ystep) + "</text>\n";
  }
  for (double v : xt) {
    const std::string x = num(px(v));
    o += "<line class=\"grid\" x1=\"" + x + "\" y1=\"" + num(y1) + "\" x2=\"" + x + "\" y2=\"" +
         num(y0) + "\"/><text class=\"xtick\" x=\"" + x + "\" y=\"" + num(y0 + 16) + "\">" +
         tick_label(v, xstep) + "</text>\n";
  }
  o += "<rect class=\"frame\" x=\"" + num(x0) + "\" y=\"" + num(y1) + "\" width=\"" + num(x1 - x0) +
       "\" height=\"" + num(y0 - y1) + "\"/>\n";
  o += "<text class=\"xlabel\" x=\"" + num((x0 + x1) / 2) + "\" y=\"" + num(h - 8) + "\">" +
       html_escape(spec.x_label) + "</text>\n";
  if (total == 0)
    o += "<text class=\"empty\" x=\"" + num((x0 + x1) / 2) + "\" y=\"" + num((y0 + y1) / 2) +
         "\">no data</text>\n";
  o += "</g>\n";

  for (const ChartSeries& s : series) {
    o += "<g class=\"series\" data-run=\"" + std::to_string(s.index) + "\" data-points=\"" +
         std::to_string(s.points.size()) + "\" style=\"color:" + html_escape(s.color) + "\">\n";
    if (s.points.size() > 1) {
      o += "<polyline fill=\"none\" stroke=\"currentColor\" stroke-width=\"1.6\" "
           "stroke-dasharray=\"" +
           std::string(dash_pattern(s.index)) + "\" points=\"";
      for (size_t i = 0; i < s.points.size(); ++i)
        o += (i ? " " : "") + num(px(s.points[i].x)) + "," + num(py(s.points[i].y));
      o += "\"/>\n";
    }
    const std::string r = num(marker_radius(s.index)), label = html_escape(s.label);
    for (const ChartPoint& p : s.points) {
      char value[32];
      std::snprintf(value, sizeof value, "%.6g", p.y);
      o += "<circle class=\"pt\" cx=\"" + num(px(p.x)) + "\" cy=\"" + num(py(p.y)) + "\" r=\"" + r +
           "\" fill=\"currentColor\" stroke=\"#fff\" stroke-width=\"0.8\"><title>" + label +
           ": step " + tick_label(p.x, 1) + ", " + value + "</title></circle>\n";
    }
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace fusetune
