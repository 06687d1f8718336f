#include "app/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "emu/units.h"
#include "emu/xml.h"

namespace emu::app {
namespace {

// Layout, in pixels.
constexpr double kWidth = 980;
constexpr double kLeft = 72;    // room for the y labels
constexpr double kRight = 190;  // room for the legend
constexpr double kHeader = 76;  // the picture's title and subtitle
constexpr double kPanelHeight = 250;
constexpr double kPlotTop = 30;     // within a panel: its title above the plot
constexpr double kPlotBottom = 42;  // within a panel: x ticks and label below the plot
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kPlotHeight = kPanelHeight - kPlotTop - kPlotBottom;
constexpr double kColumnPixels = 2;  // the series are drawn at this resolution

constexpr const char* kCapColor = "#d62728";
constexpr const char* kOomColor = "#d62728";

// Bottom to top: what lives all along first, what comes and goes last.
constexpr std::array<Category, kNumCategories> kStackOrder = {
    Category::kReserve,        Category::kParameters,  Category::kMasterWeights,
    Category::kOptimizerState, Category::kGradients,   Category::kBuckets,
    Category::kCommBuffers,    Category::kActivations, Category::kTemporaries,
};

const char* color_of(Category category) {
  switch (category) {
    case Category::kReserve: return "#bab0ac";
    case Category::kParameters: return "#4e79a7";
    case Category::kGradients: return "#f28e2b";
    case Category::kMasterWeights: return "#76b7b2";
    case Category::kOptimizerState: return "#59a14f";
    case Category::kActivations: return "#edc948";
    case Category::kTemporaries: return "#b07aa1";
    case Category::kCommBuffers: return "#ff9da7";
    case Category::kBuckets: return "#9c755f";
  }
  return "#000000";
}

// A round tick step (1, 2 or 5 × 10^n) giving about `ticks` ticks over [0, range].
double tick_step(double range, int ticks) {
  if (range <= 0) return 1;
  const double raw = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * power) return m * power;
  }
  return 10 * power;
}

// The x axis: the step's phases, not the emulator's wall time. Every boundary of a set-up, forward or backward of
// a unit, gradient reduction or optimizer span on a rank is a point of the axis, one unit apart, so the same phase
// (forward of block 7 in step 2) falls at the same x in every strategy's panel; between two boundaries the
// rank's time is interpolated linearly.
struct PhaseAxis {
  std::vector<double> boundaries;  // seconds, ascending
  // A coordinate: i at boundary i, fractional in between.
  double at(double seconds) const {
    if (boundaries.size() < 2) return 0;
    const auto upper = std::upper_bound(boundaries.begin(), boundaries.end(), seconds);
    if (upper == boundaries.begin()) return 0;
    if (upper == boundaries.end()) return static_cast<double>(boundaries.size() - 1);
    const auto i = static_cast<size_t>(upper - boundaries.begin()) - 1;
    const double width = boundaries[i + 1] - boundaries[i];
    return static_cast<double>(i) + (width > 0 ? (seconds - boundaries[i]) / width : 0);
  }
  double end() const { return boundaries.empty() ? 0 : static_cast<double>(boundaries.size() - 1); }
};

// The spans that mark phases: set-up, each unit's forward and backward, gradient reduction, optimizer (not the
// collectives, whose kind is set, nor the step that holds them all).
bool marks_phase(const Span& span) { return span.kind.empty() && span.category != "step"; }

PhaseAxis phase_axis(const std::vector<Span>& spans) {
  PhaseAxis axis;
  for (const Span& span : spans) {
    if (!marks_phase(span)) continue;
    axis.boundaries.push_back(span.start);
    axis.boundaries.push_back(span.end);
  }
  std::sort(axis.boundaries.begin(), axis.boundaries.end());
  axis.boundaries.erase(std::unique(axis.boundaries.begin(), axis.boundaries.end()), axis.boundaries.end());
  return axis;
}

// A labelled tick where a phase people name begins: set-up, then per step its forwards, backwards (one pair per
// micro-batch) and optimizer.
struct PhaseTick {
  double at;
  std::string label;
};
std::vector<PhaseTick> phase_ticks(const std::vector<Span>& spans, const PhaseAxis& axis) {
  std::vector<const Span*> ordered;
  for (const Span& span : spans) {
    if (marks_phase(span)) ordered.push_back(&span);
  }
  std::stable_sort(ordered.begin(), ordered.end(), [](const Span* a, const Span* b) { return a->start < b->start; });
  std::vector<PhaseTick> ticks;
  std::string last;
  int step = 0;
  for (const Span* span : ordered) {
    std::string kind;
    if (span->category == "setup") kind = "set-up";
    if (span->name.starts_with("forward")) kind = "fwd";
    if (span->name.starts_with("backward")) kind = "bwd";
    if (span->category == "optimizer") kind = "optimizer";
    if (kind.empty() || kind == last) continue;
    if (kind == "fwd" && (last == "set-up" || last == "optimizer")) ++step;
    last = kind;
    ticks.push_back({axis.at(span->start), kind == "fwd" && step > 0 ? fmt::format("step {} fwd", step) : kind});
  }
  return ticks;
}

// Bytes at full scale shown in GiB when the picture reaches a GiB, else MiB.
struct AxisUnit {
  double bytes;
  const char* name;
};
AxisUnit unit_for(double max_bytes) {
  return max_bytes >= static_cast<double>(kGiB) ? AxisUnit{static_cast<double>(kGiB), "GiB"}
                                                : AxisUnit{static_cast<double>(kMiB), "MiB"};
}

// One column of kColumnPixels of a rank's series: its highest point, with the categories at that point.
struct Column {
  double seconds = 0;  // the column's start
  CategoryBytes bytes;
};

// A rank's series reduced to at most one point per column, keeping each column's highest point (so every peak
// shows, however short).
std::vector<Column> columns(const MemorySeries& series, double seconds_max) {
  const double seconds_per_column = seconds_max / kPlotWidth * kColumnPixels;
  std::vector<Column> out;
  long last = -1;
  for (size_t i = 0; i < series.seconds.size(); ++i) {
    const long column = std::lround(series.seconds[i] / seconds_per_column);
    if (column != last) {
      out.push_back({static_cast<double>(column) * seconds_per_column, series.current[i]});
      last = column;
    } else if (series.current[i].total() >= out.back().bytes.total()) {
      out.back().bytes = series.current[i];
    }
  }
  return out;
}

// The panel's coordinate system: seconds and full-scale bytes to pixels inside the plot.
struct Frame {
  double top;          // the plot's top edge in the picture
  double seconds_max;  // the x axis' end: a phase coordinate (PhaseAxis), the same in every panel
  double bytes_max;    // the y axis' end, full scale
  double scale;        // bytes as run × scale = full scale
  double x(double seconds) const { return kLeft + seconds / seconds_max * kPlotWidth; }
  double y(double full_scale_bytes) const {
    return top + kPlotHeight - std::min(full_scale_bytes, bytes_max) / bytes_max * kPlotHeight;
  }
};

std::string point(double x, double y) { return fmt::format("{:.1f},{:.1f}", x, y); }

// A step line through `cols`, each value holding until the next column that changes it, as SVG path commands
// after a starting point: "V y H x V y H x ... H end". `y_of(i)` is column i's height in pixels; `same(a, b)`
// compares two columns' values. Horizontal and vertical moves take one number each, which keeps the file small.
template <typename YOf, typename Same>
std::string step_path(const Frame& f, const std::vector<Column>& cols, YOf y_of, Same same) {
  std::string path = fmt::format("V{:.1f}", y_of(0));
  size_t held = 0;
  for (size_t i = 1; i < cols.size(); ++i) {
    if (same(held, i)) continue;
    path += fmt::format("H{:.1f}V{:.1f}", f.x(cols[i].seconds), y_of(i));
    held = i;
  }
  return path + fmt::format("H{:.1f}", f.x(cols.back().seconds));
}

// The peak rank as areas stacked by category, bottom to top in kStackOrder.
void draw_stack(std::string& svg, const Frame& f, const std::vector<Column>& cols) {
  if (cols.empty()) return;
  std::vector<std::array<uint64_t, kNumCategories + 1>> tops(cols.size());  // cumulative, [0] = 0
  CategoryBytes used;
  for (size_t i = 0; i < cols.size(); ++i) {
    for (size_t c = 0; c < kNumCategories; ++c) {
      tops[i][c + 1] = tops[i][c] + cols[i].bytes[kStackOrder[c]];
      used[kStackOrder[c]] |= cols[i].bytes[kStackOrder[c]];
    }
  }
  // Each category is filled from the axis up to its top, the highest first, so that the ones below paint over all
  // but its own band: one boundary per path instead of two.
  for (size_t c = kNumCategories; c-- > 0;) {
    if (used[kStackOrder[c]] == 0) continue;
    const auto y_of = [&](size_t i) { return f.y(static_cast<double>(tops[i][c + 1]) * f.scale); };
    const auto same = [&](size_t a, size_t b) { return tops[a][c + 1] == tops[b][c + 1]; };
    svg += fmt::format("<path d=\"M{}{}V{:.1f}Z\" fill=\"{}\"/>\n", point(f.x(cols.front().seconds), f.y(0)),
                       step_path(f, cols, y_of, same), f.y(0), color_of(kStackOrder[c]));
  }
}

void draw_total_line(std::string& svg, const Frame& f, const std::vector<Column>& cols, const char* style) {
  if (cols.empty()) return;
  const auto y_of = [&](size_t i) { return f.y(static_cast<double>(cols[i].bytes.total()) * f.scale); };
  const auto same = [&](size_t a, size_t b) { return cols[a].bytes.total() == cols[b].bytes.total(); };
  svg += fmt::format("<path d=\"M{}{}\" fill=\"none\" {}/>\n", point(f.x(cols.front().seconds), y_of(0)),
                     step_path(f, cols, y_of, same), style);
}

void draw_axes(std::string& svg, const Frame& f, const AxisUnit& unit, const std::vector<PhaseTick>& ticks) {
  const double bottom = f.top + kPlotHeight;
  svg += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", kLeft,
                     f.top, kPlotWidth, kPlotHeight);
  const double y_step = tick_step(f.bytes_max / unit.bytes, 5);
  for (double v = 0; v * unit.bytes <= f.bytes_max * 1.0001; v += y_step) {
    const double y = f.y(v * unit.bytes);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", kLeft, y,
                       kLeft + kPlotWidth, y);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" dy=\"4\">{:g}</text>\n", kLeft - 6, y, v);
  }
  double last_label = -1e9;
  int row = 0;  // a label too close to the last one goes on the other row
  for (const PhaseTick& tick : ticks) {
    const double x = f.x(tick.at);
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#bbb\"/>\n", x, f.top, x,
                       bottom + 4);
    row = x - last_label < 60 ? 1 - row : 0;
    last_label = x;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"start\" font-size=\"10\">{}</text>\n", x + 1,
                       bottom + 13 + 11 * row, xml_escape(tick.label));
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"middle\">the step's phases: set-up, forward and backward of each "
      "unit, gradient reduction, optimizer (the same x in every panel)</text>\n",
      kLeft + kPlotWidth / 2, bottom + 37);
  svg += fmt::format(
      "<text transform=\"translate({},{:.1f}) rotate(-90)\" text-anchor=\"middle\">in use, full scale ({})</text>\n",
      18, f.top + kPlotHeight / 2, unit.name);
}

void draw_cap(std::string& svg, const Frame& f, double cap) {
  const double y = f.y(cap);
  svg += fmt::format(
      "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"1.5\" "
      "stroke-dasharray=\"6,4\" class=\"cap\"/>\n",
      kLeft, y, kLeft + kPlotWidth, y, kCapColor);
  svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"{}\" class=\"halo\">cap {}</text>\n",
                     kLeft + kPlotWidth - 4, y - 4, kCapColor, xml_escape(format_bytes(static_cast<uint64_t>(cap))));
}

// A red dot where each rank that ran out first asked for more than fit, at what it would then have held.
void draw_oom(std::string& svg, const Frame& f, const RunReport& report, const StrategyOutcome& o,
              const std::vector<PhaseAxis>& axes) {
  bool labelled = false;
  for (size_t r = 0; r < o.verdict.ranks.size(); ++r) {  // a rank, or a plan's role
    const strategy::RankMemory& m = o.verdict.ranks[r];
    if (!m.out_of_memory || r >= o.oom_seconds.size() || o.oom_seconds[r] < 0) continue;
    const std::string who = report.rank_words(o, r);
    const double x = f.x(r < axes.size() ? axes[r].at(o.oom_seconds[r]) : 0);
    const double y = f.y(static_cast<double>(m.in_use + m.requested) * f.scale);
    svg += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4.5\" fill=\"{}\" stroke=\"white\" class=\"oom\"><title>{} out "
        "of memory in {}</title></circle>\n",
        x, y, kOomColor, xml_escape(who), xml_escape(m.phase));
    if (labelled) continue;
    labelled = true;
    const bool left = x > kLeft + kPlotWidth * 0.6;
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\" fill=\"{}\" class=\"halo\">out of memory: {}, "
        "{}</text>\n",
        left ? x - 8 : x + 8, std::max(y - 8, f.top + 12), left ? "end" : "start", kOomColor, xml_escape(who),
        xml_escape(m.phase));
  }
}

std::string panel_title(const RunReport& r, const StrategyOutcome& o) {
  if (!o.fits()) {
    std::vector<std::string> failing;
    int count = 0;
    for (size_t i = 0; i < o.verdict.ranks.size(); ++i) {
      if (!o.verdict.ranks[i].out_of_memory) continue;
      failing.push_back(r.rank_words(o, i));
      count += o.roles.empty() ? 1 : o.roles[i].ranks();
    }
    if (count == r.world && r.world > 1)
      return fmt::format("{} — out of memory on every one of the {} ranks", o.name, r.world);
    return fmt::format("{} — out of memory on {} of {} ranks: {}", o.name, count, r.world, fmt::join(failing, ", "));
  }
  if (o.peak.empty()) return o.name;
  const uint64_t peak = o.peak[static_cast<size_t>(o.peak_rank)] * r.scale();
  return fmt::format("{} — fits: peak {} on {}", o.name, format_bytes(peak),
                     r.rank_words(o, static_cast<size_t>(o.peak_rank)));
}

// The y axis' end for one strategy: its cap or its highest peak, whichever is higher, with headroom, rounded up
// to a tick.
double bytes_max_of(const RunReport& r, const StrategyOutcome& o) {
  double top = r.cap != kNoCap ? static_cast<double>(r.cap * r.scale()) : 0;
  for (const uint64_t peak : o.peak) top = std::max(top, static_cast<double>(peak * r.scale()));
  for (const strategy::RankMemory& m : o.verdict.ranks) {
    if (m.out_of_memory) top = std::max(top, static_cast<double>((m.in_use + m.requested) * r.scale()));
  }
  top = std::max(top * 1.1, static_cast<double>(kMiB));
  const AxisUnit unit = unit_for(top);
  const double step = tick_step(top / unit.bytes, 5);
  return std::ceil(top / unit.bytes / step) * step * unit.bytes;
}

// A rank's memory series with its times replaced by phase coordinates.
MemorySeries on_axis(const MemorySeries& series, const PhaseAxis& axis) {
  MemorySeries out = series;
  for (double& t : out.seconds) t = axis.at(t);
  return out;
}

// Each rank's (a plan: role's) phase axis; a rank without spans keeps its times, scaled into the shared axis.
std::vector<PhaseAxis> axes_of(const StrategyOutcome& o) {
  std::vector<PhaseAxis> axes;
  for (size_t rank = 0; rank < o.memory.size(); ++rank) {
    axes.push_back(rank < o.spans.size() ? phase_axis(o.spans[rank]) : PhaseAxis{});
  }
  return axes;
}

void draw_panel(std::string& svg, const RunReport& r, const StrategyOutcome& o, double top, double phases_max,
                const std::vector<PhaseTick>& ticks) {
  const double bytes_max = bytes_max_of(r, o);
  const AxisUnit unit = unit_for(bytes_max);
  const Frame f{top + kPlotTop, std::max(phases_max, 1.0), bytes_max, static_cast<double>(r.scale())};
  const std::vector<PhaseAxis> axes = axes_of(o);
  svg += fmt::format("<g class=\"panel\" data-strategy=\"{}\">\n", xml_escape(o.name));
  svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" class=\"title\">{}</text>\n", kLeft, top + 18,
                     xml_escape(panel_title(r, o)));
  draw_axes(svg, f, unit, ticks);
  if (o.memory.empty()) {
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#555\">no timeline recorded</text>\n",
                       kLeft + kPlotWidth / 2, f.top + kPlotHeight / 2);
  }
  const size_t peak_rank = static_cast<size_t>(o.peak_rank);
  const auto cols = [&](size_t rank) { return columns(on_axis(o.memory[rank], axes[rank]), f.seconds_max); };
  if (peak_rank < o.memory.size()) draw_stack(svg, f, cols(peak_rank));
  for (size_t rank = 0; rank < o.memory.size(); ++rank) {
    if (rank == peak_rank) continue;
    draw_total_line(svg, f, cols(rank), "stroke=\"#222\" stroke-opacity=\"0.45\" stroke-width=\"0.8\"");
  }
  if (peak_rank < o.memory.size()) draw_total_line(svg, f, cols(peak_rank), "stroke=\"#222\" stroke-width=\"1\"");
  if (r.cap != kNoCap) draw_cap(svg, f, static_cast<double>(r.cap * r.scale()));
  draw_oom(svg, f, r, o, axes);
  svg += "</g>\n";
}

void draw_legend(std::string& svg, const RunReport& r) {
  CategoryBytes used;
  for (const StrategyOutcome& o : r.outcomes) {
    for (const MemorySeries& s : o.memory) {
      for (const CategoryBytes& p : s.current) {
        for (size_t c = 0; c < kNumCategories; ++c) used.bytes[c] |= p.bytes[c];
      }
    }
  }
  const double x = kWidth - kRight + 16;
  double y = kHeader + kPlotTop + 4;
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"title\">peak rank, by category</text>\n", x, y);
  for (auto c = kStackOrder.rbegin(); c != kStackOrder.rend(); ++c) {
    if (used[*c] == 0) continue;
    y += 19;
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"12\" fill=\"{}\"/>\n", x, y - 10, color_of(*c));
    std::string name(category_name(*c));
    std::replace(name.begin(), name.end(), '_', ' ');
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", x + 20, y, name);
  }
  y += 26;
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#222\" stroke-opacity=\"0.45\"/>\n", x,
                     y - 4, x + 14, y - 4);
  svg += fmt::format("<text x=\"{}\" y=\"{}\">other ranks (total)</text>\n", x + 20, y);
  if (r.cap != kNoCap) {
    y += 19;
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n",
        x, y - 4, x + 14, y - 4, kCapColor);
    svg += fmt::format("<text x=\"{}\" y=\"{}\">cap per rank</text>\n", x + 20, y);
  }
  y += 19;
  svg += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"4.5\" fill=\"{}\"/>\n", x + 7, y - 4, kOomColor);
  svg += fmt::format("<text x=\"{}\" y=\"{}\">first allocation past it</text>\n", x + 20, y);
}

std::string header_text(const RunReport& r) {
  return fmt::format("Memory over the step's phases per rank: {} on {} rank{}", r.options.full.name, r.world,
                     r.world == 1 ? "" : "s");
}

// Two lines under the title: what the bytes are, then how to read the panels.
std::array<std::string, 2> subtitle_lines(const RunReport& r) {
  std::string what = r.plan ? "Full-scale shapes (plan)."
                            : fmt::format("Run shrunk by k = {}; bytes shown × k², at full scale.", r.shrink);
  if (r.cap != kNoCap) what += fmt::format(" Cap {} per rank.", format_bytes(r.cap * r.scale()));
  return {what,
          "Stacked by category: the rank with the highest peak. Thin lines: the other ranks' totals. Red dots: "
          "each rank's first allocation past the cap."};
}

}  // namespace

std::string format_memory_svg(const RunReport& r) {
  const double height = kHeader + kPanelHeight * static_cast<double>(std::max<size_t>(1, r.outcomes.size())) + 8;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" fill=\"#222\">\n",
      kWidth, height);
  svg += "<style>.title{font-weight:bold} .halo{paint-order:stroke;stroke:white;stroke-width:3px}</style>\n";
  svg += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", kWidth, height);
  svg += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"16\" class=\"title\">{}</text>\n", kLeft,
                     xml_escape(header_text(r)));
  const auto subtitle = subtitle_lines(r);
  for (size_t line = 0; line < subtitle.size(); ++line) {
    svg += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\">{}</text>\n", kLeft, 48 + 16 * line,
                       xml_escape(subtitle[line]));
  }
  // One x axis for every panel: as long as the longest strategy's phases, labelled from that strategy's spans.
  double phases_max = 0;
  std::vector<PhaseTick> ticks;
  for (const StrategyOutcome& o : r.outcomes) {
    const auto p = static_cast<size_t>(o.peak_rank);
    if (p >= o.spans.size()) continue;
    const PhaseAxis axis = phase_axis(o.spans[p]);
    if (axis.end() > phases_max) {
      phases_max = axis.end();
      ticks = phase_ticks(o.spans[p], axis);
    }
  }
  for (size_t i = 0; i < r.outcomes.size(); ++i) {
    draw_panel(svg, r, r.outcomes[i], kHeader + kPanelHeight * static_cast<double>(i), phases_max, ticks);
  }
  draw_legend(svg, r);
  return svg + "</svg>\n";
}

}  // namespace emu::app
