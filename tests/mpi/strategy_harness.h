// Shared set-up for strategy tests: a tiny model, its data, a world communicator, and the single-device reference
// every strategy must match (torchtitan's ladder: single device trusted, every strategy checked against it).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/mpi/mpi_communicator.h"
#include "emu/bf16.h"
#include "emu/check.h"
#include "emu/device.h"
#include "strategies/flat.h"
#include "strategies/strategy.h"
#include "workloads/data/synthetic.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"
#include "workloads/model/tensor.h"
#include "workloads/optim/adamw_state.h"

namespace emu::testing {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// A model small enough to train in milliseconds, with sizes that need padding on 3, 5 and 8 ranks.
// `layers`: more blocks for pipeline parallelism, which needs one per stage at least.
inline model::ModelConfig tiny_config(model::Style style, int64_t batch, int64_t layers = 2) {
  model::ModelConfig config;
  config.name = "tiny";
  config.style = style;
  config.hidden = 16;
  config.ffn = style == model::Style::kLlama ? 44 : 64;
  config.vocab = 37;
  config.seq = 8;
  config.max_positions = 8;
  config.layers = layers;
  config.heads = 2;
  config.kv_heads = style == model::Style::kLlama ? 1 : 2;
  config.batch = batch;
  config.tie_embeddings = style == model::Style::kGpt2;
  return config;
}

inline data::SyntheticTokens tiny_data(const model::ModelConfig& config) {
  data::SyntheticConfig synthetic;
  synthetic.seed = 7;
  synthetic.vocab = config.vocab;
  synthetic.seq_len = config.seq;
  return data::SyntheticTokens(synthetic);
}

inline strategy::StrategyOptions test_options(std::string_view name, optim::Recipe recipe) {
  strategy::StrategyOptions options;
  strategy::set_kind(options, name);
  options.recipe = optim::precision_recipe(recipe);
  options.adamw.lr = 1e-2f;
  options.adamw.eps = 1e-4f;  // damps the sign-like first steps of elements whose gradient is only rounding noise
  options.adamw.weight_decay = 0.1f;
  options.clip_norm = 0.5f;
  options.seed = 99;
  return options;
}

// What a run produced, step by step, on every rank.
struct Trace {
  std::vector<float> losses;                             // [steps] mean over the global batch
  std::vector<double> grad_norms;                        // [steps] global norm of the step's mean gradient, unclipped
  std::vector<std::vector<std::vector<float>>> weights;  // [steps][units][elements] fp32 (master) after each step
};

// Appends one step to `trace`: `loss` (the global batch's mean, as the caller computed it), the step's gradient norm
// and, with `weights`, every unit's full weights (a collective: every rank calls it).
inline void record_step(Trace& trace, float loss, const strategy::StepResult& result, strategy::Strategy& strategy,
                        int units, bool weights) {
  trace.losses.push_back(loss);
  trace.grad_norms.push_back(result.grad_norm);
  if (!weights) return;
  std::vector<std::vector<float>> full(static_cast<size_t>(units));
  for (size_t u = 0; u < full.size(); ++u) full[u] = strategy.full_weights(static_cast<int>(u));
  trace.weights.push_back(std::move(full));
}

// The largest error of `run`'s weights after step `step` against `reference`'s, relative to max(1, |reference|), and
// where it is. A unit whose size differs is a test failure (and an infinite error).
struct WeightError {
  double worst = 0;
  size_t unit = 0, element = 0;
};
inline WeightError worst_weight_error(const Trace& run, const Trace& reference, size_t step) {
  WeightError error;
  for (size_t u = 0; u < reference.weights[step].size(); ++u) {
    const std::vector<float>& want = reference.weights[step][u];
    const std::vector<float>& got = run.weights[step][u];
    if (got.size() != want.size()) {
      ADD_FAILURE() << "step " << step + 1 << ", unit " << u << ": " << got.size() << " elements, the reference "
                    << want.size();
      return {std::numeric_limits<double>::infinity(), u, 0};
    }
    for (size_t e = 0; e < want.size(); ++e) {
      const double relative = std::abs(double(got[e]) - want[e]) / std::max(1.0, std::abs(double(want[e])));
      if (relative > error.worst) error = {relative, u, e};
    }
  }
  return error;
}

// The mean over the world's ranks of each rank's `value` (each rank's loss over its own micro-batches).
inline float mean_over_world(float value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return value / static_cast<float>(world_size());
}

namespace detail {

// The clip coefficient Strategy::step applies: clip_norm 0 turns clipping off.
inline float clip_factor(double norm, float clip_norm) {
  return clip_norm > 0 ? optim::clip_coefficient(norm, clip_norm) : 1.0f;
}

// Each unit's fp32 weights: the master copy when the recipe keeps one, else the parameters.
inline std::vector<std::vector<float>> snapshot(const model::Model& model, const std::vector<Buffer>& weights,
                                                const std::vector<std::unique_ptr<optim::AdamWState>>& optimizers) {
  std::vector<std::vector<float>> units;
  for (size_t u = 0; u < weights.size(); ++u) {
    std::vector<float> out(model.layout(static_cast<int>(u)).count);
    const optim::ElementSpan master = optimizers[u]->master();
    if (!master.empty()) {
      model::widen(master.data(), master.dtype(), out.size(), out.data());
    } else {
      model::widen(weights[u].data(), weights[u].dtype(), out.size(), out.data());
    }
    units.push_back(std::move(out));
  }
  return units;
}

// The N ranks' bf16 gradients of one micro-batch reduced as a bf16 collective does (collectives/reduce.h): partial
// sums rounded to bf16 after each of the N−1 additions, here in rank order 0, 1, …, N−1, then the sum divided by N
// and rounded once more. `ranks` holds [N][n] gradients widened to fp32 (each exact in bf16); the result is written
// to `out` as bf16 [n].
inline void bf16_average(const std::vector<std::vector<float>>& ranks, void* out) {
  const size_t n = ranks.front().size();
  std::vector<float> average(n);
  for (size_t i = 0; i < n; ++i) {
    float sum = ranks[0][i];
    for (size_t r = 1; r < ranks.size(); ++r) sum = round_to_bf16(sum + ranks[r][i]);
    average[i] = sum / static_cast<float>(ranks.size());
  }
  model::narrow(average.data(), DType::kBF16, n, out);
}

}  // namespace detail

// Whether torch.autocast(bf16) feeds `p` to its op as a bf16 cast: a matrix of a linear layer (the LM head too),
// the embedding table when the head is tied to it, a linear layer's bias; not the norms' weights and biases nor an
// embedding lookup's table (F.embedding and the norms are on none of autocast's lists, so they read fp32).
inline bool autocast_reads_bf16(const model::ParamInfo& p, bool tied_head) {
  const bool table = p.name.find("embed_tokens") != std::string::npos || p.name.find(".wte.") != std::string::npos;
  if (table) return tied_head;
  if (p.name.find(".wpe.") != std::string::npos) return false;
  if (p.shape.size() == 2) return true;
  const bool linear = p.name.find("_proj.") != std::string::npos || p.name.find(".c_") != std::string::npos;
  return linear && p.name.ends_with(".bias");
}

// `weights` (fp32) as autocast's ops read them, into `view` (fp32): autocast_reads_bf16's tensors rounded to bf16.
inline void autocast_view(const model::UnitLayout& layout, const Buffer& weights, bool tied_head, Buffer& view) {
  auto* w = static_cast<float*>(view.data());
  model::widen(weights.data(), weights.dtype(), view.count(), w);
  for (const model::ParamInfo& p : layout.params) {
    if (!autocast_reads_bf16(p, tied_head)) continue;
    for (size_t i = p.offset; i < p.offset + p.count; ++i) w[i] = round_to_bf16(w[i]);
  }
}

// Single device, the same global batch and the same recipe as the strategies, trusted by the ladder.
//   fp32 recipe: one model of micro-batch N·b takes the whole global micro-batch; `accumulation` micro-batches
//     per step. Agrees with any strategy up to the order of fp32 sums.
//   mixed recipe: a model of micro-batch b runs each rank's sequence in turn with the same bf16 weights, so each
//     rank's bf16 gradient is the strategies' bit for bit; the N gradients are averaged as a bf16 reduction
//     rounds (detail::bf16_average). It differs from a strategy only in the order of the N−1 rounded additions
//     (a ring starts each block's sum at another rank). The strategies' rounding points agree with this for one
//     micro-batch per step only (FSDP accumulates in fp32 after its reduce-scatter), so the mixed reference takes
//     accumulation 1.
//   mixed recipe under PyTorch DDP (ddp, ddp-zero: torch.autocast over fp32 weights, strategy::with_framework_recipe):
//     fp32 weights and gradients; before every step's forward the tensors autocast casts for a linear layer (its
//     weight and bias, the LM head, tied or not) are read rounded to bf16, every other one (norms, the embedding
//     tables, GPT-2's wpe) as its fp32 value; otherwise as fp32 (one model takes the global micro-batch, fp32
//     gradients summed).
// `config`'s batch is set here (N, or 1 for the bf16-gradient reference); run_reference takes tiny_config's.
inline Trace run_reference_config(model::ModelConfig config, const strategy::StrategyOptions& given, int ranks,
                                  int accumulation, int steps) {
  const strategy::StrategyOptions options = strategy::with_framework_recipe(given);
  const DType compute = given.recipe.params;  // the model's math: bf16 in the mixed recipe, under autocast too
  const bool autocast = compute != options.recipe.params;
  const bool per_rank = options.recipe.grads == DType::kBF16;
  EMU_CHECK(!per_rank || accumulation == 1, "the bf16-gradient reference takes one micro-batch per step, not {}",
            accumulation);
  config.batch = per_rank ? 1 : ranks;
  auto device = make_cpu_device({});
  model::ModelOptions model_options;
  model_options.compute = compute;
  model_options.autocast = autocast;
  model::Model model(*device, config, model_options);
  const auto data = tiny_data(config);
  model::NoHooks hooks;
  const int units = model.num_units();
  std::vector<Buffer> weights, grads, rank_grads, casts;
  std::vector<std::unique_ptr<optim::AdamWState>> optimizers;
  for (int u = 0; u < units; ++u) {
    const size_t count = model.layout(u).count;
    std::vector<float> initial(count);
    model.init_unit(u, options.seed, initial.data());
    weights.push_back(device->allocate(count, options.recipe.params, Category::kParameters));
    grads.push_back(device->allocate(count, options.recipe.grads, Category::kGradients));
    rank_grads.push_back(device->allocate(count, options.recipe.grads, Category::kGradients));
    model::narrow(initial.data(), options.recipe.params, count, weights.back().data());
    optimizers.push_back(std::make_unique<optim::AdamWState>(*device, options.recipe, count));
    optimizers.back()->load_master(optim::ConstElementSpan(initial.data(), count, DType::kF32));
    if (autocast) {
      casts.push_back(device->allocate(count, DType::kF32, Category::kActivations));
      model.bind_weights(u, casts.back().data(), DType::kF32);
    } else {
      model.bind_weights(u, weights.back().data());
    }
    model.bind_grads(u, (per_rank ? rank_grads : grads).back().data(), options.recipe.grads);
  }
  Trace trace;
  for (int step = 0; step < steps; ++step) {
    double loss = 0;
    for (size_t u = 0; u < casts.size(); ++u) {
      autocast_view(model.layout(static_cast<int>(u)), weights[u], config.tie_embeddings, casts[u]);
    }
    if (per_rank) {
      std::vector<std::vector<std::vector<float>>> by_unit(static_cast<size_t>(units));  // [units][N][elements]
      for (int r = 0; r < ranks; ++r) {
        const data::Batch batch = data.batch(step, data::sample_offset(r, ranks, 0, 1), 1);
        loss += model.step(batch.tokens.data(), batch.targets.data(), hooks) / ranks;
        for (int u = 0; u < units; ++u) {
          std::vector<float> g(rank_grads[u].count());
          model::widen(rank_grads[u].data(), rank_grads[u].dtype(), g.size(), g.data());
          by_unit[u].push_back(std::move(g));
          std::memset(rank_grads[u].data(), 0, rank_grads[u].bytes());
        }
      }
      for (int u = 0; u < units; ++u) detail::bf16_average(by_unit[u], grads[u].data());
    } else {
      for (int m = 0; m < accumulation; ++m) {
        const data::Batch batch = data.batch(step, int64_t{m} * ranks, ranks);
        loss += model.step(batch.tokens.data(), batch.targets.data(), hooks);
      }
    }
    double sum_squares = 0;
    for (const Buffer& g : grads) sum_squares += optim::grad_sum_of_squares(optim::ConstElementSpan::of(g));
    const double norm = std::sqrt(sum_squares) / accumulation;
    const float clip = detail::clip_factor(norm, options.clip_norm);
    const float lr = options.schedule.lr_at(step + 1, options.adamw.lr);
    for (int u = 0; u < units; ++u) {
      const auto decay = strategy::decay_ranges(model.layout(u), 0);
      optimizers[u]->step(options.adamw, optim::ElementSpan::of(weights[u]), optim::ConstElementSpan::of(grads[u]), 0,
                          decay, lr, clip / accumulation);
      std::memset(grads[u].data(), 0, grads[u].bytes());
    }
    trace.losses.push_back(static_cast<float>(per_rank ? loss : loss / accumulation));
    trace.grad_norms.push_back(norm);
    trace.weights.push_back(detail::snapshot(model, weights, optimizers));
  }
  return trace;
}

inline Trace run_reference(model::Style style, const strategy::StrategyOptions& given, int ranks, int accumulation,
                           int steps, int64_t layers = 2) {
  return run_reference_config(tiny_config(style, 1, layers), given, ranks, accumulation, steps);
}

// One strategy on the world: micro-batch b = 1 per rank, the same global batch as the reference. Pipeline
// parallelism (pp) runs the whole global batch through its stages: every rank is given all N × accumulation
// A strategy over MPI_COMM_WORLD alone, set up on `config` (tp, pp and their compositions split their own groups
// from the world); the test runs its steps.
struct WorldRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> world;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<strategy::Strategy> strategy;
  Trace trace;

  // The ledger of this rank's group whose name starts with `kind` ("tensor-parallel", "pipeline",
  // "data-parallel").
  const coll::Ledger& ledger(std::string_view kind) const {
    for (coll::Communicator* group : strategy->groups()) {
      if (group->name().starts_with(kind)) return group->ledger();
    }
    EMU_CHECK(false, "no {} group", kind);
    return world->ledger();
  }
};

// `model_options` at the recipe's compute dtype.
inline std::unique_ptr<WorldRun> set_up_on_world(const model::ModelConfig& config,
                                                 const strategy::StrategyOptions& options,
                                                 model::ModelOptions model_options = {}) {
  auto run = std::make_unique<WorldRun>();
  MemoryPool::Options memory;
  memory.rank = world_rank();
  run->device = make_cpu_device(memory);
  run->world = coll::make_mpi_communicator(MPI_COMM_WORLD, *run->device);
  model_options.compute = options.recipe.params;
  run->model = std::make_unique<model::Model>(*run->device, config, model_options);
  run->strategy = strategy::make_strategy({*run->device, *run->world, *run->model}, options);
  run->strategy->setup();
  return run;
}

// micro-batches of one sequence, those the N data-parallel ranks would hold between them.
// Hybrid sharding in the tests: "nodes" of two ranks when the world splits into pairs, else of one.
inline int test_ranks_per_node() { return world_size() % 2 == 0 ? 2 : 1; }

struct StrategyRun {
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> world;
  std::unique_ptr<coll::Communicator> intra_node, inter_node;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<strategy::Strategy> strategy;
  Trace trace;
};

// With `weights_every_step`, every unit's full weights are gathered after each step (a collective; the memory and
// OOM tests leave it off so that their peaks are the training's). `checkpoint`: activation checkpointing per block.
inline std::unique_ptr<StrategyRun> run_strategy(model::Style style, const strategy::StrategyOptions& options,
                                                 int accumulation, int steps, MemoryPool::Options memory = {},
                                                 bool weights_every_step = false, int64_t layers = 2,
                                                 bool checkpoint = false) {
  auto run = std::make_unique<StrategyRun>();
  const int rank = world_rank();
  const int ranks = world_size();
  memory.rank = rank;
  run->device = make_cpu_device(memory);
  run->world = coll::make_mpi_communicator(MPI_COMM_WORLD, *run->device);
  const model::ModelConfig config = tiny_config(style, 1, layers);
  model::ModelOptions model_options;
  model_options.compute = options.recipe.params;
  model_options.checkpoint = checkpoint;
  run->model =
      std::make_unique<model::Model>(*run->device, config, strategy::framework_model_options(options, model_options));
  const int per_node = test_ranks_per_node();
  run->intra_node = run->world->split(rank / per_node, rank, "intra-node");
  run->inter_node = run->world->split(rank % per_node, rank, "inter-node");
  run->strategy = strategy::make_strategy(
      {*run->device, *run->world, *run->model, run->intra_node.get(), run->inter_node.get(), nullptr}, options);
  run->strategy->setup();
  const auto data = tiny_data(config);
  for (int step = 0; step < steps; ++step) {
    std::vector<data::Batch> batches;
    batches.reserve(static_cast<size_t>(accumulation));
    const bool pipeline = options.kind == strategy::StrategyKind::kPipeline;
    for (int m = 0; m < accumulation; ++m) {
      for (int r = pipeline ? 0 : rank; r < (pipeline ? ranks : rank + 1); ++r) {
        batches.push_back(data.batch(step, data::sample_offset(r, ranks, m, 1), 1));
      }
    }
    const strategy::StepResult result = run->strategy->step(batches);
    record_step(run->trace, mean_over_world(result.loss), result, *run->strategy, run->model->num_units(),
                weights_every_step);
  }
  return run;
}

}  // namespace emu::testing
