// Pipeline parallelism (`pp`) as Megatron-LM's and DeepSpeed's pipeline engines run it: the blocks split into P
// stages, one per rank, micro-batches flowing through them, activations and their gradients passed from stage to
// stage as point-to-point messages.
//
// P is the world by default; with --pp P < N the world is D = N/P pipelines of P consecutive ranks (Megatron's
// layout with T = 1, strategy.h ParallelOptions), each a data-parallel replica training on its own slice of the
// global batch (replica d's micro-batch m holds samples (m·D + d)·b …). The stages talk within their "pipeline d"
// group; after backward (and the tied embedding's reduction) each unit's gradients the stage owns are all-reduced
// and averaged over the "data-parallel p" group of the D ranks running stage p, as Megatron-LM's
// DistributedDataParallel reduces its grad buffer (core/distributed/distributed_data_parallel.py). The gradient
// norm is summed over the pipeline's stages only, not over the replicas, whose gradients are then equal.
//
// With --tp T as well (TP × PP, Megatron's --tensor-model-parallel-size with --pipeline-model-parallel-size) every
// stage is T consecutive ranks whose blocks, embedding and head are tensor-parallel as tp splits them
// (tensor_parallel.cpp, workloads/model/tensor_parallel.h), their all-reduces in the stage's "tensor-parallel"
// group; TP rank t of a stage talks to TP rank t of the next (the "pipeline" group of the ranks with the same d and
// t). Each rank sends the whole [b·s, h] activation: without sequence parallelism the hidden state after a
// row-parallel all-reduce is whole on every TP rank, and Megatron-core's p2p_communication sends it as it is (the
// old --scatter-gather-tensors-in-pipeline, which sent 1/T and all-gathered it on arrival, is gone from core), so
// b·s·h per micro-batch per boundary per TP rank. The norm weights are whole on every TP rank and counted once in
// the gradient norm, which sums over the stage's TP group and the pipeline (the model-parallel group).
//
// With --sequence-parallel as well (Megatron's 3-D recipe) each stage runs tp's sequence parallelism
// (workloads/model/tensor_parallel.h): the first stage reduce-scatters the embedding output, the last runs the final
// norm on its rows and all-gathers them before the head, and between stages TP rank t sends its [b·s/T, h] rows to TP
// rank t of the next stage (Megatron's get_tensor_shapes divides the sequence by T): b·s·h/T per micro-batch per
// boundary (Model::rows, stage_runner.cpp). The norm weights' gradients then cover each rank's rows only: after the
// last micro-batch the stage sums those of its own layers over its TP group in one fp32 all-reduce
// (reduce_sequence_parallel_norms; Megatron's finalize_model_grads on every stage), before the data-parallel
// reduction.
//
// With --distributed-optimizer (Megatron's --use-distributed-optimizer, ZeRO-1 over the data-parallel group) the
// master weights and Adam moments of each block, and of each root tensor the stage owns, are sharded over the D
// replicas of the stage (strategies/shard.h), the gradients reduce-scattered, the parameters all-gathered after the
// step; the gradient norm then sums over the world, each element once.
//
// Stages (pipeline.h, balance_stages): contiguous blocks balanced by parameter count; the first stage also holds
// the embeddings (Llama's embed_tokens; GPT-2's wte and wpe), the last the final norm and the LM head. A tied head
// (GPT-2, tied Llama) is a second copy of the embedding on the last stage, whose gradient the two stages sum after
// backward over their own group ("embedding group": Megatron-LM's _allreduce_word_embedding_grads in
// core/distributed/finalize_model_grads.py); both then update it identically.
//
// Each stage keeps the full model states of its own layers, in the mixed recipe of DeepSpeed's PipelineEngine with
// FP16_Optimizer and of the ZeRO paper (K = 12): bit16 parameters and gradients, fp32 master weights, Adam m and v,
// 16 bytes per parameter, so a stage needs 16Ψ_s. (Megatron-LM and DeepSpeed's BF16_Optimizer accumulate
// gradients in fp32 instead, 2 bytes per parameter more; emu does not model that here.) Per stage s:
//   parameters [n_u] kParameters, gradients [n_u] kGradients, master, m, v [n_u] kOptimizerState, per unit held;
//   the root's buffers hold the whole root but are charged for the tensors the stage owns.
//
// Schedules (--schedule), with M micro-batches of the step (the global batch is M × b, every stage sees all M):
//   gpipe  every micro-batch's forward, then every backward (GPipe, Huang et al. 2019; torch.distributed.pipelining
//          ScheduleGPipe): a stage holds the activations of all M micro-batches at once.
//   1f1b   PipeDream-Flush as Megatron-LM runs it (core/pipeline_parallel/schedules.py,
//          forward_backward_pipelining_without_interleaving): stage s runs min(P − s − 1, M) warm-up forwards, then
//          alternates one forward and one backward, then cools down with the remaining backwards, so it holds at
//          most min(P − s, M) micro-batches' activations: the first stage the most.
// A stage's output [b, s, h] at the compute dtype is sent to the next stage after each forward and freed
// (Megatron's deallocate_output_tensor); the next stage receives it into a buffer that its first block saves
// (kActivations). In backward the gradient of that output comes back the same way. Per step every boundary
// carries M activations up and M gradients down: b·s·h·bytes·2·(P − 1)·M bytes over the pipeline. Megatron batches
// its sends and receives (isend/irecv); emu's block, so every stage takes its messages in one global order
// (pipeline.h, stage_program), receiving each just before the op that reads it; stage_runner.h runs that program
// (fsdp2 --pp runs its stages through it too).
//
// Interleaved 1F1B (--virtual-stages V, Megatron's --num-virtual-stages-per-pipeline-rank): each stage holds V
// chunks of L/(P·V) blocks, chunk v of stage p layer group v·P + p (pipeline.h, interleaved_chunks), the embeddings
// with chunk 0 of the first stage, the head and loss with chunk V − 1 of the last. The model runs one chunk at a time
// (Model::set_stage); a micro-batch's activation leaves the last stage's chunk v for the first stage's chunk v + 1
// and its gradient comes back the same way, so every stage sends V·M activations and V·M gradients per step (the
// first no gradient of its chunk 0, the last no activation of its chunk V − 1): V times the traffic of 1F1B.
//
// Each micro-batch's loss is the mean over its b·s tokens; the step's gradient is the mean over the M micro-batches
// (Megatron divides each micro-batch's loss by M; emu scales the summed gradients by 1/M at the update, as for
// gradient accumulation). The loss exists on the last stage only; it is summed to every stage for reporting.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "collectives/virtual/virtual_link.h"
#include "emu/check.h"
#include "strategies/flat.h"
#include "strategies/pipeline.h"
#include "strategies/shard.h"
#include "strategies/stage_runner.h"
#include "strategies/strategy.h"
#include "workloads/model/tensor_parallel.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {

std::vector<StageBlocks> balance_stages(std::span<const uint64_t> block_weights, uint64_t first_extra,
                                        uint64_t last_extra, int stages) {
  const int blocks = static_cast<int>(block_weights.size());
  EMU_CHECK(stages >= 1 && stages <= blocks, "{} pipeline stages over {} blocks", stages, blocks);
  std::vector<uint64_t> prefix(static_cast<size_t>(blocks) + 1, 0);
  for (int l = 0; l < blocks; ++l) prefix[l + 1] = prefix[l] + block_weights[static_cast<size_t>(l)];
  // weight(s, i, j): stage s over blocks i+1..j (prefix indices), with the extras of the first and last stage.
  const auto weight = [&](int s, int i, int j) {
    return prefix[j] - prefix[i] + (s == 0 ? first_extra : 0) + (s == stages - 1 ? last_extra : 0);
  };
  // best[s][j]: the lightest heaviest stage when stages s..P−1 run blocks j+1..L; cut[s][j] the end of stage s.
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  std::vector<std::vector<uint64_t>> best(static_cast<size_t>(stages) + 1,
                                          std::vector<uint64_t>(static_cast<size_t>(blocks) + 1, kNone));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(best[0].size(), 0));
  best[stages][blocks] = 0;
  for (int s = stages - 1; s >= 0; --s) {
    for (int j = 0; j <= blocks; ++j) {
      // Later ends first: among equal splits the earlier stage takes more blocks.
      for (int end = blocks - (stages - 1 - s); end > j; --end) {
        const uint64_t rest = best[s + 1][end];
        if (rest == kNone) continue;
        const uint64_t heaviest = std::max(rest, weight(s, j, end));
        if (heaviest < best[s][j]) best[s][j] = heaviest, cut[s][j] = end;
      }
    }
  }
  std::vector<StageBlocks> out;
  for (int s = 0, j = 0; s < stages; ++s) {
    out.push_back({j + 1, cut[s][j]});
    j = cut[s][j];
  }
  return out;
}

namespace {

class Pipeline final : public Strategy {
 public:
  using Strategy::Strategy;

  void setup() override {
    const Mesh mesh = mesh_of(options_, world_.size(), world_.rank());
    const int across = mesh.data_rank() * mesh.tensor + mesh.tensor_rank();  // d·T + t
    if (mesh.data > 1 || mesh.tensor > 1) {
      pipe_group_ = split_group(across, mesh.pipeline_rank(), mesh.pipeline, fmt::format("pipeline {}", across));
    }
    if (mesh.tensor > 1) {
      tp_group_ = split_tensor_group(mesh);
      tensor_ = std::make_unique<GroupTensorParallel>(*tp_group_);
      model_.set_tensor_parallel(tensor_.get());
    }
    if (mesh.data > 1) dp_group_ = split_data_group(mesh);
    const model::ModelConfig& config = model_.config();
    EMU_CHECK(mesh.pipeline <= config.layers, "pp: {} stages for {} blocks", mesh.pipeline, config.layers);
    stage_ = mesh.pipeline_rank();
    stages_ = mesh.pipeline;
    runner_ = std::make_unique<StageRunner>(model_, device_, pipe(), options_.pipeline.schedule, stage_,
                                            stage_chunks(model_, stages_, options_.pipeline.virtual_stages));
    runner_->set_chunk(0);
    if (stages_ > 1 && config.tie_embeddings) {
      const bool end = stage_ == 0 || stage_ == stages_ - 1;
      if (device_.holds_data()) {
        embedding_group_ = pipe().split(end ? 0 : 1, stage_, "embedding group");
        if (!end) embedding_group_.reset();  // the middle stages' group of their own carries nothing
      } else if (end) {  // a plan's world is virtual (collectives/virtual): so is its embedding group
        embedding_group_ =
            coll::make_virtual_communicator(device_, stage_ == 0 ? 0 : 1, 2, "embedding group", model_.config().shrink);
      }
    }
    units_.resize(static_cast<size_t>(model_.num_units()));
    index_.resize(units_.size());
    if (holds_root()) hold(0);
    for (const StageBlocks& chunk : runner_->chunks()[static_cast<size_t>(stage_)]) {
      for (int u = chunk.first; u <= chunk.last; ++u) hold(u);
    }
  }

  std::vector<float> full_weights(int unit) override {
    const size_t count = model_.full_layout(unit).count;
    std::vector<float> out(count, 0.0f);
    if (unit > 0) {
      const int owner = runner_->owner_of(unit);
      if (owner == stage_) whole_values(unit, out.data());
      pipe().broadcast(out.data(), out.data(), count, DType::kF32, owner, "full weights");
      return out;
    }
    // The root: each tensor from one stage, the embeddings (tied or not) from the first, the rest from the last.
    if (holds_root()) {
      std::vector<float> all(count);
      whole_values(0, all.data());
      const model::UnitLayout& layout = model_.full_layout(0);
      for (size_t p = 0; p < layout.params.size(); ++p) {
        const int from = embedding_side(model_.config(), p) ? 0 : stages_ - 1;
        if (from != stage_) continue;
        std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(layout.params[p].offset), layout.params[p].count,
                    out.begin() + static_cast<std::ptrdiff_t>(layout.params[p].offset));
      }
    }
    pipe().all_reduce(out.data(), out.data(), count, DType::kF32, coll::ReduceOp::kSum, "full weights");
    return out;
  }

  std::vector<coll::Communicator*> groups() override {
    std::vector<coll::Communicator*> out{&world_};
    if (pipe_group_) out.push_back(pipe_group_.get());
    if (tp_group_) out.push_back(tp_group_.get());
    if (dp_group_) out.push_back(dp_group_.get());
    if (embedding_group_) out.push_back(embedding_group_.get());
    return out;
  }

 protected:
  // The stage's program (stage_runner.h).
  double run_micro_batches(std::span<const data::Batch> micro_batches, model::Hooks& hooks) override {
    const double loss = runner_->run(micro_batches, hooks);
    reduce_embedding();
    // The loss exists on the last stage; every stage reports it.
    return sum_over(pipe(), loss, "pipeline loss (reporting)");
  }

  double gradient_sum_of_squares() override {
    double sum = 0;
    for (int u = 0; u < model_.num_units(); ++u) {
      const Held& held = units_[static_cast<size_t>(u)];
      if (!held.params.allocated()) continue;
      const DType dtype = held.grads.dtype();
      // The tensors this stage owns (of the root: the tied embedding counted once, on the first stage); those whole
      // on every TP rank (norm weights) counted on TP rank 0 only; under the distributed optimizer the elements of
      // this rank's shards.
      const model::UnitLayout& layout = model_.layout(u);
      for (size_t p = 0; p < layout.params.size(); ++p) {
        if (u == 0 && (!owns(p) || (stage_ != 0 && embedding_side(model_.config(), p)))) continue;
        if (tp_group_ && tp_group_->rank() != 0 && layout.params[p].count == model_.full_layout(u).params[p].count) {
          continue;
        }
        for (const Segment& segment : held.segments) {
          size_t lo = 0, hi = 0;
          segment.owned(layout.params[p].offset, layout.params[p].offset + layout.params[p].count, lo, hi);
          sum += optim::grad_sum_of_squares(
              optim::ConstElementSpan(element(held.grads.data(), dtype, lo), hi - lo, dtype));
        }
      }
    }
    if (distributed()) return sum_over_world(sum, "gradient norm");
    sum = sum_over(pipe(), sum, "gradient norm");
    return tp_group_ ? sum_over(*tp_group_, sum, "gradient norm") : sum;
  }

  // Data parallelism: the gradients this stage owns averaged over the replicas of the stage (each block whole, the
  // root's tensors of the stage's side one by one), reduce-scattered to their shards under the distributed optimizer.
  void finish_gradients() override {
    reduce_sequence_parallel_norms();
    if (!dp_group_) return;
    for (Held& held : units_) {
      const DType dtype = held.grads.dtype();
      for (const Segment& segment : held.segments) {
        void* grads = element(held.grads.data(), dtype, segment.offset);
        if (!distributed()) {
          dp_group_->all_reduce(grads, grads, segment.count, dtype, coll::ReduceOp::kAvg,
                                "data-parallel gradient all-reduce");
          continue;
        }
        dp_group_->reduce_scatter_v(grads, element(grads, dtype, segment.shard.offset), shard_counts(segment.count),
                                    dtype, coll::ReduceOp::kAvg, "data-parallel gradient reduce-scatter");
      }
    }
  }

  void update(double lr, float grad_scale) override {
    for (Held& held : units_) {
      const DType params = held.params.dtype(), grads = held.grads.dtype();
      for (Segment& segment : held.segments) {
        const size_t begin = segment.offset + segment.shard.offset;
        segment.optimizer->step(
            options_.adamw, optim::ElementSpan(element(held.params.data(), params, begin), segment.shard.valid, params),
            optim::ConstElementSpan(element(held.grads.data(), grads, begin), segment.shard.valid, grads), begin,
            held.decay, lr, grad_scale);
        if (distributed()) {
          void* mine = element(held.params.data(), params, segment.offset);
          dp_group_->all_gather_v(element(mine, params, segment.shard.offset), mine, shard_counts(segment.count),
                                  params, "data-parallel parameter all-gather");
        }
      }
      zero(held.grads.data(), held.grads.dtype(), held.grads.count());
    }
  }

 private:
  // A range of a unit's elements the stage updates (a block whole, or one root tensor it owns), and the shard of it
  // this rank's optimizer holds: all of it, or 1/D under the distributed optimizer.
  struct Segment {
    size_t offset = 0, count = 0;
    ShardInfo shard;
    std::unique_ptr<optim::AdamWState> optimizer;
    // The elements of [begin, end) (unit coordinates) in this rank's shard, as [lo, hi); lo == hi when none.
    void owned(size_t begin, size_t end, size_t& lo, size_t& hi) const {
      lo = std::max(begin, offset + shard.offset);
      hi = std::min(end, offset + shard.end());
      if (hi < lo) hi = lo;
    }
  };
  struct Held {  // one unit's model states on this stage
    Buffer params, grads;
    std::vector<Segment> segments;
    std::vector<optim::DecayRange> decay;
  };

  // Sequence parallelism: the norm weights of the stage's own layers (its blocks' and, on the last stage, the final
  // norm), each TP rank's gradient over its rows only, summed over the stage's TP group in one fp32 all-reduce after
  // the last micro-batch (Megatron's finalize_model_grads on every stage), before the data-parallel reduction.
  void reduce_sequence_parallel_norms() {
    if (!tp_group_ || !model_.options().sequence_parallel) return;
    std::vector<GradientSpan> spans;
    for (int u = 0; u < model_.num_units(); ++u) {
      Held& held = units_[static_cast<size_t>(u)];
      if (!held.params.allocated()) continue;
      const model::UnitLayout& layout = model_.layout(u);
      for (size_t p = 0; p < layout.params.size(); ++p) {
        if (!tp_replicated(model_, u, p) || (u == 0 && !owns(p))) continue;
        spans.push_back({element(held.grads.data(), held.grads.dtype(), layout.params[p].offset), held.grads.dtype(),
                         layout.params[p].count});
      }
    }
    all_reduce_norm_gradients(*tp_group_, device_.holds_data(), spans);
  }

  bool distributed() const { return dp_group_ != nullptr && options_.parallel.distributed_optimizer; }
  // Each data-parallel rank's real elements of `count` (shard.h): the blocks of the reduce-scatter and all-gather.
  std::vector<size_t> shard_counts(size_t count) const { return strategy::shard_counts(count, dp_group_->size()); }

  // The pipeline's group: the world when every rank is a stage of one pipeline.
  coll::Communicator& pipe() const { return pipe_group_ ? *pipe_group_ : world_; }

  bool holds_root() const { return stage_ == 0 || stage_ == stages_ - 1; }
  bool owns(size_t root_param) const {
    return (stage_ == 0 && embedding_side(model_.config(), root_param)) ||
           (stage_ == stages_ - 1 && head_side(model_.config(), root_param));
  }
  // Allocates and initialises unit `unit`'s model states; the root's are charged for the tensors this stage owns.
  void hold(int unit) {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    const model::UnitLayout& layout = model_.layout(unit);
    model::ParameterCharge charge = unit_charge(model_, unit);
    if (unit == 0) {
      double owned = 0;
      for (size_t p = 0; p < layout.params.size(); ++p) {
        if (owns(p)) owned += static_cast<double>(model::tensor_charge(model_.config(), layout.params[p]));
      }
      charge = {layout.count, owned};
    }
    Held& held = units_[static_cast<size_t>(unit)];
    const std::string name = fmt::format("pipeline stage {}, {}", stage_, layout.name);
    held.params = model::allocate_parameter_space(device_, charge, layout.count, recipe.params, Category::kParameters,
                                                  name + " parameters");
    held.grads = model::allocate_parameter_space(device_, charge, layout.count, recipe.grads, Category::kGradients,
                                                 name + " gradients");
    zero(held.grads.data(), recipe.grads, layout.count);
    for (size_t p = 0; p < (unit == 0 ? layout.params.size() : 1); ++p) {
      if (unit == 0 && !owns(p)) continue;
      Segment segment;
      segment.offset = unit == 0 ? layout.params[p].offset : 0;
      segment.count = unit == 0 ? layout.params[p].count : layout.count;
      segment.shard =
          distributed() ? shard_of(segment.count, dp_group_->rank(), dp_group_->size()) : shard_of(segment.count, 0, 1);
      const double charged =
          unit == 0 ? static_cast<double>(model::tensor_charge(model_.config(), layout.params[p])) : charge.charged;
      const model::ParameterCharge shard_charge{
          segment.shard.valid, charged * static_cast<double>(segment.shard.valid) / static_cast<double>(segment.count)};
      segment.optimizer =
          std::make_unique<optim::AdamWState>(optimizer_device(), recipe, segment.shard.valid, name, shard_charge);
      held.segments.push_back(std::move(segment));
    }
    held.decay = decay_ranges(layout, 0);
    std::vector<float> initial(device_.holds_data() ? layout.count : 0);
    if (tp_group_ && device_.holds_data()) {  // this TP rank's slice (tensor_parallel.cpp)
      index_[static_cast<size_t>(unit)] = tp_slice_index(model_, unit, tp_group_->rank(), tp_group_->size());
      init_tp_slice(model_, unit, options_.seed, index_[static_cast<size_t>(unit)], initial.data());
    } else {
      init_into(model_, unit, options_.seed, 0, layout.count, initial.empty() ? nullptr : initial.data(), DType::kF32);
    }
    convert(initial.empty() ? nullptr : initial.data(), DType::kF32, held.params.data(), recipe.params, layout.count);
    for (Segment& segment : held.segments) {
      if (!device_.holds_data()) break;
      segment.optimizer->load_master(optim::ConstElementSpan(initial.data() + segment.offset + segment.shard.offset,
                                                             segment.shard.valid, DType::kF32));
    }
    model_.bind_weights(unit, held.params.data(), recipe.params);
    model_.bind_grads(unit, held.grads.data(), recipe.grads);
  }

  // The unit's fp32 values in its full layout: the TP ranks' slices placed and summed over the stage's TP group.
  void whole_values(int unit, float* out) {
    if (!tp_group_) {
      fp32_values(unit, out);
      return;
    }
    std::vector<float> mine(model_.layout(unit).count);
    fp32_values(unit, mine.data());
    const size_t count = model_.full_layout(unit).count;
    std::fill_n(out, count, 0.0f);
    place_tp_slice(model_, unit, index_[static_cast<size_t>(unit)], mine.data(), tp_group_->rank() == 0, out);
    tp_group_->all_reduce(out, out, count, DType::kF32, coll::ReduceOp::kSum, "full weights");
  }

  // The unit's fp32 values on this stage: its master weights when the recipe keeps them (gathered from the
  // data-parallel shards under the distributed optimizer), else its parameters.
  void fp32_values(int unit, float* out) {
    const Held& held = units_[static_cast<size_t>(unit)];
    convert(held.params.data(), held.params.dtype(), out, DType::kF32, held.params.count());
    for (const Segment& segment : held.segments) {
      const optim::ElementSpan master = segment.optimizer->master();
      if (master.empty()) continue;
      std::vector<float> mine(master.size());
      convert(master.data(), master.dtype(), mine.data(), DType::kF32, master.size());
      if (distributed()) {
        dp_group_->all_gather_v(mine.data(), out + segment.offset, shard_counts(segment.count), DType::kF32,
                                "full weights");
      } else {
        std::copy(mine.begin(), mine.end(), out + segment.offset);
      }
    }
  }

  // Tied embeddings: the first and the last stage sum their gradients of the shared table.
  void reduce_embedding() {
    if (!embedding_group_ || !holds_root()) return;
    PhaseScope phase(device_.memory(), "embedding gradient all-reduce");
    const model::ParamInfo& table = model_.layout(0).params[model::kEmbedTokens];
    Held& root = units_[0];
    void* grads = element(root.grads.data(), root.grads.dtype(), table.offset);
    embedding_group_->all_reduce(grads, grads, table.count, root.grads.dtype(), coll::ReduceOp::kSum,
                                 "embedding gradient all-reduce");
  }

  // With D > 1 replicas or T > 1 (setup): the pipeline's group, the stage's TP group, the stage's replicas.
  std::unique_ptr<coll::Communicator> pipe_group_, tp_group_, dp_group_;
  std::unique_ptr<GroupTensorParallel> tensor_;
  std::vector<std::vector<std::vector<int64_t>>> index_;  // [units][params][local elements] under TP (tp_slice_index)
  int stage_ = 0, stages_ = 1;
  std::unique_ptr<StageRunner> runner_;                  // the stage's blocks and its program
  std::vector<Held> units_;                              // [units] allocated where this stage holds the unit
  std::unique_ptr<coll::Communicator> embedding_group_;  // the first and the last stage, with tied embeddings
};

}  // namespace

std::unique_ptr<Strategy> make_pipeline(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<Pipeline>(context, options);
}

}  // namespace emu::strategy
