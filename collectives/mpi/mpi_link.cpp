// MPI implementation of Link: MPI_Sendrecv for our algorithms' exchanges, MPI's collectives for the pass-through.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>
#include <vector>

#include "collectives/mpi/mpi_communicator.h"
#include "collectives/topology.h"
#include "emu/bf16.h"
#include "emu/check.h"

namespace emu::coll {
namespace {

constexpr int kTag = 0x3e17;

// Whether a rank waiting in an exchange sleeps between polls (EMU_COLL_WAIT=sleep) instead of waiting as MPI does.
bool sleep_while_waiting() {
  static const bool sleep = [] {
    const char* wait = std::getenv("EMU_COLL_WAIT");
    return wait != nullptr && std::string_view(wait) == "sleep";
  }();
  return sleep;
}

// Waits for `count` requests. By default as MPI does: Open MPI polls, yielding the core when oversubscribed
// (mpi_yield_when_idle). With EMU_COLL_WAIT=sleep it polls for 20 us, enough for a peer on another core to answer,
// then sleeps 8, 16, ... up to 128 us between polls, so that a waiting rank holds no core. That pays only on a host
// busy with other work: Linux's fair scheduler hands a yielding rank its share of the cores, taken from the other
// jobs (the default 8-rank run at load 7-19: wall 20.4 s -> 9.4 s). On an idle host a sleep (never shorter than
// the timer slack, ~50 us) leaves cores idle that a peer's answer needed: the default 8-rank run on the idle 2-core
// machine took 7.2-7.5 s sleeping, 4.3-4.7 s as MPI waits. Only waiting changes: the bytes, their order and the
// arithmetic are MPI's as before.
void wait_for(MPI_Request* requests, int count) {
  if (!sleep_while_waiting()) {
    EMU_MPI_CHECK(MPI_Waitall(count, requests, MPI_STATUSES_IGNORE));
    return;
  }
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(20);
  const Clock::time_point start = Clock::now();
  int done = 0;
  for (int sleeps = 0;;) {
    EMU_MPI_CHECK(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done != 0) return;
    if (sleeps == 0 && Clock::now() - start < kSpin) continue;
    const timespec pause{0, (8L << std::min(sleeps, 4)) * 1000};
    nanosleep(&pause, nullptr);
    ++sleeps;
  }
}

// bf16 has no MPI datatype: it travels as MPI_UINT16_T with these operators, which widen to fp32, combine and
// round back (nearest even), like our kernels.
void bf16_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}
void bf16_max(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = bf16_to_float(a[i]);
    if (x > bf16_to_float(b[i])) b[i] = a[i];
  }
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::kF32 ? MPI_FLOAT : MPI_UINT16_T; }

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  if (dtype == DType::kF32) return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
  static const MPI_Op ops[2] = {[] {
                                  MPI_Op created = MPI_OP_NULL;
                                  EMU_MPI_CHECK(MPI_Op_create(bf16_sum, 1, &created));
                                  return created;
                                }(),
                                [] {
                                  MPI_Op created = MPI_OP_NULL;
                                  EMU_MPI_CHECK(MPI_Op_create(bf16_max, 1, &created));
                                  return created;
                                }()};
  return ops[op == ReduceOp::kMax ? 1 : 0];
}

int as_int(size_t value, const char* what) {
  EMU_CHECK(value <= static_cast<size_t>(INT_MAX), "{} = {} passes MPI's int limit; use smaller buffers", what, value);
  return static_cast<int>(value);
}

class MpiLink final : public Link {
 public:
  explicit MpiLink(MPI_Comm comm) : comm_(comm) {
    EMU_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    EMU_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    EMU_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiLink() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view library() const override { return "mpi"; }

  void exchange(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes, int from) override {
    if (to == kNoPeer && from == kNoPeer) return;
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    EMU_MPI_CHECK(MPI_Irecv(recv, as_int(recv_bytes, "message bytes"), MPI_BYTE, from == kNoPeer ? MPI_PROC_NULL : from,
                            kTag, comm_, &requests[0]));
    EMU_MPI_CHECK(MPI_Isend(send, as_int(send_bytes, "message bytes"), MPI_BYTE, to == kNoPeer ? MPI_PROC_NULL : to,
                            kTag, comm_, &requests[1]));
    wait_for(requests, 2);
  }

  void native(const Call& call) override {
    const MPI_Datatype type = mpi_type(call.dtype);
    const int count = as_int(call.count, "count");
    switch (call.kind) {
      case CollectiveKind::kAllReduce:
        EMU_MPI_CHECK(MPI_Allreduce(call.send == call.recv ? MPI_IN_PLACE : call.send, call.recv, count, type,
                                    mpi_op(call.dtype, call.op), comm_));
        break;
      case CollectiveKind::kReduceScatter: reduce_scatter(call, type); break;
      case CollectiveKind::kAllGather: all_gather(call, type); break;
      case CollectiveKind::kBroadcast:
        if (rank_ == call.root && call.send != call.recv && count > 0) {
          std::memcpy(call.recv, call.send, call.count * dtype_size(call.dtype));
        }
        EMU_MPI_CHECK(MPI_Bcast(call.recv, count, type, call.root, comm_));
        break;
      case CollectiveKind::kReduce: {
        const bool in_place = rank_ == call.root && call.send == call.recv;
        EMU_MPI_CHECK(MPI_Reduce(in_place ? MPI_IN_PLACE : call.send, call.recv, count, type,
                                 mpi_op(call.dtype, call.op), call.root, comm_));
        break;
      }
      case CollectiveKind::kAllToAll:
        EMU_MPI_CHECK(MPI_Alltoall(call.send == call.recv ? MPI_IN_PLACE : call.send, count, type, call.recv, count,
                                   type, comm_));
        break;
      case CollectiveKind::kBarrier: EMU_MPI_CHECK(MPI_Barrier(comm_)); break;
      case CollectiveKind::kSend:
      case CollectiveKind::kRecv: EMU_CHECK(false, "{} has no native collective", kind_name(call.kind));
    }
  }

  void gather_all(const void* mine, size_t bytes, void* all) override {
    const int n = as_int(bytes, "bytes");
    EMU_MPI_CHECK(MPI_Allgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, comm_));
  }

  std::unique_ptr<Link> split(int color, int key) override {
    MPI_Comm child = MPI_COMM_NULL;
    EMU_MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
    return std::make_unique<MpiLink>(child);
  }

 private:
  // The caller passes NCCL's in-place layout through a temporary (algorithms/mpi_native.cpp), so send and recv
  // never alias here.
  void reduce_scatter(const Call& call, MPI_Datatype type) {
    const MPI_Op op = mpi_op(call.dtype, call.op);
    if (!uneven(call)) {
      EMU_MPI_CHECK(MPI_Reduce_scatter_block(call.send, call.recv, as_int(call.count, "count"), type, op, comm_));
      return;
    }
    std::vector<int> counts;
    for (size_t c : Blocks::of(call, size_).count) counts.push_back(as_int(c, "count"));
    EMU_MPI_CHECK(MPI_Reduce_scatter(call.send, call.recv, counts.data(), type, op, comm_));
  }

  // In place (send at the rank's block of recv) is MPI's in-place all-gather too.
  void all_gather(const Call& call, MPI_Datatype type) {
    const Blocks blocks = Blocks::of(call, size_);
    const auto mine = static_cast<size_t>(rank_);
    const bool in_place = static_cast<const char*>(call.send) ==
                          static_cast<const char*>(call.recv) + blocks.offset[mine] * dtype_size(call.dtype);
    const void* send = in_place && blocks.count[mine] > 0 ? MPI_IN_PLACE : call.send;
    if (!uneven(call)) {
      const int count = as_int(call.count, "count");
      EMU_MPI_CHECK(MPI_Allgather(send, count, type, call.recv, count, type, comm_));
      return;
    }
    std::vector<int> counts;
    std::vector<int> offsets;
    for (size_t r = 0; r < blocks.count.size(); ++r) {
      counts.push_back(as_int(blocks.count[r], "count"));
      offsets.push_back(as_int(blocks.offset[r], "offset"));
    }
    EMU_MPI_CHECK(MPI_Allgatherv(send, counts[mine], type, call.recv, counts.data(), offsets.data(), type, comm_));
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Link> make_mpi_link(MPI_Comm comm) {
  MPI_Comm duplicate = MPI_COMM_NULL;
  EMU_MPI_CHECK(MPI_Comm_dup(comm, &duplicate));
  return std::make_unique<MpiLink>(duplicate);
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, Device& device, std::string name,
                                                    CommunicatorOptions options) {
  return std::make_unique<Communicator>(make_mpi_link(comm), device, std::move(name), options);
}

}  // namespace emu::coll
