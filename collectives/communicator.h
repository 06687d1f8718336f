// The communicator the strategies (DDP, ZeRO, FSDP) talk to: one group of ranks, its collectives, its ledger.
//
// Every call goes through one dispatch point, Communicator::run(), which checks the arguments, numbers the call,
// arms the watchdog, picks the algorithm chosen for the kind, runs it on this rank's Link, finishes an average,
// and charges the ledger with the bytes moved beside the bytes the algorithm declared. The Communicator knows
// no communication library: the Link does (mpi/mpi_communicator.h makes one over MPI; a CUDA build adds NCCL).
//
// Buffers are raw pointers with element counts of `dtype` (bf16 stored as uint16, see emu/bf16.h); the meaning
// of the counts per kind and the in-place conventions are in types.h (NCCL semantics). Buffers an algorithm needs
// come from the Device as Category::kCommBuffers, so they count against the cap; an OutOfMemoryError may leave
// a call, as on a GPU. On a device that holds no data (shapes-only accounting) nothing is sent: the buffers are
// charged and released and the ledger records the declared volumes.
//
// Sub-communicators from split() have their own ledger, named after the group, and inherit the algorithms and
// options of their parent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/ledger.h"
#include "collectives/link.h"
#include "collectives/types.h"
#include "emu/device.h"
#include "emu/units.h"

namespace emu::coll {

struct CommunicatorOptions {
  // The largest message; reductions go through scratch buffers of at most this size (NCCL's buffers are 4 MiB).
  size_t slice_bytes = 4 * kMiB;
  // k of a shrunk run: the scratch slices are charged as the GPU running the full-scale model holds them,
  // slice_bytes / k² (DESIGN.md §1), while messages still go in slices of slice_bytes (4 MiB / k² would cut a
  // shrunk run's traffic into thousands of small messages and slow it, for the same bytes). 1: full scale.
  int64_t shrink = 1;
  // The slice the device is charged for: slice_bytes / k², at least 1 byte.
  size_t charged_slice_bytes() const;
  // A collective that takes longer ends the job with exit code 3; 0 turns the watchdog off.
  double watchdog_seconds = 0;
  // Ranks per node (algorithm.h, node_size: consecutive ranks fill a node), for the hierarchical all-reduce and the
  // count of bytes between nodes; 0: the whole group is one node. The app sets it from --ranks-per-node or the
  // ranks MPI finds on each host; EMU_COLL_RANKS_PER_NODE sets it for the tools and tests, which emulate nodes on
  // one machine. A group split off (split()) is taken as one node.
  int ranks_per_node = 0;
  // Before each collective, the ranks compare what they are calling (kind, count, type, op, root); ranks that
  // disagree are named and the job ends with exit code 3. Costs one small all-gather per call.
  bool check_calls = false;

  // The defaults, changed by EMU_COLL_TIMEOUT=<seconds>, EMU_COLL_CHECK=1, EMU_COLL_SLICE=<bytes> and
  // EMU_COLL_RANKS_PER_NODE=<ranks>.
  static CommunicatorOptions from_environment();
};

class Communicator {
 public:
  Communicator(std::unique_ptr<Link> link, Device& device, std::string name, CommunicatorOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return link_->rank(); }
  int size() const { return link_->size(); }
  const std::string& name() const { return name_; }
  Device& device() const { return device_; }
  const CommunicatorOptions& options() const { return options_; }

  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, std::string_view phase = {});
  // NCCL semantics: send holds size() * recv_count elements; this rank receives block rank().
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                      std::string_view phase = {});
  // Uneven blocks: rank r receives counts[r] elements; send holds their sum, blocks in rank order.
  void reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype, ReduceOp op,
                        std::string_view phase = {});
  // Uneven blocks as a window over equal shards (types.h ShardWindow): O(1) per rank at any group size.
  void reduce_scatter_v(const void* send, void* recv, const ShardWindow& window, DType dtype, ReduceOp op,
                        std::string_view phase = {});
  // recv holds size() * send_count elements, rank r's block at r * send_count.
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype, std::string_view phase = {});
  // Uneven blocks: rank r contributes counts[r] elements; recv holds their sum, blocks in rank order.
  void all_gather_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype,
                    std::string_view phase = {});
  void all_gather_v(const void* send, void* recv, const ShardWindow& window, DType dtype, std::string_view phase = {});
  // `send` is read on the root only; every rank (the root too) receives into `recv`.
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, std::string_view phase = {});
  // `recv` is written on the root only.
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
              std::string_view phase = {});
  // count elements to and from each rank; send and recv hold size() * count.
  void all_to_all(const void* send, void* recv, size_t count, DType dtype, std::string_view phase = {});
  void send(const void* data, size_t count, DType dtype, int peer, std::string_view phase = {});
  void recv(void* data, size_t count, DType dtype, int peer, std::string_view phase = {});
  void barrier(std::string_view phase = {});

  // The dispatch point every call above goes through; public so harnesses can loop over kinds.
  void run(const Call& call);

  // A new communicator over the ranks that pass the same colour, ordered by key; collective over this group.
  // `name` names the group in its ledger and in watchdog messages, e.g. "intra-node 0".
  std::unique_ptr<Communicator> split(int color, int key, std::string name);

  // Chooses the algorithm for one kind by name; throws InputError naming the valid ones.
  void set_algorithm(CollectiveKind kind, std::string_view name);
  // "all_reduce=rhd,broadcast=mpi"; throws InputError on an unknown kind or name.
  void set_algorithms(std::string_view spec);
  const Algorithm& algorithm(CollectiveKind kind) const;

  Ledger& ledger() { return ledger_; }
  const Ledger& ledger() const { return ledger_; }
  // Collectives called on this communicator so far (send and recv are not numbered).
  uint64_t sequence() const { return sequence_; }
  // The teaching view's log: every exchange this rank makes from now on is appended; null stops it.
  void set_record(std::vector<StepRecord>* record) { record_ = record; }

  // Told of every call that completes on this rank, after the ledger is charged: the group, the call, its
  // algorithm (null for send and recv), the bytes this rank moved, and when it ran (steady_clock seconds since
  // the clock's epoch). For traces; unset costs nothing. Communicators split off later inherit it.
  using Observer = std::function<void(const Communicator& group, const Call& call, const Algorithm* algorithm,
                                      const Traffic& moved, double start_seconds, double end_seconds)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

 private:
  void check_agreement(const Call& call);
  Traffic run_point_to_point(AlgorithmContext& context, const Call& call);
  Traffic run_collective(AlgorithmContext& context, const Call& call, const Algorithm& algorithm);
  std::string describe(const Call& call) const;

  std::unique_ptr<Link> link_;
  Device& device_;
  std::string name_;
  CommunicatorOptions options_;
  Ledger ledger_;
  std::vector<const Algorithm*> chosen_;  // by kind; null for send and recv
  uint64_t sequence_ = 0;
  std::vector<StepRecord>* record_ = nullptr;
  Observer observer_;
};

// What is wrong with `call` on rank `rank` of `size`, or empty if nothing is. The dispatch point ends the job
// with this text (exit code 3), since peers would otherwise wait in the collective. Null buffers are accepted
// when the device holds no data (shapes-only accounting).
std::string check_call(const Call& call, int rank, int size, bool holds_data = true);

}  // namespace emu::coll
