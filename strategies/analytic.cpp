#include "strategies/analytic.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <string>
#include <string_view>

#include "strategies/buckets.h"
#include "strategies/shard.h"
#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"
#include "workloads/model/tensor_parallel.h"

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

namespace {

// The root's tensors as a shrunk run charges each one.
std::vector<uint64_t> root_tensors_charged(const AnalyticInput& input) {
  return input.unit_tensors_charged.empty() ? input.tensors_of(0) : input.unit_tensors_charged[0];
}

// The units' elements and tensors (as held and as charged), the largest tensor's charge and which root tensors'
// gradients autograd makes at the end, for `config` laid out as `units`.
void add_layout_tensors(AnalyticInput& input, const model::ModelConfig& config,
                        std::span<const model::UnitLayout> units) {
  uint64_t largest_tensor = 0;
  for (const model::UnitLayout& unit : units) {
    input.unit_counts.push_back(unit.count);
    input.unit_charge.push_back(model::parameter_charge(config, {&unit, 1}));
    std::vector<uint64_t> tensors, charged;
    for (const model::ParamInfo& param : unit.params) {
      tensors.push_back(param.count);
      charged.push_back(model::tensor_charge(config, param));
      if (param.count > largest_tensor) {
        largest_tensor = param.count;
        input.largest_tensor_charged = charged.back();
      }
    }
    input.unit_tensors.push_back(std::move(tensors));
    input.unit_tensors_charged.push_back(std::move(charged));
  }
  if (!units.empty()) {
    for (size_t i = 0; i < units.front().params.size(); ++i) {
      input.root_at_end.push_back(model::gradient_made_at_end(config, i));
    }
  }
}

}  // namespace

uint64_t AnalyticInput::root_embedding_elements() const {
  const std::vector<uint64_t> tensors = root_tensors_charged(*this);
  uint64_t late = 0;
  for (size_t i = 0; i < tensors.size() && i < root_at_end.size(); ++i) {
    if (root_at_end[i]) late += tensors[i];
  }
  return late;
}

uint64_t AnalyticInput::root_head_tensor() const {
  const std::vector<uint64_t> tensors = root_tensors_charged(*this);
  uint64_t largest = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i >= root_at_end.size() || !root_at_end[i]) largest = std::max(largest, tensors[i]);
  }
  return largest;
}

std::vector<uint64_t> AnalyticInput::registration_order() const {
  const auto tensors = [&](size_t unit) {
    return unit < unit_tensors_charged.size() ? unit_tensors_charged[unit] : tensors_of(unit);
  };
  const std::vector<uint64_t> root = tensors(0);
  std::vector<uint64_t> order, after_blocks;
  for (size_t i = 0; i < root.size(); ++i) {
    (i < root_at_end.size() && root_at_end[i] ? order : after_blocks).push_back(root[i]);
  }
  for (size_t unit = 1; unit < unit_counts.size(); ++unit) {
    const std::vector<uint64_t> block = tensors(unit);
    order.insert(order.end(), block.begin(), block.end());
  }
  order.insert(order.end(), after_blocks.begin(), after_blocks.end());
  return order;
}

uint64_t AnalyticInput::elements(int unit, uint64_t elements) const {
  if (unit == kCharged) return elements;
  if (unit == kAllUnits) return charge.elements(elements);
  if (static_cast<size_t>(unit) >= unit_charge.size()) return elements;
  return unit_charge[static_cast<size_t>(unit)].elements(elements);
}

uint64_t AnalyticInput::bytes(int unit, uint64_t elements, DType dtype) const {
  return this->elements(unit, elements) * dtype_size(dtype);
}

uint64_t head_elements(const model::Model& model) {
  const model::ModelConfig& config = model.config();
  uint64_t head = static_cast<uint64_t>(config.vocab) * static_cast<uint64_t>(config.hidden);
  for (const model::ParamInfo& param : model.layout(0).params) {
    if (param.shape.size() == 1) head += model::tensor_charge(config, param);
  }
  return head;
}

uint64_t embedding_elements(const model::Model& model) {
  if (model.config().tie_embeddings) return 0;
  uint64_t root = 0;
  for (const model::ParamInfo& param : model.layout(0).params) root += model::tensor_charge(model.config(), param);
  return root - head_elements(model);
}

std::vector<size_t> module_order(const model::UnitLayout& layout) {
  // Each tensor's module, by the end of its Hugging Face name, in the order a Llama-style layer runs them.
  constexpr std::string_view kRun[] = {"input_layernorm",
                                       "q_proj",
                                       "qkv_proj",
                                       "k_proj",
                                       "v_proj",
                                       "o_proj",
                                       "post_attention_layernorm",
                                       "pre_feedforward_layernorm",
                                       "gate_proj",
                                       "gate_up_proj",
                                       "up_proj",
                                       "down_proj",
                                       "post_feedforward_layernorm"};
  constexpr size_t kUnknown = std::size(kRun);
  std::vector<size_t> rank(layout.params.size(), kUnknown);
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const std::string& name = layout.params[i].name;
    for (size_t r = 0; r < kUnknown; ++r) {  // ".<module>." within the name
      const size_t at = name.find(kRun[r]);
      const size_t end = at + kRun[r].size();
      if (at != std::string::npos && at > 0 && name[at - 1] == '.' && end < name.size() && name[end] == '.') {
        rank[i] = r;
      }
    }
  }
  std::vector<size_t> order(layout.params.size());
  std::iota(order.begin(), order.end(), 0);
  // Only a layout whose every tensor is named above is reordered (GPT-2's lists its own in order already).
  if (std::find(rank.begin(), rank.end(), kUnknown) != rank.end()) return order;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank[a] < rank[b]; });
  return order;
}

AnalyticInput analytic_input(const model::Model& model, int world, int ranks_per_node, int accumulation) {
  AnalyticInput input;
  add_layout_tensors(input, model.config(), model.layouts());
  for (int u = 0; u < model.num_units(); ++u) {
    input.forward_order.push_back(module_order(model.layout(u)));
    input.unit_rows.push_back(tensor_rows(model.config(), model.layout(u)));
  }
  input.charge = model::parameter_charge(model.config(), model.layouts());
  input.shrink = model.config().shrink;
  input.head_elements = head_elements(model);
  input.embedding_elements = embedding_elements(model);
  // pp: the root's tensors by their Hugging Face names: the embedding tables on the first stage, the rest (and a
  // tied table's copy) on the last.
  const model::ModelConfig& config = model.config();
  for (const model::ParamInfo& param : model.layout(0).params) {
    const uint64_t charged = model::tensor_charge(config, param);
    const bool table = param.name.find("embed_tokens") != std::string::npos ||
                       param.name.find(".wte.") != std::string::npos || param.name.find(".wpe.") != std::string::npos;
    const bool tied = config.tie_embeddings && param.name.find(".wpe.") == std::string::npos;
    if (table) input.root_first_stage += charged;
    if (!table || tied) input.root_last_stage += charged;
    if (table && tied) input.tied_embedding += charged;
  }
  input.boundary_bytes =
      static_cast<uint64_t>(config.tokens()) * static_cast<uint64_t>(config.hidden) * dtype_size(model.compute_dtype());
  input.tokens = static_cast<uint64_t>(config.tokens());
  input.checkpoint = model.options().checkpoint;
  input.sequence_parallel = model.options().sequence_parallel;
  for (int u = 0; u < model.num_units(); ++u) {
    for (size_t p = 0; p < model.layout(u).params.size(); ++p) {
      const uint64_t count = model.layout(u).params[p].count;
      if (count != model.full_layout(u).params[p].count) continue;
      input.replicated_elements += count;
      ++input.replicated_tensors;
    }
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

void add_megatron_unit(Prediction& prediction, Updated& updated, const AnalyticInput& input,
                       const optim::PrecisionRecipe& recipe, const Mesh& mesh, bool distributed, int unit,
                       uint64_t elements) {
  prediction.peak[Category::kParameters] += input.bytes(unit, elements, recipe.params);
  prediction.peak[Category::kGradients] += input.bytes(unit, elements, recipe.grads);
  if (!distributed) {
    updated.emplace_back(unit, elements);
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "data-parallel",
                     input.bytes(unit, elements, recipe.grads), mesh.data);
    return;
  }
  // 1/D of the elements (exact where D divides each unit and root tensor).
  updated.emplace_back(unit, shard_of(elements, mesh.data_rank(), mesh.data).valid);
  add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, "data-parallel",
                   input.bytes(unit, elements, recipe.grads), mesh.data);
  add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "data-parallel",
                   input.bytes(unit, elements, recipe.params), mesh.data);
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

ShardedLayout sharded_layout(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  ShardedLayout layout{mesh_of(options, input.world, input.rank), "world"};
  if (layout.mesh.tensor > 1) {
    layout.group = "data-parallel";
    add_tensor_parallel_traffic(prediction, input, "tensor-parallel", layout.mesh.tensor);
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "tensor-parallel", 4, layout.mesh.tensor);
  }
  return layout;
}

UnitShards unit_shards(const AnalyticInput& input, int group_size) {
  UnitShards shards;
  shards.group_size = group_size;
  for (uint64_t count : input.unit_counts) {
    shards.padded.push_back(padded_elements(count, group_size));
    shards.shard_elements += padded_elements(count, group_size) / group_size;
  }
  if (shards.padded.size() > 1) {
    const auto largest = std::max_element(shards.padded.begin() + 1, shards.padded.end());
    shards.largest_padded_block = *largest;
    shards.largest_block = static_cast<int>(largest - shards.padded.begin());
  }
  return shards;
}

uint64_t UnitShards::shard_bytes(const AnalyticInput& input, DType dtype) const {
  uint64_t total = 0;
  for (size_t u = 0; u < padded.size(); ++u) total += input.bytes(static_cast<int>(u), padded[u] / group_size, dtype);
  return total;
}

Updated UnitShards::updated() const {
  Updated shards;
  for (size_t u = 0; u < padded.size(); ++u) shards.emplace_back(static_cast<int>(u), padded[u] / group_size);
  return shards;
}

Prediction predict(const StrategyOptions& given, const AnalyticInput& input) {
  const StrategyOptions options = with_framework_recipe(given);
  Prediction prediction;
  Updated updated;  // what this rank's optimizer updates
  switch (options.kind) {
    case StrategyKind::kDdp:
    case StrategyKind::kDdpZero:
    case StrategyKind::kZero0: updated = predict_ddp(options, input, prediction); break;
    case StrategyKind::kZero1: updated = predict_zero12(options, input, 1, prediction); break;
    case StrategyKind::kZero2: updated = predict_zero12(options, input, 2, prediction); break;
    case StrategyKind::kZero3: updated = predict_zero3(options, input, prediction); break;
    case StrategyKind::kFsdp: updated = predict_fsdp(options, input, prediction); break;
    case StrategyKind::kFsdp2: updated = predict_fsdp2(options, input, prediction); break;
    case StrategyKind::kPipeline: updated = predict_pipeline(options, input, prediction); break;
    case StrategyKind::kTensor: updated = predict_tensor_parallel(options, input, prediction); break;
  }
  // Master weights (fp32) and Adam's two moments over the elements this rank updates, and AdamW's step
  // temporaries beside them; under offload in host memory, with the updated parameters sent back up every step.
  CategoryBytes& optimizer = input.offload ? prediction.host_peak : prediction.peak;
  for (const auto& [unit, elements] : updated) {
    if (options.recipe.has_master) optimizer[Category::kMasterWeights] += input.bytes(unit, elements, DType::kF32);
    optimizer[Category::kOptimizerState] += 2 * input.bytes(unit, elements, options.recipe.moments);
    // ZeRO-3's offloaded partitions are updated on the host: nothing goes back up.
    const bool parameters_on_host = options.kind == StrategyKind::kZero3 && options.zero.offload_param;
    if (input.offload && !parameters_on_host) {
      prediction.pcie.host_to_device += input.bytes(unit, elements, options.recipe.params);
    }
  }
  optimizer[Category::kOptimizerState] += prediction.step_temporary_elements * dtype_size(options.recipe.moments);
  return prediction;
}

}  // namespace emu::strategy

namespace emu::strategy {

Representative representative_rank(const StrategyOptions& options, const model::ModelConfig& config, int ranks,
                                   int first, int last, bool offload) {
  if (first >= last) return {first, false};
  // With fp32 gradient accumulation BF16_Optimizer (zero1) keeps no gradient partition and zero2's compact one is S
  // elements on every rank: their ranks hold alike.
  const bool zero12 = (options.kind == StrategyKind::kZero2 || options.kind == StrategyKind::kZero1) &&
                      !options.zero.fp32_grad_accumulation;
  if (zero12 && !offload) {
    // Each data-parallel rank's gradient partition holds the whole tensors meeting its S elements (shard.h), of
    // the TP slice's layout over D ranks with --tp.
    const Mesh mesh = mesh_of(options, ranks, 0);
    const model::ModelConfig slice = mesh.tensor > 1 ? model::tensor_parallel_config(config, mesh.tensor) : config;
    AnalyticInput input;
    add_layout_tensors(input, slice, model::build_layouts(slice));
    const std::vector<uint64_t> order = input.registration_order();
    const int per_replica = mesh.tensor * mesh.pipeline;
    const uint64_t busiest = partition_with_most_whole_tensors(
        order, group_shard(order, mesh.data, kNcclStartAlignment), static_cast<uint64_t>(first / per_replica),
        static_cast<uint64_t>(last / per_replica));
    return {std::max(first, static_cast<int>(busiest) * per_replica), true};
  }
  if (options.kind != StrategyKind::kDdpZero) return {first, false};
  std::vector<uint64_t> charged;  // as ddp.cpp partitions them: every tensor in registration order
  for (const model::UnitLayout& unit : model::build_layouts(config)) {
    for (const model::ParamInfo& p : unit.params) charged.push_back(model::tensor_charge(config, p));
  }
  return {zero_redundancy_busiest(charged, ranks, first, last), true};
}

}  // namespace emu::strategy
