// The sequence every strategy goes through, one function for a run and for a plan: the model on the caller's
// device, the strategy over the caller's groups, its set-up, the analytic prediction, then the optimizer steps.
// What differs is passed in: the device (a real backend, or shapes only) and the groups (MPI, or virtual) in a
// Stage; the data of each step, what is done after it, and what is collected at the end in a StepDriver.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "app/run.h"
#include "app/timeline.h"
#include "emu/device.h"
#include "strategies/strategy.h"
#include "workloads/data/token_source.h"
#include "workloads/model/model.h"

namespace emu::app {

// Where one strategy runs and on what; the caller owns all of it.
struct Stage {
  Device& device;                    // the emulated GPU, its pool capped and named for the strategy
  Device* offload = nullptr;         // host memory for the optimizer (--offload), off the cap; null: none
  Device* parameter_host = nullptr;  // host memory for ZeRO-3's offload_param partitions, off the cap; null: none
  coll::Communicator& world;
  coll::Communicator* intra = nullptr;  // this rank's node group and its cross-node group (HYBRID_SHARD)
  coll::Communicator* inter = nullptr;
  coll::Communicator* post_forward = nullptr;  // fsdp2's reshard_after_forward=M group; null: none
  coll::Communicator* control = nullptr;       // where a run's out-of-memory verdicts travel; null for a plan
  const model::ModelConfig& model;             // shrunk for a run, full scale for a plan
  const model::ModelOptions& model_options;
  std::shared_ptr<const std::vector<std::vector<float>>> initial_weights;  // null: the seeded initialisation
  // k the strategy divides its bucket and threshold sizes by: the run's, or 1 for a plan (the sizes as PyTorch
  // and DeepSpeed state them).
  int shrink = 1;
  int ranks = 1;  // the world, and ranks per node, the analytic prediction is for
  int ranks_per_node = 1;
  int accumulation = 1;
  int pipeline_micro_batches = 1;  // pp: M, every stage runs all of them (RunOptions::micro_batches)
  int steps = 1;                   // at most: the driver may stop sooner
  SpanRecorder* spans = nullptr;   // a trace's recorder of this rank's spans, or null
};

// What one strategy's sequence asks of its caller.
class StepDriver {
 public:
  virtual ~StepDriver() = default;
  // The micro-batches optimizer step `step` (from 0) trains on.
  virtual std::vector<data::Batch> micro_batches(int step) = 0;
  // tp and pp: the `count` micro-batches of data-parallel replica `replica` of `replicas` (its slice of the step's
  // global batch, data::sample_offset over the replicas), the same on every rank of the replica.
  virtual std::vector<data::Batch> replica_micro_batches(int step, int count, int replica, int replicas) = 0;
  // Just before step `step`, after its micro-batches are made.
  virtual void before_step(int step) {}
  // After step `step`, still inside its memory phase: records what the step measured; false stops the steps.
  virtual bool after_step(int step, const strategy::StepResult& result, StrategyOutcome& outcome) = 0;
  // After the last step, with the model and the strategy still alive: peaks, traffic, the weights to save.
  virtual void finish(StrategyOutcome& outcome, const model::Model& model, strategy::Strategy& strategy) = 0;
};

// A count over `steps` steps as a per-step figure, rounded to the nearest whole.
uint64_t per_step(uint64_t total, double steps);

// Adds `group`'s ledger, counted over `steps` steps, to `outcome`'s traffic and calls per step. What a run gathers
// for its report (phases "report: ...") is no step's traffic and is left out.
void add_traffic_per_step(StrategyOutcome& outcome, const coll::Communicator& group, double steps);

// Runs `options` on `stage`; the outcome's name and options are `options`, its prediction the analytic model's,
// and the rest whatever `driver` records.
StrategyOutcome run_one_strategy(const Stage& stage, const strategy::StrategyOptions& options, StepDriver& driver);

}  // namespace emu::app
