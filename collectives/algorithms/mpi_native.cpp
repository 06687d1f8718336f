// The pass-through: the communication library's own collectives (MPI_Allreduce, ...), reached via Link::native.
// Fast, and the reference our algorithms are tested against. What the library moves inside is not observable,
// so the ledger is charged with nominal volumes: those of our default algorithm for the kind (ring for
// all-reduce, reduce-scatter, all-gather and reduce, binomial tree for broadcast, pairwise for all-to-all).
#include "collectives/algorithm.h"
#include "collectives/reduce.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

// MPI's in-place reduce-scatter keeps the result at the start of the buffer, NCCL's at the rank's block; an
// in-place call (NCCL semantics) therefore goes through a temporary block.
bool needs_temporary(const Call& call, int rank, int n) {
  if (call.kind != CollectiveKind::kReduceScatter || n == 1) return false;
  const BlockView blocks = blocks_of(call, n);
  return blocks.count(rank) > 0 && call.recv == at(call.send, blocks.offset(rank), call.dtype);
}

Traffic nominal(const Call& call, int rank, int n, size_t slice_bytes) {
  const Algorithm* reference = algorithms_for(call.kind).front();
  return reference->expect(call, rank, n, slice_bytes, 0).traffic;
}

void run(AlgorithmContext& context, const Call& call) {
  Call native = call;
  if (native.op == ReduceOp::kAvg) native.op = ReduceOp::kSum;
  Buffer temporary;
  if (needs_temporary(call, context.rank(), context.size())) {
    const size_t mine = blocks_of(call, context.size()).count(context.rank());
    temporary = context.buffer(mine, call.dtype, "mpi reduce_scatter in-place block");
    native.recv = temporary.data();
    context.link.native(native);
    copy(call.dtype, temporary.data(), call.recv, mine);
  } else {
    context.link.native(native);
  }
  context.moved += nominal(call, context.rank(), context.size(), context.slice_bytes);
}

Expectation expect(const Call& call, int rank, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  Expectation expectation;
  expectation.traffic = nominal(call, rank, n, slice_bytes);
  if (needs_temporary(call, rank, n)) {
    const size_t mine = blocks_of(call, n).count(rank);
    expectation.buffer_bytes = mine * dtype_size(call.dtype);
  }
  return expectation;
}

constexpr std::string_view kSummary = "the library's own collective (MPI); nominal volumes in the ledger";

}  // namespace

extern const Algorithm kMpiAllReduce{CollectiveKind::kAllReduce, "mpi", kSummary, run, expect, nullptr};
extern const Algorithm kMpiReduceScatter{CollectiveKind::kReduceScatter, "mpi", kSummary, run, expect, nullptr};
extern const Algorithm kMpiAllGather{CollectiveKind::kAllGather, "mpi", kSummary, run, expect, nullptr};
extern const Algorithm kMpiBroadcast{CollectiveKind::kBroadcast, "mpi", kSummary, run, expect, nullptr};
extern const Algorithm kMpiReduce{CollectiveKind::kReduce, "mpi", kSummary, run, expect, nullptr};
extern const Algorithm kMpiAllToAll{CollectiveKind::kAllToAll, "mpi", kSummary, run, expect, nullptr};
extern const Algorithm kMpiBarrier{CollectiveKind::kBarrier, "mpi", kSummary, run, expect, nullptr};

}  // namespace emu::coll
