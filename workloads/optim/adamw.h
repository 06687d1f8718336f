// AdamW over a flat buffer of parameters, or over any shard of it, plus gradient clipping and the learning-rate
// schedule.
//
// The update is element-wise, so a shard [offset, offset + n) of a flat buffer is updated exactly as the same
// elements would be in a whole-buffer update; only weight decay depends on where an element sits, and the decay
// ranges are given in coordinates of the whole flat buffer for that reason. Gradient clipping needs the norm of
// the whole gradient: each rank computes the sum of squares of what it holds (grad_sum_of_squares), the caller
// all-reduces the sums, and clip_coefficient(global norm) becomes the grad_scale of the step.
//
// The step follows PyTorch's torch.optim.AdamW (decoupled weight decay, bias correction), for step t = 1, 2, ...:
//   g  = grad_scale · grad                     (clip coefficient, and 1/N if the caller averages here)
//   w  = w · (1 − lr · weight_decay)           only inside a decay range
//   m  = β1 · m + (1 − β1) · g
//   v  = β2 · v + (1 − β2) · g²
//   w  = w − lr / (1 − β1^t) · m / (sqrt(v / (1 − β2^t)) + ε)
// With decoupled = false it is Adam with L2 weight decay instead (torch.optim.Adam's weight_decay, DeepSpeed's
// FusedAdam with adam_w_mode false): no decay of w; inside a decay range the gradient becomes g + weight_decay · w
// before the moments are updated.
// The arithmetic is fp32 per element whatever the storage; bf16 weights and moments (pure bf16 recipe) are rounded
// to nearest even when stored, as a bf16 PyTorch optimizer does without stochastic rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "emu/ops.h"
#include "workloads/optim/element_span.h"

namespace emu::optim {

// Hyper-parameters, in double as PyTorch keeps them (Python floats); the per-step constants derived from them
// (1 − β, lr / (1 − β1^t), …) are computed in double and rounded to fp32 once. Defaults are PyTorch's AdamW defaults
// (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01); GPT-style pre-training often uses β2 = 0.95 and weight decay
// 0.1, which callers may set.
struct AdamWConfig {
  double lr = 1e-3;  // peak learning rate; the schedule scales it
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool decoupled = true;  // AdamW; false: Adam with L2 weight decay folded into the gradient

  // InputError naming the bad value unless lr ≥ 0, 0 ≤ β < 1, ε > 0 and weight_decay ≥ 0.
  void validate() const;
};

// Learning rate at step t (1-based, the same t as Adam's bias correction):
//   t ≤ warmup:  lr · t / warmup                          (linear warm-up; no warm-up when warmup = 0)
//                or DeepSpeed's WarmupLR (runtime/lr_schedules.py), whose scheduler steps after the optimizer, so
//                step t runs at iteration i = t − 2 (steps 1 and 2 at min_lr): min_lr + (lr − min_lr) · γ(i),
//                γ = ln(i + 1) / ln(W) (log, DeepSpeed's default) or i / W (linear) for i < W = max(2, warmup),
//                then 1, or under WarmupDecayLR (kDeepSpeedLinear) max(0, (total − i) / max(1, total − W)): a
//                linear decay to min_lr at i = total
//   kConstant:   lr afterwards
//   kCosine:     min_lr + ½(lr − min_lr)(1 + cos(π · (t − warmup) / (total − warmup))) up to t = total,
//                min_lr after it; min_lr = lr · min_lr_ratio.
struct LrSchedule {
  enum class Decay : uint8_t { kConstant, kCosine, kDeepSpeedLinear };
  enum class Warmup : uint8_t { kLinear, kDeepSpeedLog, kDeepSpeedLinear };
  Decay decay = Decay::kConstant;
  Warmup warmup = Warmup::kLinear;
  double warmup_min_lr = 0;  // DeepSpeed's warm-up starts here
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // used by kCosine (must exceed warmup_steps) and kDeepSpeedLinear
  double min_lr_ratio = 0.1;

  // InputError naming the bad value when the schedule is inconsistent.
  void validate() const;
  double lr_at(int64_t step, double peak_lr) const;
};

// A half-open range [begin, end) of elements of the whole flat buffer that receive weight decay (the matrices;
// biases, norm weights and usually embeddings are left out by the caller).
struct DecayRange {
  size_t begin = 0;
  size_t end = 0;
};

// One AdamW step over `weights.size()` elements, which are elements [offset, offset + n) of the flat buffer.
// All spans have the same length n; weights and moments may be fp32 or bf16, gradients fp32 or bf16.
struct AdamWStep {
  ElementSpan weights;                // fp32 master (mixed), or the parameters themselves (fp32, pure bf16)
  ElementSpan m;                      // first moment
  ElementSpan v;                      // second moment
  ConstElementSpan grads;             // gradient of the loss for these elements
  ElementSpan compute_copy;           // optional: receives the updated weights rounded to bf16 (the mixed recipe's
                                      // bf16 parameters); empty to skip
  size_t offset = 0;                  // index of element 0 of these spans in the whole flat buffer
  std::span<const DecayRange> decay;  // sorted, non-overlapping, whole-buffer coordinates
  int64_t step = 1;                   // t, 1-based, for bias correction
  double lr = 0;                      // learning rate for this step (LrSchedule::lr_at)
  float grad_scale = 1;               // multiplies every gradient: the clip coefficient, possibly times 1/N
  Ops* ops = nullptr;                 // the ops of the device holding the spans (Device::ops); null: the CPU's
};

// Updates weights, m, v (and compute_copy) in place, through step.ops (one Ops::adamw per run inside or outside
// the decay ranges), and waits for them. Checks that lengths agree, that the decay ranges are sorted
// and that step ≥ 1; a violation is a programming error (EMU_CHECK).
void adamw_update(const AdamWConfig& config, const AdamWStep& step);

// Sum of the squares of `grads`, accumulated in double. A sharded caller sums these over ranks (an all-reduce)
// and takes the square root to get the global norm.
double grad_sum_of_squares(ConstElementSpan grads);
// The factor clip_grad_norm_ multiplies gradients by: min(1, max_norm / (global_norm + 1e-6)), as PyTorch's
// torch.nn.utils.clip_grad_norm_. A non-finite norm gives a non-finite or zero factor, as PyTorch does.
float clip_coefficient(double global_norm, double max_norm);

}  // namespace emu::optim
