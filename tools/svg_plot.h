// Small hand-written SVG charts for the benchmark tools (no plotting library
// in Debian's C++ stack is worth the dependency for a few bars).
#pragma once
#include <string>
#include <vector>

namespace dsv4::tools {

std::string svg_escape(const std::string& s);

// One horizontal bar: `value` drawn against `limit` (the roofline), with the
// label on the left and `text` at the bar's end.
struct Bar {
  std::string label, text;
  double value = 0, limit = 0;
};
struct BarGroup {
  std::string title;
  std::vector<Bar> bars;
};

// Groups of bars, each bar scaled to its own limit (100% = the roofline,
// drawn as a dashed line).
std::string roofline_bars_svg(const std::string& title, const std::string& subtitle,
                              const std::vector<BarGroup>& groups);

}  // namespace dsv4::tools
