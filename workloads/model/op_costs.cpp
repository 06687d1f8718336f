#include "workloads/model/op_costs.h"

#include <numeric>

namespace emu::model {
namespace {

struct Shapes {
  double T, h, F, V, qd, kvd, b, s, a, d;
  double e;  // bytes per element at the compute dtype
  double r;  // bytes per element of the residual stream (fp32 under autocast)
};

Shapes shapes_of(const ModelConfig& c, const ModelOptions& o) {
  return {double(c.tokens()),
          double(c.hidden),
          double(c.ffn),
          double(c.vocab),
          double(c.q_dim()),
          double(c.kv_dim()),
          double(c.batch),
          double(c.seq),
          double(c.heads),
          double(c.head_dim()),
          double(dtype_size(o.compute)),
          double(dtype_size(o.residual()))};
}

// x [T, in] · W [in, out] → y [T, out]: 2·T·in·out FLOPs; x, W and y once each.
OpCost linear(std::string_view name, const Shapes& s, double in, double out) {
  return {name, OpClass::kMatmul, 2 * s.T * in * out, s.e * (s.T * in + in * out + s.T * out)};
}

// Backward of the same linear: dX = dY·Wᵀ and dW = Xᵀ·dY, each as many FLOPs as the forward; reads dY, W, X,
// writes dX and dW.
OpCost linear_backward(std::string_view name, const Shapes& s, double in, double out) {
  return {name, OpClass::kMatmul, 4 * s.T * in * out, s.e * (2 * s.T * out + 2 * s.T * in + 2 * in * out)};
}

// Keys each query attends to, on average, in a causal (or sliding-window) mask.
double causal_keys(const ModelConfig& c) {
  const double s = double(c.seq);
  if (c.sliding_window > 0 && c.sliding_window < c.seq) {
    const double w = double(c.sliding_window);
    return (w * (w + 1) / 2 + (s - w) * w) / s;
  }
  return (s + 1) / 2;
}

OpCost attention_forward(const ModelConfig& c, const ModelOptions& o, const Shapes& s) {
  // q·kᵀ and p·v: 2 products of 2·d FLOPs per (query, key) pair and head.
  const bool eager = o.attention == Attention::kEager;
  const double keys = eager ? s.s : causal_keys(c);
  const double flops = 4 * s.b * s.a * s.s * keys * s.d;
  double bytes = s.e * s.T * (2 * s.qd + 2 * s.kvd);          // q, k, v read, the output written
  if (eager) bytes += s.b * s.a * s.s * s.s * (2 * s.e + 4);  // the scores written, softmaxed and read back
  return {"attention", OpClass::kAttention, flops, bytes};
}

OpCost attention_backward(const ModelConfig& c, const ModelOptions& o, const Shapes& s) {
  const OpCost f = attention_forward(c, o, s);
  // Flash backward: 5 products against forward's 2 (dV, dP, dS·K, dSᵀ·Q and the recomputed scores); eager: 4.
  const double factor = o.attention == Attention::kEager ? 2.0 : 2.5;
  return {"attention backward", OpClass::kAttention, factor * f.flops, 2 * f.bytes};
}

OpCost elementwise(std::string_view name, double bytes) { return {name, OpClass::kMemory, 0, bytes}; }

}  // namespace

std::vector<OpCost> block_forward_ops(const ModelConfig& c, const ModelOptions& o) {
  const Shapes s = shapes_of(c, o);
  std::vector<OpCost> ops;
  const double norm = s.T * s.h * (s.r + s.e);  // the residual read, the normed output written
  const double add = 3 * s.T * s.h * s.r;       // two inputs and the sum
  if (c.style == Style::kGpt2) {
    ops = {elementwise("ln_1", norm),         linear("c_attn", s, s.h, 3 * s.qd),
           attention_forward(c, o, s),        linear("attn c_proj", s, s.qd, s.h),
           elementwise("residual add", add),  elementwise("ln_2", norm),
           linear("c_fc", s, s.h, s.F),       elementwise("gelu", 2 * s.T * s.F * s.e),
           linear("mlp c_proj", s, s.F, s.h), elementwise("residual add", add)};
    return ops;
  }
  // Gemma 2's sandwich norms normalise a linear's output (o_proj's, down_proj's) at the compute dtype and give it
  // back at that dtype (type_as, under autocast too) before it is added to the residual: read and written at e.
  const double sandwich = 2 * s.T * s.h * s.e;
  ops = {elementwise("input_layernorm", norm),
         linear("q_proj", s, s.h, s.qd),
         linear("k_proj", s, s.h, s.kvd),
         linear("v_proj", s, s.h, s.kvd),
         elementwise("rotary", 2 * s.T * (s.qd + s.kvd) * s.e),
         attention_forward(c, o, s),
         linear("o_proj", s, s.qd, s.h)};
  if (c.sandwich_norms) ops.push_back(elementwise("post_attention_layernorm", sandwich));
  ops.push_back(elementwise("residual add", add));
  ops.push_back(elementwise(c.sandwich_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm", norm));
  ops.push_back(linear("gate_proj", s, s.h, s.F));
  ops.push_back(linear("up_proj", s, s.h, s.F));
  ops.push_back(elementwise(c.gemma ? "geglu" : "swiglu", 3 * s.T * s.F * s.e));
  ops.push_back(linear("down_proj", s, s.F, s.h));
  if (c.sandwich_norms) ops.push_back(elementwise("post_feedforward_layernorm", sandwich));
  ops.push_back(elementwise("residual add", add));
  return ops;
}

std::vector<OpCost> block_backward_ops(const ModelConfig& c, const ModelOptions& o) {
  const Shapes s = shapes_of(c, o);
  std::vector<OpCost> ops;
  // A norm's backward reads dy, x and writes dx (its weight gradient is a reduction over the same reads); an add's
  // gradient passes through, the residual gradient accumulated once.
  const double norm = s.T * s.h * (2 * s.r + s.e);
  const double add = 3 * s.T * s.h * s.r;
  if (c.style == Style::kGpt2) {
    ops = {linear_backward("mlp c_proj", s, s.F, s.h),
           elementwise("gelu backward", 3 * s.T * s.F * s.e),
           linear_backward("c_fc", s, s.h, s.F),
           elementwise("ln_2 backward", norm),
           elementwise("residual add", add),
           linear_backward("attn c_proj", s, s.qd, s.h),
           attention_backward(c, o, s),
           linear_backward("c_attn", s, s.h, 3 * s.qd),
           elementwise("ln_1 backward", norm),
           elementwise("residual add", add)};
    return ops;
  }
  // Gemma 2's sandwich norms: dy (cast to the norm's output dtype by the add's backward) and x read, dx written,
  // all at e.
  const double sandwich = 3 * s.T * s.h * s.e;
  if (c.sandwich_norms) ops.push_back(elementwise("post_feedforward_layernorm backward", sandwich));
  ops.insert(
      ops.end(),
      {linear_backward("down_proj", s, s.F, s.h),
       elementwise(c.gemma ? "geglu backward" : "swiglu backward", 5 * s.T * s.F * s.e),
       linear_backward("up_proj", s, s.h, s.F), linear_backward("gate_proj", s, s.h, s.F),
       elementwise(c.sandwich_norms ? "pre_feedforward_layernorm backward" : "post_attention_layernorm backward", norm),
       elementwise("residual add", add)});
  if (c.sandwich_norms) ops.push_back(elementwise("post_attention_layernorm backward", sandwich));
  ops.insert(ops.end(),
             {linear_backward("o_proj", s, s.qd, s.h), attention_backward(c, o, s),
              elementwise("rotary backward", 2 * s.T * (s.qd + s.kvd) * s.e), linear_backward("v_proj", s, s.h, s.kvd),
              linear_backward("k_proj", s, s.h, s.kvd), linear_backward("q_proj", s, s.h, s.qd),
              elementwise("input_layernorm backward", norm), elementwise("residual add", add)});
  return ops;
}

std::vector<OpCost> root_forward_ops(const ModelConfig& c, const ModelOptions& o) {
  const Shapes s = shapes_of(c, o);
  const bool fused = o.loss == Loss::kFused;
  // The loss reads the logits and, for the Trainer's loss, writes and reads their fp32 upcast and log-softmax.
  const double loss = s.T * s.V * (fused ? s.e + 4 : s.e + 3 * 4);
  return {elementwise("embedding", s.T * s.h * (s.e + s.r)), elementwise("final norm", s.T * s.h * (s.r + s.e)),
          linear("lm_head", s, s.h, s.V), elementwise("loss", loss)};
}

std::vector<OpCost> root_backward_ops(const ModelConfig& c, const ModelOptions& o) {
  const Shapes s = shapes_of(c, o);
  const bool fused = o.loss == Loss::kFused;
  const double loss = s.T * s.V * (fused ? 4 + s.e : 2 * 4 + 2 * s.e);
  return {elementwise("loss backward", loss), linear_backward("lm_head", s, s.h, s.V),
          elementwise("final norm backward", s.T * s.h * (2 * s.r + s.e)),
          elementwise("embedding backward", s.T * s.h * (s.r + 4))};
}

double total_flops(const std::vector<OpCost>& ops) {
  return std::accumulate(ops.begin(), ops.end(), 0.0, [](double sum, const OpCost& op) { return sum + op.flops; });
}

double total_bytes(const std::vector<OpCost>& ops) {
  return std::accumulate(ops.begin(), ops.end(), 0.0, [](double sum, const OpCost& op) { return sum + op.bytes; });
}

}  // namespace emu::model
