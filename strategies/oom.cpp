#include "strategies/oom.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "emu/units.h"

namespace emu::strategy {
namespace {

// One rank's record as it travels: fixed size, a whole number of fp32 elements (the collectives carry fp32 and
// bf16; these bytes are only copied, never reduced).
struct Wire {
  uint64_t out_of_memory, cap, peak, requested, in_use;
  char phase[160];
  char what[96];
};
static_assert(sizeof(Wire) % 4 == 0);

void copy_text(const std::string& text, char* out, size_t size) {
  std::memset(out, 0, size);
  text.copy(out, std::min(text.size(), size - 1));
}

}  // namespace

bool OomVerdict::any() const {
  return std::any_of(ranks.begin(), ranks.end(), [](const RankMemory& r) { return r.out_of_memory; });
}

std::vector<int> OomVerdict::failing_ranks() const {
  std::vector<int> out;
  for (const RankMemory& r : ranks) {
    if (r.out_of_memory) out.push_back(r.rank);
  }
  return out;
}

std::string OomVerdict::summary() const {
  const std::vector<int> failing = failing_ranks();
  if (failing.empty()) return fmt::format("all {} ranks fit", ranks.size());
  const RankMemory& first = ranks[static_cast<size_t>(failing.front())];
  const uint64_t over = first.peak > first.cap ? first.peak - first.cap : 0;
  return fmt::format(
      "rank{} {} of {} ran out of memory; rank {} first in {} (tried to allocate {} for {} with {} in use of a {} "
      "cap), needing {} at its peak, {} more than its cap",
      failing.size() == 1 ? "" : "s", fmt::join(failing, ", "), ranks.size(), first.rank, first.phase,
      format_bytes(first.requested), first.what.empty() ? "an unnamed tensor" : first.what, format_bytes(first.in_use),
      format_bytes(first.cap), format_bytes(first.peak), format_bytes(over));
}

OomVerdict agree_on_oom(const MemoryPool& memory, coll::Communicator& control) {
  Wire mine{};
  const auto& oom = memory.first_oom();
  mine.out_of_memory = oom.has_value() ? 1 : 0;
  mine.cap = memory.cap();
  mine.peak = memory.reserved_peak();  // what the device had to hold: reserved, or allocated when exact
  if (oom) {
    mine.requested = oom->requested;
    mine.in_use = oom->in_use;
    copy_text(oom->phase, mine.phase, sizeof(mine.phase));
    copy_text(oom->what, mine.what, sizeof(mine.what));
  }
  std::vector<Wire> all(static_cast<size_t>(control.size()));
  constexpr size_t kElements = sizeof(Wire) / 4;
  control.all_gather(&mine, all.data(), kElements, DType::kF32, "out-of-memory agreement");
  OomVerdict verdict;
  for (int r = 0; r < control.size(); ++r) {
    const Wire& w = all[static_cast<size_t>(r)];
    verdict.ranks.push_back(
        {r, w.out_of_memory != 0, w.cap, w.peak, w.requested, w.in_use, std::string(w.phase), std::string(w.what)});
  }
  return verdict;
}

}  // namespace emu::strategy
