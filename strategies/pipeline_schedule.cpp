// The pipeline schedules' op order, their timing and the message order that runs them (strategies/pipeline.h): what
// the `pp` strategy runs and what the trace's pipeline view draws.
#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "emu/check.h"
#include "strategies/pipeline.h"
#include "strategies/strategy.h"

namespace emu::strategy {

std::vector<std::vector<StageBlocks>> interleaved_chunks(int layers, int stages, int chunks) {
  EMU_CHECK(stages >= 1 && chunks >= 1 && layers % (stages * chunks) == 0, "{} blocks in {} x {} equal chunks", layers,
            stages, chunks);
  const int per_chunk = layers / (stages * chunks);
  std::vector<std::vector<StageBlocks>> out(static_cast<size_t>(stages));
  for (int p = 0; p < stages; ++p) {
    for (int v = 0; v < chunks; ++v) {
      const int group = v * stages + p;  // 0-based layer group
      out[static_cast<size_t>(p)].push_back({group * per_chunk + 1, (group + 1) * per_chunk});
    }
  }
  return out;
}

double bubble_fraction(int stages, int micro_batches, int chunks) {
  return static_cast<double>(stages - 1) / static_cast<double>(chunks * micro_batches + stages - 1);
}

namespace {

// Megatron's schedule table (get_schedule_table, with its default group of P micro-batches per virtual stage):
// virtual micro-batch k of V·M runs micro-batch m through chunk v, groups of P micro-batches through chunk 0, then
// chunk 1, …; a backward takes the chunks in reverse.
PipelineOp virtual_op(int k, bool forward, int stages, int chunks) {
  const int group = k / (stages * chunks), within = k % (stages * chunks);
  const int chunk = within / stages;
  return {forward, group * stages + within % stages, forward ? chunk : chunks - 1 - chunk};
}

}  // namespace

std::vector<PipelineOp> stage_order(Schedule schedule, int stages, int stage, int micro_batches, int chunks) {
  EMU_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 0 && chunks >= 1,
            "stage {} of {}, {} micro-batches, {} chunks", stage, stages, micro_batches, chunks);
  EMU_CHECK(chunks == 1 || (schedule == Schedule::k1F1B && stages >= 2 && micro_batches % stages == 0),
            "interleaving {} chunks over {} stages needs 1F1B and M = {} a multiple of P", chunks, stages,
            micro_batches);
  std::vector<PipelineOp> order;
  const int total = micro_batches * chunks;
  order.reserve(2 * static_cast<size_t>(total));
  if (schedule == Schedule::kGpipe) {
    for (int m = 0; m < micro_batches; ++m) order.push_back({true, m});
    for (int m = 0; m < micro_batches; ++m) order.push_back({false, m});
    return order;
  }
  const int warmup = chunks == 1 ? std::min(stages - stage - 1, total)
                                 : std::min(2 * (stages - stage - 1) + (chunks - 1) * stages, total);
  const auto op = [&](int k, bool forward) {
    return chunks == 1 ? PipelineOp{forward, k} : virtual_op(k, forward, stages, chunks);
  };
  for (int k = 0; k < warmup; ++k) order.push_back(op(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(op(warmup + k, true));
    order.push_back(op(k, false));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(op(k, false));
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

namespace {

// Per stage, direction, chunk and micro-batch: a time, < 0 while unknown. [P][2][V][M], direction 1 the forward.
class OpTimes {
 public:
  OpTimes(int stages, int chunks, int micro_batches)
      : chunks_(chunks),
        micro_batches_(micro_batches),
        at_(static_cast<size_t>(stages) * 2 * static_cast<size_t>(chunks) * static_cast<size_t>(micro_batches), -1) {}
  double& operator()(int stage, const PipelineOp& op) {
    const int slot_index = (stage * 2 + (op.forward ? 1 : 0)) * chunks_ + op.chunk;
    const auto slot = static_cast<size_t>(slot_index);
    return at_[slot * static_cast<size_t>(micro_batches_) + static_cast<size_t>(op.micro_batch)];
  }

 private:
  int chunks_, micro_batches_;
  std::vector<double> at_;
};

// The stage and op whose output `op` on `stage` reads, if another stage's: a forward the previous stage's forward
// of the micro-batch (the first stage's chunk v > 0 the last stage's chunk v − 1), a backward the next stage's
// backward (the last stage's chunk v < V − 1 the first stage's chunk v + 1). False where the op starts from the
// embedding or the loss.
bool input_of(int stages, int chunks, int stage, const PipelineOp& op, int& from, PipelineOp& source) {
  source = op;
  if (op.forward) {
    if (stage == 0 && op.chunk == 0) return false;
    from = (stage + stages - 1) % stages;
    source.chunk = op.chunk - (stage == 0 ? 1 : 0);
    return true;
  }
  if (stage == stages - 1 && op.chunk == chunks - 1) return false;
  from = (stage + 1) % stages;
  source.chunk = op.chunk + (stage == stages - 1 ? 1 : 0);
  return true;
}

}  // namespace

std::vector<std::vector<TimedOp>> pipeline_timeline(Schedule schedule, int stages, int micro_batches,
                                                    double forward_seconds, double backward_seconds, int chunks) {
  std::vector<std::vector<PipelineOp>> orders;
  orders.reserve(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) orders.push_back(stage_order(schedule, stages, s, micro_batches, chunks));
  OpTimes end(stages, chunks, micro_batches);  // when each op ended
  std::vector<std::vector<TimedOp>> timeline(static_cast<size_t>(stages));
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  // Place whichever stage's next op has its input; every schedule here is deadlock-free, so each sweep places one.
  for (size_t placed = 0, total = 2 * static_cast<size_t>(micro_batches * chunks * stages); placed < total;) {
    const size_t before = placed;
    for (int s = 0; s < stages; ++s) {
      const auto si = static_cast<size_t>(s);
      if (next[si] == orders[si].size()) continue;
      const PipelineOp op = orders[si][next[si]];
      int from = s;
      PipelineOp source = op;
      double ready = 0;
      if (input_of(stages, chunks, s, op, from, source)) {
        ready = end(from, source);
      } else if (!op.forward) {  // the loss: after this stage's own forward of the micro-batch
        ready = end(s, {true, op.micro_batch, op.chunk});
      }
      if (ready < 0) continue;
      const double start = std::max(ready, timeline[si].empty() ? 0.0 : timeline[si].back().end);
      const double finish = start + (op.forward ? forward_seconds : backward_seconds);
      end(s, op) = finish;
      timeline[si].push_back({op, start, finish});
      ++next[si];
      ++placed;
    }
    EMU_CHECK(placed > before, "a {}-stage schedule of {} micro-batches ({} chunks) stalled", stages, micro_batches,
              chunks);
  }
  return timeline;
}

std::vector<StageEvent> stage_program(Schedule schedule, int stages, int stage, int micro_batches, int chunks) {
  const auto timeline = pipeline_timeline(schedule, stages, micro_batches, 1.0, 2.0, chunks);
  OpTimes start(stages, chunks, micro_batches);
  for (int s = 0; s < stages; ++s) {
    for (const TimedOp& t : timeline[static_cast<size_t>(s)]) start(s, t.op) = t.start;
  }
  // (when, what: 0 a message, 1 an op; then for a message its sender and receiver, for an op 0 0) → the event. A
  // message is ordered by when its reader starts, every stage alike; at equal times messages go before ops, and a
  // receiving stage runs one op at a time, so (time, receiver) names one message.
  std::vector<std::tuple<double, int, int, int, StageEvent>> events;
  for (const TimedOp& t : timeline[static_cast<size_t>(stage)]) {
    events.emplace_back(t.start, 1, 0, 0, StageEvent{StageEvent::Kind::kCompute, t.op, -1});
  }
  for (int s = 0; s < stages; ++s) {
    for (const TimedOp& t : timeline[static_cast<size_t>(s)]) {
      int from = s;
      PipelineOp source = t.op;
      if (!input_of(stages, chunks, s, t.op, from, source)) continue;
      if (s == stage) events.emplace_back(t.start, 0, from, s, StageEvent{StageEvent::Kind::kReceive, t.op, from});
      if (from == stage) events.emplace_back(t.start, 0, from, s, StageEvent{StageEvent::Kind::kSend, source, s});
    }
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<3>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<3>(b), std::get<2>(b));
  });
  std::vector<StageEvent> program;
  program.reserve(events.size());
  for (const auto& e : events) program.push_back(std::get<4>(e));
  return program;
}

}  // namespace emu::strategy
