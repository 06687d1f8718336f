// What the trace and the memory picture draw, as each rank records it and as it travels to rank 0: spans of work
// (set-up, steps, a unit's forward or backward, collectives) and the memory timeline, thinned to a bounded number
// of points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/types.h"
#include "emu/memory.h"

namespace emu::coll {
class Communicator;
struct Algorithm;
}  // namespace emu::coll

namespace emu::app {

// In-use bytes of one rank over time, thinned to a bounded number of points (peaks kept), with the bytes of
// every category at each point: what the trace's counters and the memory picture draw.
struct MemorySeries {
  std::vector<double> seconds;         // since the strategy's set-up began
  std::vector<CategoryBytes> current;  // in use by category after the change
  std::vector<uint64_t> reserved;      // held by the device (the caching allocator's segments + the reserve)
};

// A span of work on one rank, for the trace: set-up, a step, forward/backward of a unit, the gradient reduction,
// the optimizer, a collective.
struct Span {
  std::string name;      // "forward, block 3", "all_gather 1.20 MiB (ring) — forward all-gather, unit 3"
  std::string category;  // "setup", "step", "compute", "collective", "optimizer"
  double start = 0;      // seconds since the strategy's set-up began
  double end = 0;
  // One collective call (`kind` is empty for every other span):
  std::string kind;       // "all_gather"
  std::string algorithm;  // "ring"; empty for send and recv
  std::string group;      // "world", "intra-node 0", "control" (the out-of-memory agreement)
  std::string phase;      // the caller's label, e.g. "forward all-gather, unit 3"
  uint64_t bytes = 0;     // the payload, S in the bandwidth formulas, as run (not full scale)
  uint64_t sent = 0;      // this rank's point-to-point bytes, as the ledger counts them
  uint64_t received = 0;
};

inline constexpr size_t kMaxSeriesPoints = 1500;
inline constexpr size_t kMaxSpansPerRank = 20'000;

// Thins a rank's timeline to at most kMaxSeriesPoints, keeping in each stretch the point of highest use.
MemorySeries thin_timeline(const std::vector<TimelinePoint>& timeline);

// Seconds on the steady clock, which spans are measured by.
double steady_seconds();

// One rank's spans of one strategy, for the trace. Times arrive as steady_clock seconds and are kept relative to
// `origin`, taken just before the device (and so its memory timeline) was made. Past kMaxSpansPerRank the rest
// are counted, not kept.
class SpanRecorder {
 public:
  explicit SpanRecorder(double origin) : origin_(origin) {}

  void add(Span span);
  void add(std::string_view name, std::string_view category, double start, double end);
  // "all_gather 1.20 MiB (ring) — forward all-gather, unit 3"
  void add_call(const coll::Communicator& group, const coll::Call& call, const coll::Algorithm* algorithm,
                const coll::Traffic& moved, double start, double end);

  const std::vector<Span>& spans() const { return spans_; }
  uint64_t dropped() const { return dropped_; }

 private:
  double origin_;
  std::vector<Span> spans_;
  uint64_t dropped_ = 0;
};

// Spans travel to rank 0 as bytes: each field in order, strings as a length and their characters.
std::vector<char> pack_spans(const std::vector<Span>& spans);
std::vector<Span> unpack_spans(const std::vector<char>& packed);

}  // namespace emu::app
