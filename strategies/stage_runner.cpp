#include "strategies/stage_runner.h"

#include <fmt/format.h>

#include <utility>

#include "emu/check.h"
#include "workloads/model/shrink.h"

namespace emu::strategy {

bool embedding_side(const model::ModelConfig& config, size_t param) {
  return param == model::kEmbedTokens || (config.style == model::Style::kGpt2 && param == model::kWpe);
}
bool head_side(const model::ModelConfig& config, size_t param) {
  return !embedding_side(config, param) || (param == model::kEmbedTokens && config.tie_embeddings);
}

std::vector<std::vector<StageBlocks>> stage_chunks(const model::Model& model, int stages, int virtual_stages) {
  const model::ModelConfig& config = model.config();
  if (virtual_stages > 1) return interleaved_chunks(static_cast<int>(config.layers), stages, virtual_stages);
  const model::UnitLayout& root = model.layout(0);
  uint64_t first = 0, last = 0;
  for (size_t p = 0; p < root.params.size(); ++p) {
    const uint64_t charged = model::tensor_charge(config, root.params[p]);
    if (embedding_side(config, p)) first += charged;
    if (head_side(config, p)) last += charged;
  }
  std::vector<uint64_t> blocks;
  for (int u = 1; u < model.num_units(); ++u) {
    uint64_t charged = 0;
    for (const model::ParamInfo& p : model.layout(u).params) charged += model::tensor_charge(config, p);
    blocks.push_back(charged);
  }
  std::vector<std::vector<StageBlocks>> chunks;
  for (const StageBlocks& stage : balance_stages(blocks, first, last, stages)) chunks.push_back({stage});
  return chunks;
}

StageRunner::StageRunner(model::Model& model, Device& device, coll::Communicator& pipe, Schedule schedule, int stage,
                         std::vector<std::vector<StageBlocks>> chunks)
    : model_(model), device_(device), pipe_(pipe), schedule_(schedule), stage_(stage), chunks_(std::move(chunks)) {}

bool StageRunner::ends_model(int chunk) const {
  return stage_ == stages() - 1 && chunk == static_cast<int>(chunks_[0].size()) - 1;
}

int StageRunner::owner_of(int block) const {
  for (int s = 0; s < stages(); ++s) {
    for (const StageBlocks& chunk : chunks_[static_cast<size_t>(s)]) {
      if (block >= chunk.first && block <= chunk.last) return s;
    }
  }
  EMU_CHECK(false, "block {} is on no stage", block);
  return 0;
}

void StageRunner::set_chunk(int chunk) {
  const StageBlocks& blocks = chunks_[static_cast<size_t>(stage_)][static_cast<size_t>(chunk)];
  model_.set_stage(blocks.first, blocks.last);
}

// [R, h]: the whole b·s rows, or under sequence parallelism the TP rank's b·s/t (Model::rows).
size_t StageRunner::activation_count() const { return model_.rows() * static_cast<size_t>(model_.config().hidden); }

double StageRunner::run(std::span<const data::Batch> micro_batches, model::Hooks& hooks,
                        const std::function<void(int chunk)>& chunk_done) {
  const int count = static_cast<int>(micro_batches.size());
  const int chunks = static_cast<int>(chunks_[0].size());
  held_.clear();
  held_.resize(static_cast<size_t>(count) * static_cast<size_t>(chunks));
  std::vector<Buffer> inputs(held_.size()), output_grads(held_.size()), outputs(held_.size()),
      input_grads(held_.size());
  const auto at = [&](const PipelineOp& op) {
    return static_cast<size_t>(op.chunk) * static_cast<size_t>(count) + static_cast<size_t>(op.micro_batch);
  };
  std::vector<int> backwards(static_cast<size_t>(chunks), 0);  // per chunk, its backwards run so far
  double loss = 0;
  for (const StageEvent& event : stage_program(schedule_, stages(), stage_, count, chunks)) {
    const PipelineOp& op = event.op;
    if (event.kind == StageEvent::Kind::kReceive) {
      (op.forward ? inputs : output_grads)[at(op)] = receive(op, event.peer);
      continue;
    }
    if (event.kind == StageEvent::Kind::kSend) {
      Buffer sent = std::move((op.forward ? outputs : input_grads)[at(op)]);
      pipe_.send(sent.data(), activation_count(), model_.compute_dtype(), event.peer,
                 op.forward ? "pipeline activations" : "pipeline gradients");
      continue;
    }
    set_chunk(op.chunk);
    if (op.forward) {
      if (inputs[at(op)].allocated()) model_.set_stage_input(std::move(inputs[at(op)]));
      const data::Batch& batch = micro_batches[static_cast<size_t>(op.micro_batch)];
      loss += model_.forward(batch.tokens.data(), batch.targets.data(), hooks);
      if (!ends_model(op.chunk)) outputs[at(op)] = model_.take_stage_output();
      held_[at(op)] = model_.take_in_flight();
      continue;
    }
    model_.restore_in_flight(std::move(held_[at(op)]));
    if (output_grads[at(op)].allocated()) model_.set_output_gradient(std::move(output_grads[at(op)]));
    model_.backward(hooks);
    if (!starts_model(op.chunk)) input_grads[at(op)] = model_.take_input_gradient();
    if (++backwards[static_cast<size_t>(op.chunk)] == count && chunk_done) chunk_done(op.chunk);
  }
  return loss;
}

Buffer StageRunner::receive(const PipelineOp& op, int peer) {
  Buffer buffer = device_.allocate(
      activation_count(), model_.compute_dtype(), op.forward ? Category::kActivations : Category::kTemporaries,
      fmt::format("pipeline {}, micro-batch {} (received)", op.forward ? "input" : "output gradient", op.micro_batch));
  pipe_.recv(buffer.data(), activation_count(), model_.compute_dtype(), peer,
             op.forward ? "pipeline activations" : "pipeline gradients");
  return buffer;
}

}  // namespace emu::strategy
