// Hierarchical all-reduce, for ranks spread over nodes: L ranks per node (CommunicatorOptions::ranks_per_node,
// consecutive ranks on a node), M = N / L nodes. Three rings, the slow links between nodes used by one of them only:
//
//   1. within each node, a ring reduce-scatter: local rank l ends with chunk l summed over its node (L-1 steps);
//   2. between nodes, the M ranks of local rank l (one per node) ring all-reduce chunk l: each now holds chunk l
//      summed over every rank (2(M-1) steps, 2(M-1)/M of S/L over the network);
//   3. within each node, a ring all-gather of the chunks (L-1 steps).
//
// Horovod's hierarchical allreduce has the same three phases (horovod/common/ops/nccl_operations.cc,
// NCCLHierarchicalAllreduce: ncclReduceScatter within the node, an MPI_Allreduce of each shard across nodes,
// ncclAllGather within the node); its inter-node all-reduce is whatever MPI picks, here the ring, which MPI and NCCL
// run for large messages and which sends the least a rank can send: 2(M-1)/M of the shard. Each rank so sends 1/L
// of what a flat ring over the N ranks would send across the network, which is the point: the node's NVLink carries
// the rest. With L = N (one node) it is the ring all-reduce; with L = 1, the ring all-reduce between nodes.
//
// The buffer is cut as the ring cuts it over N ranks (Blocks::even); chunk l is blocks l·M .. l·M + M-1, so the
// teaching view names the inter-node messages by block. L must divide N: nodes of unequal size are refused.
#include <fmt/format.h>

#include <algorithm>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"
#include "emu/check.h"

namespace emu::coll {
namespace {

// L and M of a group of n ranks; throws InputError when L does not divide n.
struct Nodes {
  int per_node = 1;  // L
  int count = 1;     // M
};
Nodes nodes_of(int n, int ranks_per_node) {
  const int per_node = node_size(ranks_per_node, n);
  if (n % per_node != 0) {
    throw InputError(
        fmt::format("all_reduce=hier: {} ranks per node do not divide the group's {} ranks; accepted: "
                    "a divisor of {} (or 0: one node)",
                    per_node, n, n));
  }
  return {per_node, n / per_node};
}

// Chunk c (of L) of the N-block cut: blocks c·M .. c·M + M-1.
size_t chunk_offset(const BlockView& blocks, int c, const Nodes& nodes) { return blocks.offset(c * nodes.count); }
size_t chunk_count(const BlockView& blocks, int c, const Nodes& nodes) {
  const size_t end = c + 1 == nodes.per_node ? blocks.total() : blocks.offset((c + 1) * nodes.count);
  return end - chunk_offset(blocks, c, nodes);
}
// The largest message: a chunk (chunk 0, the even cut's largest) when a node holds more than one rank, else a block.
size_t largest_message(const BlockView& blocks, const Nodes& nodes) {
  return nodes.per_node > 1 ? chunk_count(blocks, 0, nodes) : blocks.largest();
}

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int r = context.rank();
  const DType dtype = call.dtype;
  const Nodes nodes = nodes_of(n, context.ranks_per_node);
  copy(dtype, call.send, call.recv, call.count);
  if (n == 1 || call.count == 0) return;
  const int per_node = nodes.per_node;
  const int node = r / per_node;
  const int local = r % per_node;
  const BlockView blocks = BlockView::even(call.count, n);
  // scratch: [min(largest message, slice)] elements, where each received slice lands before it is added.
  Buffer scratch = context.scratch(largest_message(blocks, nodes), 1, dtype, "hier all_reduce scratch");
  void* data = call.recv;

  // Within the node: a ring over its L ranks, on chunks.
  const int next = node * per_node + ring_next(local, per_node);
  const int prev = node * per_node + ring_prev(local, per_node);
  const auto chunk_transfer = [&](int a, int b) {
    const size_t a_offset = chunk_offset(blocks, a, nodes);
    const size_t b_offset = chunk_offset(blocks, b, nodes);
    Transfer transfer{at(data, a_offset, dtype), chunk_count(blocks, a, nodes), next, -1,
                      at(data, b_offset, dtype), chunk_count(blocks, b, nodes), prev, -1};
    transfer.send_offset = static_cast<int64_t>(a_offset);
    transfer.recv_offset = static_cast<int64_t>(b_offset);
    return transfer;
  };
  for (int step = 0; step < per_node - 1; ++step) {
    const Transfer transfer =
        chunk_transfer(ring_rs_send_block(local, step, per_node), ring_rs_recv_block(local, step, per_node));
    exchange_reduce(context, dtype, call.op,
                    fmt::format("intra-node reduce-scatter step {}/{}", step + 1, per_node - 1), transfer,
                    transfer.recv, scratch.data());
  }

  // Between nodes: a ring over the M ranks of local rank `local`, on the blocks of chunk `local`.
  const int m = nodes.count;
  const int up = ring_next(node, m) * per_node + local;
  const int down = ring_prev(node, m) * per_node + local;
  const auto block_transfer = [&](int a, int b) {
    const int send_block = local * m + a;
    const int recv_block = local * m + b;
    return Transfer{at(data, blocks.offset(send_block), dtype), blocks.count(send_block), up,   send_block,
                    at(data, blocks.offset(recv_block), dtype), blocks.count(recv_block), down, recv_block};
  };
  for (int step = 0; step < m - 1; ++step) {
    const Transfer transfer = block_transfer(ring_rs_send_block(node, step, m), ring_rs_recv_block(node, step, m));
    exchange_reduce(context, dtype, call.op, fmt::format("inter-node reduce-scatter step {}/{}", step + 1, m - 1),
                    transfer, transfer.recv, scratch.data());
  }
  for (int step = 0; step < m - 1; ++step) {
    const Transfer transfer = block_transfer(ring_ag_send_block(node, step, m), ring_ag_recv_block(node, step, m));
    exchange_copy(context, dtype, fmt::format("inter-node all-gather step {}/{}", step + 1, m - 1), transfer);
  }

  // Within the node again: the chunks around the ring.
  for (int step = 0; step < per_node - 1; ++step) {
    const Transfer transfer =
        chunk_transfer(ring_ag_send_block(local, step, per_node), ring_ag_recv_block(local, step, per_node));
    exchange_copy(context, dtype, fmt::format("intra-node all-gather step {}/{}", step + 1, per_node - 1), transfer);
  }
}

// Within the node, as the ring all-reduce over L chunks: the reduce-scatter sends every chunk but l and receives
// every chunk but l-1, the all-gather sends every chunk but l+1 and receives every chunk but l. Between nodes, the
// same over the M blocks of chunk l, with the node's index in place of l: all of it between nodes.
Expectation expect(const Call& call, int rank, int n, size_t slice_bytes, int ranks_per_node) {
  const Nodes nodes = nodes_of(n, ranks_per_node);
  Expectation expectation;
  expectation.between_nodes = Traffic{};
  if (n == 1 || call.count == 0) return expectation;
  const int per_node = nodes.per_node;
  const int m = nodes.count;
  const int node = rank / per_node;
  const int local = rank % per_node;
  const BlockView blocks = BlockView::even(call.count, n);
  const uint64_t e = dtype_size(call.dtype);
  const auto chunk = [&](int c) { return chunk_count(blocks, wrap(c, per_node), nodes) * e; };
  const auto block = [&](int j) { return blocks.count(local * m + wrap(j, m)) * e; };
  const uint64_t total = blocks.total() * e;
  const uint64_t shard = chunk(local);
  Traffic between;
  between.sent = 2 * shard - block(node) - block(node + 1);
  between.received = 2 * shard - block(node - 1) - block(node);
  expectation.traffic.sent = 2 * total - chunk(local) - chunk(local + 1) + between.sent;
  expectation.traffic.received = 2 * total - chunk(local - 1) - chunk(local) + between.received;
  expectation.between_nodes = between;
  expectation.buffer_bytes = std::min(largest_message(blocks, nodes), slice_elements(slice_bytes, call.dtype)) * e;
  return expectation;
}

// Every rank takes part in every step. Within the node, 2(L-1) steps of S/L over its links; between nodes, 2(M-1)
// steps of S/(LM) over the network; each step of a reduce-scatter adds what it received.
Cost cost(double s, int n, int ranks_per_node) {
  const Nodes nodes = nodes_of(n, ranks_per_node);
  const double l = nodes.per_node;
  const double m = nodes.count;
  const double intra_bytes = 2 * (l - 1) / l * s;
  const double inter_bytes = 2 * (m - 1) / m * s / l;
  Cost cost{2 * (l - 1) + 2 * (m - 1), intra_bytes + inter_bytes, ((l - 1) / l + (m - 1) / (m * l)) * s,
            "2(L-1) α + 2(L-1)/L S β within the node; 2(M-1) α + 2(M-1)/M S/L β between nodes (L ranks per node, "
            "M = N/L nodes); ((L-1)/L + (M-1)/(ML)) S γ"};
  cost.split = true;
  cost.inter_rounds = 2 * (m - 1);
  cost.inter_bytes = inter_bytes;
  return cost;
}

}  // namespace

extern const Algorithm kHierAllReduce{
    CollectiveKind::kAllReduce,
    "hier",
    "ring reduce-scatter within each node, ring all-reduce of each shard between nodes, ring all-gather within the "
    "node; 1/L of the flat ring's bytes between nodes",
    run,
    expect,
    cost};

}  // namespace emu::coll
