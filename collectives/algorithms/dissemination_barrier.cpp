// Dissemination barrier: in round k rank r signals r + 2^k and waits for r - 2^k; after ceil(log2 N) rounds
// every rank has heard, directly or not, from every other. Zero-byte messages; nothing is counted.
#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

void run(AlgorithmContext& context, const Call&) {
  const int n = context.size();
  const int r = context.rank();
  for (int distance = 1, round = 1; distance < n; distance *= 2, ++round) {
    const int to = wrap(r + distance, n);
    const int from = wrap(r - distance, n);
    if (context.record != nullptr) {
      context.record->push_back(StepRecord{fmt::format("round {}", round), to, -1, 0, from, -1, 0, false});
    }
    context.link.exchange(nullptr, 0, to, nullptr, 0, from);
  }
}

Expectation expect(const Call&, int, int, size_t, int) { return {}; }

Cost cost(double, int n, int) { return {static_cast<double>(ceil_log2(n)), 0, 0, "ceil(log2 N) α"}; }

}  // namespace

extern const Algorithm kDisseminationBarrier{CollectiveKind::kBarrier,
                                             "dissemination",
                                             "ceil(log2 N) rounds of zero-byte signals at doubling distances",
                                             run,
                                             expect,
                                             cost};

}  // namespace emu::coll
