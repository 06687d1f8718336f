// Shared set-up for strategy tests: a tiny model, its data, a world communicator, and the single-device reference
// every strategy must match (torchtitan's ladder: single device trusted, every strategy checked against it).
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/mpi/mpi_communicator.h"
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
inline model::ModelConfig tiny_config(model::Style style, int64_t batch) {
  model::ModelConfig config;
  config.name = "tiny";
  config.style = style;
  config.hidden = 16;
  config.ffn = style == model::Style::kLlama ? 44 : 64;
  config.vocab = 37;
  config.seq = 8;
  config.max_positions = 8;
  config.layers = 2;
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

struct Trace {
  std::vector<float> losses;                // per step, mean over the global batch
  std::vector<std::vector<float>> weights;  // per unit, fp32, after the last step
};

// Single device, the whole global batch: N·b sequences per micro-batch, `accumulation` micro-batches per step.
inline Trace run_reference(model::Style style, const strategy::StrategyOptions& options, int ranks, int accumulation,
                           int steps) {
  const model::ModelConfig config = tiny_config(style, ranks);
  auto device = make_cpu_device({});
  model::ModelOptions model_options;
  model_options.compute = options.recipe.params;
  model::Model model(*device, config, model_options);
  const auto data = tiny_data(config);
  model::NoHooks hooks;
  const int units = model.num_units();
  std::vector<Buffer> weights, grads;
  std::vector<std::unique_ptr<optim::AdamWState>> optimizers;
  for (int u = 0; u < units; ++u) {
    const size_t count = model.layout(u).count;
    std::vector<float> initial(count);
    model.init_unit(u, options.seed, initial.data());
    weights.push_back(device->allocate(count, options.recipe.params, Category::kParameters));
    grads.push_back(device->allocate(count, options.recipe.grads, Category::kGradients));
    model::narrow(initial.data(), options.recipe.params, count, weights.back().data());
    optimizers.push_back(std::make_unique<optim::AdamWState>(*device, options.recipe, count));
    optimizers.back()->load_master(optim::ConstElementSpan(initial.data(), count, DType::kF32));
    model.bind_weights(u, weights.back().data());
    model.bind_grads(u, grads.back().data());
  }
  Trace trace;
  for (int step = 0; step < steps; ++step) {
    double loss = 0;
    for (int m = 0; m < accumulation; ++m) {
      const data::Batch batch = data.batch(step, int64_t{m} * ranks, ranks);
      loss += model.step(batch.tokens.data(), batch.targets.data(), hooks);
    }
    double sum_squares = 0;
    for (const Buffer& g : grads) sum_squares += optim::grad_sum_of_squares(optim::ConstElementSpan::of(g));
    const double norm = std::sqrt(sum_squares) / accumulation;
    const float clip = optim::clip_coefficient(norm, options.clip_norm);
    const float lr = options.schedule.lr_at(step + 1, options.adamw.lr);
    for (int u = 0; u < units; ++u) {
      const auto decay = strategy::decay_ranges(model.layout(u), 0);
      optimizers[u]->step(options.adamw, optim::ElementSpan::of(weights[u]), optim::ConstElementSpan::of(grads[u]), 0,
                          decay, lr, clip / accumulation);
      std::memset(grads[u].data(), 0, grads[u].bytes());
    }
    trace.losses.push_back(static_cast<float>(loss / accumulation));
  }
  for (int u = 0; u < units; ++u) {
    std::vector<float> out(model.layout(u).count);
    const optim::ElementSpan master = optimizers[u]->master();
    if (!master.empty()) {
      model::widen(master.data(), master.dtype(), out.size(), out.data());
    } else {
      model::widen(weights[u].data(), weights[u].dtype(), out.size(), out.data());
    }
    trace.weights.push_back(std::move(out));
  }
  return trace;
}

// One strategy on the world: micro-batch b = 1 per rank, the same global batch as the reference.
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

inline std::unique_ptr<StrategyRun> run_strategy(model::Style style, const strategy::StrategyOptions& options,
                                                 int accumulation, int steps, MemoryPool::Options memory = {}) {
  auto run = std::make_unique<StrategyRun>();
  const int rank = world_rank();
  const int ranks = world_size();
  memory.rank = rank;
  run->device = make_cpu_device(memory);
  run->world = coll::make_mpi_communicator(MPI_COMM_WORLD, *run->device);
  const model::ModelConfig config = tiny_config(style, 1);
  model::ModelOptions model_options;
  model_options.compute = options.recipe.params;
  run->model = std::make_unique<model::Model>(*run->device, config, model_options);
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
    for (int m = 0; m < accumulation; ++m) {
      batches.push_back(data.batch(step, data::sample_offset(rank, ranks, m, 1), 1));
    }
    float loss = run->strategy->step(batches).loss;
    MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    run->trace.losses.push_back(loss / static_cast<float>(ranks));
  }
  return run;
}

inline void collect_weights(StrategyRun& run) {
  for (int u = 0; u < run.model->num_units(); ++u) run.trace.weights.push_back(run.strategy->full_weights(u));
}

}  // namespace emu::testing
