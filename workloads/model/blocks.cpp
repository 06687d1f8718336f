#include "workloads/model/blocks.h"

#include <fmt/format.h>

#include <cmath>
#include <initializer_list>

#include "emu/check.h"
#include "workloads/model/shrink.h"
#include "workloads/model/tensor.h"
#include "workloads/model/tensor_parallel.h"

namespace emu::model {

using Access = F32::Access;

namespace {

// "block <unit> <what>", formatted into the stack: a tensor's name is read only by an out-of-memory report, and a
// plan names millions of them.
class BlockName {
 public:
  BlockName(int unit, std::string_view what) { fmt::format_to(std::back_inserter(text_), "block {} {}", unit, what); }
  operator std::string_view() const { return {text_.data(), text_.size()}; }  // NOLINT(google-explicit-constructor)

 private:
  fmt::memory_buffer text_;
};

}  // namespace

Buffer BlockEnv::allocate(size_t count, DType dtype, Category category, std::string_view what) const {
  return device.allocate(count, dtype, category, BlockName(unit, what));
}

Buffer BlockEnv::hold(size_t count, DType dtype, Category category, std::string_view what) const {
  return device.allocate(0, dtype, category, BlockName(unit, what), count * dtype_size(dtype));
}

Buffer BlockEnv::allocate_per_row(size_t count, DType dtype, Category category, std::string_view what) const {
  return model::allocate_per_row(device, config, count, dtype, category, BlockName(unit, what));
}

void BlockEnv::made(std::initializer_list<size_t> offsets) const {
  if (!gradient_made) return;
  for (size_t offset : offsets) gradient_made(offset);
}

void BlockEnv::tp_all_reduce(Buffer& partial, std::string_view what) const {
  if (tp == nullptr) return;
  if (math) ops->synchronize();
  tp->all_reduce(partial, fmt::format("{} (block {})", what, unit));
}

bool BlockEnv::sequence_parallel() const { return tp != nullptr && options.sequence_parallel; }

int64_t BlockEnv::rows() const { return sequence_parallel() ? config.tokens() / tp->size() : config.tokens(); }

void BlockSaved::release_all_but_input() {
  const auto reset = [](std::initializer_list<Buffer*> buffers) {
    for (Buffer* b : buffers) b->reset();
  };
  reset({&x32, &norm1_stats, &norm1_hat, &norm1_plus_one, &xn1, &xn1_casts});
  reset({&q, &k, &v, &qkv, &probs, &probs_copy, &lse, &attn});
  reset({&x2, &x2_32, &norm2_stats, &norm2_hat, &norm2_plus_one, &xn2, &xn2_casts});
  reset({&gate, &up, &silu, &fc, &gelu_tanh, &gelu_half, &gelu_sum, &act});
  reset({&softcap_tanh, &attn_o, &attn_o32, &norm3_stats, &norm3_hat, &norm3_plus_one});
  reset({&mlp_o, &mlp_o32, &norm4_stats, &norm4_hat, &norm4_plus_one});
}

const float* norm_weight(Ops* ops, const ModelConfig& config, const float* w, Scratch& scratch) {
  if (!config.gemma || ops == nullptr) return w;
  const size_t h = size_t(config.hidden);
  float* out = scratch.reserve_as<float>(*ops, 2 * h, false);  // [h] 1 + w, then [h] ones
  const std::vector<float> ones(h, 1.0f);
  ops->copy_from_host(out + h, ones.data(), h * sizeof(float));
  ops->add(w, out + h, out, h);
  return out;
}

namespace {

// A parameter's place in the flat weights or gradients; null when the device holds no data (shapes only), where
// null plus an offset would be undefined.
template <typename T>
T* offset_into(T* base, size_t offset) {
  return base == nullptr ? nullptr : base + offset;
}

struct Dims {
  int64_t T, h, kvd, F, b, s, a, qd;
  size_t th() const { return size_t(T * h); }
  size_t tf() const { return size_t(T * F); }
  size_t tq() const { return size_t(T * qd); }  // q and the attention output: [T, a·d]
};

Dims dims(const ModelConfig& c) {
  return {c.tokens(), c.hidden, c.kv_dim(), c.ffn, c.batch, c.seq, c.heads, c.q_dim()};
}

// Gemma 2 scales the scores by query_pre_attn_scalar^−½ and soft-caps them; every other model by d^−½, uncapped.
AttentionShape attention_shape(const ModelConfig& c) {
  const float scale = c.query_scale != 0 ? static_cast<float>(1 / std::sqrt(c.query_scale)) : 0.0f;
  return {c.batch, c.seq, c.heads, c.kv_heads, c.head_dim(), 0, 0, scale, static_cast<float>(c.attn_softcap)};
}

bool eager(const BlockEnv& env) { return env.options.attention == Attention::kEager; }

// Rows of the logsumexp per (sequence, head): s, or for SDPA in fp32, which a GPU runs with the memory-efficient
// kernel, s rounded up to a multiple of 32 (PyTorch aten/src/ATen/native/transformers/cuda/attention.cu,
// _efficient_attention_forward: logsumexp [B, heads, ceil(M/32)·32]).
int64_t logsumexp_rows(const BlockEnv& env) {
  const int64_t s = env.config.seq;
  if (env.options.attention == Attention::kSdpa && env.options.compute == DType::kF32) return (s + 31) / 32 * 32;
  return s;
}

// Llama's eager attention takes its softmax in fp32 (softmax(dtype=float32)) and multiplies V by a copy at the
// compute dtype; GPT-2's takes it at the scores' dtype, and .type(value.dtype) is then a no-op, except under
// autocast, where its fp32 causal mask (made at the fp32 embeddings' dtype) promotes the bf16 scores to fp32.
bool fp32_softmax(const BlockEnv& env) { return env.config.style == Style::kLlama || env.options.autocast; }
bool fp32_softmax_copy(const BlockEnv& env) { return fp32_softmax(env) && env.options.compute != DType::kF32; }
DType softmax_dtype(const BlockEnv& env) { return fp32_softmax(env) ? DType::kF32 : env.options.compute; }
size_t score_count(const ModelConfig& c) { return size_t(c.batch * c.heads * c.seq * c.seq); }

// Columns of the saved k and v: eager attention under grouped-query attention saves repeat_kv's copies [T, h];
// SDPA (enable_gqa when there is no mask, transformers integrations/sdpa_attention.py use_gqa_in_sdpa) and flash
// attention read the kv heads directly.
int64_t saved_kv_columns(const BlockEnv& env) {
  const ModelConfig& c = env.config;
  return eager(env) && c.kv_heads < c.heads ? c.q_dim() : c.kv_dim();
}

// Selective recomputation (ModelOptions::selective_recompute; Megatron-LM --recompute-granularity selective,
// transformer/attention.py _checkpointed_attention_forward): the attention core saves nothing for backward, which
// runs it again. Under full checkpointing the whole block is recomputed anyway.
bool selective(const BlockEnv& env) { return env.options.selective_recompute && !env.options.checkpoint; }

// The attention core on q, k, v, shared by both styles: saves the softmax or the logsumexp, writes attn.
// Eager holds, while its softmax runs, the scores at the compute dtype (q·kᵀ, then scaled and masked, each
// replacing the last) and, for Llama at e = 2, their fp32 conversion. Under selective recomputation (and not
// `recomputing`, the run in backward that makes them for the core's backward) what it saves is released at once.
void attention_forward(const BlockEnv& env, const AttentionShape& shape, BlockSaved& s, const float* q, const float* k,
                       const float* v, Category output_category, bool recomputing = false) {
  const ModelConfig& c = env.config;
  const DType dt = env.options.compute;
  const bool drop = selective(env) && !recomputing;
  const Category category = drop || recomputing ? Category::kTemporaries : output_category;
  Buffer scores, converted;
  if (eager(env)) {
    scores = env.allocate(score_count(c), dt, Category::kTemporaries, "attention scores");
    if (c.attn_softcap != 0) {  // Gemma 2: tanh(scores / cap), its output saved for backward
      s.softcap_tanh = env.allocate(score_count(c), dt, category, "attention scores soft-capping tanh");
    }
    if (fp32_softmax_copy(env)) {
      converted = env.allocate(score_count(c), DType::kF32, Category::kTemporaries, "attention scores in fp32");
    }
    s.probs = env.allocate(score_count(c), softmax_dtype(env), category, "attention softmax");
  } else {
    s.lse = env.allocate_per_row(size_t(c.batch * c.heads) * size_t(logsumexp_rows(env)), DType::kF32, category,
                                 "attention logsumexp");
  }
  s.attn = env.allocate(size_t(c.tokens() * c.q_dim()), dt, recomputing ? Category::kTemporaries : output_category,
                        recomputing ? "attention output (recomputed)" : "attention output");
  if (env.math) {
    F32 attn(env.ops, s.attn, Access::kWrite);
    if (eager(env)) {
      F32 probs(env.ops, s.probs, Access::kWrite);
      env.ops->attention_forward_classic(shape, q, k, v, probs, attn);
    } else {
      F32 lse(env.ops, s.lse, Access::kWrite);
      env.ops->attention_forward_flash(shape, q, k, v, attn, lse);
    }
  }
  converted.reset();
  if (eager(env) && fp32_softmax_copy(env)) {
    s.probs_copy = env.allocate(score_count(c), dt, category, "attention softmax at the compute dtype");
  }
  if (drop) {
    for (Buffer* b : {&s.probs, &s.probs_copy, &s.lse, &s.softcap_tanh}) b->reset();
  }
}

// Fills dq, dk, dv (strided as `shape` says) from dattn; releases the softmax or lse and attn. Eager backward
// holds the softmax's gradient (at the compute dtype, then in fp32 for Llama at e = 2) and the scores' gradient
// (in the softmax's dtype) beside the saved fp32 softmax while softmax's backward runs.
void attention_backward(const BlockEnv& env, const AttentionShape& shape, BlockSaved& s, const float* q, const float* k,
                        const float* v, const float* dattn, float* dq, float* dk, float* dv) {
  const ModelConfig& c = env.config;
  const DType dt = env.options.compute;
  // Selective recomputation: the core runs again from the saved q, k, v; its output (a new tensor: o_proj's saved
  // input stays as it was until this backward ends) and what it saves are held for the core's backward only.
  Buffer output_saved;
  if (selective(env)) {
    output_saved = std::move(s.attn);
    attention_forward(env, shape, s, q, k, v, Category::kTemporaries, true);
  }
  if (eager(env)) {
    Buffer dprobs = env.allocate(score_count(c), dt, Category::kTemporaries, "attention softmax gradient");
    s.probs_copy.reset();
    if (fp32_softmax_copy(env)) {
      Buffer wide =
          env.allocate(score_count(c), DType::kF32, Category::kTemporaries, "attention softmax gradient, fp32");
      dprobs = std::move(wide);
    }
    Buffer dscores =
        env.allocate(score_count(c), softmax_dtype(env), Category::kTemporaries, "attention score gradients");
    if (env.math) {
      F32 probs(env.ops, s.probs, Access::kRead), attn(env.ops, s.attn, Access::kRead),
          ds(env.ops, dscores, Access::kWrite);
      env.ops->attention_backward_classic(shape, q, k, v, probs, attn, dattn, dq, dk, dv, ds);
    }
    s.probs.reset();
    dprobs.reset();
    if (fp32_softmax_copy(env)) {  // .float()'s backward: the score gradient back at the compute dtype
      Buffer narrow = env.allocate(score_count(c), dt, Category::kTemporaries, "attention score gradients");
      dscores = std::move(narrow);
    }
    if (c.attn_softcap != 0) {  // tanh's backward, from its saved output: the gradient of the scores before capping
      Buffer uncapped =
          env.allocate(score_count(c), dt, Category::kTemporaries, "attention score gradients before soft-capping");
      s.softcap_tanh.reset();
      dscores = std::move(uncapped);
    }
  } else if (env.math) {
    F32 lse(env.ops, s.lse, Access::kRead), attn(env.ops, s.attn, Access::kRead);
    env.ops->attention_backward_flash(shape, q, k, v, attn, lse, dattn, dq, dk, dv);
  }
  s.lse.reset();
  s.attn.reset();
  output_saved.reset();
}

// Under autocast a norm's output is fp32 (`wide`, held by the layer until its sublayer returns, saved by none) and
// each linear reading it saves its own cast at the compute dtype (autocast caches casts of leaf parameters only):
// `out` is the first one's, the caller allocates the others. Elsewhere `out` is the output itself and `wide` stays
// unallocated.
void allocate_norm_output(const BlockEnv& env, size_t n, Buffer& out, Buffer& wide, Category cat,
                          std::string_view name) {
  if (env.options.autocast) {
    wide = env.allocate(n, DType::kF32, Category::kTemporaries, fmt::format("{} output in fp32", name));
    out = env.allocate(n, env.options.compute, cat, fmt::format("{} output cast by autocast", name));
  } else {
    out = env.allocate(n, env.options.compute, cat, fmt::format("{} output", name));
  }
}

// The further casts of a norm's output that `linears` more linear layers save under autocast (none otherwise).
Buffer norm_output_casts(const BlockEnv& env, int64_t linears, Category cat, std::string_view what) {
  if (!env.options.autocast || linears == 0) return {};
  return env.allocate(size_t(linears * env.config.tokens() * env.config.hidden), env.options.compute, cat, what);
}

// LlamaRMSNorm.forward on `in` [T, h]: saves its input in fp32 (`in32`, a copy, when `in` is bf16; `in` itself when
// fp32: in fp32 and under autocast), rstd, the normalised tensor at the input's dtype and writes the output.
// GemmaRMSNorm.forward keeps the same but the normalised tensor in fp32 (it multiplies before casting back), and
// (1 + weight) in fp32 [h] (`plus_one`, ∝ h, charged as a per-row term).
void rms_norm_forward(const BlockEnv& env, const float* w, const Buffer& in, Buffer& in32, Buffer& rstd, Buffer& hat,
                      Buffer& plus_one, Buffer& out, Buffer& wide, Category cat, std::string_view name) {
  const ModelConfig& c = env.config;
  const bool narrow = in.dtype() != DType::kF32;
  const int64_t rows = env.rows();  // T, or T/t under sequence parallelism
  const size_t n = size_t(rows * c.hidden);
  if (narrow) in32 = env.allocate(n, DType::kF32, cat, fmt::format("{} input in fp32", name));
  rstd = env.allocate_per_row(size_t(rows), DType::kF32, cat, fmt::format("{} rstd", name));
  hat = env.allocate(n, c.gemma ? DType::kF32 : in.dtype(), cat, fmt::format("{} normalised input", name));
  if (c.gemma) {
    plus_one = env.allocate_per_row(size_t(c.hidden), DType::kF32, cat, fmt::format("{} (1 + weight)", name));
  }
  allocate_norm_output(env, n, out, wide, cat, name);
  if (!env.math) return;
  if (narrow) env.ops->bf16_to_f32(in.as<uint16_t>(), in32.as<float>(), n);
  Scratch factor;
  F32 x(env.ops, narrow ? in32 : in, Access::kRead), st(env.ops, rstd, Access::kWrite), y(env.ops, out, Access::kWrite);
  env.ops->rmsnorm_forward(x, norm_weight(env.ops, c, w, factor), y, st, rows, c.hidden,
                           static_cast<float>(c.norm_eps));
}

// Gemma2RMSNorm.forward on a sublayer's output `o` [T, h] at the compute dtype (the o_proj or down_proj output), as
// rms_norm_forward saves it: its fp32 copy (`o32`, when o is bf16), rstd, the fp32 normalised tensor and (1 + w).
// Its output is cast back to o's dtype (type_as), not to autocast's: under autocast too it is `out` at the compute
// dtype, made from an fp32 product (`wide`, dropped once cast) and saved by none; the residual add promotes it to
// the fp32 stream.
void sandwich_norm_forward(const BlockEnv& env, const float* w, const Buffer& o, Buffer& o32, Buffer& rstd, Buffer& hat,
                           Buffer& plus_one, Buffer& out, Category cat, std::string_view name) {
  Buffer wide;
  rms_norm_forward(env, w, o, o32, rstd, hat, plus_one, out, wide, cat, name);
}

// Backward of a Gemma 2 norm on a sublayer's output (y = norm(o), added to the residual): from dres, the gradient of
// the residual after the add, the gradient of o, charged [T, h] at the compute dtype (returned) and computed in fp32
// into `math` (zeroed first: rmsnorm_backward accumulates); the norm weight's gradient accumulated into `dw`.
Buffer sandwich_norm_backward(const BlockEnv& env, const float* w, float* dw, const float* dres, const Buffer& o,
                              const Buffer& o32, const Buffer& stats, Scratch& math, const float*& dx_math,
                              std::string_view what) {
  const ModelConfig& c = env.config;
  const DType dt = env.options.compute;
  const size_t n = size_t(c.tokens() * c.hidden);
  Buffer grad = env.allocate(n, dt, Category::kTemporaries, what);
  if (env.math) {
    float* dx = math.reserve_as<float>(*env.ops, n, true);
    dx_math = dx;
    F32 x(env.ops, dt != DType::kF32 ? o32 : o, Access::kRead), st(env.ops, stats, Access::kRead);
    Scratch factor;
    env.ops->rmsnorm_backward(dres, x, norm_weight(env.ops, c, w, factor), st, dx, dw, c.tokens(), c.hidden);
  }
  return grad;
}

// Sequence parallelism (tensor_parallel.h): `slice` [T/t, h] all-gathered into a new [T, h] temporary at its dtype,
// what a column-parallel layer reads (Megatron's gather_from_sequence_parallel_region); empty without it.
Buffer gather_rows(const BlockEnv& env, const Buffer& slice, std::string_view what) {
  if (!env.sequence_parallel()) return {};
  Buffer full = env.allocate(size_t(env.config.tokens() * env.config.hidden), slice.dtype(), Category::kTemporaries,
                             fmt::format("{} all-gathered", what));
  if (env.math) env.ops->synchronize();
  env.tp->all_gather(slice, full, fmt::format("tp all-gather, {} (block {})", what, env.unit));
  return full;
}

// Sequence parallelism: the partial sums `full` [T, h] reduce-scattered into this rank's rows `slice` [T/t, h].
void scatter_rows(const BlockEnv& env, const Buffer& full, Buffer& slice, std::string_view what) {
  if (env.math) env.ops->synchronize();
  env.tp->reduce_scatter(full, slice, fmt::format("tp reduce-scatter, {} (block {})", what, env.unit));
}

// Sequence parallelism: the gradient of the rank's rows of the residual stream, `dres` [T/t, h] (emu's fp32 math),
// all-gathered for a row-parallel layer's backward (the reduce-scatter's backward): `charged` [T, h] at the residual
// dtype is what autograd holds, `math` its values in fp32, returned (null on a shapes-only device).
const float* gather_gradient(const BlockEnv& env, const float* dres, Buffer& charged, Scratch& math,
                             std::string_view what) {
  const DType dtype = env.options.residual();
  const size_t local = size_t(env.rows() * env.config.hidden), n = size_t(env.config.tokens() * env.config.hidden);
  // The rank's rows at the residual dtype, the tensor the charged gradient already is (charged nothing here).
  Buffer mine = env.device.allocate(local, dtype, Category::kTemporaries, "d residual rows (emu's math)", 0);
  if (env.math) {
    if (dtype == DType::kF32) {
      env.ops->fill_zero(mine.data(), local * sizeof(float));
      env.ops->accumulate(mine.as<float>(), dres, local);
    } else {
      env.ops->f32_to_bf16(dres, mine.as<uint16_t>(), local);
    }
  }
  charged = gather_rows(env, mine, what);
  if (!env.math) return nullptr;
  float* out = math.reserve_as<float>(*env.ops, n, dtype == DType::kF32);
  if (dtype == DType::kF32) {
    env.ops->accumulate(out, charged.as<float>(), n);
  } else {
    env.ops->bf16_to_f32(charged.as<uint16_t>(), out, n);
  }
  return out;
}

// A row-parallel projection [T, k] → [T, h]: its weight (`layout`: Llama's Linear or GPT-2's Conv1D) and its bias
// [h] (GPT-2's c_proj; null for Llama).
struct RowParallel {
  const float* w = nullptr;
  const float* bias = nullptr;
  WeightLayout layout = WeightLayout::kOutIn;
  int64_t k = 0;
};

// out [rows, h] += bias [h] on every row, then += residual: what a row-parallel layer adds after its reduction.
void add_bias_and_residual(const BlockEnv& env, const float* bias, const Buffer& residual, Buffer& out, int64_t rows) {
  if (!env.math) return;
  const int64_t h = env.config.hidden;
  F32 r(env.ops, residual, Access::kRead), o(env.ops, out, Access::kReadWrite);
  if (bias != nullptr) {
    for (int64_t t = 0; t < rows; ++t) env.ops->accumulate(o + t * h, bias, size_t(h));
  }
  env.ops->accumulate(o, r, size_t(rows * h));
}

// out = in·W (+ bias) + residual for a projection [T, k] → [T, h] written straight into the residual stream. Under
// TP it is row-parallel: the product is a partial sum, all-reduced at out's dtype; then the bias (whole on every
// rank, Megatron's RowParallelLinear adds it to the reduced output, once) and the residual are added.
// Under sequence parallelism the partial sum [T, h] is a temporary, reduce-scattered into out [T/t, h] (Megatron's
// reduce_scatter_to_sequence_parallel_region), and the residual is the rank's rows.
void row_parallel_add(const BlockEnv& env, const Buffer& in, const RowParallel& proj, const Buffer& residual,
                      Buffer& out, std::string_view what) {
  const int64_t T = env.config.tokens(), h = env.config.hidden;
  const size_t n = size_t(T * h);
  if (env.sequence_parallel()) {
    Buffer partial = env.allocate(n, out.dtype(), Category::kTemporaries, fmt::format("{} partial sum", what));
    if (env.math) {
      F32 a(env.ops, in, Access::kRead), p(env.ops, partial, Access::kWrite);
      env.ops->linear_forward(a, proj.w, nullptr, p, T, proj.k, h, proj.layout);
    }
    scatter_rows(env, partial, out, what);
    partial.reset();
    add_bias_and_residual(env, proj.bias, residual, out, env.rows());
    return;
  }
  if (env.tp == nullptr) {
    if (env.math) {
      F32 a(env.ops, in, Access::kRead), r(env.ops, residual, Access::kRead), o(env.ops, out, Access::kWrite);
      env.ops->linear_forward(a, proj.w, proj.bias, o, T, proj.k, h, proj.layout);
      env.ops->accumulate(o, r, n);
    }
    return;
  }
  if (env.math) {
    F32 a(env.ops, in, Access::kRead), o(env.ops, out, Access::kWrite);
    env.ops->linear_forward(a, proj.w, nullptr, o, T, proj.k, h, proj.layout);
  }
  env.tp_all_reduce(out, fmt::format("tp all-reduce, {}", what));
  add_bias_and_residual(env, proj.bias, residual, out, T);
}

// The gradient of a column-parallel layer's input, `dx` [T, h], a partial sum over the TP group (Megatron's f):
// all-reduced in place, or under sequence parallelism reduce-scattered into a new [T/t, h] that replaces it.
void column_input_gradient(const BlockEnv& env, Buffer& dx, std::string_view what) {
  if (!env.sequence_parallel()) {
    env.tp_all_reduce(dx, fmt::format("tp all-reduce, {}", what));
    return;
  }
  Buffer rows = env.allocate(size_t(env.rows() * env.config.hidden), dx.dtype(), Category::kTemporaries,
                             fmt::format("{}, the rank's rows", what));
  scatter_rows(env, dx, rows, what);
  dx = std::move(rows);
}

Buffer llama_forward(const BlockEnv& env, const float* w, BlockSaved& s, Category cat, Category out_cat,
                     bool keep_input) {
  const ModelConfig& c = env.config;
  const Dims d = dims(c);
  const DType dt = env.options.compute;
  const LlamaBlockOffsets off = llama_block_offsets(c, env.layout);
  auto W = [&](size_t offset) { return offset_into(w, offset); };
  auto B = [&](size_t offset) { return off.bias ? offset_into(w, offset) : nullptr; };
  const int64_t kv_cols = saved_kv_columns(env);
  // Under autocast: the linears after each norm beyond the first, each saving its own cast of the norm's output.
  const int64_t attention_linears = c.fused_projections ? 0 : 2, mlp_linears = c.fused_projections ? 0 : 1;

  Buffer wide;  // under autocast, input_layernorm's fp32 output: held until the attention returns
  rms_norm_forward(env, W(off.input_norm), s.x, s.x32, s.norm1_stats, s.norm1_hat, s.norm1_plus_one, s.xn1, wide, cat,
                   "input_layernorm");
  s.xn1_casts = norm_output_casts(env, attention_linears, cat, "k_proj and v_proj inputs cast by autocast");
  // Sequence parallelism: q, k and v read the norm's output all-gathered; its slice is what stays saved.
  Buffer xn1_full = gather_rows(env, s.xn1, "input_layernorm output");
  s.q = env.allocate(d.tq(), dt, cat, "q");
  s.k = env.allocate(size_t(d.T * kv_cols), dt, cat, kv_cols == d.kvd ? "k" : "k (repeat_kv copy)");
  s.v = env.allocate(size_t(d.T * kv_cols), dt, cat, kv_cols == d.kvd ? "v" : "v (repeat_kv copy)");
  if (env.math) {
    F32 xn(env.ops, xn1_full.allocated() ? xn1_full : s.xn1, Access::kRead);
    F32 q(env.ops, s.q, Access::kWrite), k(env.ops, s.k, Access::kWrite), v(env.ops, s.v, Access::kWrite);
    env.ops->linear_forward(xn, W(off.q), B(off.q_bias), q, d.T, d.h, d.qd, WeightLayout::kOutIn);
    env.ops->linear_forward(xn, W(off.k), B(off.k_bias), k, d.T, d.h, d.kvd, WeightLayout::kOutIn);
    env.ops->linear_forward(xn, W(off.v), B(off.v_bias), v, d.T, d.h, d.kvd, WeightLayout::kOutIn);
    env.ops->rope_apply(q, env.rope_cos, env.rope_sin, d.T, d.s, c.heads, c.head_dim(), c.rotary_dim(), false);
    env.ops->rope_apply(k, env.rope_cos, env.rope_sin, d.T, d.s, c.kv_heads, c.head_dim(), c.rotary_dim(), false);
  }
  xn1_full.reset();
  {
    F32 q(env.ops, s.q, Access::kRead), k(env.ops, s.k, Access::kRead), v(env.ops, s.v, Access::kRead);
    attention_forward(env, attention_shape(c), s, q, k, v, cat);
  }
  if (off.sandwich) {
    // Gemma 2: x2 = x + post_attention_layernorm(attn·Woᵀ). The norm saves as every Gemma norm does; at e = 2 the
    // projection itself goes once its fp32 copy exists, and the norm's output once it is added. Under autocast
    // input_layernorm's fp32 output goes when the attention returns, before this norm runs.
    s.attn_o = env.allocate(d.th(), dt, cat, "o_proj output");
    if (env.math) {
      F32 attn(env.ops, s.attn, Access::kRead), o(env.ops, s.attn_o, Access::kWrite);
      env.ops->linear_forward(attn, W(off.o), nullptr, o, d.T, d.qd, d.h, WeightLayout::kOutIn);
    }
    env.tp_all_reduce(s.attn_o, "tp all-reduce, o_proj output");
    wide.reset();
    Buffer normed;
    sandwich_norm_forward(env, W(off.attn_out_norm), s.attn_o, s.attn_o32, s.norm3_stats, s.norm3_hat, s.norm3_plus_one,
                          normed, cat, "post_attention_layernorm");
    if (dt != DType::kF32) s.attn_o.reset();
    // x + the norm's output at o_proj's dtype: type promotion gives the stream's dtype (fp32 under autocast).
    const DType promoted = env.options.residual();
    s.x2 = env.allocate(d.th(), promoted, cat, "residual after attention");
    if (env.math) {
      F32 n(env.ops, normed, Access::kRead), x(env.ops, s.x, Access::kRead), x2(env.ops, s.x2, Access::kWrite);
      env.ops->add(n, x, x2, d.th());
    }
  } else {
    // x2 = x + attn·Woᵀ: the projection is written straight into the residual stream.
    s.x2 = env.allocate(size_t(env.rows() * d.h), env.options.residual(), cat, "residual after attention");
    row_parallel_add(env, s.attn, {W(off.o), nullptr, WeightLayout::kOutIn, d.qd}, s.x, s.x2, "o_proj output");
  }
  wide.reset();
  rms_norm_forward(env, W(off.post_norm), s.x2, s.x2_32, s.norm2_stats, s.norm2_hat, s.norm2_plus_one, s.xn2, wide, cat,
                   off.sandwich ? "pre_feedforward_layernorm" : "post_attention_layernorm");
  s.xn2_casts = norm_output_casts(env, mlp_linears, cat, "up_proj input cast by autocast");
  Buffer xn2_full = gather_rows(env, s.xn2, "post_attention_layernorm output");
  s.gate = env.allocate(d.tf(), dt, cat, "gate_proj output");
  s.silu = env.allocate(d.tf(), dt, cat, c.gemma ? "gelu(gate)" : "silu(gate)");
  s.up = env.allocate(d.tf(), dt, cat, "up_proj output");
  s.act = env.allocate(d.tf(), dt, cat, "silu(gate)·up");
  if (env.math) {
    F32 xn(env.ops, xn2_full.allocated() ? xn2_full : s.xn2, Access::kRead), g(env.ops, s.gate, Access::kWrite),
        u(env.ops, s.up, Access::kWrite), a(env.ops, s.act, Access::kWrite);
    env.ops->linear_forward(xn, W(off.gate), nullptr, g, d.T, d.h, d.F, WeightLayout::kOutIn);
    env.ops->linear_forward(xn, W(off.up), nullptr, u, d.T, d.h, d.F, WeightLayout::kOutIn);
    if (c.gemma) {
      env.ops->geglu_forward(g, u, a, d.tf());
    } else {
      env.ops->swiglu_forward(g, u, a, d.tf());
    }
  }
  xn2_full.reset();
  Buffer out;
  if (off.sandwich) {  // Gemma 2: out = x2 + post_feedforward_layernorm(down(...)), saved as after attention
    s.mlp_o = env.allocate(d.th(), dt, cat, "down_proj output");
    if (env.math) {
      F32 a(env.ops, s.act, Access::kRead), m(env.ops, s.mlp_o, Access::kWrite);
      env.ops->linear_forward(a, W(off.down), nullptr, m, d.T, d.F, d.h, WeightLayout::kOutIn);
    }
    env.tp_all_reduce(s.mlp_o, "tp all-reduce, down_proj output");
    wide.reset();  // under autocast, pre_feedforward_layernorm's fp32 output: the MLP has returned
    Buffer normed;
    sandwich_norm_forward(env, W(off.mlp_out_norm), s.mlp_o, s.mlp_o32, s.norm4_stats, s.norm4_hat, s.norm4_plus_one,
                          normed, cat, "post_feedforward_layernorm");
    if (dt != DType::kF32) s.mlp_o.reset();
    out = env.allocate(d.th(), env.options.residual(), out_cat, "output");
    if (env.math) {
      F32 n(env.ops, normed, Access::kRead), x2(env.ops, s.x2, Access::kRead), o(env.ops, out, Access::kWrite);
      env.ops->add(n, x2, o, d.th());
    }
  } else {
    out = env.allocate(size_t(env.rows() * d.h), env.options.residual(), out_cat, "output");
    row_parallel_add(env, s.act, {W(off.down), nullptr, WeightLayout::kOutIn, d.F}, s.x2, out, "down_proj output");
  }
  // At e = 2 nothing saved the residual stream itself, only its fp32 copies: it goes when the layer returns. In fp32
  // and under autocast the norms saved the stream itself.
  if (env.options.residual() != DType::kF32) {
    s.x2.reset();
    if (!keep_input) s.x.reset();
  }
  return out;
}

void llama_backward(const BlockEnv& env, const float* w, BlockSaved& s, float* dres, float* dw) {
  const ModelConfig& c = env.config;
  const Dims d = dims(c);
  const DType dt = env.options.compute;
  const LlamaBlockOffsets off = llama_block_offsets(c, env.layout);
  auto W = [&](size_t offset) { return offset_into(w, offset); };
  auto G = [&](size_t offset) { return offset_into(dw, offset); };
  auto GB = [&](size_t offset) { return off.bias ? offset_into(dw, offset) : nullptr; };

  // MLP: out = x2 + down(silu(gate)·up) (Gemma 2: x2 + post_feedforward_layernorm(down(...)))
  {
    // Gemma 2: the gradient of the down_proj output in fp32, what emu's math reads; under sequence parallelism the
    // gradient of the block output all-gathered.
    Scratch dm_math;
    Buffer dm;
    const float* dmlp = dres;
    if (off.sandwich) {
      dm = sandwich_norm_backward(env, W(off.mlp_out_norm), G(off.mlp_out_norm), dres, s.mlp_o, s.mlp_o32,
                                  s.norm4_stats, dm_math, dmlp, "d down_proj output");
      env.made({off.mlp_out_norm});
      for (Buffer* b : {&s.mlp_o, &s.mlp_o32, &s.norm4_stats, &s.norm4_hat, &s.norm4_plus_one}) b->reset();
    } else if (env.sequence_parallel()) {
      dmlp = gather_gradient(env, dres, dm, dm_math, "d block output");
    }
    Buffer dact = env.allocate(d.tf(), dt, Category::kTemporaries, "d(silu(gate)·up)");
    if (env.math) {
      F32 a(env.ops, s.act, Access::kRead), da(env.ops, dact, Access::kWrite);
      env.ops->linear_backward(a, W(off.down), dmlp, da, G(off.down), nullptr, d.T, d.F, d.h, WeightLayout::kOutIn,
                               false);
    }
    env.made({off.down});
    dm.reset();
    s.act.reset();
    // act_fn(gate)·up's backward (a MulBackward0) makes d act_fn(gate) and d up from the saved act_fn(gate) and up,
    // which it then releases; up_proj's backward comes next (the last linear of forward is the first of backward),
    // then act_fn's (d gate, a new tensor; d act_fn(gate) and the saved gate released), then gate_proj's. emu's
    // kernel makes d gate and d up at once: `dgate` holds d gate for the math, charged nothing, and what autograd
    // holds is charged by `dact_fn` and then `dgate_held`.
    const size_t tf_bytes = d.tf() * dtype_size(dt);
    Buffer dgate = env.device.allocate(d.tf(), dt, Category::kTemporaries, "d gate (emu's math)", 0);
    Buffer dact_fn =
        env.device.allocate(0, dt, Category::kTemporaries,
                            fmt::format("block {} d {}(gate)", env.unit, c.gemma ? "gelu" : "silu"), tf_bytes);
    Buffer dup = env.allocate(d.tf(), dt, Category::kTemporaries, "d up");
    if (env.math) {
      F32 da(env.ops, dact, Access::kRead), g(env.ops, s.gate, Access::kRead), u(env.ops, s.up, Access::kRead);
      F32 dg(env.ops, dgate, Access::kWrite), du(env.ops, dup, Access::kWrite);
      if (c.gemma) {
        env.ops->geglu_backward(da, g, u, dg, du, d.tf());
      } else {
        env.ops->swiglu_backward(da, g, u, dg, du, d.tf());
      }
    }
    dact.reset();
    s.silu.reset();
    s.up.reset();
    // Sequence parallelism: the saved slice of the norm output gathered again for the weight gradients.
    Buffer xn2_full = gather_rows(env, s.xn2, "post_attention_layernorm output, for the weight gradients");
    const Buffer& xn2 = xn2_full.allocated() ? xn2_full : s.xn2;
    Buffer dxn =
        env.allocate(d.th(), env.options.residual(), Category::kTemporaries, "d post_attention_layernorm output");
    if (env.math) {
      F32 xn(env.ops, xn2, Access::kRead), du(env.ops, dup, Access::kRead), dx(env.ops, dxn, Access::kWrite);
      env.ops->linear_backward(xn, W(off.up), du, dx, G(off.up), nullptr, d.T, d.h, d.F, WeightLayout::kOutIn, false);
    }
    env.made({off.up});
    dup.reset();
    s.xn2_casts.reset();  // autocast: up_proj's cast of its input, saved by up_proj alone
    Buffer dgate_held =
        env.device.allocate(0, dt, Category::kTemporaries, fmt::format("block {} d gate", env.unit), tf_bytes);
    dact_fn.reset();
    s.gate.reset();
    if (env.math) {
      F32 xn(env.ops, xn2, Access::kRead), dg(env.ops, dgate, Access::kRead), dx(env.ops, dxn, Access::kReadWrite);
      env.ops->linear_backward(xn, W(off.gate), dg, dx, G(off.gate), nullptr, d.T, d.h, d.F, WeightLayout::kOutIn,
                               true);
    }
    env.made({off.gate});
    dgate.reset();
    dgate_held.reset();
    xn2_full.reset();
    s.xn2.reset();
    s.norm2_hat.reset();
    column_input_gradient(env, dxn, "gate_proj and up_proj input gradient");
    if (env.math) {
      F32 dx(env.ops, dxn, Access::kRead), x2(env.ops, s.x2_32.count() > 0 ? s.x2_32 : s.x2, Access::kRead),
          st(env.ops, s.norm2_stats, Access::kRead);
      Scratch factor;
      env.ops->rmsnorm_backward(dx, x2, norm_weight(env.ops, c, W(off.post_norm), factor), st, dres, G(off.post_norm),
                                env.rows(), d.h);
    }
    env.made({off.post_norm});
    s.x2.reset();
    s.x2_32.reset();
    s.norm2_stats.reset();
    s.norm2_plus_one.reset();
  }
  // Attention: x2 = x + o_proj(attention(rope(q_proj(xn1)), rope(k_proj(xn1)), v_proj(xn1))) (Gemma 2: the
  // projection through post_attention_layernorm)
  Scratch do_math;
  Buffer dout;
  const float* dattn_out = dres;
  if (off.sandwich) {
    dout = sandwich_norm_backward(env, W(off.attn_out_norm), G(off.attn_out_norm), dres, s.attn_o, s.attn_o32,
                                  s.norm3_stats, do_math, dattn_out, "d o_proj output");
    env.made({off.attn_out_norm});
    for (Buffer* b : {&s.attn_o, &s.attn_o32, &s.norm3_stats, &s.norm3_hat, &s.norm3_plus_one}) b->reset();
  } else if (env.sequence_parallel()) {
    dattn_out = gather_gradient(env, dres, dout, do_math, "d residual after attention");
  }
  Buffer dattn = env.allocate(d.tq(), dt, Category::kTemporaries, "d attention output");
  if (env.math) {
    F32 attn(env.ops, s.attn, Access::kRead), da(env.ops, dattn, Access::kWrite);
    env.ops->linear_backward(attn, W(off.o), dattn_out, da, G(off.o), nullptr, d.T, d.qd, d.h, WeightLayout::kOutIn,
                             false);
  }
  env.made({off.o});
  dout.reset();
  Buffer dq = env.allocate(d.tq(), dt, Category::kTemporaries, "d q");
  Buffer dk = env.allocate(size_t(d.T * d.kvd), dt, Category::kTemporaries, "d k");
  Buffer dv = env.allocate(size_t(d.T * d.kvd), dt, Category::kTemporaries, "d v");
  {
    F32 q(env.ops, s.q, Access::kRead), k(env.ops, s.k, Access::kRead), v(env.ops, s.v, Access::kRead),
        da(env.ops, dattn, Access::kRead);
    F32 gq(env.ops, dq, Access::kWrite), gk(env.ops, dk, Access::kWrite), gv(env.ops, dv, Access::kWrite);
    attention_backward(env, attention_shape(c), s, q, k, v, da, gq, gk, gv);
    if (env.math) {
      env.ops->rope_apply(gq, env.rope_cos, env.rope_sin, d.T, d.s, c.heads, c.head_dim(), c.rotary_dim(), true);
      env.ops->rope_apply(gk, env.rope_cos, env.rope_sin, d.T, d.s, c.kv_heads, c.head_dim(), c.rotary_dim(), true);
    }
  }
  dattn.reset();
  s.q.reset();
  s.k.reset();
  s.v.reset();
  Buffer xn1_full = gather_rows(env, s.xn1, "input_layernorm output, for the weight gradients");
  Buffer dxn = env.allocate(d.th(), env.options.residual(), Category::kTemporaries, "d input_layernorm output");
  if (env.math) {
    F32 xn(env.ops, xn1_full.allocated() ? xn1_full : s.xn1, Access::kRead), gq(env.ops, dq, Access::kRead),
        gk(env.ops, dk, Access::kRead), gv(env.ops, dv, Access::kRead);
    F32 dx(env.ops, dxn, Access::kWrite);
    env.ops->linear_backward(xn, W(off.q), gq, dx, G(off.q), GB(off.q_bias), d.T, d.h, d.qd, WeightLayout::kOutIn,
                             false);
    env.ops->linear_backward(xn, W(off.k), gk, dx, G(off.k), GB(off.k_bias), d.T, d.h, d.kvd, WeightLayout::kOutIn,
                             true);
    env.ops->linear_backward(xn, W(off.v), gv, dx, G(off.v), GB(off.v_bias), d.T, d.h, d.kvd, WeightLayout::kOutIn,
                             true);
  }
  // v_proj ran last in forward: autograd reaches it first.
  if (off.bias) {
    env.made({off.v, off.v_bias, off.k, off.k_bias, off.q, off.q_bias});
  } else {
    env.made({off.v, off.k, off.q});
  }
  dq.reset();
  dk.reset();
  dv.reset();
  xn1_full.reset();
  s.xn1.reset();
  s.xn1_casts.reset();
  s.norm1_hat.reset();
  column_input_gradient(env, dxn, "q_proj, k_proj and v_proj input gradient");
  if (env.math) {
    F32 dx(env.ops, dxn, Access::kRead), x(env.ops, s.x32.count() > 0 ? s.x32 : s.x, Access::kRead),
        st(env.ops, s.norm1_stats, Access::kRead);
    Scratch factor;
    env.ops->rmsnorm_backward(dx, x, norm_weight(env.ops, c, W(off.input_norm), factor), st, dres, G(off.input_norm),
                              env.rows(), d.h);
  }
  env.made({off.input_norm});
  s.x.reset();
  s.x32.reset();
  s.norm1_stats.reset();
  s.norm1_plus_one.reset();
}

Buffer gpt2_forward(const BlockEnv& env, const float* w, BlockSaved& s, Category cat, Category out_cat) {
  EMU_CHECK(!env.sequence_parallel(), "GPT-2 blocks are not split along the sequence (check_sequence_parallel)");
  const ModelConfig& c = env.config;
  const Dims d = dims(c);
  const DType dt = env.options.compute;
  auto W = [&](size_t i) { return offset_into(w, env.layout.params[i].offset); };
  const float eps = static_cast<float>(c.norm_eps);

  Buffer wide;  // under autocast, the fp32 output of ln_1, then of ln_2: held until its sublayer returns
  s.norm1_stats = env.allocate_per_row(size_t(2 * d.T), DType::kF32, cat, "ln_1 mean and rstd");
  allocate_norm_output(env, d.th(), s.xn1, wide, cat, "ln_1");
  // Under TP c_attn is column-parallel: this rank's a/t heads of q, k and v, qd = h/t columns each.
  s.qkv = env.allocate(3 * d.tq(), dt, cat, "qkv");
  if (env.math) {
    F32 x(env.ops, s.x, Access::kRead), st(env.ops, s.norm1_stats, Access::kWrite), xn(env.ops, s.xn1, Access::kWrite);
    env.ops->layernorm_forward(x, W(kLn1Weight), W(kLn1Bias), xn, st, st + d.T, d.T, d.h, eps);
    F32 qkv(env.ops, s.qkv, Access::kWrite);
    env.ops->linear_forward(xn, W(kAttnWeight), W(kAttnBias), qkv, d.T, d.h, 3 * d.qd, WeightLayout::kInOut);
  }
  {
    F32 qkv(env.ops, s.qkv, Access::kRead);
    AttentionShape shape = attention_shape(c);
    shape.q_stride = shape.kv_stride = 3 * d.qd;
    const float* base = qkv.get();
    attention_forward(env, shape, s, base, base ? base + d.qd : nullptr, base ? base + 2 * d.qd : nullptr, cat);
  }
  s.x2 = env.allocate(d.th(), env.options.residual(), cat, "residual after attention");
  wide.reset();
  // attn.c_proj, row-parallel under TP: its partial sums all-reduced, then its bias and the residual added.
  row_parallel_add(env, s.attn, {W(kAttnProjWeight), W(kAttnProjBias), WeightLayout::kInOut, d.qd}, s.x, s.x2,
                   "attn.c_proj output");
  s.norm2_stats = env.allocate_per_row(size_t(2 * d.T), DType::kF32, cat, "ln_2 mean and rstd");
  allocate_norm_output(env, d.th(), s.xn2, wide, cat, "ln_2");
  if (env.math) {
    F32 x2(env.ops, s.x2, Access::kRead);
    F32 st(env.ops, s.norm2_stats, Access::kWrite), xn(env.ops, s.xn2, Access::kWrite);
    env.ops->layernorm_forward(x2, W(kLn2Weight), W(kLn2Bias), xn, st, st + d.T, d.T, d.h, eps);
  }
  // gelu_new, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), op by op as PyTorch runs the Python expression: each
  // intermediate of the tanh's argument is dropped once the next one exists, so two are alive at a time. Under
  // autocast, CUDA's runs pow in fp32 (autocast_mode.h, AT_FORALL_FP32): pow saves an fp32 cast of c_fc's output,
  // which nothing else saves, the tanh branch is fp32 from there on, 0.5·x stays bf16, and c_proj saves a bf16 cast
  // of the fp32 product.
  const bool ac = env.options.autocast;
  const DType branch = ac ? DType::kF32 : dt;
  Buffer fc_out, product;  // under autocast: c_fc's bf16 output and the fp32 product, until the next layer returns
  // emu's math computes gelu from c_fc's output in one kernel: the intermediates are held (charged), not made.
  if (ac) {
    fc_out = env.hold(d.tf(), dt, Category::kTemporaries, "c_fc output");
  } else {
    s.fc = env.allocate(d.tf(), dt, cat, "c_fc output");
  }
  s.gelu_half = env.hold(d.tf(), dt, cat, "gelu_new 0.5·x");
  if (ac) s.fc = env.allocate(d.tf(), DType::kF32, cat, "c_fc output cast to fp32 for pow");
  {
    Buffer cube = env.hold(d.tf(), branch, Category::kTemporaries, "gelu_new x³");
    Buffer inner = env.hold(d.tf(), branch, Category::kTemporaries, "gelu_new tanh argument");
    cube.reset();
    s.gelu_tanh = env.hold(d.tf(), branch, cat, "gelu_new tanh");
  }
  s.gelu_sum = env.hold(d.tf(), branch, cat, "gelu_new 1 + tanh");
  if (ac) product = env.hold(d.tf(), DType::kF32, Category::kTemporaries, "gelu output in fp32");
  fc_out.reset();
  s.act = env.allocate(d.tf(), dt, cat, ac ? "gelu output cast by autocast" : "gelu output");
  if (env.math) {  // c_fc, column-parallel under TP: this rank's F/t columns
    F32 xn(env.ops, s.xn2, Access::kRead), fc(env.ops, s.fc, Access::kWrite), a(env.ops, s.act, Access::kWrite);
    env.ops->linear_forward(xn, W(kFcWeight), W(kFcBias), fc, d.T, d.h, d.F, WeightLayout::kInOut);
    env.ops->gelu_forward(fc, a, d.tf());
  }
  // A recomputation stops here: torch.utils.checkpoint (non-reentrant, early stop on by default, as Hugging Face's
  // gradient checkpointing runs it) ends it once the last tensor backward needs is saved again, c_proj's input, before
  // c_proj runs; so neither the MLP's output nor the block's is made again. Under TP the layer is Megatron's, whose
  // CheckpointFunction recomputes it whole, its c_proj all-reduce included.
  if (env.recomputing && env.tp == nullptr) return Buffer();
  Buffer out = env.allocate(d.th(), env.options.residual(), out_cat, "output");
  row_parallel_add(env, s.act, {W(kMlpProjWeight), W(kMlpProjBias), WeightLayout::kInOut, d.F}, s.x2, out,
                   "mlp.c_proj output");
  return out;
}

// gelu_new's backward as autograd runs the Python expression 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), node by
// node from `d_act` (the gradient of its output, c_proj's input gradient) to the gradient of c_fc's output, which it
// returns; every tensor charged as held (emu's math does it in one kernel) and freed when autograd frees it. Two
// moments hold the most: the product's backward (x, 0.5·x, tanh and 1 + tanh saved, d_act and both factors'
// gradients) and pow's (x saved; the 0.5·x branch's gradient, the tanh argument's, the cube's, x², 3·x² and pow's
// input gradient): 7 [T, F] tensors each at the compute dtype (checked against a recorded MemTracker timeline,
// scripts/oracle/record.py --timeline). Under autocast (CUDA's, autocast_mode.h: pow in fp32) the tanh branch is
// fp32: c_proj's input gradient is cast back to fp32 for the fp32 product (_to_copy's backward), the product's
// backward makes both factors' gradients in fp32 before the engine casts 0.5·x's to bf16 (validate_outputs), the
// add's backward casts the tanh argument's gradient to bf16 for c_fc's output, and pow's input gradient is cast back
// to bf16 (the autocast cast's backward): 28 B per [T, F] element at the product's backward, 24 at pow's.
Buffer gelu_new_backward(const BlockEnv& env, BlockSaved& s, Buffer d_act) {
  const size_t n = size_t(env.config.tokens() * env.config.ffn);
  const DType dt = env.options.compute;
  const bool ac = env.options.autocast;
  const DType branch = ac ? DType::kF32 : dt;  // the tanh branch's and the product's dtype
  auto hold = [&](DType dtype, std::string_view what) { return env.hold(n, dtype, Category::kTemporaries, what); };
  Buffer d_prod = std::move(d_act);
  if (ac) d_prod = hold(DType::kF32, "d gelu output in fp32 (autocast cast's backward)");  // d_act freed by the move
  // product = 0.5·x · (1 + tanh): both factors' gradients, in the product's dtype; 0.5·x's then cast to its own.
  Buffer d_sum = hold(branch, "d (1 + tanh)");
  Buffer d_half = hold(branch, "d 0.5·x");
  if (ac) d_half = hold(dt, "d 0.5·x cast to bf16");
  d_prod.reset();
  s.gelu_half.reset();
  s.gelu_sum.reset();
  Buffer d_t = hold(branch, "d tanh argument (tanh backward)");
  d_sum.reset();
  s.gelu_tanh.reset();
  Buffer d_inner = hold(branch, "d (x + 0.044715·x³)");
  d_t.reset();
  Buffer d_inner_cast;  // autocast: the add's gradient for c_fc's bf16 output
  if (ac) d_inner_cast = hold(dt, "d (x + 0.044715·x³) cast to bf16");
  Buffer d_cube = hold(branch, "d x³");
  if (ac) d_inner.reset();  // its bf16 cast waits for c_fc's output instead
  Buffer square = hold(branch, "x² (pow backward)");
  Buffer thrice = hold(branch, "3·x² (pow backward)");
  Buffer d_pow = hold(branch, "d x through pow");
  square.reset();
  thrice.reset();
  d_cube.reset();
  s.fc.reset();  // pow's saved input
  if (ac) d_pow = hold(dt, "d x through pow cast to bf16");
  Buffer summed = hold(dt, "d c_fc output through the tanh branch");
  d_inner.reset();
  d_inner_cast.reset();
  d_pow.reset();
  Buffer d_x_half = hold(dt, "d x through 0.5·x");
  d_half.reset();
  Buffer d_fc = hold(dt, "d c_fc output");
  summed.reset();
  d_x_half.reset();
  return d_fc;
}

void gpt2_backward(const BlockEnv& env, const float* w, BlockSaved& s, float* dres, float* dw) {
  const ModelConfig& c = env.config;
  const Dims d = dims(c);
  const DType dt = env.options.compute;
  auto W = [&](size_t i) { return offset_into(w, env.layout.params[i].offset); };
  auto G = [&](size_t i) { return offset_into(dw, env.layout.params[i].offset); };

  // MLP: out = x2 + c_proj(gelu(c_fc(ln_2(x2))))
  // emu's math: one [T, F] buffer, charged nothing, holding c_proj's input gradient and then, turned in place, c_fc's
  // output gradient. What autograd makes between the two is charged op by op (gelu_new_backward).
  Buffer dfc =
      env.device.allocate(d.tf(), dt, Category::kTemporaries, fmt::format("block {} d gelu output", env.unit), 0);
  Buffer d_act = env.hold(d.tf(), dt, Category::kTemporaries, "d gelu output (c_proj's input gradient)");
  if (env.math) {
    F32 a(env.ops, s.act, Access::kRead), g(env.ops, dfc, Access::kWrite), fc(env.ops, s.fc, Access::kRead);
    env.ops->linear_backward(a, W(kMlpProjWeight), dres, g, G(kMlpProjWeight), G(kMlpProjBias), d.T, d.F, d.h,
                             WeightLayout::kInOut, false);
    env.ops->gelu_backward(g, fc, g, d.tf());  // in place: the gradient of gelu's output becomes that of c_fc's
  }
  auto made = [&](std::initializer_list<size_t> params) {
    for (size_t i : params) env.made({env.layout.params[i].offset});
  };
  made({kMlpProjWeight, kMlpProjBias});
  s.act.reset();
  Buffer d_fc = gelu_new_backward(env, s, std::move(d_act));
  Buffer dxn = env.allocate(d.th(), env.options.residual(), Category::kTemporaries, "d ln_2 output");
  if (env.math) {
    F32 xn(env.ops, s.xn2, Access::kRead), g(env.ops, dfc, Access::kRead), dx(env.ops, dxn, Access::kWrite);
    env.ops->linear_backward(xn, W(kFcWeight), g, dx, G(kFcWeight), G(kFcBias), d.T, d.h, d.F, WeightLayout::kInOut,
                             false);
  }
  made({kFcWeight, kFcBias});
  dfc.reset();
  d_fc.reset();
  s.xn2.reset();
  column_input_gradient(env, dxn, "c_fc input gradient");
  if (env.math) {
    F32 dx(env.ops, dxn, Access::kRead), x2(env.ops, s.x2, Access::kRead), st(env.ops, s.norm2_stats, Access::kRead);
    env.ops->layernorm_backward(dx, x2, W(kLn2Weight), st, st + d.T, dres, G(kLn2Weight), G(kLn2Bias), d.T, d.h);
  }
  made({kLn2Weight, kLn2Bias});
  dxn.reset();
  s.x2.reset();
  s.norm2_stats.reset();

  // Attention: x2 = x + c_proj(attention(c_attn(ln_1(x))))
  Buffer dattn = env.allocate(d.tq(), dt, Category::kTemporaries, "d attention output");
  if (env.math) {
    F32 attn(env.ops, s.attn, Access::kRead), da(env.ops, dattn, Access::kWrite);
    env.ops->linear_backward(attn, W(kAttnProjWeight), dres, da, G(kAttnProjWeight), G(kAttnProjBias), d.T, d.qd, d.h,
                             WeightLayout::kInOut, false);
  }
  made({kAttnProjWeight, kAttnProjBias});
  Buffer dqkv = env.allocate(3 * d.tq(), dt, Category::kTemporaries, "d qkv");
  {
    F32 qkv(env.ops, s.qkv, Access::kRead), da(env.ops, dattn, Access::kRead), g(env.ops, dqkv, Access::kWrite);
    AttentionShape shape = attention_shape(c);
    shape.q_stride = shape.kv_stride = 3 * d.qd;
    const float* q = qkv.get();
    float* dq = g.get();
    if (env.math) {
      attention_backward(env, shape, s, q, q + d.qd, q + 2 * d.qd, da, dq, dq + d.qd, dq + 2 * d.qd);
    } else {
      attention_backward(env, shape, s, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    }
  }
  dattn.reset();
  Buffer dxn1 = env.allocate(d.th(), env.options.residual(), Category::kTemporaries, "d ln_1 output");
  if (env.math) {
    F32 xn(env.ops, s.xn1, Access::kRead), g(env.ops, dqkv, Access::kRead), dx(env.ops, dxn1, Access::kWrite);
    env.ops->linear_backward(xn, W(kAttnWeight), g, dx, G(kAttnWeight), G(kAttnBias), d.T, d.h, 3 * d.qd,
                             WeightLayout::kInOut, false);
  }
  made({kAttnWeight, kAttnBias});
  dqkv.reset();
  s.qkv.reset();
  s.xn1.reset();
  column_input_gradient(env, dxn1, "c_attn input gradient");
  if (env.math) {
    F32 dx(env.ops, dxn1, Access::kRead), x(env.ops, s.x, Access::kRead), st(env.ops, s.norm1_stats, Access::kRead);
    env.ops->layernorm_backward(dx, x, W(kLn1Weight), st, st + d.T, dres, G(kLn1Weight), G(kLn1Bias), d.T, d.h);
  }
  made({kLn1Weight, kLn1Bias});
  s.x.reset();
  s.norm1_stats.reset();
}

}  // namespace

Buffer block_forward(const BlockEnv& env, const float* weights, Buffer x, BlockSaved& saved, Category saved_category,
                     Category output_category, bool keep_input) {
  saved.x = std::move(x);
  return env.config.style == Style::kLlama
             ? llama_forward(env, weights, saved, saved_category, output_category, keep_input)
             : gpt2_forward(env, weights, saved, saved_category, output_category);
}

void block_backward(const BlockEnv& env, const float* weights, BlockSaved& saved, float* dres, float* dweights) {
  if (env.config.style == Style::kLlama) {
    llama_backward(env, weights, saved, dres, dweights);
  } else {
    gpt2_backward(env, weights, saved, dres, dweights);
  }
}

}  // namespace emu::model
