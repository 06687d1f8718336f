#include "collectives/ledger.h"

#include <fmt/format.h>

#include "emu/units.h"

namespace emu::coll {

LedgerEntry& LedgerEntry::operator+=(const LedgerEntry& other) {
  calls += other.calls;
  moved += other.moved;
  expected += other.expected;
  seconds += other.seconds;
  between_nodes += other.between_nodes;
  payload += other.payload;
  return *this;
}

void Ledger::charge(CollectiveKind kind, std::string_view phase, const Traffic& moved, const Traffic& expected,
                    double seconds, const Traffic& between_nodes, uint64_t payload) {
  auto it = entries_.find(std::pair<CollectiveKind, std::string_view>(kind, phase));
  if (it == entries_.end()) it = entries_.emplace(Key(kind, std::string(phase)), LedgerEntry{}).first;
  it->second += LedgerEntry{1, moved, expected, seconds, between_nodes, payload};
}

LedgerEntry Ledger::at(CollectiveKind kind, std::string_view phase) const {
  const auto it = entries_.find(std::pair<CollectiveKind, std::string_view>(kind, phase));
  return it == entries_.end() ? LedgerEntry{} : it->second;
}

LedgerEntry Ledger::total(CollectiveKind kind) const {
  LedgerEntry sum;
  for (const auto& [key, entry] : entries_) {
    if (key.first == kind) sum += entry;
  }
  return sum;
}

LedgerEntry Ledger::total() const {
  LedgerEntry sum;
  for (const auto& [key, entry] : entries_) sum += entry;
  return sum;
}

std::string Ledger::format() const {
  std::string out = fmt::format("traffic ledger of group '{}'\n{:<15} {:<36} {:>7} {:>12} {:>12} {:>9} {:>10}\n",
                                group_, "kind", "phase", "calls", "sent", "received", "expected", "time");
  for (const auto& [key, entry] : entries_) {
    const bool as_expected = entry.moved == entry.expected;
    out += fmt::format("{:<15} {:<36} {:>7} {:>12} {:>12} {:>9} {:>9.3f}s\n", kind_name(key.first),
                       key.second.empty() ? "-" : key.second, entry.calls, format_bytes(entry.moved.sent),
                       format_bytes(entry.moved.received), as_expected ? "yes" : "NO", entry.seconds);
  }
  return out;
}

}  // namespace emu::coll
