#include "strategies/sharded_units.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>

#include "emu/check.h"

namespace emu::strategy {

void ShardedUnits::setup() {
  const optim::PrecisionRecipe& recipe = options_.recipe;
  const Mesh mesh = mesh_of(options_, world_.size(), world_.rank());
  EMU_CHECK(mesh.pipeline == 1, "{} over pipeline stages is not built", options_.name());
  if (mesh.tensor > 1) {  // the T ranks of this rank's TP slice, bound to the model as its TP group
    mesh_.tensor = split_tensor_group(mesh);
    mesh_.view = std::make_unique<GroupTensorParallel>(*mesh_.tensor);
    model_.set_tensor_parallel(mesh_.view.get());
    mesh_.data = split_data_group(mesh);  // the D ranks holding the same TP slice
  }
  groups_ = shard_groups();
  const DType grad_dtype = gradient_shard_dtype();
  const int units = model_.num_units();
  EMU_CHECK(!offloads_parameters() || context_.parameter_host != nullptr,
            "parameter offload needs a host device in the strategy's context");
  Device& parameter_device = offloads_parameters() ? *context_.parameter_host : device_;
  units_.resize(static_cast<size_t>(units));
  for (int u = 0; u < units; ++u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    const size_t count = model_.layout(u).count;
    unit.shard = shard_of(count, shard_rank(), shard_size());
    const model::ParameterCharge charge = unit_charge(model_, u);
    if (keeps_parameter_shard() || shard_size() == 1 || !recipe.has_master) {
      unit.params = model::allocate_parameter_space(parameter_device, charge, unit.shard.shard, recipe.params,
                                                    Category::kParameters, fmt::format("unit {} parameter shard", u));
    }
    if (!lazy_gradient_shards()) {
      unit.grads = model::allocate_parameter_space(optimizer_device(), charge, unit.shard.shard, grad_dtype,
                                                   Category::kGradients, fmt::format("unit {} gradient shard", u));
    }
    unit.optimizer = std::make_unique<optim::AdamWState>(optimizer_device(), recipe, unit.shard.shard,
                                                         fmt::format("unit {} optimizer shard", u), charge);
    unit.decay = decay_ranges(model_.layout(u), 0);
    unit.keep_gathered = keeps_gathered(charge.elements(count));
    std::vector<float> initial(device_.holds_data() ? unit.shard.shard : 0);  // host scratch, padding stays 0
    initial_shard(u, unit.shard, initial.empty() ? nullptr : initial.data());
    convert(initial.empty() ? nullptr : initial.data(), DType::kF32, unit.params.data(), recipe.params, initial.size());
    if (device_.holds_data()) {
      unit.optimizer->load_master(optim::ConstElementSpan(initial.data(), initial.size(), DType::kF32));
    }
  }
}

void ShardedUnits::initial_shard(int u, const ShardInfo& shard, float* out) {
  if (!mesh_.view) {
    init_into(model_, u, options_.seed, shard.offset, shard.valid, out, DType::kF32);
    return;
  }
  if (out == nullptr) return;
  tp_index_.resize(units_.size());
  std::vector<std::vector<int64_t>>& index = tp_index_[static_cast<size_t>(u)];
  index = tp_slice_index(model_, u, mesh_.tensor->rank(), mesh_.tensor->size());
  std::vector<float> slice(model_.layout(u).count);
  init_tp_slice(model_, u, options_.seed, index, slice.data());
  std::copy_n(slice.begin() + static_cast<std::ptrdiff_t>(shard.offset), shard.valid, out);
}

std::vector<float> ShardedUnits::full_weights(int u) {
  UnitState& unit = units_[static_cast<size_t>(u)];
  std::vector<float> mine(unit.shard.shard);
  const optim::ElementSpan master = unit.optimizer->master();
  if (!master.empty()) {
    convert(master.data(), master.dtype(), mine.data(), DType::kF32, mine.size());
  } else {
    convert(unit.params.data(), unit.params.dtype(), mine.data(), DType::kF32, mine.size());
  }
  std::vector<float> all(unit.shard.padded);
  if (groups_.alone) {
    all = std::move(mine);
  } else {
    shard_group().all_gather(mine.data(), all.data(), unit.shard.shard, DType::kF32, "report: gather weights");
  }
  all.resize(unit.shard.numel);
  if (!mesh_.view) return all;
  return gather_tp_unit(model_, u, tp_index_[static_cast<size_t>(u)], all.data(), *mesh_.tensor,
                        "report: gather weights");
}

std::vector<coll::Communicator*> ShardedUnits::groups() {
  std::vector<coll::Communicator*> all = {&world_};
  if (groups_.shard != nullptr) all.push_back(groups_.shard);
  if (groups_.replicas != nullptr && groups_.replicas != &world_ && groups_.replicas != groups_.shard) {
    all.push_back(groups_.replicas);
  }
  if (mesh_.tensor) all.push_back(mesh_.tensor.get());
  if (mesh_.data && mesh_.data.get() != groups_.shard && mesh_.data.get() != groups_.replicas) {
    all.push_back(mesh_.data.get());
  }
  return all;
}

double ShardedUnits::gradient_sum_of_squares() {
  // The ranks of one shard group own every element once; replicas across groups hold the same values.
  double local = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitState& unit = units_[u];
    if (!unit.grads.allocated()) continue;
    local += mesh_.view
                 ? tp_shard_sum_of_squares(model_, static_cast<int>(u), 0, unit.shard, unit.grads, mesh_.tensor->rank())
                 : optim::grad_sum_of_squares(optim::ConstElementSpan::of(unit.grads));
  }
  double total = groups_.alone ? local : sum_over(shard_group(), local, "clip: gradient norm");
  // Over TP the shard group holds one slice: the TP group's slices summed, each replicated tensor once.
  if (mesh_.tensor) total = sum_over(*mesh_.tensor, total, "clip: gradient norm, tensor-parallel");
  return total;
}

void ShardedUnits::update(double lr, float grad_scale) {
  for (int u = 0; u < model_.num_units(); ++u) update_unit(u, lr, grad_scale);
  release_stale_units();
}

void ShardedUnits::update_unit(int u, double lr, float grad_scale) {
  UnitState& unit = units_[static_cast<size_t>(u)];
  if (!unit.grads.allocated()) return;  // no backward reached the unit: AdamW skips a parameter without .grad
  // Without a kept parameter shard the step updates the master shard alone.
  const optim::ElementSpan params = unit.params.allocated()
                                        ? optim::ElementSpan::of(unit.params)
                                        : optim::ElementSpan(nullptr, unit.shard.shard, options_.recipe.params);
  unit.optimizer->step(options_.adamw, params, optim::ConstElementSpan::of(unit.grads), unit.shard.offset, unit.decay,
                       lr, grad_scale);
  count_step_traffic(unit_charge(model_, u).elements(unit.shard.shard), dtype_size(unit.grads.dtype()));
  if (lazy_gradient_shards()) {
    unit.grads.reset();  // zero_grad(set_to_none=True)
  } else {
    zero(unit.grads.data(), unit.grads.dtype(), unit.grads.count());
  }
}

void ShardedUnits::release_stale_units() {
  // Units kept gathered hold the old values: they are freed here and gathered afresh at their next use.
  for (int u = 0; u < model_.num_units(); ++u) release(u, /*stale=*/true);
}

void ShardedUnits::count_step_traffic(size_t elements, size_t gradient_bytes) {
  if (!offloads_parameters()) {
    count_offload(elements, gradient_bytes);
    return;
  }
  // The updated partition stays in host memory: with the optimizer there, only the gradients go down; with the
  // optimizer on the device, the updated bit16 partition goes down into its host copy.
  const size_t param_bytes = dtype_size(options_.recipe.params);
  host_traffic_.device_to_host += elements * (context_.offload != nullptr ? gradient_bytes : param_bytes);
}

void ShardedUnits::gather(int u, std::string_view pass) {
  UnitState& unit = units_[static_cast<size_t>(u)];
  if (shard_size() == 1 && !offloads_parameters()) {  // the shard is the whole unit; nothing to gather
    model_.bind_weights(u, unit.params.data());
    return;
  }
  if (unit.gathered.allocated()) return;
  const DType dtype = options_.recipe.params;
  const std::string phase = fmt::format("{} all-gather, unit {}", pass, u);
  PhaseScope scope(device_.memory(), phase);
  const model::ParameterCharge charge = unit_charge(model_, u);
  // An offloaded shard is copied up from host memory into its slice of the gathered buffer (DeepSpeed's
  // partition_parameters.py all-gather copies ds_tensor from the CPU), as a shrunk run charges it.
  if (offloads_parameters()) host_traffic_.host_to_device += charge.elements(unit.shard.shard) * dtype_size(dtype);
  // FSDP1 without a kept shard: the low-precision shard (_mp_shard) made from the master shard for this
  // all-gather and freed after it (FlatParamHandle pre_unshard / post_unshard).
  Buffer low_precision;
  if (!unit.params.allocated()) {
    low_precision = model::allocate_parameter_space(device_, charge, unit.shard.shard, dtype, Category::kParameters,
                                                    fmt::format("unit {} low-precision shard", u));
    const optim::ElementSpan master = unit.optimizer->master();
    convert(master.data(), master.dtype(), low_precision.data(), dtype, unit.shard.shard);
  }
  const Buffer& source = unit.params.allocated() ? unit.params : low_precision;
  const std::string what = fmt::format("unit {} gathered parameters", u);
  unit.gathered =
      charges_gathered_itself(u)
          ? device_.allocate(unit.shard.padded, dtype, Category::kParameters, what, 0)
          : model::allocate_parameter_space(device_, charge, unit.shard.padded, dtype, Category::kParameters, what);
  void* mine = element(unit.gathered.data(), dtype, unit.shard.offset);
  convert(source.data(), dtype, mine, dtype, unit.shard.shard);
  if (shard_size() > 1) shard_group().all_gather(mine, unit.gathered.data(), unit.shard.shard, dtype, phase);
  model_.bind_weights(u, unit.gathered.data());
}

void ShardedUnits::release(int u, bool stale) {
  UnitState& unit = units_[static_cast<size_t>(u)];
  if (unit.keep_gathered && !stale) return;
  model_.bind_weights(u, nullptr);
  unit.gathered.reset();
}

void ShardedUnits::begin_gradients(int u) {
  UnitState& unit = units_[static_cast<size_t>(u)];
  const std::string what = fmt::format("unit {} gradients", u);
  if (u > 0 && forms_flat_gradient()) {  // a block's, view by view (gradient_made)
    unit.views.allocate(device_, model_, u, options_.recipe.grads, what);
    model_.bind_grads(u, unit.views.data());
    return;
  }
  const bool in_parts = u == 0 && !charges_gradients_itself(u) && makes_root_gradients_in_parts();
  unit.unit_grads = charges_gradients_itself(u)
                        ? device_.allocate(unit.shard.padded, options_.recipe.grads, Category::kGradients, what, 0)
                    : in_parts
                        ? allocate_root_gradients(device_, model_, unit.shard.padded, options_.recipe.grads, what)
                        : model::allocate_parameter_space(device_, unit_charge(model_, u), unit.shard.padded,
                                                          options_.recipe.grads, Category::kGradients, what);
  if (in_parts) root_charges_.begin(device_, model_, options_.recipe.grads, what);
  model_.bind_grads(u, unit.unit_grads.data());
}

void ShardedUnits::before_embedding_backward() {
  if (root_charges_.begun()) root_charges_.embeddings_made();
}

void ShardedUnits::gradient_made(int u, size_t offset) {
  if (u == 0) {
    if (root_charges_.begun()) root_charges_.made(offset);
    return;
  }
  UnitState& unit = units_[static_cast<size_t>(u)];
  if (unit.views.allocated()) unit.views.made(offset);
}

void ShardedUnits::form_flat_gradient(int u) {
  if (!forms_flat_gradient()) return;
  UnitState& unit = units_[static_cast<size_t>(u)];
  const DType dtype = options_.recipe.grads;
  const size_t count = model_.layout(u).count;
  Buffer flat =
      device_.allocate(unit.shard.padded, dtype, Category::kGradients, fmt::format("unit {} FlatParameter gradient", u),
                       unit_charge(model_, u).bytes(count, dtype));
  if (u == 0) {
    convert(unit.unit_grads.data(), dtype, flat.data(), dtype, count);
    root_charges_.reset();
  } else {
    unit.views.check_complete();
    convert(unit.views.data(), dtype, flat.data(), dtype, count);
    unit.views.reset();
  }
  zero(element(flat.data(), dtype, count), dtype, unit.shard.padded - count);  // the shard padding
  unit.unit_grads = std::move(flat);
  model_.bind_grads(u, unit.unit_grads.data());
}

bool ShardedUnits::lazy_gradient_shards() const {
  return makes_gradient_shards_in_backward() && context_.offload == nullptr;
}

void ShardedUnits::reduce_gradients(int u) {
  UnitState& unit = units_[static_cast<size_t>(u)];
  const DType dtype = options_.recipe.grads;
  Buffer output;  // FSDP1's [S_u] reduce-scatter output: charged only
  if (forms_flat_gradient()) {
    if (!groups_.alone && (unit.grads.allocated() || gradient_shard_dtype() != dtype)) {
      output = device_.allocate(0, dtype, Category::kGradients, fmt::format("unit {} reduce-scatter output", u),
                                unit_charge(model_, u).bytes(unit.shard.shard, dtype));
    }
  }
  void* data = unit.unit_grads.data();
  void* mine = element(data, dtype, unit.shard.offset);
  if (!groups_.alone) {
    const std::string phase = fmt::format("backward reduce-scatter, unit {}", u);
    PhaseScope scope(device_.memory(), phase);
    shard_group().reduce_scatter(data, mine, unit.shard.shard, dtype, coll::ReduceOp::kAvg, phase);
  }
  if (groups_.replicas != nullptr) {
    const std::string phase = fmt::format("backward all-reduce across replicas, unit {}", u);
    PhaseScope scope(device_.memory(), phase);
    groups_.replicas->all_reduce(mine, mine, unit.shard.shard, dtype, coll::ReduceOp::kAvg, phase);
  }
  if (!unit.grads.allocated()) {  // the first reduce-scatter of this step makes the shard, beside the unit's gradients
    unit.grads =
        model::allocate_parameter_space(device_, unit_charge(model_, u), unit.shard.shard, gradient_shard_dtype(),
                                        Category::kGradients, fmt::format("unit {} gradient shard", u));
    zero(unit.grads.data(), unit.grads.dtype(), unit.grads.count());
  }
  accumulate(mine, dtype, unit.grads.data(), unit.grads.dtype(), unit.shard.shard);
  output.reset();
  model_.bind_grads(u, nullptr);
  unit.unit_grads.reset();
  if (u == 0) root_charges_.reset();
}

std::vector<int> ShardedUnits::following_units(int u, bool forward) const {
  const int last = model_.num_units() - 1;
  std::vector<int> next;
  if (forward) {
    for (int v = u + 1; v <= last; ++v) next.push_back(v);
  } else {
    for (int v = (u == 0 ? last : u - 1); v >= 1; --v) next.push_back(v);
  }
  return next;
}

}  // namespace emu::strategy
