#include "collectives/tools/teach_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string_view>

#include "collectives/topology.h"
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

}  // namespace

std::string chunk_text(int block, int64_t offset, uint64_t bytes, size_t element_bytes) {
  if (block >= 0) return fmt::format("block {} ({})", block, format_bytes(bytes));
  if (offset >= 0 && element_bytes > 0) {
    return fmt::format("elements [{},{}) ({})", offset, static_cast<uint64_t>(offset) + bytes / element_bytes,
                       format_bytes(bytes));
  }
  return format_bytes(bytes);
}

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

std::string format_steps(const Logs& logs, const std::vector<std::vector<int>>& rounds, size_t element_bytes) {
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
        if (sends(step)) {
          what += fmt::format("sends {} to r{}",
                              chunk_text(step.send_block, step.send_offset, step.send_bytes, element_bytes), step.to);
        }
        if (receives(step)) {
          what += fmt::format("{}receives {} from r{}{}", what.empty() ? "" : "; ",
                              chunk_text(step.recv_block, step.recv_offset, step.recv_bytes, element_bytes), step.from,
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

namespace {

using Contributors = uint64_t;  // one bit per rank whose input an element holds

// The partition the view cuts each rank's buffer by, in elements of the buffer the exchanges address.
Blocks view_blocks(const Layout& layout, int n) {
  switch (layout.kind) {
    case CollectiveKind::kAllReduce: return Blocks::even(layout.count, n);
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll: return Blocks::uniform(layout.count, n);
    default: {
      const std::vector<size_t> whole{layout.count};
      return Blocks::of(whole);
    }
  }
}

std::vector<std::vector<Contributors>> initial_contents(const Layout& layout, const Blocks& blocks, int n) {
  std::vector<std::vector<Contributors>> state(static_cast<size_t>(n),
                                               std::vector<Contributors>(blocks.total, Contributors{0}));
  for (int r = 0; r < n; ++r) {
    auto& mine = state[static_cast<size_t>(r)];
    const Contributors self = Contributors{1} << r;
    const auto own_block = [&] {
      const auto b = static_cast<size_t>(r);
      std::fill_n(mine.begin() + static_cast<std::ptrdiff_t>(blocks.offset[b]), blocks.count[b], self);
    };
    switch (layout.kind) {
      case CollectiveKind::kAllGather:
      case CollectiveKind::kAllToAll: own_block(); break;
      case CollectiveKind::kBroadcast:
        if (r == layout.root) std::fill(mine.begin(), mine.end(), self);
        break;
      default: std::fill(mine.begin(), mine.end(), self);
    }
  }
  return state;
}

// "a0+a3": block a summed over ranks 0 and 3. Above 4 ranks, where a full sum would fill a line ("a0+a1+...+a7"
// eight times over), a run of three or more consecutive ranks is written as its ends: "b0+b2..b7".
std::string contributors_text(Contributors set, int block, int ranks) {
  if (set == 0) return "·";
  const auto has = [&](int r) { return r < 64 && ((set >> r) & 1) != 0; };
  const char name = static_cast<char>('a' + block);
  std::string out;
  for (int r = 0; r < 64; ++r) {
    if (!has(r)) continue;
    int last = r;
    while (has(last + 1)) ++last;
    const bool run = ranks > 4 && last - r >= 2;
    out += fmt::format("{}{}{}", out.empty() ? "" : "+", name, r);
    if (run) {
      out += fmt::format("..{}{}", name, last);
      r = last;
    }
  }
  return out;
}

std::string block_contents(const std::vector<Contributors>& elements, size_t begin, size_t count, int block,
                           int ranks) {
  const auto text = [&](Contributors set) { return contributors_text(set, block, ranks); };
  std::vector<Contributors> distinct;
  for (size_t e = begin; e < begin + count; ++e) {
    if (distinct.empty() || distinct.back() != elements[e]) distinct.push_back(elements[e]);
  }
  if (distinct.size() == 1) return text(distinct[0]);
  std::string out = "{";
  for (size_t i = 0; i < distinct.size(); ++i) out += (i == 0 ? "" : ", ") + text(distinct[i]);
  return out + "}";
}

// The first place where the final contents differ from the collective's definition, or empty.
std::string definition_disagreement(const Layout& layout, const Blocks& blocks,
                                    const std::vector<std::vector<Contributors>>& state) {
  const int n = static_cast<int>(state.size());
  const Contributors everyone = n == 64 ? ~Contributors{0} : (Contributors{1} << n) - 1;
  for (int r = 0; r < n; ++r) {
    for (size_t b = 0; b < blocks.count.size(); ++b) {
      Contributors want = 0;
      bool checked = true;
      switch (layout.kind) {
        case CollectiveKind::kAllReduce: want = everyone; break;
        case CollectiveKind::kReduceScatter:
          want = everyone;
          checked = static_cast<int>(b) == r;
          break;
        case CollectiveKind::kAllGather:
        case CollectiveKind::kAllToAll: want = Contributors{1} << b; break;
        case CollectiveKind::kBroadcast: want = Contributors{1} << layout.root; break;
        case CollectiveKind::kReduce:
          want = everyone;
          checked = r == layout.root;
          break;
        default: checked = false;
      }
      if (!checked) continue;
      for (size_t e = blocks.offset[b]; e < blocks.offset[b] + blocks.count[b]; ++e) {
        if (state[static_cast<size_t>(r)][e] != want) {
          return fmt::format("r{} block {} holds {}, the collective leaves {}", r, static_cast<char>('a' + b),
                             block_contents(state[static_cast<size_t>(r)], e, 1, static_cast<int>(b), n),
                             block_contents(std::vector<Contributors>{want}, 0, 1, static_cast<int>(b), n));
        }
      }
    }
  }
  return "";
}

}  // namespace

namespace {

// Follows the exchanges round by round over each rank's buffer of contributor sets.
class ContentsReplay {
 public:
  ContentsReplay(const Layout& layout, const Logs& logs, const std::vector<std::vector<int>>& rounds)
      : layout_(layout),
        logs_(logs),
        rounds_(rounds),
        blocks_(view_blocks(layout, static_cast<int>(logs.size()))),
        state_(initial_contents(layout, blocks_, static_cast<int>(logs.size()))),
        sender_of_(match_messages(logs)) {}

  // The round's exchanges applied; the frame after it. Empty error() when every exchange could be placed.
  Frame play(int round) {
    Frame frame;
    frame.round = round;
    if (send(round)) receive(round, frame);
    frame.stages = stages(round);
    frame.blocks = blocks();
    return frame;
  }

  Frame inputs() const { return Frame{0, "inputs", blocks(), {}}; }
  const std::string& error() const { return error_; }
  std::string verdict() const { return definition_disagreement(layout_, blocks_, state_); }

 private:
  std::vector<std::vector<std::string>> blocks() const {
    std::vector<std::vector<std::string>> out(state_.size());
    for (size_t r = 0; r < state_.size(); ++r) {
      for (size_t b = 0; b < blocks_.count.size(); ++b) {
        out[r].push_back(block_contents(state_[r], blocks_.offset[b], blocks_.count[b], static_cast<int>(b),
                                        static_cast<int>(state_.size())));
      }
    }
    return out;
  }

  std::string stages(int round) const {
    std::vector<std::string> names;
    for (size_t r = 0; r < logs_.size(); ++r) {
      for (size_t i = 0; i < logs_[r].size(); ++i) {
        if (rounds_[r][i] != round) continue;
        // A stage may name several parts ("tree 1 up, tree 0 up"); each is listed once.
        std::string_view rest = logs_[r][i].stage;
        while (!rest.empty()) {
          const size_t comma = rest.find(", ");
          const std::string part(rest.substr(0, comma));
          if (std::find(names.begin(), names.end(), part) == names.end()) names.push_back(part);
          rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 2);
        }
      }
    }
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
    return out;
  }

  // Where one side of an exchange lies: its logged offset, else its block's, else the whole buffer, which it must
  // then be (a side with neither that is not the whole buffer cannot be placed, and is an error, not offset 0).
  std::optional<std::pair<size_t, size_t>> placed(size_t rank, size_t index, int64_t offset, int block, uint64_t bytes,
                                                  const char* side) {
    const size_t count = bytes / layout_.element_bytes;
    std::pair<size_t, size_t> where{0, count};
    if (offset >= 0) {
      where.first = static_cast<size_t>(offset);
    } else if (block >= 0 && static_cast<size_t>(block) < blocks_.offset.size()) {
      where.first = blocks_.offset[static_cast<size_t>(block)];
    } else if (count != blocks_.total) {
      return fail(rank, index,
                  fmt::format("{} {} with neither a block nor an offset, and the buffer is {}", side,
                              format_bytes(bytes), format_bytes(blocks_.total * layout_.element_bytes)));
    }
    if (where.first + count > blocks_.total) {
      return fail(
          rank, index,
          fmt::format("{} elements [{},{}) of a buffer of {}", side, where.first, where.first + count, blocks_.total));
    }
    return where;
  }

  std::nullopt_t fail(size_t rank, size_t index, const std::string& what) {
    if (error_.empty()) {
      error_ = fmt::format("r{}'s exchange {} ({}) {}", rank, index + 1, logs_[rank][index].stage, what);
    }
    return std::nullopt;
  }

  // What each exchange of the round sends is its rank's state before the round's receives.
  bool send(int round) {
    for (size_t r = 0; r < logs_.size(); ++r) {
      for (size_t i = 0; i < logs_[r].size(); ++i) {
        const StepRecord& step = logs_[r][i];
        if (rounds_[r][i] != round || !sends(step)) continue;
        const auto where = placed(r, i, step.send_offset, step.send_block, step.send_bytes, "sends");
        if (!where) return false;
        const auto [offset, count] = *where;
        std::vector<Contributors> payload(count, Contributors{1} << r);  // all-to-all: the sender's own input
        if (layout_.kind != CollectiveKind::kAllToAll) {
          std::copy_n(state_[r].begin() + static_cast<std::ptrdiff_t>(offset), count, payload.begin());
        }
        in_flight_[{static_cast<int>(r), i}] = std::move(payload);
      }
    }
    return true;
  }

  void receive(int round, Frame& frame) {
    for (size_t r = 0; r < logs_.size(); ++r) {
      for (size_t i = 0; i < logs_[r].size(); ++i) {
        const StepRecord& step = logs_[r][i];
        if (rounds_[r][i] != round || !receives(step)) continue;
        const auto sender = sender_of_.find({static_cast<int>(r), i});
        if (sender == sender_of_.end()) {
          fail(r, i, fmt::format("receives from r{}, which sends it nothing", step.from));
          return;
        }
        const std::vector<Contributors>& payload = in_flight_.at(sender->second);
        const auto where = placed(r, i, step.recv_offset, step.recv_block, step.recv_bytes, "receives");
        if (!where) return;
        const auto [offset, count] = *where;
        if (count != payload.size()) {
          fail(r, i, fmt::format("receives {} elements, r{} sent {}", count, sender->second.first, payload.size()));
          return;
        }
        for (size_t e = 0; e < count; ++e) {
          Contributors& held = state_[r][offset + e];
          held = step.reduced ? (held | payload[e]) : payload[e];
        }
        const StepRecord& sent = logs_[static_cast<size_t>(sender->second.first)][sender->second.second];
        frame.messages.push_back(Message{
            sender->second.first, static_cast<int>(r),
            chunk_text(sent.send_block, sent.send_offset, sent.send_bytes, layout_.element_bytes), step.reduced});
      }
    }
  }

  const Layout& layout_;
  const Logs& logs_;
  const std::vector<std::vector<int>>& rounds_;
  Blocks blocks_;
  std::vector<std::vector<Contributors>> state_;
  std::map<std::pair<int, size_t>, std::pair<int, size_t>> sender_of_;
  std::map<std::pair<int, size_t>, std::vector<Contributors>> in_flight_;  // keyed by the sending exchange
  std::string error_;
};

}  // namespace

Replay replay_contents(const Layout& layout, const Logs& logs, const std::vector<std::vector<int>>& rounds) {
  if (logs.size() > 26 || layout.count == 0) return {};
  int last = 0;
  for (const auto& list : rounds) {
    for (int round : list) last = std::max(last, round);
  }
  ContentsReplay replay(layout, logs, rounds);
  Replay out;
  out.frames.push_back(replay.inputs());
  for (int round = 1; round <= last; ++round) {
    out.frames.push_back(replay.play(round));
    if (!replay.error().empty()) return {{}, "", replay.error()};
  }
  out.verdict = replay.verdict();
  return out;
}

Contents format_contents(const Layout& layout, const Logs& logs, const std::vector<std::vector<int>>& rounds) {
  return format_contents(replay_contents(layout, logs, rounds));
}

Contents format_contents(const Replay& replay) {
  std::string out;
  for (const Frame& frame : replay.frames) {
    if (frame.round == 0) continue;
    out += fmt::format("after round {}:\n", frame.round);
    for (size_t r = 0; r < frame.blocks.size(); ++r) {
      std::string line;
      for (const std::string& block : frame.blocks[r]) line += (line.empty() ? "" : " | ") + block;
      out += fmt::format("  r{} [{}]\n", r, line);
    }
  }
  return {out, replay.verdict, replay.error};
}

nlohmann::json to_json(const std::vector<StepRecord>& log) {
  nlohmann::json out = nlohmann::json::array();
  for (const StepRecord& s : log) {
    out.push_back({s.stage, s.to, s.send_block, s.send_bytes, s.from, s.recv_block, s.recv_bytes, s.reduced,
                   s.send_offset, s.recv_offset});
  }
  return out;
}

std::vector<StepRecord> from_json(const nlohmann::json& json) {
  std::vector<StepRecord> log;
  for (const auto& s : json) {
    log.push_back(StepRecord{s[0].get<std::string>(), s[1].get<int>(), s[2].get<int>(), s[3].get<uint64_t>(),
                             s[4].get<int>(), s[5].get<int>(), s[6].get<uint64_t>(), s[7].get<bool>(),
                             s[8].get<int64_t>(), s[9].get<int64_t>()});
  }
  return log;
}

}  // namespace emu::coll::teach
