#include "collectives/communicator.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "collectives/reduce.h"
#include "collectives/steps.h"
#include "collectives/topology.h"
#include "collectives/watchdog.h"
#include "emu/check.h"
#include "emu/log.h"

namespace emu::coll {
namespace {

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// The part of the output that ReduceOp::kAvg divides: every rank's result, or the root's.
void finish_average(const Call& call, int rank, int size) {
  if (call.op != ReduceOp::kAvg) return;
  switch (call.kind) {
    case CollectiveKind::kAllReduce: divide(call.dtype, call.recv, call.count, size); break;
    case CollectiveKind::kReduceScatter: divide(call.dtype, call.recv, blocks_of(call, size).count(rank), size); break;
    case CollectiveKind::kReduce:
      if (rank == call.root) divide(call.dtype, call.recv, call.count, size);
      break;
    default: break;
  }
}

// What each rank is about to call, compared across ranks in the checking mode.
struct Signature {
  uint64_t sequence = 0;
  uint64_t count = 0;
  int32_t root = 0;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t pad = 0;
  bool operator==(const Signature& other) const {
    return sequence == other.sequence && count == other.count && root == other.root && kind == other.kind &&
           dtype == other.dtype && op == other.op;
  }
};

std::string signature_text(const Signature& s) {
  const CollectiveKind kind = kind_at(s.kind);
  std::string text =
      fmt::format("{} #{} of {} x {}", kind_name(kind), s.sequence, s.count, dtype_name(static_cast<DType>(s.dtype)));
  if (kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kReduce) {
    text += fmt::format(" {}", op_name(static_cast<ReduceOp>(s.op)));
  }
  if (kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kReduce) text += fmt::format(" root {}", s.root);
  return text;
}

}  // namespace

CommunicatorOptions CommunicatorOptions::from_environment() {
  CommunicatorOptions options;
  if (const char* timeout = std::getenv("EMU_COLL_TIMEOUT")) options.watchdog_seconds = std::atof(timeout);
  if (const char* check = std::getenv("EMU_COLL_CHECK")) options.check_calls = std::strcmp(check, "0") != 0;
  if (const char* slice = std::getenv("EMU_COLL_SLICE")) {
    const long long bytes = std::atoll(slice);
    if (bytes <= 0) throw InputError(fmt::format("EMU_COLL_SLICE={}: expected a positive number of bytes", slice));
    options.slice_bytes = static_cast<size_t>(bytes);
  }
  if (const char* per_node = std::getenv("EMU_COLL_RANKS_PER_NODE")) {
    const long long ranks = std::atoll(per_node);
    if (ranks <= 0 || ranks > (1 << 20)) {
      throw InputError(
          fmt::format("EMU_COLL_RANKS_PER_NODE={}: expected a number of ranks, 1 to {}", per_node, 1 << 20));
    }
    options.ranks_per_node = static_cast<int>(ranks);
  }
  return options;
}

size_t CommunicatorOptions::charged_slice_bytes() const {
  const auto k2 = static_cast<size_t>(shrink) * static_cast<size_t>(shrink);
  return std::max<size_t>(1, slice_bytes / k2);
}

namespace {

// "<which> buffer is null but holds N elements; " when a data-holding rank passed no buffer for a non-empty part.
std::string missing_buffer(const void* pointer, size_t count, const char* which, bool holds_data) {
  if (!holds_data || pointer != nullptr || count == 0) return "";
  return fmt::format("{} buffer is null but holds {} elements; ", which, count);
}

// Per-rank counts and the reduction operator against the kind.
std::string check_counts_and_op(const Call& call, int size) {
  const bool reduces = call.kind == CollectiveKind::kAllReduce || call.kind == CollectiveKind::kReduceScatter ||
                       call.kind == CollectiveKind::kReduce;
  const bool uneven_allowed = call.kind == CollectiveKind::kReduceScatter || call.kind == CollectiveKind::kAllGather;
  if (uneven(call) && !uneven_allowed) return "per-rank counts are only for reduce_scatter and all_gather";
  if (!call.counts.empty() && call.counts.size() != static_cast<size_t>(size)) {
    return fmt::format("{} per-rank counts given for a group of {} ranks", call.counts.size(), size);
  }
  const ShardWindow& w = call.window;
  if (w.active() && (w.lo > w.hi || w.hi > w.shard * static_cast<size_t>(size) || !call.counts.empty())) {
    return fmt::format("a window [{}, {}) over shards of {} does not fit a group of {} ranks", w.lo, w.hi, w.shard,
                       size);
  }
  if (!reduces && call.op != ReduceOp::kSum)
    return "a reduction operator was given to a collective that does not reduce";
  return "";
}

// All-reduce and all-to-all: send and recv of the same size, the same buffer or apart.
std::string check_same_size_buffers(const Call& call, int size, bool holds_data) {
  const size_t e = dtype_size(call.dtype);
  const size_t count = call.kind == CollectiveKind::kAllToAll ? call.count * static_cast<size_t>(size) : call.count;
  std::string problem =
      missing_buffer(call.send, count, "send", holds_data) + missing_buffer(call.recv, count, "recv", holds_data);
  if (problem.empty() && call.send != call.recv && overlap(call.send, count * e, call.recv, count * e)) {
    problem = "send and recv overlap without being the same buffer (in place)";
  }
  return problem;
}

// Reduce-scatter and all-gather: the whole buffer and this rank's block, in place only at the block's own offset.
std::string check_block_buffers(const Call& call, int rank, int size, bool holds_data) {
  const size_t e = dtype_size(call.dtype);
  const BlockView blocks = blocks_of(call, size);
  const size_t mine = blocks.count(rank);
  const bool gather = call.kind == CollectiveKind::kAllGather;
  const void* whole = gather ? call.recv : call.send;
  const void* part = gather ? call.send : call.recv;
  std::string problem = missing_buffer(whole, blocks.total(), gather ? "recv" : "send", holds_data) +
                        missing_buffer(part, mine, gather ? "send" : "recv", holds_data);
  const void* in_place = at(whole, blocks.offset(rank), call.dtype);
  if (problem.empty() && part != in_place && overlap(whole, blocks.total() * e, part, mine * e)) {
    problem = "the rank's block overlaps the whole buffer without sitting at its own offset (in place)";
  }
  return problem;
}

// Broadcast and reduce: a root in the group; the root's send (broadcast) or recv (reduce) and every rank's other.
std::string check_rooted_buffers(const Call& call, int rank, int size, bool holds_data) {
  if (call.root < 0 || call.root >= size) return fmt::format("root {} is not a rank of 0..{}", call.root, size - 1);
  const bool at_root = rank == call.root;
  if (call.kind == CollectiveKind::kBroadcast) {
    return (at_root ? missing_buffer(call.send, call.count, "send", holds_data) : "") +
           missing_buffer(call.recv, call.count, "recv", holds_data);
  }
  return missing_buffer(call.send, call.count, "send", holds_data) +
         (at_root ? missing_buffer(call.recv, call.count, "recv", holds_data) : "");
}

// Send and recv: another rank of the group as the peer, and the message's buffer.
std::string check_peer(const Call& call, int rank, int size, bool holds_data) {
  if (call.root < 0 || call.root >= size || call.root == rank) {
    return fmt::format("peer {} is not another rank of 0..{} (this is rank {})", call.root, size - 1, rank);
  }
  return missing_buffer(call.kind == CollectiveKind::kSend ? call.send : call.recv, call.count, "message", holds_data);
}

}  // namespace

std::string check_call(const Call& call, int rank, int size, bool holds_data) {
  if (std::string problem = check_counts_and_op(call, size); !problem.empty()) return problem;
  std::string problem;
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kAllToAll: problem = check_same_size_buffers(call, size, holds_data); break;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather: problem = check_block_buffers(call, rank, size, holds_data); break;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce: problem = check_rooted_buffers(call, rank, size, holds_data); break;
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv: problem = check_peer(call, rank, size, holds_data); break;
    case CollectiveKind::kBarrier: break;
  }
  if (problem.ends_with("; ")) problem.resize(problem.size() - 2);
  return problem;
}

Communicator::Communicator(std::unique_ptr<Link> link, Device& device, std::string name, CommunicatorOptions options)
    : link_(std::move(link)),
      device_(device),
      name_(std::move(name)),
      options_(options),
      ledger_(name_),
      chosen_(kNumKinds, nullptr) {
  for (size_t i = 0; i < kNumKinds; ++i) {
    const auto candidates = algorithms_for(kind_at(i));
    if (!candidates.empty()) chosen_[i] = candidates.front();
  }
}

Communicator::~Communicator() = default;

void Communicator::set_algorithm(CollectiveKind kind, std::string_view name) {
  const Algorithm* found = find_algorithm(kind, name);
  if (found == nullptr) {
    const std::string valid = algorithm_names(kind);
    throw InputError(fmt::format("unknown {} algorithm '{}'; valid: {}", kind_name(kind), name,
                                 valid.empty() ? "none (point-to-point)" : valid));
  }
  chosen_[static_cast<size_t>(kind)] = found;
}

void Communicator::set_algorithms(std::string_view spec) {
  for (const auto& [kind, algorithm] : parse_algorithm_list(spec)) set_algorithm(kind, algorithm);
}

const Algorithm& Communicator::algorithm(CollectiveKind kind) const {
  const Algorithm* chosen = chosen_[static_cast<size_t>(kind)];
  EMU_CHECK(chosen != nullptr, "{} is point-to-point and has no algorithm", kind_name(kind));
  return *chosen;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name) {
  CommunicatorOptions options = options_;
  options.ranks_per_node = 0;  // which of the group's ranks share a node is not known here: one node
  auto child = std::make_unique<Communicator>(link_->split(color, key), device_, std::move(name), options);
  child->chosen_ = chosen_;
  child->observer_ = observer_;
  return child;
}

std::string Communicator::describe(const Call& call) const {
  std::string text = is_collective(call.kind) ? fmt::format("{} #{}", kind_name(call.kind), sequence_)
                                              : fmt::format("{} with rank {}", kind_name(call.kind), call.root);
  text += fmt::format(" (phase '{}', group '{}'", call.phase, name_);
  if (is_collective(call.kind)) text += fmt::format(", algorithm {}", algorithm(call.kind).name);
  return text + fmt::format(", {} bytes)", payload_bytes(call, size()));
}

void Communicator::check_agreement(const Call& call) {
  const Signature mine{sequence_,
                       uneven(call) ? blocks_of(call, size()).total() : call.count,
                       call.root,
                       static_cast<uint8_t>(call.kind),
                       static_cast<uint8_t>(call.dtype),
                       static_cast<uint8_t>(call.op),
                       0};
  std::vector<Signature> all(static_cast<size_t>(size()));
  link_->gather_all(&mine, sizeof(Signature), all.data());
  bool same = true;
  for (const Signature& other : all) same = same && other == mine;
  if (same) return;
  // Group the ranks by what they called: "r0-r2: all_reduce #5 of 1024 x float32 sum; r3: broadcast #5 ...".
  std::map<std::string, std::string> ranks_by_call;
  for (size_t r = 0; r < all.size(); ++r) {
    std::string& ranks = ranks_by_call[signature_text(all[r])];
    ranks += (ranks.empty() ? "r" : ",r") + std::to_string(r);
  }
  std::string text;
  for (const auto& [what, ranks] : ranks_by_call)
    text += fmt::format("{}{}: {}", text.empty() ? "" : "; ", ranks, what);
  std::fprintf(stderr, "%s coll: check: ranks of group '%s' disagree on collective #%llu: %s\n", rank_tag().c_str(),
               name_.c_str(), static_cast<unsigned long long>(sequence_), text.c_str());
  std::fflush(stderr);
  fatal(fmt::format("mismatched collectives at #{} in group '{}'", sequence_, name_), __FILE__, __LINE__);
}

// send or recv: one exchange with the peer. Returns the declared traffic.
Traffic Communicator::run_point_to_point(AlgorithmContext& context, const Call& call) {
  const uint64_t bytes = call.count * dtype_size(call.dtype);
  const Traffic expected = call.kind == CollectiveKind::kSend ? Traffic{bytes, 0} : Traffic{0, bytes};
  if (!device_.holds_data()) {
    context.moved = expected;
    return expected;
  }
  Transfer transfer;
  if (call.kind == CollectiveKind::kSend) {
    transfer.send = call.send, transfer.send_count = call.count, transfer.to = call.root;
  } else {
    transfer.recv = call.recv, transfer.recv_count = call.count, transfer.from = call.root;
  }
  exchange_copy(context, call.dtype, kind_name(call.kind), transfer);
  return expected;
}

// A collective: the algorithm, then the division of an average. Returns the declared traffic.
Traffic Communicator::run_collective(AlgorithmContext& context, const Call& call, const Algorithm& algorithm) {
  const Expectation expectation =
      algorithm.expect(call, rank(), size(), options_.charged_slice_bytes(), options_.ranks_per_node);
  if (device_.holds_data()) {
    algorithm.run(context, call);
    finish_average(call, rank(), size());
  } else {
    // Shapes-only: the buffers are charged for the length of the call, nothing moves.
    device_.memory().release(device_.memory().charge(expectation.buffer_bytes, Category::kCommBuffers, algorithm.name));
    context.moved = expectation.traffic;
    if (expectation.between_nodes) context.moved_between_nodes = *expectation.between_nodes;
  }
  return expectation.traffic;
}

void Communicator::run(const Call& call) {
  const int r = rank();
  const int n = size();
  if (const std::string problem = check_call(call, r, n, device_.holds_data()); !problem.empty()) {
    fatal(fmt::format("bad arguments to {} (phase '{}', group '{}'): {}", kind_name(call.kind), call.phase, name_,
                      problem),
          __FILE__, __LINE__);
  }
  const bool collective = is_collective(call.kind);
  if (collective) ++sequence_;
  const Algorithm* algorithm = collective ? chosen_[static_cast<size_t>(call.kind)] : nullptr;
  // Disarmed on every way out, an out-of-memory error included.
  struct Disarm {
    bool armed;
    ~Disarm() {
      if (armed) watchdog::disarm();
    }
  } disarm{options_.watchdog_seconds > 0};
  if (disarm.armed) watchdog::arm(options_.watchdog_seconds, describe(call));
  if (collective && options_.check_calls) check_agreement(call);

  const auto start = std::chrono::steady_clock::now();
  AlgorithmContext context{*link_,    device_, options_.slice_bytes,    options_.charged_slice_bytes(),
                           Traffic{}, record_, options_.ranks_per_node, Traffic{}};
  const Traffic expected = collective ? run_collective(context, call, *algorithm) : run_point_to_point(context, call);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (context.moved != expected) {
    log::warn("coll", "{} moved {} B sent / {} B received, declared {} / {}", describe(call), context.moved.sent,
              context.moved.received, expected.sent, expected.received);
  }
  ledger_.charge(call.kind, call.phase, context.moved, expected, seconds, context.moved_between_nodes,
                 payload_bytes(call, size()));
  if (observer_) {
    const double started = std::chrono::duration<double>(start.time_since_epoch()).count();
    observer_(*this, call, algorithm, context.moved, started, started + seconds);
  }
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              std::string_view phase) {
  run(Call{CollectiveKind::kAllReduce, send, recv, count, {}, dtype, op, 0, phase});
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op,
                                  std::string_view phase) {
  run(Call{CollectiveKind::kReduceScatter, send, recv, recv_count, {}, dtype, op, 0, phase});
}

void Communicator::reduce_scatter_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype,
                                    ReduceOp op, std::string_view phase) {
  const size_t mine = counts.size() > static_cast<size_t>(rank()) ? counts[static_cast<size_t>(rank())] : 0;
  run(Call{CollectiveKind::kReduceScatter, send, recv, mine, counts, dtype, op, 0, phase});
}

void Communicator::reduce_scatter_v(const void* send, void* recv, const ShardWindow& window, DType dtype, ReduceOp op,
                                    std::string_view phase) {
  Call call{CollectiveKind::kReduceScatter, send, recv, window.count(rank()), {}, dtype, op, 0, phase};
  call.window = window;
  run(call);
}

void Communicator::all_gather(const void* send, void* recv, size_t send_count, DType dtype, std::string_view phase) {
  run(Call{CollectiveKind::kAllGather, send, recv, send_count, {}, dtype, ReduceOp::kSum, 0, phase});
}

void Communicator::all_gather_v(const void* send, void* recv, std::span<const size_t> counts, DType dtype,
                                std::string_view phase) {
  const size_t mine = counts.size() > static_cast<size_t>(rank()) ? counts[static_cast<size_t>(rank())] : 0;
  run(Call{CollectiveKind::kAllGather, send, recv, mine, counts, dtype, ReduceOp::kSum, 0, phase});
}

void Communicator::all_gather_v(const void* send, void* recv, const ShardWindow& window, DType dtype,
                                std::string_view phase) {
  Call call{CollectiveKind::kAllGather, send, recv, window.count(rank()), {}, dtype, ReduceOp::kSum, 0, phase};
  call.window = window;
  run(call);
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                             std::string_view phase) {
  run(Call{CollectiveKind::kBroadcast, send, recv, count, {}, dtype, ReduceOp::kSum, root, phase});
}

void Communicator::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
                          std::string_view phase) {
  run(Call{CollectiveKind::kReduce, send, recv, count, {}, dtype, op, root, phase});
}

void Communicator::all_to_all(const void* send, void* recv, size_t count, DType dtype, std::string_view phase) {
  run(Call{CollectiveKind::kAllToAll, send, recv, count, {}, dtype, ReduceOp::kSum, 0, phase});
}

void Communicator::send(const void* data, size_t count, DType dtype, int peer, std::string_view phase) {
  run(Call{CollectiveKind::kSend, data, nullptr, count, {}, dtype, ReduceOp::kSum, peer, phase});
}

void Communicator::recv(void* data, size_t count, DType dtype, int peer, std::string_view phase) {
  run(Call{CollectiveKind::kRecv, nullptr, data, count, {}, dtype, ReduceOp::kSum, peer, phase});
}

void Communicator::barrier(std::string_view phase) {
  run(Call{CollectiveKind::kBarrier, nullptr, nullptr, 0, {}, DType::kF32, ReduceOp::kSum, 0, phase});
}

}  // namespace emu::coll
