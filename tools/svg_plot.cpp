#include "svg_plot.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace dsv4::tools {

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '\'')
      o += "&apos;";
    else
      o += c;
  }
  return o;
}

std::string roofline_bars_svg(const std::string& title, const std::string& subtitle,
                              const std::vector<BarGroup>& groups) {
  const int width = 900, left = 300, bar_width = 480, row = 28, group_gap = 40;
  int height = 90;
  for (const BarGroup& g : groups) height += group_gap + row * int(g.bars.size());
  std::ostringstream s;
  s << "<?xml version='1.0' encoding='UTF-8'?>\n<svg xmlns='http://www.w3.org/2000/svg' width='" << width
    << "' height='" << height << "' font-family='sans-serif' font-size='13'>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='" << width / 2 << "' y='26' text-anchor='middle' font-size='17'>" << svg_escape(title) << "</text>\n"
    << "<text x='" << width / 2 << "' y='46' text-anchor='middle' font-size='11'>" << svg_escape(subtitle)
    << "</text>\n";
  int y = 70;
  for (const BarGroup& g : groups) {
    s << "<text x='10' y='" << y + 16 << "' font-weight='bold'>" << svg_escape(g.title) << "</text>\n";
    y += group_gap - 12;
    const int top = y;
    for (const Bar& b : g.bars) {
      const double share = b.limit > 0 ? std::clamp(b.value / b.limit, 0.0, 1.2) : 0.0;
      s << "<text x='" << left - 8 << "' y='" << y + 17 << "' text-anchor='end'>" << svg_escape(b.label) << "</text>\n"
        << "<rect x='" << left << "' y='" << y + 4 << "' width='" << int(share * bar_width) << "' height='" << row - 8
        << "' fill='#3b78c4'/>\n"
        << "<text x='" << left + int(share * bar_width) + 6 << "' y='" << y + 17 << "' font-size='11'>"
        << svg_escape(b.text) << "</text>\n";
      y += row;
    }
    s << "<line x1='" << left + bar_width << "' y1='" << top << "' x2='" << left + bar_width << "' y2='" << y
      << "' stroke='#c0392b' stroke-dasharray='5,4'/>\n"
      << "<text x='" << left + bar_width << "' y='" << top - 2
      << "' text-anchor='middle' font-size='10' fill='#c0392b'>"
      << "roofline</text>\n";
    y += 12;
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace dsv4::tools
