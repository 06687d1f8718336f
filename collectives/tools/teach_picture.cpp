#include "collectives/tools/teach_picture.h"
#include "emu/xml.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace emu::coll::teach {
namespace {

// Characters as a monospace font shows them ("·" is two bytes of UTF-8 and one character).
size_t shown_length(std::string_view text) {
  size_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

constexpr double kCharWidth = 7.4;  // 12 px monospace

// Where everything of a panel goes; the same for every round, so the slider does not move the boxes.
struct Geometry {
  int ranks = 0;
  size_t blocks = 0;
  double column = 64;  // a rank's box
  double arcs = 0;     // the arrows' region above the boxes
  static constexpr double kGap = 28, kMargin = 20, kTitle = 30, kBox = 28, kLine = 17;

  double width() const { return 2 * kMargin + ranks * column + std::max(ranks - 1, 0) * kGap; }
  double box_top() const { return kTitle + arcs; }
  double height() const { return box_top() + kBox + 10 + static_cast<double>(blocks) * kLine + 14; }
  double centre(int rank) const { return kMargin + rank * (column + kGap) + column / 2; }
};

// How high an arrow rises above the boxes: with the distance it spans, and higher going left, so that the two
// directions of an exchange between the same pair do not overlap.
double rise(const Message& message) {
  return 18 + 16.0 * std::abs(message.to - message.from) + (message.to < message.from ? 16 : 0);
}

Geometry geometry(const Replay& replay) {
  Geometry g;
  for (const Frame& frame : replay.frames) {
    g.ranks = std::max(g.ranks, static_cast<int>(frame.blocks.size()));
    for (const auto& rank : frame.blocks) {
      g.blocks = std::max(g.blocks, rank.size());
      for (const std::string& block : rank) {
        g.column = std::max(g.column, static_cast<double>(shown_length(block)) * kCharWidth + 16);
      }
    }
    for (const Message& message : frame.messages) g.arcs = std::max(g.arcs, rise(message));
  }
  g.arcs += 22;  // the label above the highest arrow
  return g;
}

// One round: its title, the arrows with their labels, the boxes and the blocks beneath them.
std::string panel(const Frame& frame, const Geometry& g, const std::string& attributes) {
  const std::string title =
      frame.round == 0 ? std::string("inputs") : fmt::format("after round {}: {}", frame.round, frame.stages);
  std::string out = fmt::format("<g class=\"step\" data-round=\"{}\" data-title=\"{}\"{}>\n", frame.round,
                                xml_escape(title), attributes);
  out += fmt::format("<text class=\"panel-title\" x=\"{}\" y=\"20\">{}</text>\n", Geometry::kMargin, xml_escape(title));
  const double y = g.box_top();
  for (const Message& message : frame.messages) {
    const double h = rise(message);
    const double direction = message.to > message.from ? 1 : -1;
    // Out of a box right of its centre going right, into a box left of its centre: ring neighbours' arrows and the
    // wrap-around one do not meet.
    const double x1 = g.centre(message.from) + 0.15 * g.column * direction;
    const double x2 = g.centre(message.to) - 0.3 * g.column * direction;
    const double middle = (x1 + x2) / 2;
    out += fmt::format(
        "<path class=\"msg {}\" d=\"M {:.1f} {:.1f} Q {:.1f} {:.1f} {:.1f} {:.1f}\" marker-end=\"url(#{})\"/>\n",
        message.reduced ? "added" : "copied", x1, y, middle, y - 2 * h, x2, y,
        message.reduced ? "head-added" : "head-copied");
    out += fmt::format("<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", middle, y - h - 4,
                       xml_escape(message.chunk));
  }
  for (int r = 0; r < static_cast<int>(frame.blocks.size()); ++r) {
    const double left = g.centre(r) - g.column / 2;
    out += fmt::format("<rect class=\"rank\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" rx=\"4\"/>\n",
                       left, y, g.column, Geometry::kBox);
    out += fmt::format("<text class=\"rank-name\" x=\"{:.1f}\" y=\"{:.1f}\">r{}</text>\n", g.centre(r), y + 19, r);
    const auto& blocks = frame.blocks[static_cast<size_t>(r)];
    for (size_t b = 0; b < blocks.size(); ++b) {
      out += fmt::format("<text class=\"block\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", g.centre(r),
                         y + Geometry::kBox + 16 + static_cast<double>(b) * Geometry::kLine, xml_escape(blocks[b]));
    }
  }
  return out + "</g>\n";
}

constexpr std::string_view kStyle = R"(
  .panel-title { font: bold 13px sans-serif; fill: #222; }
  .rank { fill: #eef2f7; stroke: #445; stroke-width: 1.2; }
  .rank-name { font: bold 13px sans-serif; text-anchor: middle; fill: #223; }
  .block { font: 12px monospace; text-anchor: middle; fill: #222; }
  .label { font: 11px monospace; text-anchor: middle; fill: #333; }
  .msg { fill: none; stroke-width: 1.6; }
  .msg.added { stroke: #d9480f; }
  .msg.copied { stroke: #1c7ed6; }
  .legend { font: 11px sans-serif; fill: #333; }
)";

std::string defs() {
  return "<defs>\n"
         "<marker id=\"head-added\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" "
         "orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#d9480f\"/></marker>\n"
         "<marker id=\"head-copied\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" "
         "orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#1c7ed6\"/></marker>\n"
         "</defs>\n";
}

constexpr std::string_view kLegend =
    "orange: the receiver adds the chunk to its own; blue: it copies it. Beneath each rank its blocks a, b, ...: "
    "a0+a3 is block a summed over the inputs of r0 and r3, · nothing yet.";

}  // namespace

std::string format_svg(const Replay& replay, const PictureText& text) {
  const Geometry g = geometry(replay);
  const double header = 48;
  const double width = std::max(g.width(), 640.0);
  const double height = header + static_cast<double>(replay.frames.size()) * g.height();
  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} "
      "{1:.0f}\">\n<style>{2}</style>\n{3}"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text class=\"panel-title\" x=\"{4}\" y=\"18\">{5}</text>\n"
      "<text class=\"legend\" x=\"{4}\" y=\"36\">{6}</text>\n",
      width, height, kStyle, defs(), Geometry::kMargin, xml_escape(text.title), xml_escape(kLegend));
  for (size_t i = 0; i < replay.frames.size(); ++i) {
    out += panel(replay.frames[i], g,
                 fmt::format(" transform=\"translate(0,{:.1f})\"", header + static_cast<double>(i) * g.height()));
  }
  return out + "</svg>\n";
}

std::string format_html(const Replay& replay, const PictureText& text) {
  const Geometry g = geometry(replay);
  const size_t last = replay.frames.empty() ? 0 : replay.frames.size() - 1;
  std::string panels;
  for (const Frame& frame : replay.frames) panels += panel(frame, g, "");
  // The script shows one panel: the slider's, or the one `#step=K` names when the page opens.
  return fmt::format(
      R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{0}</title>
<style>
  body {{ font: 14px sans-serif; margin: 16px; color: #222; }}
  .controls {{ margin: 8px 0; }}
  #step {{ width: 320px; vertical-align: middle; }}
  {1}
</style></head>
<body>
<h1 style="font-size: 17px">{0}</h1>
<p>{2}</p>
<p class="legend">{3}</p>
<div class="controls"><label for="step">step</label> <input type="range" id="step" min="0" max="{4}" value="0">
<output id="step-title" for="step"></output></div>
<svg xmlns="http://www.w3.org/2000/svg" width="{5:.0f}" height="{6:.0f}" viewBox="0 0 {5:.0f} {6:.0f}">
{7}<rect width="100%" height="100%" fill="white"/>
{8}</svg>
<script>
(function () {{
  const slider = document.getElementById("step");
  const title = document.getElementById("step-title");
  const panels = Array.from(document.querySelectorAll("g.step"));
  function show(step) {{
    for (const g of panels) g.style.display = g.dataset.round === String(step) ? "" : "none";
    const shown = panels.find(g => g.dataset.round === String(step));
    title.textContent = shown ? shown.dataset.title : "";
    document.body.dataset.shown = String(step);
  }}
  slider.addEventListener("input", () => show(slider.value));
  const asked = /step=(\d+)/.exec(window.location.hash);
  if (asked) {{
    slider.value = asked[1];
    slider.dispatchEvent(new Event("input"));
  }} else {{
    show(slider.value);
  }}
}})();
</script>
</body></html>
)",
      xml_escape(text.title), kStyle, xml_escape(text.summary), xml_escape(kLegend), last, std::max(g.width(), 640.0),
      g.height(), defs(), panels);
}

}  // namespace emu::coll::teach
