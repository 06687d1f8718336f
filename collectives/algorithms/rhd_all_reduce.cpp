// Recursive halving-doubling all-reduce (Rabenseifner): latency-oriented, 2 log2 N steps instead of the ring's
// 2(N-1), with the same (N-1)/N volume per half when N is a power of two.
//
// Over p = 2^k ranks: in halving step k, partners v and v ^ mask split their common region in two, each sends
// the half the other keeps and adds the half it receives, so after log2 p steps each rank holds 1/p of the sum.
// Doubling retraces the steps, exchanging the reduced halves, until every rank holds the whole sum.
// For N not a power of two, the first 2(N - p) ranks fold first: each even one hands its whole vector to the odd
// one after it and sits out until the odd one hands the result back at the end.
//
// The plan (who exchanges which elements with whom) is a pure function, so expect() sums the same plan.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

struct Move {
  std::string stage;
  int peer = kNoPeer;
  size_t send_offset = 0, send_count = 0;
  size_t recv_offset = 0, recv_count = 0;
  bool reduce = false;
};

struct Region {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

std::vector<Move> plan(size_t count, int rank, int n) {
  std::vector<Move> moves;
  if (n == 1 || count == 0) return moves;
  const int p = floor_pow2(n);
  const int extra = n - p;
  const Region whole{0, count};
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      moves.push_back({"fold: hand over", rank + 1, 0, count, 0, 0, false});
      moves.push_back({"unfold: take back", rank + 1, 0, 0, 0, count, false});
      return moves;
    }
    moves.push_back({"fold: take over", rank - 1, 0, 0, 0, count, true});
  }
  const int v = rank < 2 * extra ? rank / 2 : rank - extra;
  const auto real = [&](int virtual_rank) {
    return virtual_rank < extra ? 2 * virtual_rank + 1 : virtual_rank + extra;
  };
  // kept[i]: the region this rank keeps at halving step i; given[i]: the partner's half.
  std::vector<Region> kept;
  std::vector<Region> given;
  std::vector<int> partners;
  Region region = whole;
  int step = 1;
  for (int mask = p / 2; mask >= 1; mask /= 2, ++step) {
    const int partner = v ^ mask;
    const size_t middle = region.begin + region.size() / 2;
    const Region low{region.begin, middle};
    const Region high{middle, region.end};
    const bool keep_low = (v & mask) == 0;
    const Region keep = keep_low ? low : high;
    const Region give = keep_low ? high : low;
    moves.push_back(
        {fmt::format("halving step {}", step), real(partner), give.begin, give.size(), keep.begin, keep.size(), true});
    kept.push_back(keep);
    given.push_back(give);
    partners.push_back(real(partner));
    region = keep;
  }
  for (size_t i = kept.size(); i-- > 0;) {
    moves.push_back({fmt::format("doubling step {}", kept.size() - i), partners[i], kept[i].begin, kept[i].size(),
                     given[i].begin, given[i].size(), false});
  }
  if (rank < 2 * extra) moves.push_back({"unfold: hand back", rank - 1, 0, count, 0, 0, false});
  return moves;
}

size_t largest_reduced(const std::vector<Move>& moves) {
  size_t largest = 0;
  for (const Move& move : moves) {
    if (move.reduce) largest = std::max(largest, move.recv_count);
  }
  return largest;
}

void run(AlgorithmContext& context, const Call& call) {
  const DType dtype = call.dtype;
  copy(dtype, call.send, call.recv, call.count);
  const std::vector<Move> moves = plan(call.count, context.rank(), context.size());
  const size_t reduced = largest_reduced(moves);
  // scratch: [min(largest reduced region, slice)] for each received slice before it is added.
  Buffer scratch;
  if (reduced > 0) {
    scratch = context.scratch(reduced, 1, dtype, "rhd scratch");
  }
  for (const Move& move : moves) {
    const Transfer transfer{at(call.recv, move.send_offset, dtype),
                            move.send_count,
                            move.peer,
                            -1,
                            at(call.recv, move.recv_offset, dtype),
                            move.recv_count,
                            move.peer,
                            -1,
                            static_cast<int64_t>(move.send_offset),
                            static_cast<int64_t>(move.recv_offset)};
    if (move.reduce) {
      exchange_reduce(context, dtype, call.op, move.stage, transfer, transfer.recv, scratch.data());
    } else {
      exchange_copy(context, dtype, move.stage, transfer);
    }
  }
}

Expectation expect(const Call& call, int rank, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  const std::vector<Move> moves = plan(call.count, rank, n);
  const uint64_t e = dtype_size(call.dtype);
  Expectation expectation;
  for (const Move& move : moves) {
    expectation.traffic.sent += move.send_count * e;
    expectation.traffic.received += move.recv_count * e;
  }
  const size_t reduced = largest_reduced(moves);
  if (reduced > 0) expectation.buffer_bytes = std::min(reduced, slice_elements(slice_bytes, call.dtype)) * e;
  return expectation;
}

// Over p = floor_pow2(N) ranks: log2 p halving and log2 p doubling rounds, each rank sending and adding half of
// what it holds. When N is not a power of two the odd rank of each folded pair also receives and adds the whole
// buffer first and hands the whole result back last: two rounds of S more.
Cost cost(double s, int n, int /*ranks_per_node*/) {
  const int p = floor_pow2(n);
  const double steps = 2.0 * ceil_log2(p);
  const double half = (p - 1.0) / p * s;
  if (p == n) return {steps, 2 * half, half, "2 log2 N α + 2(N-1)/N S β + (N-1)/N S γ"};
  return {steps + 2, 2 * half + 2 * s, half + s,
          "(2 log2 p + 2) α + (2(p-1)/p + 2) S β + ((p-1)/p + 1) S γ, p = 2^floor(log2 N)"};
}

}  // namespace

extern const Algorithm kRhdAllReduce{CollectiveKind::kAllReduce,
                                     "rhd",
                                     "recursive halving then doubling; 2 log2 N steps, latency-oriented",
                                     run,
                                     expect,
                                     cost};

}  // namespace emu::coll
