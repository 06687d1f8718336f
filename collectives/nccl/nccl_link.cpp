// NCCL implementation of Link.
//
// NCCL has no uneven (v) collectives: reduce_scatter with counts is one ncclReduce per block to its owner, and
// all_gather with counts one ncclBroadcast per block from its owner, each set in one NCCL group. all_to_all is a
// group of sends and receives. Barrier and gather_all go through MPI (host memory, checks only). split() makes a
// new NCCL communicator over the split MPI communicator, with a fresh unique id: every rank of the parent calls
// split, as with MPI_Comm_split, so no rank waits on a group it is not in.
#include "collectives/nccl/nccl_link.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <climits>
#include <vector>

#include "collectives/topology.h"
#include "emu/check.h"
#include "emu/cuda/check.h"

// EMU_NCCL_CHECK(ncclAllReduce(...)): on an error, names the call, NCCL's text and its last error, ends every rank.
#define EMU_NCCL_CHECK(call)                                                                                  \
  do {                                                                                                        \
    const ncclResult_t emu_nccl_rc_ = (call);                                                                 \
    if (emu_nccl_rc_ != ncclSuccess) [[unlikely]] {                                                           \
      ::emu::fatal(::fmt::format("NCCL call failed: {}: {} ({}); hint: NCCL_DEBUG=WARN shows NCCL's reason; " \
                                 "NCCL needs one GPU per rank",                                               \
                                 #call, ncclGetErrorString(emu_nccl_rc_), ncclGetLastError(nullptr)),         \
                   __FILE__, __LINE__);                                                                       \
    }                                                                                                         \
  } while (0)

namespace emu::coll {
namespace {

ncclDataType_t nccl_type(DType dtype) { return dtype == DType::kF32 ? ncclFloat32 : ncclBfloat16; }

// kAvg arrives as kSum (Link's contract); the communicator divides afterwards.
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

const char* at_bytes(const void* base, size_t elements, DType dtype) {
  return static_cast<const char*>(base) + elements * dtype_size(dtype);
}
char* at_bytes(void* base, size_t elements, DType dtype) {
  return static_cast<char*>(base) + elements * dtype_size(dtype);
}

class NcclLink final : public Link {
 public:
  NcclLink(MPI_Comm comm, int gpu) : mpi_(comm), gpu_(gpu) {
    EMU_MPI_CHECK(MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN));
    EMU_MPI_CHECK(MPI_Comm_rank(mpi_, &rank_));
    EMU_MPI_CHECK(MPI_Comm_size(mpi_, &size_));
    EMU_CUDA_CHECK(cudaSetDevice(gpu_));
    ncclUniqueId id{};
    if (rank_ == 0) EMU_NCCL_CHECK(ncclGetUniqueId(&id));
    EMU_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_));
    EMU_NCCL_CHECK(ncclCommInitRank(&nccl_, size_, id, rank_));
    EMU_CUDA_CHECK(cudaStreamCreate(&stream_));  // blocking: ordered after the default stream's compute
  }
  ~NcclLink() override {
    if (nccl_ != nullptr) ncclCommDestroy(nccl_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view library() const override { return "nccl"; }

  void exchange(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes, int from) override {
    if ((to == kNoPeer || send_bytes == 0) && (from == kNoPeer || recv_bytes == 0)) return;
    EMU_NCCL_CHECK(ncclGroupStart());
    if (to != kNoPeer && send_bytes > 0) EMU_NCCL_CHECK(ncclSend(send, send_bytes, ncclUint8, to, nccl_, stream_));
    if (from != kNoPeer && recv_bytes > 0) {
      EMU_NCCL_CHECK(ncclRecv(recv, recv_bytes, ncclUint8, from, nccl_, stream_));
    }
    EMU_NCCL_CHECK(ncclGroupEnd());
    wait();
  }

  void native(const Call& call) override {
    const ncclDataType_t type = nccl_type(call.dtype);
    switch (call.kind) {
      case CollectiveKind::kAllReduce:
        EMU_NCCL_CHECK(ncclAllReduce(call.send, call.recv, call.count, type, nccl_op(call.op), nccl_, stream_));
        break;
      case CollectiveKind::kReduceScatter: reduce_scatter(call, type); break;
      case CollectiveKind::kAllGather: all_gather(call, type); break;
      case CollectiveKind::kBroadcast:
        EMU_NCCL_CHECK(ncclBroadcast(call.send, call.recv, call.count, type, call.root, nccl_, stream_));
        break;
      case CollectiveKind::kReduce:
        EMU_NCCL_CHECK(ncclReduce(call.send, call.recv, call.count, type, nccl_op(call.op), call.root, nccl_, stream_));
        break;
      case CollectiveKind::kAllToAll: all_to_all(call, type); break;
      case CollectiveKind::kBarrier:
        wait();
        EMU_MPI_CHECK(MPI_Barrier(mpi_));
        return;
      case CollectiveKind::kSend:
      case CollectiveKind::kRecv: EMU_CHECK(false, "{} has no native collective", kind_name(call.kind));
    }
    wait();
  }

  void gather_all(const void* mine, size_t bytes, void* all) override {
    EMU_CHECK(bytes <= static_cast<size_t>(INT_MAX), "gather_all of {} bytes passes MPI's int limit", bytes);
    const int n = static_cast<int>(bytes);
    EMU_MPI_CHECK(MPI_Allgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, mpi_));
  }

  std::unique_ptr<Link> split(int color, int key) override {
    MPI_Comm child = MPI_COMM_NULL;
    EMU_MPI_CHECK(MPI_Comm_split(mpi_, color, key, &child));
    return std::make_unique<NcclLink>(child, gpu_);
  }

 private:
  void wait() { EMU_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // NCCL's in-place layout (recv at the rank's block of send) is NCCL's own; uneven blocks: one reduce per owner.
  void reduce_scatter(const Call& call, ncclDataType_t type) {
    if (!uneven(call)) {
      EMU_NCCL_CHECK(ncclReduceScatter(call.send, call.recv, call.count, type, nccl_op(call.op), nccl_, stream_));
      return;
    }
    const Blocks blocks = Blocks::of(call, size_);
    EMU_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      if (blocks.count[i] == 0) continue;
      EMU_NCCL_CHECK(ncclReduce(at_bytes(call.send, blocks.offset[i], call.dtype), call.recv, blocks.count[i], type,
                                nccl_op(call.op), r, nccl_, stream_));
    }
    EMU_NCCL_CHECK(ncclGroupEnd());
  }

  // In place (send at the rank's block of recv) is NCCL's in-place all-gather; uneven: one broadcast per owner.
  void all_gather(const Call& call, ncclDataType_t type) {
    if (!uneven(call)) {
      EMU_NCCL_CHECK(ncclAllGather(call.send, call.recv, call.count, type, nccl_, stream_));
      return;
    }
    const Blocks blocks = Blocks::of(call, size_);
    EMU_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      if (blocks.count[i] == 0) continue;
      EMU_NCCL_CHECK(ncclBroadcast(call.send, at_bytes(call.recv, blocks.offset[i], call.dtype), blocks.count[i], type,
                                   r, nccl_, stream_));
    }
    EMU_NCCL_CHECK(ncclGroupEnd());
  }

  // count elements to and from each peer. In place (send == recv) goes through a copy of send, since a peer's
  // block may arrive before this rank's block for that peer has left.
  void all_to_all(const Call& call, ncclDataType_t type) {
    const size_t block_bytes = call.count * dtype_size(call.dtype);
    const void* send = call.send;
    void* copy = nullptr;
    if (call.send == call.recv && call.count > 0) {
      EMU_CUDA_CHECK(cudaMallocAsync(&copy, block_bytes * size_t(size_), stream_));
      EMU_CUDA_CHECK(cudaMemcpyAsync(copy, call.send, block_bytes * size_t(size_), cudaMemcpyDefault, stream_));
      send = copy;
    }
    EMU_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<size_t>(r);
      EMU_NCCL_CHECK(ncclSend(at_bytes(send, i * call.count, call.dtype), call.count, type, r, nccl_, stream_));
      EMU_NCCL_CHECK(ncclRecv(at_bytes(call.recv, i * call.count, call.dtype), call.count, type, r, nccl_, stream_));
    }
    EMU_NCCL_CHECK(ncclGroupEnd());
    if (copy != nullptr) EMU_CUDA_CHECK(cudaFreeAsync(copy, stream_));
  }

  MPI_Comm mpi_;
  int gpu_;
  int rank_ = 0;
  int size_ = 1;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Link> make_nccl_link(MPI_Comm comm, int gpu) {
  MPI_Comm duplicate = MPI_COMM_NULL;
  EMU_MPI_CHECK(MPI_Comm_dup(comm, &duplicate));
  return std::make_unique<NcclLink>(duplicate, gpu);
}

}  // namespace emu::coll
