// One pipeline stage's side of a step, shared by `pp` (pipeline.cpp, Megatron-LM's stages) and fsdp2 with --pp
// (fsdp2.cpp, torch.distributed.pipelining's PipelineStage under torchtitan): which blocks the stage runs, and its
// program (pipeline.h stage_program) run through the model with the strategy's hooks, activations and their
// gradients sent and received over the pipeline's group. What each strategy does with the units' parameters and
// gradients stays in its hooks; this class only moves the micro-batches.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "collectives/communicator.h"
#include "emu/device.h"
#include "strategies/pipeline.h"
#include "workloads/data/token_source.h"
#include "workloads/model/model.h"

namespace emu::strategy {

// Which of the root's tensors a stage runs: the embeddings on the first, the final norm and head (and a tied
// embedding's copy) on the last.
bool embedding_side(const model::ModelConfig& config, size_t param);
bool head_side(const model::ModelConfig& config, size_t param);

// Each stage's chunks of blocks ([P][V]): contiguous stages balanced by the parameters a shrunk run charges (the
// full-scale counts ÷ k², so that the shrunk and the full-scale model split alike; pipeline.h balance_stages), or
// with `virtual_stages` V > 1 Megatron's equal interleaved chunks (pipeline.h interleaved_chunks).
std::vector<std::vector<StageBlocks>> stage_chunks(const model::Model& model, int stages, int virtual_stages);

class StageRunner {
 public:
  // Stage `stage` of `chunks.size()` over `pipe` (ranks ordered by stage), running `schedule`.
  StageRunner(model::Model& model, Device& device, coll::Communicator& pipe, Schedule schedule, int stage,
              std::vector<std::vector<StageBlocks>> chunks);

  // The stage's program: its forwards and backwards in the schedule's order, chunk by chunk, and the messages
  // between them, each received just before the op that reads it and sent, in the one global order every stage
  // follows, after the op that made it. Returns the sum of this stage's micro-batch losses (the last stage's; 0
  // elsewhere). `chunk_done`, if given, is called with a chunk's index right after the chunk's last backward of the
  // step, before anything else the stage runs (torch.distributed.pipelining's REDUCE_GRAD action, which its
  // multi-stage schedules place just after each stage's last backward: schedules.py _add_reduce_grad).
  double run(std::span<const data::Batch> micro_batches, model::Hooks& hooks,
             const std::function<void(int chunk)>& chunk_done = {});

  int stage() const { return stage_; }
  int stages() const { return static_cast<int>(chunks_.size()); }
  const std::vector<std::vector<StageBlocks>>& chunks() const { return chunks_; }
  // This stage's chunk `chunk` begins the model (the embedding) or ends it (the head and the loss).
  bool starts_model(int chunk) const { return stage_ == 0 && chunk == 0; }
  bool ends_model(int chunk) const;
  bool holds_root() const { return stage_ == 0 || stage_ == stages() - 1; }
  // The stage that runs block `block` (1-based).
  int owner_of(int block) const;
  // The model runs this stage's chunk `chunk` from now on.
  void set_chunk(int chunk);

 private:
  size_t activation_count() const;
  // The message `op` reads, from stage `peer`: its input activation (kept by its first block) or the gradient of its
  // output.
  Buffer receive(const PipelineOp& op, int peer);

  model::Model& model_;
  Device& device_;
  coll::Communicator& pipe_;
  Schedule schedule_;
  int stage_ = 0;
  std::vector<std::vector<StageBlocks>> chunks_;  // [P][V] each stage's blocks, one chunk unless interleaved
  std::vector<model::Model::InFlight> held_;      // [V·M] the chunks' micro-batches between forward and backward
};

}  // namespace emu::strategy
