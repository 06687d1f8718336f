// NCCL against MPI: every kind on the NCCL link gives MPI's results (inputs whose sums are exact, so bit for bit)
// and the same ledger volumes. Needs one GPU per rank; skips otherwise, on every rank alike.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cuda_runtime_api.h>

#include <span>
#include <string_view>
#include <vector>

#include "collectives/mpi/mpi_communicator.h"
#include "collectives/nccl/select.h"
#include "emu/backend.h"
#include "emu/cuda/check.h"
#include "emu/cuda/cuda_device.h"

namespace emu::coll {
namespace {

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}
int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Skips on every rank unless every rank sees at least world-size GPUs (single node: one GPU per rank).
bool gpus_for_every_rank() {
  int mine = cuda::device_count() >= world_size() ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

Call make_call(CollectiveKind kind, size_t count, std::string_view phase, ReduceOp op = ReduceOp::kSum, int root = 0,
               std::span<const size_t> counts = {}) {
  Call call;
  call.kind = kind;
  call.count = count;
  call.counts = counts;
  call.dtype = DType::kF32;
  call.op = op;
  call.root = root;
  call.phase = phase;
  return call;
}

class NcclParity : public testing::Test {
 protected:
  void SetUp() override {
    if (!gpus_for_every_rank()) {
      GTEST_SKIP() << "NCCL parity needs one visible GPU per rank (" << world_size() << " ranks, "
                   << cuda::device_count() << " GPUs seen); run scripts/gpu-check.sh on a GPU machine";
    }
    gpu_ = make_device("cuda", {}, world_rank());
    cpu_ = make_device("cpu", {});
    nccl_ = make_communicator(MPI_COMM_WORLD, *gpu_, "world");
    mpi_ = make_mpi_communicator(MPI_COMM_WORLD, *cpu_, "world");
    mpi_->set_algorithms(
        "all_reduce=mpi,reduce_scatter=mpi,all_gather=mpi,broadcast=mpi,reduce=mpi,all_to_all=mpi,barrier=mpi");
  }

  // Small integers: every partial sum is exact in fp32 and bf16, so any order gives the same bits.
  std::vector<float> input(size_t n) const {
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = float((i * 7 + size_t(world_rank()) * 3) % 13);
    return values;
  }

  // Runs `call` (send/recv set by the caller for MPI) on both, with the NCCL side's buffers on the GPU.
  void both(Call call, const std::vector<float>& send, size_t recv_count) {
    std::vector<float> mpi_recv(recv_count, -1.0f);
    Call on_mpi = call;
    on_mpi.send = send.data();
    on_mpi.recv = mpi_recv.data();
    mpi_->run(on_mpi);

    Buffer gsend = gpu_->allocate(send.size(), DType::kF32, Category::kTemporaries);
    Buffer grecv = gpu_->allocate(recv_count, DType::kF32, Category::kTemporaries);
    EMU_CUDA_CHECK(cudaMemcpy(gsend.data(), send.data(), send.size() * 4, cudaMemcpyDefault));
    std::vector<float> fill(recv_count, -1.0f);
    EMU_CUDA_CHECK(cudaMemcpy(grecv.data(), fill.data(), recv_count * 4, cudaMemcpyDefault));
    Call on_nccl = call;
    on_nccl.send = gsend.data();
    on_nccl.recv = grecv.data();
    nccl_->run(on_nccl);
    std::vector<float> nccl_recv(recv_count);
    EMU_CUDA_CHECK(cudaMemcpy(nccl_recv.data(), grecv.data(), recv_count * 4, cudaMemcpyDefault));
    EXPECT_EQ(nccl_recv, mpi_recv) << kind_name(call.kind);
    const LedgerEntry a = nccl_->ledger().at(call.kind, call.phase), b = mpi_->ledger().at(call.kind, call.phase);
    EXPECT_EQ(a.calls, b.calls);
    EXPECT_EQ(a.moved, b.moved) << kind_name(call.kind) << " ledger";
    EXPECT_EQ(a.expected, b.expected) << kind_name(call.kind) << " ledger";
  }

  std::unique_ptr<Device> gpu_, cpu_;
  std::unique_ptr<Communicator> nccl_, mpi_;
};

TEST_F(NcclParity, ChoosesNcclWhenEveryRankHasItsOwnGpu) {
  EXPECT_EQ(choose_library(MPI_COMM_WORLD, *gpu_), "nccl");
  EXPECT_EQ(choose_library(MPI_COMM_WORLD, *cpu_), "mpi");
}

TEST_F(NcclParity, EveryKindMatchesMpi) {
  const size_t n = 1000, size = size_t(world_size());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    both(make_call(CollectiveKind::kAllReduce, n, "ar", op), input(n), n);
    both(make_call(CollectiveKind::kReduceScatter, n, "rs", op), input(n * size), n);
    both(make_call(CollectiveKind::kReduce, n, "reduce", op, int(size) - 1), input(n), n);
  }
  both(make_call(CollectiveKind::kAllGather, n, "ag"), input(n), n * size);
  both(make_call(CollectiveKind::kBroadcast, n, "bcast", ReduceOp::kSum, 0), input(n), n);
  both(make_call(CollectiveKind::kAllToAll, n, "a2a"), input(n * size), n * size);
}

TEST_F(NcclParity, UnevenBlocksMatchMpi) {
  std::vector<size_t> counts;
  size_t total = 0;
  for (int r = 0; r < world_size(); ++r) total += counts.emplace_back(size_t(100 + 37 * r));
  const size_t mine = counts[size_t(world_rank())];
  both(make_call(CollectiveKind::kReduceScatter, mine, "rs_v", ReduceOp::kSum, 0, counts), input(total), mine);
  both(make_call(CollectiveKind::kAllGather, mine, "ag_v", ReduceOp::kSum, 0, counts), input(mine), total);
}

}  // namespace
}  // namespace emu::coll
