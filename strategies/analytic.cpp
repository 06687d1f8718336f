#include "strategies/analytic.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strategies/shard.h"

namespace emu::strategy {
namespace {

// Nominal ring bytes one rank sends for one call on a payload of `bytes` over `ranks` ranks.
uint64_t ring_sent(coll::CollectiveKind kind, uint64_t bytes, int ranks) {
  if (ranks <= 1) return 0;
  const double factor =
      kind == coll::CollectiveKind::kAllReduce ? 2.0 * (ranks - 1) / ranks : static_cast<double>(ranks - 1) / ranks;
  return static_cast<uint64_t>(std::llround(factor * static_cast<double>(bytes)));
}

}  // namespace

uint64_t AnalyticInput::parameter_count() const {
  return std::accumulate(unit_counts.begin(), unit_counts.end(), uint64_t{0});
}

std::vector<uint64_t> AnalyticInput::tensors_of(size_t unit) const {
  if (unit < unit_tensors.size()) return unit_tensors[unit];
  return {unit_counts[unit]};
}

AnalyticInput analytic_input(const model::Model& model, int world, int ranks_per_node, int accumulation) {
  AnalyticInput input;
  for (int u = 0; u < model.num_units(); ++u) {
    input.unit_counts.push_back(model.layout(u).count);
    std::vector<uint64_t> tensors;
    for (const model::ParamInfo& param : model.layout(u).params) tensors.push_back(param.count);
    input.unit_tensors.push_back(std::move(tensors));
  }
  input.world = world;
  input.ranks_per_node = ranks_per_node;
  input.accumulation = accumulation;
  return input;
}

uint64_t Prediction::model_state_bytes() const {
  return peak[Category::kParameters] + peak[Category::kGradients] + peak[Category::kMasterWeights] +
         peak[Category::kOptimizerState];
}

uint64_t Prediction::sent(coll::CollectiveKind kind) const {
  uint64_t total = 0;
  for (const PredictedTraffic& t : traffic) {
    if (t.kind == kind) total += t.sent;
  }
  return total;
}

void add_ring_traffic(Prediction& prediction, coll::CollectiveKind kind, const std::string& group,
                      uint64_t payload_bytes, int group_size, uint64_t calls) {
  if (group_size <= 1 || calls == 0) return;
  const uint64_t sent = calls * ring_sent(kind, payload_bytes, group_size);
  for (PredictedTraffic& entry : prediction.traffic) {
    if (entry.kind == kind && entry.group == group) {
      entry.calls += calls;
      entry.sent += sent;
      return;
    }
  }
  prediction.traffic.push_back({kind, group, calls, sent});
}

uint64_t padded_elements(uint64_t count, int ranks) { return shard_of(count, 0, ranks).padded; }

UnitShards unit_shards(const AnalyticInput& input, int group_size) {
  UnitShards shards;
  for (uint64_t count : input.unit_counts) {
    shards.padded.push_back(padded_elements(count, group_size));
    shards.shard_elements += padded_elements(count, group_size) / group_size;
  }
  if (shards.padded.size() > 1) {
    shards.largest_padded_block = *std::max_element(shards.padded.begin() + 1, shards.padded.end());
  }
  return shards;
}

Prediction predict(const StrategyOptions& options, const AnalyticInput& input) {
  Prediction prediction;
  uint64_t updated_elements = 0;  // what this rank's optimizer updates
  switch (options.kind) {
    case StrategyKind::kDdp: updated_elements = predict_ddp(options, input, prediction); break;
    case StrategyKind::kZero1: updated_elements = predict_zero12(options, input, 1, prediction); break;
    case StrategyKind::kZero2: updated_elements = predict_zero12(options, input, 2, prediction); break;
    case StrategyKind::kZero3: updated_elements = predict_zero3(options, input, prediction); break;
    case StrategyKind::kFsdp: updated_elements = predict_fsdp(options, input, prediction); break;
  }
  // Master weights (fp32) and Adam's two moments over the elements this rank updates; under offload in host
  // memory, with the updated parameters sent back up every step.
  CategoryBytes& optimizer = input.offload ? prediction.host_peak : prediction.peak;
  optimizer[Category::kMasterWeights] = options.recipe.has_master ? updated_elements * 4 : 0;
  optimizer[Category::kOptimizerState] = updated_elements * 2 * dtype_size(options.recipe.moments);
  if (input.offload) prediction.pcie.host_to_device = updated_elements * dtype_size(options.recipe.params);
  return prediction;
}

}  // namespace emu::strategy
