#include "workloads/model/model.h"

#include <fmt/format.h>

#include <cstring>

#include "emu/check.h"
#include "workloads/model/kernels.h"
#include "workloads/model/tensor.h"

namespace emu::model {

using kernels::WeightLayout;
using Access = F32::Access;

Model::Model(Device& device, ModelConfig config, ModelOptions options)
    : device_(device), config_(std::move(config)), options_(options), math_(device.holds_data()) {
  config_.validate();
  layouts_ = build_layouts(config_);
  units_.resize(layouts_.size());
  saved_.resize(static_cast<size_t>(config_.layers));
}

Model::~Model() { discard(); }

const UnitLayout& Model::layout(int unit) const {
  EMU_CHECK(unit >= 0 && unit < num_units(), "unit {} is outside [0, {})", unit, num_units());
  return layouts_[static_cast<size_t>(unit)];
}

void Model::bind_weights(int unit, const void* weights) {
  layout(unit);
  units_[static_cast<size_t>(unit)].weights = weights;
}

void Model::bind_grads(int unit, void* grads) {
  layout(unit);
  units_[static_cast<size_t>(unit)].grads = grads;
}

void Model::init_unit(int unit, uint64_t seed, float* out) const {
  const UnitLayout& l = layout(unit);
  init_unit_range(l, unit, seed, 0, l.count, out);
}

const float* Model::weights_f32(int unit, std::vector<float>& scratch) const {
  if (!math_) return nullptr;
  const Unit& u = units_[static_cast<size_t>(unit)];
  EMU_CHECK(u.weights != nullptr, "no weights are bound to unit {} ({}); bind them before its before_ hook returns",
            unit, layout(unit).name);
  if (options_.compute == DType::kF32) return static_cast<const float*>(u.weights);
  scratch.resize(layout(unit).count);
  widen(u.weights, options_.compute, scratch.size(), scratch.data());
  return scratch.data();
}

void Model::flush_grads(int unit, std::vector<float>& grads) {
  if (!math_) return;
  const Unit& u = units_[static_cast<size_t>(unit)];
  EMU_CHECK(u.grads != nullptr, "no gradient buffer is bound to unit {} ({})", unit, layout(unit).name);
  accumulate_into(u.grads, options_.compute, grads.data(), grads.size());
}

BlockEnv Model::block_env(int unit) const {
  return BlockEnv{device_, config_, options_, layout(unit), unit, rope_cos_.as<float>(), rope_sin_.as<float>(), math_};
}

float Model::forward(const int32_t* tokens, const int32_t* targets, Hooks& hooks) {
  discard();
  MemoryPool& pool = device_.memory();
  {
    PhaseScope phase(pool, "forward, embedding");
    hooks.before_forward(0);
    root_weights_ = weights_f32(0, root_w_);
    forward_root_start(tokens);
  }
  for (int unit = 1; unit <= config_.layers; ++unit) {
    PhaseScope phase(pool, fmt::format("forward, block {}", unit));
    hooks.before_forward(unit);
    BlockSaved& saved = saved_[static_cast<size_t>(unit - 1)];
    const Category saved_category = options_.checkpoint ? Category::kTemporaries : Category::kActivations;
    Buffer out = block_forward(block_env(unit), weights_f32(unit, block_w_), std::move(final_x_), saved, saved_category,
                               Category::kActivations);
    if (options_.checkpoint) saved.release_all_but_input();
    final_x_ = std::move(out);
    hooks.after_forward(unit);
  }
  PhaseScope phase(pool, "loss");
  const float loss = forward_root_end(targets);
  hooks.after_forward(0);
  has_forward_ = true;
  return loss;
}

void Model::backward(Hooks& hooks) {
  EMU_CHECK(has_forward_, "backward needs a forward first");
  MemoryPool& pool = device_.memory();
  {
    PhaseScope phase(pool, "backward, head");
    hooks.before_backward(0);
    root_weights_ = weights_f32(0, root_w_);
    if (math_) root_g_.assign(layouts_[0].count, 0.0f);
    backward_root_start();
  }
  for (int unit = config_.layers; unit >= 1; --unit) backward_block(unit, hooks);
  PhaseScope phase(pool, "backward, embedding");
  backward_root_end();
  flush_grads(0, root_g_);
  has_forward_ = false;
  hooks.after_backward(0);
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
  final_xn_.reset();
  logits_.reset();
  dres_.reset();
  tokens_.reset();
  rope_cos_.reset();
  rope_sin_.reset();
  has_forward_ = false;
}

void Model::forward_root_start(const int32_t* tokens) {
  const ModelConfig& c = config_;
  const UnitLayout& root = layouts_[0];
  const size_t T = size_t(c.tokens());
  tokens_ = device_.allocate(T, DType::kF32, Category::kActivations, "token ids");
  if (math_) std::memcpy(tokens_.data(), tokens, T * sizeof(int32_t));
  if (c.style == Style::kLlama) {
    const size_t half = size_t(c.head_dim() / 2);
    rope_cos_ = device_.allocate(size_t(c.seq) * half, DType::kF32, Category::kTemporaries, "rotary cos table");
    rope_sin_ = device_.allocate(size_t(c.seq) * half, DType::kF32, Category::kTemporaries, "rotary sin table");
    if (math_) kernels::rope_tables(c.seq, c.head_dim(), c.rope_theta, rope_cos_.as<float>(), rope_sin_.as<float>());
  }
  final_x_ = device_.allocate(T * size_t(c.hidden), options_.compute, Category::kActivations, "embedding output");
  if (!math_) return;
  const float* table = root_weights_ + root.params[kEmbedTokens].offset;  // kWte for GPT-2: same position
  const float* positions = c.style == Style::kGpt2 ? root_weights_ + root.params[kWpe].offset : nullptr;
  F32 x(final_x_, Access::kWrite);
  kernels::embedding_forward(tokens, table, positions, x, c.tokens(), c.seq, c.hidden);
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
  const size_t T = size_t(c.tokens());
  final_stats_ = device_.allocate(llama ? T : 2 * T, DType::kF32, Category::kActivations, "final norm statistics");
  final_xn_ = device_.allocate(T * size_t(c.hidden), options_.compute, Category::kActivations, "final norm output");
  logits_ = device_.allocate(T * size_t(c.vocab), DType::kF32, Category::kActivations, "logits");
  if (!math_) return 0;
  const float* w = root_weights_;
  const float eps = static_cast<float>(c.norm_eps);
  F32 x(final_x_, Access::kRead), st(final_stats_, Access::kWrite), xn(final_xn_, Access::kWrite);
  if (llama) {
    kernels::rmsnorm_forward(x, w + root.params[kFinalNorm].offset, xn, st, c.tokens(), c.hidden, eps);
  } else {
    kernels::layernorm_forward(x, w + root.params[kLnFWeight].offset, w + root.params[kLnFBias].offset, xn, st, st + T,
                               c.tokens(), c.hidden, eps);
  }
  float* logits = logits_.as<float>();
  kernels::linear_forward(xn, w + root.params[head_param(c)].offset, nullptr, logits, c.tokens(), c.hidden, c.vocab,
                          WeightLayout::kOutIn);
  const double sum = kernels::cross_entropy(logits, targets, c.tokens(), c.vocab, 1.0f / float(T));
  return static_cast<float>(sum / double(T));
}

void Model::backward_root_start() {
  const ModelConfig& c = config_;
  const UnitLayout& root = layouts_[0];
  const bool llama = c.style == Style::kLlama;
  const size_t T = size_t(c.tokens());
  const float* w = root_weights_;
  float* g = root_g_.data();
  Buffer dxn = device_.allocate(T * size_t(c.hidden), options_.compute, Category::kTemporaries, "d final norm output");
  if (math_) {
    F32 xn(final_xn_, Access::kRead), dx(dxn, Access::kWrite);
    const size_t head = root.params[head_param(c)].offset;
    kernels::linear_backward(xn, w + head, logits_.as<float>(), dx, g + head, nullptr, c.tokens(), c.hidden, c.vocab,
                             WeightLayout::kOutIn, false);
  }
  logits_.reset();
  final_xn_.reset();
  dres_ = device_.allocate(T * size_t(c.hidden), options_.compute, Category::kTemporaries, "d residual stream");
  if (math_) {
    F32 dx(dxn, Access::kRead), x(final_x_, Access::kRead), st(final_stats_, Access::kRead);
    F32 dres(dres_, Access::kReadWrite);
    if (llama) {
      const size_t n = root.params[kFinalNorm].offset;
      kernels::rmsnorm_backward(dx, x, w + n, st, dres, g + n, c.tokens(), c.hidden);
    } else {
      const size_t nw = root.params[kLnFWeight].offset, nb = root.params[kLnFBias].offset;
      kernels::layernorm_backward(dx, x, w + nw, st, st + T, dres, g + nw, g + nb, c.tokens(), c.hidden);
    }
  }
  final_x_.reset();
  final_stats_.reset();
}

void Model::backward_block(int unit, Hooks& hooks) {
  PhaseScope phase(device_.memory(), fmt::format("backward, block {}", unit));
  hooks.before_backward(unit);
  const float* w = weights_f32(unit, block_w_);
  if (math_) block_g_.assign(layout(unit).count, 0.0f);
  const BlockEnv env = block_env(unit);
  BlockSaved& saved = saved_[static_cast<size_t>(unit - 1)];
  if (options_.checkpoint) {
    PhaseScope recompute(device_.memory(), fmt::format("backward, block {} (recomputing forward)", unit));
    Buffer x = std::move(saved.x);
    block_forward(env, w, std::move(x), saved, Category::kActivations, Category::kTemporaries).reset();
  }
  {
    F32 dres(dres_, Access::kReadWrite);
    block_backward(env, w, saved, dres, block_g_.data());
  }
  flush_grads(unit, block_g_);
  hooks.after_backward(unit);
}

void Model::backward_root_end() {
  const ModelConfig& c = config_;
  const UnitLayout& root = layouts_[0];
  if (math_) {
    F32 dres(dres_, Access::kRead);
    float* g = root_g_.data();
    float* dpositions = c.style == Style::kGpt2 ? g + root.params[kWpe].offset : nullptr;
    kernels::embedding_backward(tokens_.as<int32_t>(), dres, g + root.params[kEmbedTokens].offset, dpositions,
                                c.tokens(), c.seq, c.hidden);
  }
  dres_.reset();
  tokens_.reset();
  rope_cos_.reset();
  rope_sin_.reset();
}

}  // namespace emu::model
