// The teaching view: the exchanges every rank made in one collective, put in order and shown step by step.
//
// Each rank logs its exchanges (StepRecord) while the algorithm runs on real data. Here, with all ranks' logs in
// hand, each exchange gets a logical round: one after the rank's previous exchange, and no earlier than the
// exchange that sent what it receives (messages between a pair arrive in order). A ring then shows N-1 rounds
// per half, a binomial tree ceil(log2 N). The rounds are printed as text and written as a Chrome trace that
// Perfetto opens: one track per rank, one slice per exchange, an arrow per message.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collectives/algorithm.h"

namespace emu::coll::teach {

using Logs = std::vector<std::vector<StepRecord>>;  // [rank][exchange]

// rounds[rank][exchange], from 1.
std::vector<std::vector<int>> logical_rounds(const Logs& logs);

// One line per exchange, grouped by round, with each rank's bytes sent and received so far. Elements of
// `element_bytes` bytes name the range an exchange logged by offset (halving-doubling's halves).
std::string format_steps(const Logs& logs, const std::vector<std::vector<int>>& rounds, size_t element_bytes);

// What one side of an exchange carries, as the text and the pictures label it: "block 2 (8 B)",
// "elements [4,6) (8 B)", or the bytes alone (the whole buffer).
std::string chunk_text(int block, int64_t offset, uint64_t bytes, size_t element_bytes);

// {"traceEvents": [...]}: a track per rank, a slice per exchange (1 ms per round), flow arrows per message.
nlohmann::json chrome_trace(const Logs& logs, const std::vector<std::vector<int>>& rounds, const std::string& title);

// The exchanges in the cost model's terms (algorithm.h, Cost): the rounds, and for the busiest rank the bytes it
// moved one exchange after another (the larger of what it sent and received in each: links are full duplex) and
// the bytes it added into its own.
struct ExecutedCost {
  int rounds = 0;
  uint64_t bytes = 0;
  uint64_t reduced = 0;
};
ExecutedCost executed_cost(const Logs& logs, const std::vector<std::vector<int>>& rounds);

// Empty when the algorithm's closed form agrees with what it did: the same rounds, and bytes and reduced bytes
// within one element per round (the blocks of a count that N does not divide differ by one element); otherwise
// what disagrees.
std::string cost_disagreement(const Cost& model, const ExecutedCost& executed, uint64_t element_bytes);

// How one call's buffer is laid out, for the contents view.
struct Layout {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  size_t count = 0;  // as the call's: the buffer (all_reduce, broadcast, reduce) or each rank's block (the others)
  size_t element_bytes = 4;
  int root = 0;  // broadcast and reduce
};

// Each rank's buffer after every round, block by block (a, b, c, ... as the partition cuts it): whose inputs each
// block holds, added ("a0+a3": block a summed over ranks 0 and 3) or copied, "·" where nothing has arrived yet; for
// all-to-all, the rank each block came from. `verdict` compares the last round's contents with what the collective
// is defined to leave (all-reduce: every block summed over every rank on every rank; reduce-scatter: block r summed
// on rank r; all-gather: block b from rank b everywhere; ...): empty when they agree. Both empty for more than 26
// ranks.
// `error` names an exchange the view cannot place in the buffer (a logged side with neither a block nor an offset
// that is not the whole buffer, or one that runs past its end); the text is then empty.
struct Contents {
  std::string text;
  std::string verdict;
  std::string error;
};
Contents format_contents(const Layout& layout, const Logs& logs, const std::vector<std::vector<int>>& rounds);

// The same replay as frames, for the pictures (teach_picture.h): each rank's blocks after every round and the
// messages the round carried. The text above is printed from these frames.
struct Message {
  int from = kNoPeer;
  int to = kNoPeer;
  std::string chunk;     // chunk_text of the sending side
  bool reduced = false;  // the receiver added it to its own
};
struct Frame {
  int round = 0;                                 // 0: the inputs, before any exchange
  std::string stages;                            // the round's stages, "reduce-scatter step 1/3"
  std::vector<std::vector<std::string>> blocks;  // [rank][block]: "a0+a3", "·"
  std::vector<Message> messages;
};
struct Replay {
  std::vector<Frame> frames;  // round 0 .. the last
  std::string verdict;        // as Contents::verdict
  std::string error;          // as Contents::error; the frames are then empty
};
Replay replay_contents(const Layout& layout, const Logs& logs, const std::vector<std::vector<int>>& rounds);
Contents format_contents(const Replay& replay);

nlohmann::json to_json(const std::vector<StepRecord>& log);
std::vector<StepRecord> from_json(const nlohmann::json& json);

}  // namespace emu::coll::teach
