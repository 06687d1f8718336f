#include "strategies/analytic.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "strategies/shard.h"

namespace emu::strategy {
namespace {

using coll::Kind;

// Nominal ring bytes one rank sends for one call on a payload of `bytes` over `n` ranks.
uint64_t ring_sent(Kind kind, uint64_t bytes, int n) {
  if (n <= 1) return 0;
  const double factor = kind == Kind::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
  return static_cast<uint64_t>(factor * static_cast<double>(bytes) + 0.5);
}

uint64_t padded(uint64_t count, int n) { return shard_of(count, 0, n).padded; }

class Builder {
 public:
  explicit Builder(Prediction& prediction) : prediction_(prediction) {}
  void add(Kind kind, const std::string& group, uint64_t payload_bytes, int n, uint64_t calls = 1) {
    if (n <= 1 || calls == 0) return;
    for (PredictedTraffic& t : prediction_.traffic) {
      if (t.kind == kind && t.group == group) {
        t.calls += calls;
        t.sent += calls * ring_sent(kind, payload_bytes, n);
        return;
      }
    }
    prediction_.traffic.push_back({kind, group, calls, calls * ring_sent(kind, payload_bytes, n)});
  }

 private:
  Prediction& prediction_;
};

void predict_ddp(const StrategyOptions& o, const AnalyticInput& in, uint64_t psi, Prediction& out) {
  const auto& r = o.recipe;
  out.peak[Category::kParameters] = psi * dtype_size(r.params);
  out.peak[Category::kGradients] = psi * dtype_size(r.grads);
  if (!o.ddp.gradient_as_bucket_view) out.peak[Category::kBuckets] = psi * dtype_size(r.grads);
  out.formula = "(2 + 2 + K)Ψ: a full replica";
  // One all-reduce per bucket; the bucket count does not change the volume.
  Builder(out).add(Kind::kAllReduce, "world", psi * dtype_size(r.grads), in.world);
}

void predict_zero12(const StrategyOptions& o, const AnalyticInput& in, uint64_t psi, int stage, Prediction& out) {
  const auto& r = o.recipe;
  const int n = in.world;
  const uint64_t p = padded(psi, n);
  const uint64_t s = p / n;
  const uint64_t g = dtype_size(r.grads);
  out.peak[Category::kParameters] = p * dtype_size(r.params);
  Builder traffic(out);
  if (stage == 1) {
    out.peak[Category::kGradients] = p * g;
    out.formula = "(2 + 2 + K/N)Ψ: optimizer state partitioned";
    traffic.add(Kind::kReduceScatter, "world", p * g, n);
  } else {
    const uint64_t root = in.unit_counts.front();
    const uint64_t largest_block = *std::max_element(in.unit_counts.begin() + 1, in.unit_counts.end());
    const uint64_t largest = std::max(root, largest_block);
    const uint64_t bucket = std::min<uint64_t>(std::max<uint64_t>(largest, o.scaled(o.zero.reduce_bucket_elements)), p);
    out.peak[Category::kGradients] = s * g + (root + largest_block) * g;
    out.peak[Category::kBuckets] = bucket * g * (o.zero.overlap_comm ? 2 : 1);
    out.formula = "(2 + (2 + K)/N)Ψ: optimizer state and gradients partitioned";
    // Every micro-batch reduce-scatters the gradients of [0, Ψ) (padding is never reduced).
    traffic.add(Kind::kReduceScatter, "world", psi * g, n, static_cast<uint64_t>(in.accumulation));
  }
  traffic.add(Kind::kAllGather, "world", p * dtype_size(r.params), n);
  traffic.add(Kind::kAllReduce, "world", 4, n);  // the gradient norm's partial sums
}

// M, the ranks one unit is sharded over: the world, one rank for NO_SHARD, a node for HYBRID_SHARD.
int shard_group_size(const StrategyOptions& o, const AnalyticInput& in) {
  const Sharding sharding = o.kind == StrategyKind::kFsdp ? o.fsdp.sharding : Sharding::kFullShard;
  if (sharding == Sharding::kNoShard) return 1;
  if (sharding == Sharding::kHybridShard) return in.ranks_per_node;
  return in.world;
}

void predict_sharded(const StrategyOptions& o, const AnalyticInput& in, Prediction& out) {
  const auto& r = o.recipe;
  const bool fsdp = o.kind == StrategyKind::kFsdp;
  const Sharding sharding = fsdp ? o.fsdp.sharding : Sharding::kFullShard;
  const int m = shard_group_size(o, in);
  const int replicas = in.world / m;
  const uint64_t p_bytes = dtype_size(r.params);
  const uint64_t g_bytes = dtype_size(r.grads);
  const uint64_t shard_grad_bytes = fsdp && r.has_master ? 4 : g_bytes;
  const auto& counts = in.unit_counts;
  const size_t units = counts.size();

  uint64_t shards = 0;
  std::vector<uint64_t> padded_units;
  for (uint64_t c : counts) {
    padded_units.push_back(padded(c, m));
    shards += padded(c, m) / m;
  }
  std::vector<bool> persistent(units, false);
  for (size_t u = 0; u < units && !fsdp; ++u) persistent[u] = counts[u] <= o.scaled(o.zero.param_persistence_threshold);

  // Gathered parameters at the peak: the root, the persistent units, and the window of blocks in use.
  uint64_t gathered = 0;
  if (m > 1) {
    uint64_t always = padded_units[0];
    for (size_t u = 1; u < units; ++u) {
      if (persistent[u]) always += padded_units[u];
    }
    uint64_t window = 0;
    std::vector<uint64_t> blocks;
    for (size_t u = 1; u < units; ++u) blocks.push_back(persistent[u] ? 0 : padded_units[u]);
    if (sharding == Sharding::kShardGradOp) {
      window = std::accumulate(blocks.begin(), blocks.end(), uint64_t{0});
    } else if (fsdp) {
      const bool pairs = o.fsdp.backward_prefetch != BackwardPrefetch::kNone || o.fsdp.forward_prefetch;
      for (size_t i = 0; i < blocks.size(); ++i) {
        window = std::max(window, blocks[i] + (pairs && i + 1 < blocks.size() ? blocks[i + 1] : 0));
      }
    } else {
      // ZeRO-3: the block in use plus following ones that fit the prefetch bucket and the live limit.
      const uint64_t budget = o.scaled(o.zero.prefetch_bucket_elements);
      const uint64_t live = o.scaled(o.zero.max_live_parameters);
      for (size_t i = 0; i < blocks.size(); ++i) {
        uint64_t fetched = 0, in_use = blocks[i];
        for (size_t j = i + 1; j < blocks.size(); ++j) {
          if (blocks[j] == 0) continue;
          if (fetched + blocks[j] > budget || always + in_use + blocks[j] > live) break;
          fetched += blocks[j];
          in_use += blocks[j];
        }
        window = std::max(window, in_use);
      }
    }
    gathered = always + window;
  }
  out.peak[Category::kParameters] = (shards + gathered) * p_bytes;
  const uint64_t largest_block = units > 1 ? *std::max_element(padded_units.begin() + 1, padded_units.end()) : 0;
  out.peak[Category::kGradients] = shards * shard_grad_bytes + (padded_units[0] + largest_block) * g_bytes;
  out.formula = sharding == Sharding::kNoShard ? "(2 + 2 + K)Ψ: a full replica (NO_SHARD)"
                : m < in.world                 ? fmt::format("(2 + 2 + K)Ψ/{}: sharded within {} ranks", m, m)
                                               : "(2 + 2 + K)Ψ/N: everything partitioned";

  Builder traffic(out);
  const uint64_t a = static_cast<uint64_t>(in.accumulation);
  const std::string intra = m < in.world ? "intra-node" : "world";
  for (size_t u = 0; u < units; ++u) {
    const uint64_t unit_params = padded_units[u] * p_bytes;
    if (persistent[u]) {
      traffic.add(Kind::kAllGather, intra, unit_params, m, 1);  // once per step, after the update
    } else {
      const bool twice = sharding != Sharding::kShardGradOp && u != 0;  // the root stays gathered in between
      traffic.add(Kind::kAllGather, intra, unit_params, m, a * (twice ? 2 : 1));
    }
    traffic.add(Kind::kReduceScatter, intra, padded_units[u] * g_bytes, m, a);
    if (m < in.world) traffic.add(Kind::kAllReduce, "inter-node", padded_units[u] / m * g_bytes, replicas, a);
  }
  traffic.add(Kind::kAllReduce, intra, 4, m);  // the gradient norm's partial sums
}

}  // namespace

AnalyticInput analytic_input(const model::Model& model, int world, int ranks_per_node, int accumulation) {
  AnalyticInput input;
  for (int u = 0; u < model.num_units(); ++u) input.unit_counts.push_back(model.layout(u).count);
  input.world = world;
  input.ranks_per_node = ranks_per_node;
  input.accumulation = accumulation;
  return input;
}

uint64_t Prediction::model_state_bytes() const {
  return peak[Category::kParameters] + peak[Category::kGradients] + peak[Category::kMasterWeights] +
         peak[Category::kOptimizerState];
}

uint64_t Prediction::sent(coll::Kind kind) const {
  uint64_t total = 0;
  for (const PredictedTraffic& t : traffic) {
    if (t.kind == kind) total += t.sent;
  }
  return total;
}

Prediction predict(const StrategyOptions& options, const AnalyticInput& input) {
  Prediction out;
  const uint64_t psi = std::accumulate(input.unit_counts.begin(), input.unit_counts.end(), uint64_t{0});
  const auto& r = options.recipe;
  // Master weights and Adam moments (K bytes per parameter) over what this rank updates.
  uint64_t updated = psi;
  switch (options.kind) {
    case StrategyKind::kDdp: predict_ddp(options, input, psi, out); break;
    case StrategyKind::kZero1:
    case StrategyKind::kZero2:
      predict_zero12(options, input, psi, options.kind == StrategyKind::kZero1 ? 1 : 2, out);
      updated = padded(psi, input.world) / input.world;
      break;
    case StrategyKind::kZero3:
    case StrategyKind::kFsdp: {
      predict_sharded(options, input, out);
      const int m = shard_group_size(options, input);
      updated = 0;
      for (uint64_t c : input.unit_counts) updated += padded(c, m) / m;
      break;
    }
  }
  out.peak[Category::kMasterWeights] = r.has_master ? updated * 4 : 0;
  out.peak[Category::kOptimizerState] = updated * 2 * dtype_size(r.moments);
  return out;
}

}  // namespace emu::strategy
