#include "workloads/model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "emu/bf16.h"
#include "emu/check.h"
#include "workloads/model/blocks.h"
#include "workloads/model/rope.h"
#include "workloads/model/shrink.h"
#include "workloads/model/tensor.h"
#include "workloads/model/tensor_parallel.h"

namespace emu::model {

using Access = F32::Access;

Model::Model(Device& device, ModelConfig config, ModelOptions options)
    : device_(device),
      config_(std::move(config)),
      options_(options),
      math_(device.holds_data()),
      ops_(math_ ? device.ops() : nullptr) {
  EMU_CHECK(!math_ || ops_ != nullptr, "the {} device holds data but hands out no ops", device.backend());
  EMU_CHECK(!options_.autocast || options_.compute != DType::kF32, "autocast needs a compute dtype below fp32");
  config_.validate();
  layouts_ = build_layouts(config_);
  units_.resize(layouts_.size());
  saved_.resize(static_cast<size_t>(config_.layers));
  last_block_ = static_cast<int>(config_.layers);
  full_config_ = config_;
  full_layouts_ = layouts_;
}

void Model::set_tensor_parallel(TensorParallel* tp) {
  EMU_CHECK(tp != nullptr && tp_ == nullptr, "tensor parallelism is set once");
  EMU_CHECK(device_.backend() != "cuda", "tp's parallel cross-entropy runs on the host: cpu and shapes devices only");
  config_ = tensor_parallel_config(full_config_, tp->size());
  if (options_.sequence_parallel) check_sequence_parallel(config_, options_, tp->size());
  layouts_ = build_layouts(config_);
  units_.assign(layouts_.size(), {});
  tp_ = tp;
}

const UnitLayout& Model::full_layout(int unit) const {
  EMU_CHECK(unit >= 0 && unit < num_units(), "unit {} is outside [0, {})", unit, num_units());
  return full_layouts_[static_cast<size_t>(unit)];
}

Model::~Model() { discard(); }

const UnitLayout& Model::layout(int unit) const {
  EMU_CHECK(unit >= 0 && unit < num_units(), "unit {} is outside [0, {})", unit, num_units());
  return layouts_[static_cast<size_t>(unit)];
}

void Model::bind_weights(int unit, const void* weights) { bind_weights(unit, weights, options_.compute); }

void Model::bind_weights(int unit, const void* weights, DType dtype) {
  layout(unit);
  EMU_CHECK(dtype == DType::kF32 || dtype == options_.compute, "unit {} weights bound as {}, computing in {}", unit,
            dtype_name(dtype), dtype_name(options_.compute));
  units_[static_cast<size_t>(unit)].weights = weights;
  units_[static_cast<size_t>(unit)].weights_dtype = dtype;
}

void Model::bind_grads(int unit, void* grads) { bind_grads(unit, grads, options_.compute); }

void Model::bind_grads(int unit, void* grads, DType dtype) {
  layout(unit);
  EMU_CHECK(dtype == DType::kF32 || dtype == options_.compute, "unit {} gradients bound as {}, computing in {}", unit,
            dtype_name(dtype), dtype_name(options_.compute));
  units_[static_cast<size_t>(unit)].grads = grads;
  units_[static_cast<size_t>(unit)].grads_dtype = dtype;
}

void Model::initial_values(int unit, uint64_t seed, size_t begin, size_t count, float* out) const {
  const UnitLayout& l = full_layout(unit);
  EMU_CHECK(begin <= l.count && count <= l.count - begin, "elements [{}, {}) outside unit {} of {}", begin,
            begin + count, unit, l.count);
  if (initial_weights_ == nullptr) {
    init_unit_range(l, unit, seed, begin, count, out);
    return;
  }
  const std::vector<float>& values = (*initial_weights_)[static_cast<size_t>(unit)];
  std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(begin), count, out);
}

void Model::init_unit(int unit, uint64_t seed, float* out) const {
  initial_values(unit, seed, 0, full_layout(unit).count, out);
}

void Model::set_initial_weights(std::shared_ptr<const std::vector<std::vector<float>>> weights) {
  if (weights != nullptr) {
    EMU_CHECK(weights->size() == full_layouts_.size(), "initial weights for {} units, the model has {}",
              weights->size(), full_layouts_.size());
    for (size_t u = 0; u < full_layouts_.size(); ++u) {
      EMU_CHECK((*weights)[u].size() == full_layouts_[u].count,
                "initial weights of unit {}: {} values, its layout has {}", u, (*weights)[u].size(),
                full_layouts_[u].count);
    }
  }
  initial_weights_ = std::move(weights);
}

const float* Model::weights_f32(int unit, Scratch& scratch) const {
  if (!math_) return nullptr;
  const UnitBindings& u = units_[static_cast<size_t>(unit)];
  EMU_CHECK(u.weights != nullptr, "no weights are bound to unit {} ({}); bind them before its before_ hook returns",
            unit, layout(unit).name);
  if (u.weights_dtype == DType::kF32) return static_cast<const float*>(u.weights);
  const size_t n = layout(unit).count;
  float* copy = scratch.reserve_as<float>(*ops_, n, false);
  ops_->bf16_to_f32(static_cast<const uint16_t*>(u.weights), copy, n);
  return copy;
}

float* Model::zeroed_grads(int unit, Scratch& scratch) const {
  return math_ ? scratch.reserve_as<float>(*ops_, layout(unit).count, true) : nullptr;
}

void Model::flush_grads(int unit, const float* grads) {
  if (!math_) return;
  const UnitBindings& u = units_[static_cast<size_t>(unit)];
  EMU_CHECK(u.grads != nullptr, "no gradient buffer is bound to unit {} ({})", unit, layout(unit).name);
  const size_t n = layout(unit).count;
  if (u.grads_dtype == DType::kF32) {
    ops_->accumulate(static_cast<float*>(u.grads), grads, n);
  } else {
    ops_->accumulate_bf16(static_cast<uint16_t*>(u.grads), grads, n);
  }
}

void Model::sync() const {
  if (ops_ != nullptr) ops_->synchronize();
}

BlockEnv Model::block_env(int unit) const {
  return BlockEnv{device_, config_, options_, layout(unit), unit, rope_cos_.as<float>(), rope_sin_.as<float>(),
                  math_,   ops_,    {},       tp_};
}

float Model::forward(const int32_t* tokens, const int32_t* targets, Hooks& hooks) {
  Buffer input = first_block_ > 1 ? std::move(final_x_) : Buffer();  // a later pipeline stage's input
  discard();
  final_x_ = std::move(input);
  MemoryPool& pool = device_.memory();
  const bool first = first_block_ == 1, last = last_block_ == config_.layers;
  if (holds_root()) {
    PhaseScope phase(pool, first ? "forward, embedding" : "forward, root");
    sync();
    hooks.before_forward(0);
    root_weights_ = weights_f32(0, root_w_);
  }
  if (first) {
    PhaseScope phase(pool, "forward, embedding");
    forward_root_start(tokens);
  } else {
    EMU_CHECK(final_x_.allocated(), "stage of blocks {}..{}: no input was set before forward", first_block_,
              last_block_);
    allocate_rope_tables();
  }
  for (int unit = first_block_; unit <= last_block_; ++unit) {
    PhaseScope phase(pool, fmt::format("forward, block {}", unit));
    sync();
    hooks.before_forward(unit);
    BlockSaved& saved = saved_[static_cast<size_t>(unit - 1)];
    const Category saved_category = options_.checkpoint ? Category::kTemporaries : Category::kActivations;
    Buffer out = block_forward(block_env(unit), weights_f32(unit, block_w_), std::move(final_x_), saved, saved_category,
                               Category::kActivations, options_.checkpoint);
    if (options_.checkpoint) saved.release_all_but_input();
    final_x_ = std::move(out);
    sync();
    hooks.after_forward(unit);
  }
  float loss = 0;
  {
    std::optional<PhaseScope> phase;  // the root's closing hook runs in the loss's phase, as it follows the loss
    if (last) phase.emplace(pool, "loss");
    if (last) loss = forward_root_end(targets);
    sync();
    if (holds_root()) hooks.after_forward(0);
  }
  has_forward_ = true;
  return loss;
}

void Model::backward(Hooks& hooks) {
  EMU_CHECK(has_forward_, "backward needs a forward first");
  MemoryPool& pool = device_.memory();
  const bool first = first_block_ == 1, last = last_block_ == config_.layers;
  if (holds_root()) {
    PhaseScope phase(pool, last ? "backward, head" : "backward, root");
    sync();
    hooks.before_backward(0);
    root_weights_ = weights_f32(0, root_w_);
    root_grads_ = zeroed_grads(0, root_g_);
  }
  if (last) {
    PhaseScope phase(pool, "backward, head");
    backward_root_start(hooks);
  } else {
    EMU_CHECK(dres_.allocated(), "stage of blocks {}..{}: no output gradient was set before backward", first_block_,
              last_block_);
  }
  for (int unit = last_block_; unit >= first_block_; --unit) backward_block(unit, hooks);
  PhaseScope phase(pool, "backward, embedding");
  if (first) {
    sync();
    const bool tied = tied_head_part_.allocated();
    if (!tied) hooks.before_embedding_backward();  // AccumulateGrad takes the embedding's gradient as made
    Buffer embedding_part = backward_root_end();
    if (tied) {  // the two parts summed into a new tensor and freed; AccumulateGrad takes the sum
      Buffer sum = tied_table_part("autograd's sum of the tied table's two gradients");
      embedding_part.reset();
      tied_head_part_.reset();
      sync();
      hooks.before_embedding_backward();
    }
  } else {  // dres_ is the gradient of the stage's input, for take_input_gradient
    tokens_.reset();
    rope_cos_.reset();
    rope_sin_.reset();
  }
  if (holds_root()) flush_grads(0, root_grads_);
  has_forward_ = false;
  sync();
  if (holds_root()) hooks.after_backward(0);
}

float Model::step(const int32_t* tokens, const int32_t* targets, Hooks& hooks) {
  const float loss = forward(tokens, targets, hooks);
  backward(hooks);
  return loss;
}

void Model::discard() {
  for (BlockSaved& s : saved_) {
    s.release_all_but_input();
    s.x.reset();
  }
  final_x_.reset();
  final_stats_.reset();
  final_hat_.reset();
  final_plus_one_.reset();
  final_xn_.reset();
  logits_.reset();
  softcap_tanh_.reset();
  dres_.reset();
  tied_head_part_.reset();
  tokens_.reset();
  rope_cos_.reset();
  rope_sin_.reset();
  has_forward_ = false;
}

void Model::set_stage(int first_block, int last_block) {
  EMU_CHECK(1 <= first_block && first_block <= last_block && last_block <= config_.layers,
            "stage of blocks {}..{} is outside 1..{}", first_block, last_block, config_.layers);
  first_block_ = first_block;
  last_block_ = last_block;
}

void Model::set_stage_input(Buffer x) {
  EMU_CHECK(first_block_ > 1, "the stage starting at block 1 embeds its tokens: it takes no input");
  final_x_ = std::move(x);
}

Buffer Model::take_stage_output() {
  EMU_CHECK(last_block_ < config_.layers && has_forward_, "no stage output: the stage ends at block {} of {}",
            last_block_, config_.layers);
  return std::move(final_x_);
}

void Model::set_output_gradient(Buffer grad) {
  EMU_CHECK(last_block_ < config_.layers, "the last stage starts backward from its loss: it takes no gradient");
  dres_ = std::move(grad);
}

Buffer Model::take_input_gradient() {
  EMU_CHECK(first_block_ > 1, "the stage starting at block 1 hands no input gradient on");
  return std::move(dres_);
}

Model::InFlight Model::take_in_flight() {
  InFlight state;
  state.tokens = std::move(tokens_);
  state.rope_cos = std::move(rope_cos_);
  state.rope_sin = std::move(rope_sin_);
  state.saved = std::move(saved_);
  saved_ = std::vector<BlockSaved>(static_cast<size_t>(config_.layers));
  state.final_x = std::move(final_x_);
  state.final_stats = std::move(final_stats_);
  state.final_hat = std::move(final_hat_);
  state.final_plus_one = std::move(final_plus_one_);
  state.final_xn = std::move(final_xn_);
  state.logits = std::move(logits_);
  state.tp_outside = std::move(tp_outside_);
  tp_outside_.clear();
  state.has_forward = has_forward_;
  has_forward_ = false;
  return state;
}

void Model::restore_in_flight(InFlight state) {
  EMU_CHECK(!has_forward_, "restoring a held forward over one the model still holds");
  discard();
  tokens_ = std::move(state.tokens);
  rope_cos_ = std::move(state.rope_cos);
  rope_sin_ = std::move(state.rope_sin);
  saved_ = std::move(state.saved);
  final_x_ = std::move(state.final_x);
  final_stats_ = std::move(state.final_stats);
  final_hat_ = std::move(state.final_hat);
  final_plus_one_ = std::move(state.final_plus_one);
  final_xn_ = std::move(state.final_xn);
  logits_ = std::move(state.logits);
  tp_outside_ = std::move(state.tp_outside);
  has_forward_ = state.has_forward;
}

void Model::allocate_rope_tables() {
  const ModelConfig& c = config_;
  if (c.style != Style::kLlama) return;
  const size_t half = size_t(c.rotary_dim() / 2);
  // Charged as Hugging Face holds them (LlamaRotaryEmbedding.forward): cos and sin of cat((freqs, freqs)), [1, s, r]
  // each for r rotary dimensions (the head's d, or Phi-4-mini's partial 96 of 128), cast to the hidden states' dtype
  // (the residual stream's: fp32 under autocast); emu's math reads [s, r/2].
  const size_t held = size_t(c.seq) * size_t(c.rotary_dim()) * dtype_size(options_.residual());
  rope_cos_ = device_.allocate(size_t(c.seq) * half, DType::kF32, Category::kTemporaries, "rotary cos [1, s, d]", held);
  rope_sin_ = device_.allocate(size_t(c.seq) * half, DType::kF32, Category::kTemporaries, "rotary sin [1, s, d]", held);
  if (math_) {  // computed once on the host, as a GPU run computes its tables, then brought over
    std::vector<float> cos(rope_cos_.count()), sin(rope_sin_.count());
    rope_tables(c.seq, rope_inverse_frequencies(c.rotary_dim(), c.rope_theta, c.rope_scaling, c.seq * c.shrink),
                cos.data(), sin.data(), c.rope_scaling.attention_factor);
    ops_->copy_from_host(rope_cos_.data(), cos.data(), cos.size() * sizeof(float));
    ops_->copy_from_host(rope_sin_.data(), sin.data(), sin.size() * sizeof(float));
  }
}

void Model::forward_root_start(const int32_t* tokens) {
  const ModelConfig& c = config_;
  const UnitLayout& root = layouts_[0];
  const size_t T = size_t(c.tokens());
  tokens_ = allocate_per_row(device_, c, T, DType::kF32, Category::kActivations, "token ids");
  std::vector<int32_t> local;  // TP: the tokens as rows of this rank's vocabulary slice (tensor_parallel.h)
  if (tp_ != nullptr && math_) {
    local.resize(T);
    vocab_parallel_tokens(tokens, c.tokens(), c.vocab, vocab_begin(), local.data(), tp_outside_);
    tokens = local.data();
  }
  if (math_) ops_->copy_from_host(tokens_.data(), tokens, T * sizeof(int32_t));
  allocate_rope_tables();
  // Gemma's embedding (transformers GemmaTextScaledWordEmbedding) multiplies the looked-up rows by √h into a new
  // tensor; the unscaled rows are a temporary of the lookup.
  // Under autocast the embedding runs on the fp32 table and the residual stream starts in fp32.
  Buffer unscaled;
  if (c.gemma) {
    unscaled = device_.allocate(T * size_t(c.hidden), options_.residual(), Category::kTemporaries,
                                "embedding output before the √h scale");
  }
  // Sequence parallelism: the looked-up rows are a [T, h] partial sum, reduce-scattered into the rank's rows.
  const bool sp = sequence_parallel();
  Buffer partial;
  if (sp) {
    partial = device_.allocate(T * size_t(c.hidden), options_.residual(), Category::kTemporaries,
                               "embedding output, partial sum before the reduce-scatter");
  }
  final_x_ =
      device_.allocate(rows() * size_t(c.hidden), options_.residual(), Category::kActivations, "embedding output");
  // GPT-2's learned positions (wpe) are whole on every rank: under TP they are added after the token rows are
  // summed, as Megatron's LanguageModelEmbedding adds position_embeddings to VocabParallelEmbedding's reduced output.
  const float* positions = c.style == Style::kGpt2 && math_ ? root_weights_ + root.params[kWpe].offset : nullptr;
  if (math_) {
    const float* table = root_weights_ + root.params[kEmbedTokens].offset;  // kWte for GPT-2: same position
    F32 x(ops_, sp ? partial : final_x_, Access::kWrite);
    ops_->embedding_forward(tokens_.as<int32_t>(), table, tp_ == nullptr ? positions : nullptr, x, c.tokens(), c.seq,
                            c.hidden);
    for (size_t t = 0; t < tp_outside_.size(); ++t) {  // TP: rows of other ranks' tokens are zeros here
      if (tp_outside_[t] != 0) ops_->fill_zero(x + t * size_t(c.hidden), size_t(c.hidden) * sizeof(float));
    }
    if (c.gemma) ops_->scale(x, embedding_scale(), T * size_t(c.hidden));
  }
  if (sp) {  // VocabParallelEmbedding with reduce_scatter_embeddings: summed and scattered along the rows
    sync();
    tp_->reduce_scatter(partial, final_x_, "tp reduce-scatter, embedding output");
  } else if (tp_ != nullptr) {  // VocabParallelEmbedding: the ranks' rows summed
    sync();
    tp_->all_reduce(final_x_, "tp all-reduce, embedding output");
    if (positions != nullptr) {  // each sequence's rows + wpe[0, s)
      F32 x(ops_, final_x_, Access::kReadWrite);
      const size_t n = size_t(c.seq * c.hidden);
      for (int64_t b = 0; b < c.batch; ++b) ops_->accumulate(x + size_t(b) * n, positions, n);
    }
  }
}

bool Model::sequence_parallel() const { return tp_ != nullptr && options_.sequence_parallel; }

size_t Model::rows() const { return size_t(sequence_parallel() ? config_.tokens() / tp_->size() : config_.tokens()); }

Buffer Model::gather_rows(const Buffer& slice, std::string_view what) {
  Buffer full = device_.allocate(size_t(config_.tokens() * config_.hidden), slice.dtype(), Category::kTemporaries,
                                 fmt::format("{} all-gathered", what));
  sync();
  tp_->all_gather(slice, full, fmt::format("tp all-gather, {}", what));
  return full;
}

int64_t Model::vocab_begin() const { return tp_ != nullptr ? int64_t{tp_->rank()} * config_.vocab : 0; }

float Model::embedding_scale() const {
  // √h at the weights' dtype (embed_scale.to(self.weight.dtype)): 45.25 rather than 45.2548 for h = 2048 in bf16;
  // fp32 under autocast, whose parameters are fp32 (the embedding is on none of its lists).
  const float scale = std::sqrt(float(config_.hidden));
  return options_.compute == DType::kF32 || options_.autocast ? scale : round_to_bf16(scale);
}

namespace {
// Where the LM head's [V, h] weight lies in the root: lm_head, or the token embedding when tied (GPT-2 always).
size_t head_param(const ModelConfig& c) {
  return c.style == Style::kLlama && !c.tie_embeddings ? size_t(kLmHead) : size_t(kEmbedTokens);
}
}  // namespace

float Model::forward_root_end(const int32_t* targets) {
  const ModelConfig& c = config_;
  const UnitLayout& root = layouts_[0];
  const bool llama = c.style == Style::kLlama;
  const size_t T = size_t(c.tokens()), R = rows();  // R: the final norm's rows, T/t under sequence parallelism
  // LlamaRMSNorm.forward saves its input in fp32 (hidden_states.to(float32): a copy of a bf16 input, which the
  // model's forward then drops, so emu keeps the copy in its place; an fp32 input itself), rstd and the normalised
  // tensor at the input's dtype (GemmaRMSNorm's in fp32, with (1 + weight) in fp32), as a block's norms do
  // (blocks.cpp rms_norm_forward); the normalised tensor is charged only, the math needs the input and rstd.
  Buffer narrow_input;
  if (llama && final_x_.dtype() != DType::kF32) {
    Buffer wide_input =
        device_.allocate(R * size_t(c.hidden), DType::kF32, Category::kActivations, "final norm input in fp32");
    if (math_) ops_->bf16_to_f32(final_x_.as<uint16_t>(), wide_input.as<float>(), R * size_t(c.hidden));
    narrow_input = std::exchange(final_x_, std::move(wide_input));
  }
  final_stats_ =
      allocate_per_row(device_, c, llama ? R : 2 * T, DType::kF32, Category::kActivations, "final norm statistics");
  if (llama) {
    const DType hat = c.gemma ? DType::kF32 : narrow_input.allocated() ? narrow_input.dtype() : final_x_.dtype();
    final_hat_ = device_.allocate(0, hat, Category::kActivations, "final norm normalised input",
                                  R * size_t(c.hidden) * dtype_size(hat));
    if (c.gemma) {
      final_plus_one_ = allocate_per_row(device_, c, size_t(c.hidden), DType::kF32, Category::kActivations,
                                         "final norm (1 + weight)");
    }
  }
  // Under autocast the final norm's output is fp32, held until the model's forward returns (its
  // last_hidden_state), and the head saves its bf16 cast.
  Buffer wide;
  if (options_.autocast) {
    wide = device_.allocate(T * size_t(c.hidden), DType::kF32, Category::kTemporaries, "final norm output in fp32");
  }
  final_xn_ = device_.allocate(R * size_t(c.hidden), options_.compute, Category::kActivations,
                               options_.autocast ? "final norm output cast by autocast" : "final norm output");
  narrow_input.reset();
  const float* w = root_weights_;
  const float eps = static_cast<float>(c.norm_eps);
  const auto final_norm = [&] {
    F32 x(ops_, final_x_, Access::kRead), st(ops_, final_stats_, Access::kWrite), xn(ops_, final_xn_, Access::kWrite);
    if (llama) {
      Scratch factor;
      ops_->rmsnorm_forward(x, norm_weight(ops_, c, w + root.params[kFinalNorm].offset, factor), xn, st, int64_t(R),
                            c.hidden, eps);
    } else {
      ops_->layernorm_forward(x, w + root.params[kLnFWeight].offset, w + root.params[kLnFBias].offset, xn, st, st + T,
                              c.tokens(), c.hidden, eps);
    }
  };
  // Sequence parallelism: the norm runs on the rank's rows; the head (column-parallel) reads its output
  // all-gathered, held until the logits are made, and saves the slice.
  Buffer xn_full;
  if (sequence_parallel()) {
    if (math_) final_norm();
    xn_full = gather_rows(final_xn_, "final norm output");
  }
  // The Trainer's loss (ForCausalLMLoss) holds, besides the fp32 log-softmax that cross_entropy saves, the head's
  // logits at the compute dtype and their fp32 upcast until compute_loss returns; fp32 logits are upcast to
  // themselves. emu's math needs one fp32 [T, V] buffer: the logits, turned into their gradient by the loss.
  Buffer head, upcast;
  if (options_.loss == Loss::kTrainer) {
    head = device_.allocate(T * size_t(c.vocab), options_.compute, Category::kTemporaries, "logits (lm_head output)");
    if (c.final_softcap != 0) {
      // Gemma 2 (Gemma2ForCausalLM.forward): logits / cap, tanh (its output saved for backward), × cap: each a new
      // [T, V] tensor at the compute dtype replacing the one before but the saved tanh; `head` stands for the last.
      Buffer divided =
          device_.allocate(T * size_t(c.vocab), options_.compute, Category::kTemporaries, "logits / final soft-cap");
      softcap_tanh_ = device_.allocate(T * size_t(c.vocab), options_.compute, Category::kActivations,
                                       "tanh(logits / final soft-cap)");
    }
    if (options_.compute != DType::kF32) {
      upcast = device_.allocate(T * size_t(c.vocab), DType::kF32, Category::kTemporaries, "logits.float()");
    }
  }
  logits_ = device_.allocate(T * size_t(c.vocab), DType::kF32, Category::kActivations,
                             options_.loss == Loss::kTrainer ? "log_softmax of the logits (fp32)" : "logits (fp32)");
  if (!math_) {
    if (tp_ != nullptr) vocab_parallel_cross_entropy(*tp_, nullptr, nullptr, c.tokens(), c.vocab, 0, 1.0f);
    return 0;
  }
  if (!xn_full.allocated()) final_norm();
  F32 xn(ops_, xn_full.allocated() ? xn_full : final_xn_, Access::kRead);
  float* logits = logits_.as<float>();
  ops_->linear_forward(xn, w + root.params[head_param(c)].offset, nullptr, logits, c.tokens(), c.hidden, c.vocab,
                       WeightLayout::kOutIn);
  if (c.final_softcap != 0) {
    ops_->softcap_forward(logits, softcap_t_.reserve_as<float>(*ops_, T * size_t(c.vocab), false),
                          static_cast<float>(c.final_softcap), T * size_t(c.vocab));
  }
  int32_t* device_targets = targets_.reserve_as<int32_t>(*ops_, T, false);
  ops_->copy_from_host(device_targets, targets, T * sizeof(int32_t));
  const double sum = tp_ != nullptr ? vocab_parallel_cross_entropy(*tp_, logits, targets, c.tokens(), c.vocab,
                                                                   vocab_begin(), 1.0f / float(T))
                                    : ops_->cross_entropy(logits, device_targets, c.tokens(), c.vocab, 1.0f / float(T));
  return static_cast<float>(sum / double(T));
}

Buffer Model::logits_gradient() {
  const size_t n = size_t(config_.tokens()) * size_t(config_.vocab);
  const bool capped = config_.final_softcap != 0;
  if (options_.loss == Loss::kFused) {  // the loss left its gradient in place; a fused kernel caps in place too
    if (capped && math_) ops_->softcap_backward(logits_.as<float>(), softcap_t_.reserve_as<float>(*ops_, n, false), n);
    return std::move(logits_);
  }
  Buffer grad = trainer_logits_gradient();
  if (!capped) return grad;
  // Gemma 2's soft-cap backward (× cap, tanh from its saved output, / cap): the gradient of the head's output, a new
  // [T, V] tensor at the compute dtype.
  Buffer through = device_.allocate(n, grad.dtype(), Category::kTemporaries, "logits gradient before soft-capping");
  if (math_) {
    float* t = softcap_t_.reserve_as<float>(*ops_, n, false);
    if (grad.dtype() == DType::kF32) {
      ops_->fill_zero(through.data(), n * sizeof(float));
      ops_->accumulate(through.as<float>(), grad.as<float>(), n);
      ops_->softcap_backward(through.as<float>(), t, n);
    } else {
      ops_->softcap_backward(logits_grad_.reserve_as<float>(*ops_, n, false), t, n);
    }
  }
  softcap_tanh_.reset();
  return through;
}

Buffer Model::trainer_logits_gradient() {
  // The Trainer's loss backward, as autograd runs it (torch nn.functional.cross_entropy = log_softmax + nll_loss):
  // nll_loss's backward writes the gradient of the log-softmax [T, V] fp32, log_softmax's backward the gradient of
  // the upcast logits [T, V] fp32 beside it and the saved log-softmax, then .float()'s backward narrows it to the
  // compute dtype. In emu's math the gradient already sits in logits_; it is carried along.
  const size_t n = size_t(config_.tokens()) * size_t(config_.vocab);
  Buffer dlogp = device_.allocate(n, DType::kF32, Category::kTemporaries, "log_softmax gradient (nll_loss backward)");
  Buffer dlogits = device_.allocate(n, DType::kF32, Category::kTemporaries, "logits.float() gradient");
  if (math_) {
    ops_->fill_zero(dlogp.data(), n * sizeof(float));
    ops_->add(logits_.as<float>(), dlogp.as<float>(), dlogits.as<float>(), n);
  }
  dlogp.reset();
  logits_.reset();
  if (options_.compute == DType::kF32) return dlogits;
  Buffer narrow = device_.allocate(n, options_.compute, Category::kTemporaries, "logits gradient");
  if (math_) {  // the head's backward reads the fp32 gradient (logits_grad_), as emu's fp32 math does throughout
    ops_->f32_to_bf16(dlogits.as<float>(), narrow.as<uint16_t>(), n);
    ops_->accumulate(logits_grad_.reserve_as<float>(*ops_, n, true), dlogits.as<float>(), n);
  }
  return narrow;
}

void Model::backward_root_start(Hooks& hooks) {
  const ModelConfig& c = config_;
  const UnitLayout& root = layouts_[0];
  const bool llama = c.style == Style::kLlama;
  const size_t T = size_t(c.tokens());
  const float* w = root_weights_;
  float* g = root_grads_;
  const size_t R = rows();
  Buffer dlogits = logits_gradient();
  // Sequence parallelism: the head's saved input slice gathered again for its weight gradient.
  Buffer xn_full =
      sequence_parallel() ? gather_rows(final_xn_, "final norm output, for the head's weight gradient") : Buffer();
  Buffer dxn =
      device_.allocate(T * size_t(c.hidden), options_.residual(), Category::kTemporaries, "d final norm output");
  if (math_) {
    F32 xn(ops_, xn_full.allocated() ? xn_full : final_xn_, Access::kRead), dx(ops_, dxn, Access::kWrite);
    const float* dl = dlogits.dtype() == DType::kF32 ? dlogits.as<float>()
                                                     : logits_grad_.reserve_as<float>(*ops_, dlogits.count(), false);
    const size_t head = root.params[head_param(c)].offset;
    ops_->linear_backward(xn, w + head, dl, dx, g + head, nullptr, c.tokens(), c.hidden, c.vocab, WeightLayout::kOutIn,
                          false);
  }
  if (holds_tied_table()) {  // autograd keeps it for the table's AccumulateGrad until the embedding's part comes
    tied_head_part_ = tied_table_part("autograd's input buffer: the head's part of the tied table's gradient");
  }
  dlogits.reset();
  xn_full.reset();
  final_xn_.reset();
  if (!holds_tied_table()) {  // the head's AccumulateGrad, once its backward has released what it read
    sync();
    hooks.gradient_made(0, root.params[head_param(c)].offset);
  }
  if (sequence_parallel()) {  // the head's input gradient, a partial sum, reduce-scattered to the rank's rows
    Buffer mine = device_.allocate(R * size_t(c.hidden), options_.residual(), Category::kTemporaries,
                                   "d final norm output, the rank's rows");
    sync();
    tp_->reduce_scatter(dxn, mine, "tp reduce-scatter, lm_head input gradient");
    dxn = std::move(mine);
  } else if (tp_ != nullptr) {  // the vocabulary-parallel head's input gradient: a partial sum over the slices (f)
    sync();
    tp_->all_reduce(dxn, "tp all-reduce, lm_head input gradient");
  }
  dres_ = device_.allocate(R * size_t(c.hidden), options_.residual(), Category::kTemporaries, "d residual stream");
  if (math_) {
    F32 dx(ops_, dxn, Access::kRead), x(ops_, final_x_, Access::kRead), st(ops_, final_stats_, Access::kRead);
    F32 dres(ops_, dres_, Access::kReadWrite);
    if (llama) {
      const size_t n = root.params[kFinalNorm].offset;
      Scratch factor;
      ops_->rmsnorm_backward(dx, x, norm_weight(ops_, c, w + n, factor), st, dres, g + n, int64_t(R), c.hidden);
    } else {
      const size_t nw = root.params[kLnFWeight].offset, nb = root.params[kLnFBias].offset;
      ops_->layernorm_backward(dx, x, w + nw, st, st + T, dres, g + nw, g + nb, c.tokens(), c.hidden);
    }
  }
  final_x_.reset();
  final_stats_.reset();
  final_hat_.reset();
  final_plus_one_.reset();
  sync();
  if (llama) {
    hooks.gradient_made(0, root.params[kFinalNorm].offset);
  } else {
    hooks.gradient_made(0, root.params[kLnFWeight].offset);
    hooks.gradient_made(0, root.params[kLnFBias].offset);
  }
}

void Model::backward_block(int unit, Hooks& hooks) {
  PhaseScope phase(device_.memory(), fmt::format("backward, block {}", unit));
  sync();
  hooks.before_backward(unit);
  const float* w = weights_f32(unit, block_w_);
  float* g = zeroed_grads(unit, block_g_);
  BlockEnv env = block_env(unit);
  env.gradient_made = [&hooks, unit](size_t offset) { hooks.gradient_made(unit, offset); };
  BlockSaved& saved = saved_[static_cast<size_t>(unit - 1)];
  if (options_.checkpoint) {
    PhaseScope recompute(device_.memory(), fmt::format("backward, block {} (recomputing forward)", unit));
    Buffer x = std::move(saved.x);
    env.recomputing = true;
    block_forward(env, w, std::move(x), saved, Category::kActivations, Category::kTemporaries, true).reset();
    env.recomputing = false;
  }
  {
    F32 dres(ops_, dres_, Access::kReadWrite);
    block_backward(env, w, saved, dres, g);
  }
  flush_grads(unit, g);
  sync();
  hooks.after_backward(unit);
}

bool Model::holds_tied_table() const {
  return config_.tie_embeddings && first_block_ == 1 && last_block_ == config_.layers;
}

Buffer Model::tied_table_part(std::string_view what) const {
  const ParamInfo& table = layouts_[0].params[kEmbedTokens];
  const DType dtype = units_[0].grads_dtype;
  return device_.allocate(0, dtype, Category::kTemporaries, what, tensor_charge(config_, table) * dtype_size(dtype));
}

Buffer Model::backward_root_end() {
  const ModelConfig& c = config_;
  const UnitLayout& root = layouts_[0];
  // Sequence parallelism: the embedding's backward reads the gradient of every row (the reduce-scatter's backward).
  if (sequence_parallel()) dres_ = gather_rows(dres_, "d embedding output");
  if (math_) {
    F32 dres(ops_, dres_, Access::kReadWrite);
    if (c.gemma) ops_->scale(dres, embedding_scale(), size_t(c.tokens() * c.hidden));  // × √h's backward
    float* g = root_grads_;
    float* dpositions = c.style == Style::kGpt2 ? g + root.params[kWpe].offset : nullptr;
    if (dpositions != nullptr && tp_ != nullptr) {  // TP: wpe's gradient from every row, the same on every rank
      const size_t n = size_t(c.seq * c.hidden);
      for (int64_t b = 0; b < c.batch; ++b) ops_->accumulate(dpositions, dres + size_t(b) * n, n);
      dpositions = nullptr;
    }
    for (size_t t = 0; t < tp_outside_.size(); ++t) {  // TP: other ranks' tokens add nothing to this slice
      if (tp_outside_[t] != 0) ops_->fill_zero(dres + t * size_t(c.hidden), size_t(c.hidden) * sizeof(float));
    }
    ops_->embedding_backward(tokens_.as<int32_t>(), dres, g + root.params[kEmbedTokens].offset, dpositions, c.tokens(),
                             c.seq, c.hidden);
  }
  // A tied table's second part, made beside the residual's gradient it is computed from.
  Buffer embedding_part = tied_head_part_.allocated()
                              ? tied_table_part("autograd's embedding part of the tied table's gradient")
                              : Buffer();
  dres_.reset();
  tokens_.reset();
  rope_cos_.reset();
  rope_sin_.reset();
  return embedding_part;
}

}  // namespace emu::model
