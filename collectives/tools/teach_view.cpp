#include "collectives/tools/teach_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "emu/units.h"

namespace emu::coll::teach {
namespace {

bool sends(const StepRecord& step) { return step.to != kNoPeer; }
bool receives(const StepRecord& step) { return step.from != kNoPeer; }

// For each receiving exchange, the (rank, index) of the exchange that sent its message: the k-th message from
// a to b is received by b's k-th exchange that receives from a.
std::map<std::pair<int, size_t>, std::pair<int, size_t>> match_messages(const Logs& logs) {
  std::map<std::pair<int, int>, std::vector<size_t>> sent;  // (from, to) -> sending exchanges in order
  for (size_t r = 0; r < logs.size(); ++r) {
    for (size_t i = 0; i < logs[r].size(); ++i) {
      if (sends(logs[r][i])) sent[{static_cast<int>(r), logs[r][i].to}].push_back(i);
    }
  }
  std::map<std::pair<int, size_t>, std::pair<int, size_t>> sender_of;
  std::map<std::pair<int, int>, size_t> next;
  for (size_t r = 0; r < logs.size(); ++r) {
    for (size_t i = 0; i < logs[r].size(); ++i) {
      if (!receives(logs[r][i])) continue;
      const std::pair<int, int> pair{logs[r][i].from, static_cast<int>(r)};
      const size_t k = next[pair]++;
      const auto& list = sent[pair];
      if (k < list.size()) sender_of[{static_cast<int>(r), i}] = {pair.first, list[k]};
    }
  }
  return sender_of;
}

std::string block_text(int block, uint64_t bytes) {
  return block >= 0 ? fmt::format("block {} ({})", block, format_bytes(bytes)) : format_bytes(bytes);
}

}  // namespace

std::vector<std::vector<int>> logical_rounds(const Logs& logs) {
  const auto sender_of = match_messages(logs);
  std::vector<std::vector<int>> rounds(logs.size());
  for (size_t r = 0; r < logs.size(); ++r) rounds[r].assign(logs[r].size(), 1);
  // Relax until stable: round = max(previous on this rank + 1, round of the sender). Exchanges in a ring wait on
  // each other in a cycle, so this is a fixed point rather than one pass; rounds only grow and are bounded.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < logs.size(); ++r) {
      for (size_t i = 0; i < logs[r].size(); ++i) {
        int round = i == 0 ? 1 : rounds[r][i - 1] + 1;
        const auto it = sender_of.find({static_cast<int>(r), i});
        if (it != sender_of.end()) {
          round = std::max(round, rounds[static_cast<size_t>(it->second.first)][it->second.second]);
        }
        if (round != rounds[r][i]) {
          rounds[r][i] = round;
          changed = true;
        }
      }
    }
  }
  return rounds;
}

ExecutedCost executed_cost(const Logs& logs, const std::vector<std::vector<int>>& rounds) {
  ExecutedCost cost;
  for (size_t r = 0; r < logs.size(); ++r) {
    uint64_t bytes = 0, reduced = 0;
    for (const StepRecord& step : logs[r]) {
      bytes += std::max(step.send_bytes, step.recv_bytes);
      if (step.reduced) reduced += step.recv_bytes;
    }
    cost.bytes = std::max(cost.bytes, bytes);
    cost.reduced = std::max(cost.reduced, reduced);
    for (int round : rounds[r]) cost.rounds = std::max(cost.rounds, round);
  }
  return cost;
}

std::string cost_disagreement(const Cost& model, const ExecutedCost& executed, uint64_t element_bytes) {
  const double slack = std::max(model.rounds, 1.0) * static_cast<double>(element_bytes);
  std::string out;
  if (static_cast<double>(executed.rounds) != model.rounds) {
    out += fmt::format("rounds: {} executed, {} in the model; ", executed.rounds, model.rounds);
  }
  if (std::abs(static_cast<double>(executed.bytes) - model.bytes) > slack) {
    out += fmt::format("bytes on the critical path: {} executed, {:.1f} in the model; ", executed.bytes, model.bytes);
  }
  if (std::abs(static_cast<double>(executed.reduced) - model.reduced) > slack) {
    out += fmt::format("bytes reduced: {} executed, {:.1f} in the model; ", executed.reduced, model.reduced);
  }
  if (!out.empty()) out.resize(out.size() - 2);
  return out;
}

std::string format_steps(const Logs& logs, const std::vector<std::vector<int>>& rounds) {
  int last = 0;
  for (const auto& list : rounds) {
    for (int round : list) last = std::max(last, round);
  }
  std::vector<Traffic> so_far(logs.size());
  std::string out;
  for (int round = 1; round <= last; ++round) {
    out += fmt::format("round {}\n", round);
    for (size_t r = 0; r < logs.size(); ++r) {
      for (size_t i = 0; i < logs[r].size(); ++i) {
        if (rounds[r][i] != round) continue;
        const StepRecord& step = logs[r][i];
        so_far[r] += Traffic{step.send_bytes, step.recv_bytes};
        std::string what;
        if (sends(step)) what += fmt::format("sends {} to r{}", block_text(step.send_block, step.send_bytes), step.to);
        if (receives(step)) {
          what += fmt::format("{}receives {} from r{}{}", what.empty() ? "" : "; ",
                              block_text(step.recv_block, step.recv_bytes), step.from,
                              step.reduced ? ", adds it to its own" : "");
        }
        if (what.empty()) what = "waits";
        out += fmt::format("  r{:<3} {:<26} {:<78} so far: sent {}, received {}\n", r, step.stage, what,
                           format_bytes(so_far[r].sent), format_bytes(so_far[r].received));
      }
    }
  }
  return out;
}

nlohmann::json chrome_trace(const Logs& logs, const std::vector<std::vector<int>>& rounds, const std::string& title) {
  constexpr double kRoundUs = 1000;  // one round is drawn as 1 ms
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", title}}}});
  const auto sender_of = match_messages(logs);
  int flow = 0;
  for (size_t r = 0; r < logs.size(); ++r) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 0},
                      {"tid", r},
                      {"args", {{"name", fmt::format("rank {}", r)}}}});
    Traffic so_far;
    for (size_t i = 0; i < logs[r].size(); ++i) {
      const StepRecord& step = logs[r][i];
      so_far += Traffic{step.send_bytes, step.recv_bytes};
      const double start = (rounds[r][i] - 1) * kRoundUs;
      events.push_back({{"ph", "X"},
                        {"name", step.stage},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", start},
                        {"dur", 0.9 * kRoundUs},
                        {"args",
                         {{"to", step.to},
                          {"send_block", step.send_block},
                          {"send_bytes", step.send_bytes},
                          {"from", step.from},
                          {"recv_block", step.recv_block},
                          {"recv_bytes", step.recv_bytes},
                          {"reduced", step.reduced},
                          {"sent_so_far", so_far.sent},
                          {"received_so_far", so_far.received}}}});
      const auto it = sender_of.find({static_cast<int>(r), i});
      if (it == sender_of.end()) continue;
      const auto [from, index] = it->second;
      const double sent_at = (rounds[static_cast<size_t>(from)][index] - 1) * kRoundUs + 0.1 * kRoundUs;
      events.push_back({{"ph", "s"},
                        {"name", "message"},
                        {"cat", "message"},
                        {"id", flow},
                        {"pid", 0},
                        {"tid", from},
                        {"ts", sent_at}});
      events.push_back({{"ph", "f"},
                        {"bp", "e"},
                        {"name", "message"},
                        {"cat", "message"},
                        {"id", flow},
                        {"pid", 0},
                        {"tid", r},
                        {"ts", start + 0.5 * kRoundUs}});
      ++flow;
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

nlohmann::json to_json(const std::vector<StepRecord>& log) {
  nlohmann::json out = nlohmann::json::array();
  for (const StepRecord& s : log) {
    out.push_back({s.stage, s.to, s.send_block, s.send_bytes, s.from, s.recv_block, s.recv_bytes, s.reduced});
  }
  return out;
}

std::vector<StepRecord> from_json(const nlohmann::json& json) {
  std::vector<StepRecord> log;
  for (const auto& s : json) {
    log.push_back(StepRecord{s[0].get<std::string>(), s[1].get<int>(), s[2].get<int>(), s[3].get<uint64_t>(),
                             s[4].get<int>(), s[5].get<int>(), s[6].get<uint64_t>(), s[7].get<bool>()});
  }
  return log;
}

}  // namespace emu::coll::teach
