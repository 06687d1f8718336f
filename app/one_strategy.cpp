#include "app/one_strategy.h"

#include <fmt/format.h>

#include <cmath>

#include "emu/log.h"
#include "emu/memory.h"
#include "workloads/model/memory_terms.h"

namespace emu::app {
namespace {

// Every group's calls (splits made later inherit the observer from the world) and the strategy's spans.
void trace(SpanRecorder& spans, const Stage& stage, strategy::Strategy& strategy) {
  const auto observer = [&spans](const coll::Communicator& group, const coll::Call& call,
                                 const coll::Algorithm* algorithm, const coll::Traffic& moved, double start,
                                 double end) { spans.add_call(group, call, algorithm, moved, start, end); };
  for (coll::Communicator* group : {&stage.world, stage.intra, stage.inter, stage.post_forward, stage.control}) {
    if (group != nullptr) group->set_observer(observer);
  }
  strategy.set_span_sink([&spans](std::string_view name, std::string_view category, double start, double end) {
    spans.add(name, category, start, end);
  });
}

}  // namespace

uint64_t per_step(uint64_t total, double steps) {
  return static_cast<uint64_t>(std::llround(static_cast<double>(total) / steps));
}

void add_traffic_per_step(StrategyOutcome& outcome, const coll::Communicator& group, double steps) {
  for (const auto& [key, entry] : group.ledger().entries()) {
    if (key.second.starts_with("report:")) continue;
    const TrafficKey traffic_key{key.first, group_kind(group.name())};
    coll::Traffic& t = outcome.traffic_per_step[traffic_key];
    t.sent += per_step(entry.moved.sent, steps);
    t.received += per_step(entry.moved.received, steps);
    outcome.calls_per_step[traffic_key] += per_step(entry.calls, steps);
  }
}

StrategyOutcome run_one_strategy(const Stage& stage, const strategy::StrategyOptions& options, StepDriver& driver) {
  StrategyOutcome outcome;
  outcome.name = options.name();
  outcome.options = options;
  strategy::StrategyOptions sized = options;
  sized.shrink = stage.shrink;
  // PyTorch DDP's mixed recipe is autocast over fp32 parameters: the model saves what autocast saves (blocks.h).
  const model::ModelOptions model_options = strategy::framework_model_options(sized, stage.model_options);
  model::Model model(stage.device, stage.model, model_options);
  model.set_initial_weights(stage.initial_weights);
  auto strategy = strategy::make_strategy({stage.device, stage.world, model, stage.intra, stage.inter, stage.offload,
                                           stage.parameter_host, stage.post_forward},
                                          sized);
  if (stage.spans != nullptr) trace(*stage.spans, stage, *strategy);
  {
    PhaseScope phase(stage.device.memory(), "set-up: parameters, gradients and optimizer state");
    const double start = steady_seconds();
    strategy->setup();
    if (stage.spans != nullptr) stage.spans->add("set-up", "setup", start, steady_seconds());
  }
  log::phase_end(fmt::format("{}: set-up", outcome.name));
  const bool pipeline = strategy::pipelined(options);
  strategy::AnalyticInput input = strategy::analytic_input(
      model, stage.ranks, stage.ranks_per_node, pipeline ? stage.pipeline_micro_batches : stage.accumulation);
  input.offload = stage.offload != nullptr;
  input.rank = stage.world.rank();
  outcome.prediction = strategy::predict(sized, input);
  // model.config(): the rank's own shapes (tp's slice: a/t heads, F/t, V'/t; set in set-up); under sequence
  // parallelism the residual stream's and the norms' rows are T/t.
  const bool tensor_sequence =
      model_options.sequence_parallel &&
      (options.kind == strategy::StrategyKind::kTensor || strategy::mesh_of(options, stage.ranks, 0).tensor > 1);
  outcome.predicted_activations = model::saved_activation_bytes(
      model.config(), model_options, tensor_sequence ? strategy::mesh_of(options, stage.ranks, 0).tensor : 1);
  log::phase_end(fmt::format("{}: predictions", outcome.name));

  for (int step = 0; step < stage.steps; ++step) {
    // pp's stages and the TP ranks of tp and fsdp2 --tp run their replica's micro-batches (all of the global
    // batch's without --tp, --pp).
    const strategy::Mesh mesh = strategy::mesh_of(options, stage.ranks, stage.world.rank());
    const bool tensor = options.kind == strategy::StrategyKind::kTensor || mesh.tensor > 1;
    const std::vector<data::Batch> micro_batches =
        pipeline || tensor
            ? driver.replica_micro_batches(step, pipeline ? stage.pipeline_micro_batches : stage.accumulation,
                                           mesh.data_rank(), mesh.data)
            : driver.micro_batches(step);
    driver.before_step(step);
    PhaseScope phase(stage.device.memory(), fmt::format("step {}", step + 1));
    const double start = steady_seconds();
    const strategy::StepResult result = strategy->step(micro_batches);
    if (stage.spans != nullptr) stage.spans->add(fmt::format("step {}", step + 1), "step", start, steady_seconds());
    const bool go_on = driver.after_step(step, result, outcome);
    log::phase_end(fmt::format("{}: step {}", outcome.name, step + 1));
    if (!go_on) break;
  }
  driver.finish(outcome, model, *strategy);
  log::phase_end(fmt::format("{}: results gathered", outcome.name));
  return outcome;
}

}  // namespace emu::app
