// NCCL's double binary tree all-reduce: the buffer is cut in two halves, half t reduced up tree t to its root
// and broadcast back down it (the two trees of topology.h, dbtree_links). A rank is inner in at most one tree and a
// leaf in the other, so where a single tree leaves its leaves idle and its root moves the whole buffer every round,
// here the two trees keep every rank's links busy in both directions: NCCL's way to log-depth latency at close to
// the ring's bandwidth. Each half is pipelined in chunks of at most one slice (NCCL cuts its buffer the same way).
//
// The schedule is a plan of synchronous steps (a pure function of N, the count and the chunk, so every rank knows
// every other's). In a tree with its top inner rank at level L (the levels of topology.h: a position's lowest set
// bit), one chunk goes up in 2L + 1 steps — step 2j + s carries the partial sums of the level-j ranks that are
// child s of their parent, so no parent receives two at once — and comes down in 2L + 1 more, in the reverse order.
// Both trees run in the same steps: a rank is at different levels in the two, so it never sends twice or receives
// twice in a step, and a leaf's send in one tree often shares an exchange with a receive in the other (links are
// full duplex). Chunk k starts at the first step after chunk k-1's start where none of its moves collide with those
// already placed, so a chunk climbs while the one before it descends. Every rank runs the steps in order, idle ones
// included; each step's messages are sent and received in that step, so blocking exchanges cannot deadlock.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

// Half t of the buffer: tree 0 carries the first ceil(count / 2) elements, tree 1 the rest.
struct Piece {
  size_t offset = 0;
  size_t count = 0;
};
Piece half_of(size_t count, int tree) {
  const size_t first = (count + 1) / 2;
  return tree == 0 ? Piece{0, first} : Piece{first, count - first};
}

// One rank's part of one step: what it sends to whom, what it receives from whom and whether it adds it.
struct Side {
  int peer = kNoPeer;
  Piece piece;
  int tree = 0;
  bool up = true;
  size_t chunk = 0;
};
struct Move {
  Side send;
  Side recv;
};
using Plan = std::vector<std::vector<Move>>;  // [step][rank]

// Level of a tree position (its lowest set bit) and the top inner level L.
int level(int position) { return ceil_log2((position & -position) + 1) - 1; }
int top_level(int n) { return n <= 1 ? 0 : level(floor_pow2(n - 1)); }
int position_of(int tree, int rank, int n) {
  return tree == 0 ? rank : (n % 2 == 1 ? wrap(rank - 1, n) : n - 1 - rank);
}

// The up step of `rank` in `tree` within a chunk, 2j + s, or -1 for the root.
int up_step(int tree, int rank, int n) {
  const TreeLinks links = dbtree_links(tree, rank, n);
  if (links.parent < 0) return -1;
  const int side = dbtree_links(tree, links.parent, n).child0 == rank ? 0 : 1;
  return 2 * level(position_of(tree, rank, n)) + side;
}

Plan plan(size_t count, size_t chunk, int n) {
  Plan steps;
  if (n == 1 || count == 0) return steps;
  const int per_chunk = 2 * (2 * top_level(n) + 1);
  const size_t chunks = (half_of(count, 0).count + chunk - 1) / chunk;
  struct Edge {
    int step, from, to;
    Side side;
  };
  size_t start = 0;
  for (size_t k = 0; k < chunks; ++k) {
    std::vector<Edge> edges;  // chunk k's moves, steps relative to its start
    for (int t = 0; t < 2; ++t) {
      const Piece half = half_of(count, t);
      const size_t begin = std::min(k * chunk, half.count);
      const Piece piece{half.offset + begin, std::min(chunk, half.count - begin)};
      if (piece.count == 0) continue;
      for (int r = 0; r < n; ++r) {
        const int up = up_step(t, r, n);
        if (up < 0) continue;
        const int parent = dbtree_links(t, r, n).parent;
        edges.push_back({up, r, parent, {kNoPeer, piece, t, true, k}});
        edges.push_back({per_chunk - 1 - up, parent, r, {kNoPeer, piece, t, false, k}});
      }
    }
    const auto fits = [&](size_t at) {
      for (const Edge& e : edges) {
        const size_t step = at + static_cast<size_t>(e.step);
        if (step < steps.size() && (steps[step][static_cast<size_t>(e.from)].send.peer != kNoPeer ||
                                    steps[step][static_cast<size_t>(e.to)].recv.peer != kNoPeer)) {
          return false;
        }
      }
      return true;
    };
    if (k > 0) ++start;
    while (!fits(start)) ++start;
    steps.resize(std::max(steps.size(), start + static_cast<size_t>(per_chunk)),
                 std::vector<Move>(static_cast<size_t>(n)));
    for (const Edge& e : edges) {
      auto& row = steps[start + static_cast<size_t>(e.step)];
      row[static_cast<size_t>(e.from)].send = e.side;
      row[static_cast<size_t>(e.from)].send.peer = e.to;
      row[static_cast<size_t>(e.to)].recv = e.side;
      row[static_cast<size_t>(e.to)].recv.peer = e.from;
    }
  }
  return steps;
}

std::string describe(const Side& side, size_t chunks) {
  return fmt::format("tree {} {}{}", side.tree, side.up ? "up" : "down",
                     chunks > 1 ? fmt::format(" {}", side.chunk + 1) : std::string());
}

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int r = context.rank();
  const DType dtype = call.dtype;
  copy(dtype, call.send, call.recv, call.count);
  if (n == 1 || call.count == 0) return;
  const size_t chunk = slice_elements(context.slice_bytes, dtype);
  const size_t chunks = (half_of(call.count, 0).count + chunk - 1) / chunk;
  const Plan steps = plan(call.count, chunk, n);
  // scratch: [min(larger half, slice)] where each received partial sum lands before it is added.
  Buffer scratch;
  if (dbtree_links(0, r, n).child0 >= 0 || dbtree_links(1, r, n).child0 >= 0) {
    scratch = context.scratch(half_of(call.count, 0).count, 1, dtype, "dbtree all_reduce scratch");
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    const Move& move = steps[s][static_cast<size_t>(r)];
    Transfer x;
    std::string what;
    if (move.send.peer != kNoPeer) {
      x.send = at(call.recv, move.send.piece.offset, dtype);
      x.send_count = move.send.piece.count;
      x.to = move.send.peer;
      x.send_offset = static_cast<int64_t>(move.send.piece.offset);
      what = describe(move.send, chunks);
    }
    if (move.recv.peer != kNoPeer) {
      x.recv = at(call.recv, move.recv.piece.offset, dtype);
      x.recv_count = move.recv.piece.count;
      x.from = move.recv.peer;
      x.recv_offset = static_cast<int64_t>(move.recv.piece.offset);
      const std::string received = describe(move.recv, chunks);
      if (received != what) what += (what.empty() ? "" : ", ") + received;
    }
    const std::string stage = what.empty() ? std::string("idle") : what;
    if (move.recv.peer != kNoPeer && move.recv.up) {
      exchange_reduce(context, dtype, call.op, stage, x, x.recv, scratch.data());
    } else {
      exchange_copy(context, dtype, stage, x);  // an idle step is logged too: the rounds are the plan's steps
    }
  }
}

constexpr std::string_view kFormula = "(4 floor(log2(N-1)) + 2) α + 4 S β + S γ (N >= 6)";

// In tree t a rank sends its half up once (unless it is the root) and down once per child, and receives it once
// per child and once from its parent.
Expectation expect(const Call& call, int rank, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  if (n == 1 || call.count == 0) return {};
  const uint64_t e = dtype_size(call.dtype);
  Expectation expectation;
  bool adds = false;
  for (int t = 0; t < 2; ++t) {
    const TreeLinks links = dbtree_links(t, rank, n);
    const uint64_t bytes = half_of(call.count, t).count * e;
    const uint64_t links_used =
        (links.parent >= 0 ? 1u : 0u) + (links.child0 >= 0 ? 1u : 0u) + (links.child1 >= 0 ? 1u : 0u);
    expectation.traffic.sent += links_used * bytes;
    expectation.traffic.received += links_used * bytes;
    adds = adds || links.child0 >= 0;
  }
  if (adds) {
    expectation.buffer_bytes = std::min(half_of(call.count, 0).count, slice_elements(slice_bytes, call.dtype)) * e;
  }
  return expectation;
}

// One chunk (the model does not pipeline): 2L + 1 steps up and 2L + 1 down. The busiest rank is inner in one tree
// with a parent and two children (6 moves of S/2 there) and a leaf of the other (2 more), 8 one-way moves, 4 S,
// once N >= 6 gives it children that are not leaves; below that some of its moves share an exchange with the
// other tree's: N = 4, 5: 6 steps of S/2 (3 S); N = 3: 4 (2 S); N = 2: each rank sends and receives its half in
// the same step, up then down (S). It adds two halves, S (one, S/2, at N = 2).
Cost cost(double s, int n, int /*ranks_per_node*/) {
  if (n <= 1) return {0, 0, 0, kFormula};
  const double steps = n == 2 ? 2 : n == 3 ? 4 : n <= 5 ? 6 : 8;
  return {2.0 * (2 * top_level(n) + 1), steps * s / 2, n == 2 ? s / 2 : s, kFormula};
}

}  // namespace

extern const Algorithm kDbtreeAllReduce{
    CollectiveKind::kAllReduce,
    "dbtree",
    "NCCL's double binary tree: each half of the buffer reduced up and broadcast down its own tree, pipelined",
    run,
    expect,
    cost};

}  // namespace emu::coll
