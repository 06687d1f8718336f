#include "strategies/strategy.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "collectives/virtual/virtual_link.h"
#include "emu/check.h"

namespace emu::strategy {
namespace {

struct Named {
  std::string_view name;
  StrategyKind kind;
  Sharding sharding;
};
constexpr Named kNames[] = {
    {"ddp", StrategyKind::kDdp, Sharding::kFullShard},
    {"ddp-zero", StrategyKind::kDdpZero, Sharding::kFullShard},
    {"zero0", StrategyKind::kZero0, Sharding::kFullShard},
    {"zero1", StrategyKind::kZero1, Sharding::kFullShard},
    {"zero2", StrategyKind::kZero2, Sharding::kFullShard},
    {"zero3", StrategyKind::kZero3, Sharding::kFullShard},
    {"fsdp", StrategyKind::kFsdp, Sharding::kFullShard},
    {"fsdp-grad-op", StrategyKind::kFsdp, Sharding::kShardGradOp},
    {"fsdp-no-shard", StrategyKind::kFsdp, Sharding::kNoShard},
    {"fsdp-hybrid", StrategyKind::kFsdp, Sharding::kHybridShard},
    {"fsdp2", StrategyKind::kFsdp2, Sharding::kFullShard},
    {"pp", StrategyKind::kPipeline, Sharding::kFullShard},
    {"tp", StrategyKind::kTensor, Sharding::kFullShard},
};

}  // namespace

std::string StrategyOptions::name() const {
  for (const Named& named : kNames) {
    if (named.kind == kind && (kind != StrategyKind::kFsdp || named.sharding == fsdp.sharding)) {
      // Interleaved pipelines: their chunks per stage ("pp·v2", "pp4·v2·dp2", "fsdp2·pp2·v2·tp8").
      const std::string chunks =
          pipelined(*this) && pipeline.virtual_stages > 1 ? fmt::format("·v{}", pipeline.virtual_stages) : "";
      if (named_data < 1) return std::string(named.name) + chunks;
      // "fsdp2·tp2" (D = N/T); with --pp "fsdp2·pp2·tp8" (D = N/(T·P)); ZeRO-3's, FSDP's and ZeRO-1/2's over TP
      // alike, "zero3·tp2", "fsdp-grad-op·tp2", "zero2·tp2"
      if (sharded_over_layout(kind) || zero12_over_tensor(*this)) {
        std::string out(named.name);
        if (parallel.pipeline > 1) out += fmt::format("·pp{}{}", parallel.pipeline, chunks);
        if (parallel.tensor > 1) out += fmt::format("·tp{}", parallel.tensor);
        return out;
      }
      const bool tensor = kind == StrategyKind::kTensor;
      std::string out = fmt::format("{}{}{}", named.name, tensor ? parallel.tensor : parallel.pipeline, chunks);
      if (!tensor && parallel.tensor > 1) out += fmt::format("·tp{}", parallel.tensor);
      if (named_data > 1) out += fmt::format("·dp{}", named_data);
      if (named_data > 1 && parallel.distributed_optimizer) out += "·do";
      return out;
    }
  }
  return "unknown";
}

bool pipelined(const StrategyOptions& options) {
  return options.kind == StrategyKind::kPipeline ||
         (options.kind == StrategyKind::kFsdp2 && options.parallel.pipeline > 1);
}

bool sharded_over_layout(StrategyKind kind) {
  return kind == StrategyKind::kFsdp2 || kind == StrategyKind::kZero3 || kind == StrategyKind::kFsdp;
}

bool pipelined_or_tensor(const StrategyOptions& options) {
  return options.parallel.tensor > 1 || options.parallel.pipeline > 1;
}

bool zero12_over_tensor(const StrategyOptions& options) {
  return (options.kind == StrategyKind::kZero1 || options.kind == StrategyKind::kZero2) && options.parallel.tensor > 1;
}

Mesh mesh_of(const StrategyOptions& options, int world, int rank) {
  Mesh mesh;
  mesh.rank = rank;
  const bool sharded = sharded_over_layout(options.kind);
  if (options.kind != StrategyKind::kTensor && options.kind != StrategyKind::kPipeline &&
      !(sharded && pipelined_or_tensor(options)) && !zero12_over_tensor(options)) {
    mesh.data = world;
    return mesh;
  }
  const bool tensor = options.kind == StrategyKind::kTensor;
  const bool pipeline = options.kind == StrategyKind::kPipeline;
  if (!tensor && !pipeline) {  // FSDP2, ZeRO-3, FSDP (ZeRO-1/2 over TP) over a TP and/or PP layout: the degrees given
    mesh.tensor = std::max(1, options.parallel.tensor);
    mesh.pipeline = std::max(1, options.parallel.pipeline);
  } else {
    mesh.tensor = options.parallel.tensor > 0 ? options.parallel.tensor : (tensor ? world : 1);
    mesh.pipeline = options.parallel.pipeline > 0 ? options.parallel.pipeline : (tensor ? 1 : world);
  }
  const int model_parallel = mesh.tensor * mesh.pipeline;
  if (model_parallel > world || world % model_parallel != 0) {
    throw InputError(fmt::format(
        "{}: {} ranks are not divisible by tensor-parallel {} x pipeline-parallel {} = {}; accepted: a number of "
        "ranks that is a multiple of {} (the data-parallel degree is ranks / {})",
        options.name(), world, mesh.tensor, mesh.pipeline, model_parallel, model_parallel, model_parallel));
  }
  mesh.data = world / model_parallel;
  return mesh;
}

uint64_t StrategyOptions::scaled(uint64_t full_scale) const {
  const uint64_t k2 = static_cast<uint64_t>(shrink) * static_cast<uint64_t>(shrink);
  return std::max<uint64_t>(1, full_scale / k2);
}

std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for (const Named& named : kNames) names.emplace_back(named.name);
  return names;
}

void set_kind(StrategyOptions& options, std::string_view name) {
  for (const Named& named : kNames) {
    if (named.name == name) {
      options.kind = named.kind;
      options.fsdp.sharding = named.sharding;
      options = with_framework_recipe(options);
      return;
    }
  }
  throw InputError(fmt::format("strategy '{}' is not one of {}", name, fmt::join(strategy_names(), ", ")));
}

StrategyOptions with_framework_recipe(StrategyOptions options) {
  const bool ddp = options.kind == StrategyKind::kDdp || options.kind == StrategyKind::kDdpZero;
  optim::PrecisionRecipe& recipe = options.recipe;
  if (ddp && recipe.recipe == optim::Recipe::kMixed && !recipe.fp16 && recipe.params == DType::kBF16) {
    recipe.params = DType::kF32;
    recipe.grads = DType::kF32;
    recipe.has_master = false;
    recipe.moments = DType::kF32;
  }
  // Megatron-LM's mixed recipe (tensor_parallel.cpp): bf16 parameters, fp32 main gradients, fp32 master and moments.
  // pp's stages tensor-parallel too (--tp with --pp) are Megatron-LM's alone: its recipe.
  const bool megatron =
      options.kind == StrategyKind::kTensor || (options.kind == StrategyKind::kPipeline && options.parallel.tensor > 1);
  if (megatron && recipe.recipe == optim::Recipe::kMixed && recipe.params == DType::kBF16) {
    recipe.grads = DType::kF32;
  }
  return options;
}

model::ModelOptions framework_model_options(const StrategyOptions& options, model::ModelOptions model) {
  model.autocast = with_framework_recipe(options).recipe.params != model.compute;
  return model;
}

std::vector<std::string> comm_hook_names() { return {"none", "bf16"}; }
std::vector<std::string> schedule_names() { return {"gpipe", "1f1b"}; }

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string unit_name(int unit) { return unit == 0 ? "root" : fmt::format("block {}", unit); }

}  // namespace

// Stands between the model and the strategy while a span sink is set: forwards every hook to the strategy, in
// order, and records a span per unit from its before_ hook to its after_ hook. The model nests units (the root's
// forward holds every block's), so the spans nest too.
class Strategy::SpanHooks : public model::Hooks {
 public:
  explicit SpanHooks(Strategy& strategy) : strategy_(strategy), forward_(num_units()), backward_(num_units()) {}

  void before_forward(int unit) override {
    forward_[static_cast<size_t>(unit)] = now_seconds();
    strategy_.before_forward(unit);
  }
  void after_forward(int unit) override {
    strategy_.after_forward(unit);
    strategy_.span_sink_(fmt::format("forward, {}", unit_name(unit)), "compute", forward_[static_cast<size_t>(unit)],
                         now_seconds());
  }
  void before_backward(int unit) override {
    backward_[static_cast<size_t>(unit)] = now_seconds();
    strategy_.before_backward(unit);
  }
  void after_backward(int unit) override {
    strategy_.after_backward(unit);
    strategy_.span_sink_(fmt::format("backward, {}", unit_name(unit)), "compute", backward_[static_cast<size_t>(unit)],
                         now_seconds());
  }
  void before_embedding_backward() override { strategy_.before_embedding_backward(); }
  void gradient_made(int unit, size_t offset) override { strategy_.gradient_made(unit, offset); }

 private:
  size_t num_units() const { return static_cast<size_t>(strategy_.model_.num_units()); }

  Strategy& strategy_;
  std::vector<double> forward_, backward_;  // [units] when each unit's before_ hook was called
};

template <typename Work>
void Strategy::record_span(std::string_view name, std::string_view category, Work&& work) {
  if (!span_sink_) {
    work();
    return;
  }
  const double start = now_seconds();
  work();
  span_sink_(name, category, start, now_seconds());
}

Strategy::Strategy(StrategyContext context, StrategyOptions options)
    : context_(context), options_(options), model_(context.model), device_(context.device), world_(context.world) {}

Strategy::~Strategy() = default;

StepResult Strategy::step(std::span<const data::Batch> micro_batches) {
  const auto start = std::chrono::steady_clock::now();
  const int count = static_cast<int>(micro_batches.size());
  EMU_CHECK(count > 0, "a step needs at least one micro-batch");
  std::optional<SpanHooks> span_hooks;
  if (span_sink_) span_hooks.emplace(*this);
  model::Hooks& hooks = span_hooks ? static_cast<model::Hooks&>(*span_hooks) : static_cast<model::Hooks&>(*this);
  const double loss = run_micro_batches(micro_batches, hooks);
  {
    PhaseScope phase(device_.memory(), "gradient reduction");
    record_span("gradient reduction", "collective", [&] { finish_gradients(); });
  }
  // The gradients now hold the sum over micro-batches of the rank-averaged gradient; the step's gradient is that
  // sum divided by the number of micro-batches.
  StepResult result;
  result.grad_norm = std::sqrt(gradient_sum_of_squares()) / count;
  const float clip = options_.clip_norm > 0 ? optim::clip_coefficient(result.grad_norm, options_.clip_norm) : 1.0f;
  ++steps_;
  {
    PhaseScope phase(device_.memory(), "optimizer step");
    const std::vector<uint64_t> tensors = optimizer_tensors();
    const optim::StepTemporaries temporaries(optimizer_device(), options_.adamw_impl, tensors, options_.recipe.moments);
    record_span("optimizer step", "optimizer",
                [&] { update(options_.schedule.lr_at(steps_, options_.adamw.lr), clip / static_cast<float>(count)); });
  }
  result.loss = static_cast<float>(loss / count);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

double Strategy::run_micro_batches(std::span<const data::Batch> micro_batches, model::Hooks& hooks) {
  const int count = static_cast<int>(micro_batches.size());
  double loss = 0;
  for (int i = 0; i < count; ++i) {
    begin_micro_batch(i, count);
    const data::Batch& batch = micro_batches[static_cast<size_t>(i)];
    loss += model_.step(batch.tokens.data(), batch.targets.data(), hooks);
  }
  return loss;
}

std::unique_ptr<Strategy> make_ddp(StrategyContext context, const StrategyOptions& options);
std::unique_ptr<Strategy> make_zero12(StrategyContext context, const StrategyOptions& options, int stage);
std::unique_ptr<Strategy> make_zero3(StrategyContext context, const StrategyOptions& options);
std::unique_ptr<Strategy> make_fsdp(StrategyContext context, const StrategyOptions& options);
std::unique_ptr<Strategy> make_fsdp2(StrategyContext context, const StrategyOptions& options);
std::unique_ptr<Strategy> make_pipeline(StrategyContext context, const StrategyOptions& options);
std::unique_ptr<Strategy> make_tensor_parallel(StrategyContext context, const StrategyOptions& options);

std::unique_ptr<Strategy> make_strategy(StrategyContext context, const StrategyOptions& options) {
  switch (options.kind) {
    case StrategyKind::kDdp:
    case StrategyKind::kDdpZero:
    case StrategyKind::kZero0: return make_ddp(context, with_framework_recipe(options));
    case StrategyKind::kZero1: return make_zero12(context, options, 1);
    case StrategyKind::kZero2: return make_zero12(context, options, 2);
    case StrategyKind::kZero3: return make_zero3(context, options);
    case StrategyKind::kFsdp: return make_fsdp(context, options);
    case StrategyKind::kFsdp2: return make_fsdp2(context, options);
    case StrategyKind::kPipeline: return make_pipeline(context, with_framework_recipe(options));
    case StrategyKind::kTensor: return make_tensor_parallel(context, with_framework_recipe(options));
  }
  EMU_CHECK(false, "unknown strategy kind {}", static_cast<int>(options.kind));
  return nullptr;
}

void Strategy::count_offload(size_t elements, size_t gradient_bytes) {
  if (context_.offload == nullptr) return;
  if (gradient_bytes == 0) gradient_bytes = dtype_size(options_.recipe.grads);
  host_traffic_.device_to_host += elements * gradient_bytes;
  host_traffic_.host_to_device += elements * dtype_size(options_.recipe.params);
}

double Strategy::sum_over_world(double local, std::string_view phase) { return sum_over(world_, local, phase); }

double Strategy::sum_over(coll::Communicator& group, double local, std::string_view phase) {
  // Collectives carry fp32 and bf16, as NCCL's would for this: the partial sums travel as fp32.
  float total = static_cast<float>(local);
  group.all_reduce(&total, &total, 1, DType::kF32, coll::ReduceOp::kSum, phase);
  return total;
}

std::unique_ptr<coll::Communicator> Strategy::split_group(int color, int rank, int size, const std::string& name) {
  if (device_.holds_data()) return world_.split(color, world_.rank(), name);
  return coll::make_virtual_communicator(device_, rank, size, name, model_.config().shrink);
}

std::unique_ptr<coll::Communicator> Strategy::split_tensor_group(const Mesh& mesh) {
  const int stage = world_.rank() / mesh.tensor;  // d·P + p
  return split_group(stage, mesh.tensor_rank(), mesh.tensor, fmt::format("tensor-parallel {}", stage));
}

std::unique_ptr<coll::Communicator> Strategy::split_data_group(const Mesh& mesh) {
  const int slice = mesh.pipeline_rank() * mesh.tensor + mesh.tensor_rank();  // p·T + t
  return split_group(slice, mesh.data_rank(), mesh.data, fmt::format("data-parallel {}", slice));
}

}  // namespace emu::strategy
