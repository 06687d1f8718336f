// The memory picture's x axis is the step's phases, shared by every panel (app/svg.cpp): the same moment of the step
// falls at the same x for two strategies whose wall times differ, which a time axis scaled per panel would not do.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "app/svg.h"

namespace emu::app {
namespace {

// One rank of one strategy: set-up, a block's forward and backward, then the optimizer, ending at the given times
// (seconds); its memory jumps from 1 GiB to 3 GiB halfway through the optimizer.
StrategyOutcome strategy_with_times(const std::string& name, double setup, double forward, double backward,
                                    double optimizer) {
  StrategyOutcome o;
  o.name = name;
  o.verdict.ranks.resize(1);
  o.peak = {3ull << 30};
  o.reserved_peak = o.peak;
  o.allocated_at_reserved_peak = o.peak;
  o.oom_seconds = {-1};
  const auto span = [](std::string label, std::string category, double start, double end) {
    Span s;
    s.name = std::move(label);
    s.category = std::move(category);
    s.start = start;
    s.end = end;
    return s;
  };
  o.spans = {{
      span("set-up", "setup", 0, setup),
      span("forward, block 1", "compute", setup, forward),
      span("backward, block 1", "compute", forward, backward),
      span("optimizer step", "optimizer", backward, optimizer),
  }};
  CategoryBytes before, after;
  before[Category::kParameters] = 1ull << 30;
  after = before;
  after[Category::kTemporaries] = 2ull << 30;
  o.memory = {MemorySeries{{setup / 2, (backward + optimizer) / 2}, {before, after}, {1ull << 30, 3ull << 30}}};
  return o;
}

// The x at which a panel's total line (the peak rank's, drawn last and darkest) first changes height.
std::vector<double> jumps(const std::string& svg) {
  const std::regex line(R"re(<path d="M[0-9.]+,[0-9.]+V[0-9.]+H([0-9.]+)V[0-9.]+[^"]*" fill="none" stroke="#222" )re"
                        R"re(stroke-width="1"/>)re");
  std::vector<double> xs;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), line); it != std::sregex_iterator(); ++it) {
    xs.push_back(std::stod((*it)[1].str()));
  }
  return xs;
}

TEST(SvgAxis, TheSameMomentOfTheStepIsAtTheSameXInEveryPanel) {
  RunReport report;
  report.world = 1;
  // Wall times differ tenfold (set-up 1 s vs 10 s; the optimizer 1 s vs 8 s): on a time axis the jump, halfway
  // through the optimizer, would be at 3.5/4 of one panel and 16/20 of the other.
  report.outcomes = {strategy_with_times("fast", 1, 2, 3, 4), strategy_with_times("slow", 10, 11, 12, 20)};
  const std::string svg = format_memory_svg(report);
  const std::vector<double> xs = jumps(svg);
  ASSERT_EQ(xs.size(), 2u) << svg;
  EXPECT_EQ(xs[0], xs[1]) << "halfway through the optimizer, in both panels";
  // Phases are one notch each: set-up [0, 1], forward [1, 2], backward [2, 3], optimizer [3, 4]; halfway through
  // the optimizer is 3.5 of 4 notches across the plot (72 px from the left, 718 px wide, 2 px columns).
  EXPECT_NEAR(xs[0], 72 + 3.5 / 4 * 718, 2.0);
  EXPECT_NE(svg.find(">optimizer</text>"), std::string::npos);
}

}  // namespace
}  // namespace emu::app
