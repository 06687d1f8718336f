// The pipeline schedules' op order and their timing (strategies/pipeline.h): what the `pp` strategy runs and what
// the trace's pipeline view draws.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "emu/check.h"
#include "strategies/pipeline.h"
#include "strategies/strategy.h"

namespace emu::strategy {

std::vector<PipelineOp> stage_order(Schedule schedule, int stages, int stage, int micro_batches) {
  EMU_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 0, "stage {} of {}, {} micro-batches",
            stage, stages, micro_batches);
  std::vector<PipelineOp> order;
  order.reserve(2 * static_cast<size_t>(micro_batches));
  if (schedule == Schedule::kGpipe) {
    for (int m = 0; m < micro_batches; ++m) order.push_back({true, m});
    for (int m = 0; m < micro_batches; ++m) order.push_back({false, m});
    return order;
  }
  const int warmup = std::min(stages - stage - 1, micro_batches);
  const int steady = micro_batches - warmup;
  for (int m = 0; m < warmup; ++m) order.push_back({true, m});
  for (int i = 0; i < steady; ++i) {
    order.push_back({true, warmup + i});
    order.push_back({false, i});
  }
  for (int m = steady; m < micro_batches; ++m) order.push_back({false, m});
  return order;
}

int most_in_flight(std::span<const PipelineOp> order) {
  int held = 0, most = 0;
  for (const PipelineOp& op : order) {
    held += op.forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

std::vector<std::vector<TimedOp>> pipeline_timeline(Schedule schedule, int stages, int micro_batches,
                                                    double forward_seconds, double backward_seconds) {
  std::vector<std::vector<PipelineOp>> orders;
  orders.reserve(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) orders.push_back(stage_order(schedule, stages, s, micro_batches));
  // When each stage's forward and backward of each micro-batch ended; < 0 while not placed.
  const auto m_count = static_cast<size_t>(micro_batches);
  std::vector<std::vector<double>> forward_end(static_cast<size_t>(stages), std::vector<double>(m_count, -1));
  std::vector<std::vector<double>> backward_end = forward_end;
  std::vector<std::vector<TimedOp>> timeline(static_cast<size_t>(stages));
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  // Place whichever stage's next op has its input; every schedule here is deadlock-free, so each sweep places one.
  for (size_t placed = 0, total = 2 * m_count * static_cast<size_t>(stages); placed < total;) {
    const size_t before = placed;
    for (int s = 0; s < stages; ++s) {
      const auto si = static_cast<size_t>(s);
      if (next[si] == orders[si].size()) continue;
      const PipelineOp op = orders[si][next[si]];
      const auto m = static_cast<size_t>(op.micro_batch);
      double ready = 0;
      if (op.forward && s > 0) ready = forward_end[si - 1][m];
      if (!op.forward) ready = s + 1 < stages ? backward_end[si + 1][m] : forward_end[si][m];
      if (ready < 0) continue;
      const double start = std::max(ready, timeline[si].empty() ? 0.0 : timeline[si].back().end);
      const double end = start + (op.forward ? forward_seconds : backward_seconds);
      (op.forward ? forward_end : backward_end)[si][m] = end;
      timeline[si].push_back({op, start, end});
      ++next[si];
      ++placed;
    }
    EMU_CHECK(placed > before, "a {}-stage schedule of {} micro-batches stalled", stages, micro_batches);
  }
  return timeline;
}

}  // namespace emu::strategy
