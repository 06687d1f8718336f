#include "workloads/optim/adamw.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <type_traits>

#include "emu/bf16.h"
#include "emu/cpu/cpu_ops.h"

namespace emu::optim {
namespace {

// Byte offset `elements` into a span's storage.
template <typename P>
P advance(P data, size_t elements, DType dtype) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<P>>, const char*, char*>;
  return data == nullptr ? nullptr : static_cast<P>(static_cast<Byte>(data) + elements * dtype_size(dtype));
}

// Walks the span in runs that are wholly inside or wholly outside the decay ranges, one op per run.
void update_runs(const AdamWStep& s, const AdamWOp& constants, Ops& ops) {
  const size_t n = s.weights.size();
  const auto run = [&](size_t begin, size_t end, bool decayed) {
    if (begin >= end) return;
    AdamWOp op = constants;
    op.weights = advance(s.weights.data(), begin, s.weights.dtype());
    op.m = advance(s.m.data(), begin, s.m.dtype());
    op.v = advance(s.v.data(), begin, s.v.dtype());
    op.grads = advance(s.grads.data(), begin, s.grads.dtype());
    op.copy =
        s.compute_copy.empty() ? nullptr : static_cast<uint16_t*>(advance(s.compute_copy.data(), begin, DType::kBF16));
    op.n = end - begin;
    op.decay = decayed;
    ops.adamw(op);
  };
  size_t local = 0;  // next element of the shard to update
  for (const DecayRange& range : s.decay) {
    if (range.end <= s.offset + local) continue;
    if (range.begin >= s.offset + n) break;
    const size_t begin = std::max(range.begin, s.offset + local) - s.offset;
    const size_t end = std::min(range.end, s.offset + n) - s.offset;
    run(local, begin, false);
    run(begin, end, true);
    local = end;
  }
  run(local, n, false);
  ops.synchronize();  // the caller's host code may read the state next
}

void check_step(const AdamWStep& s) {
  const size_t n = s.weights.size();
  EMU_CHECK(s.m.size() == n && s.v.size() == n && s.grads.size() == n,
            "AdamW spans disagree: weights {}, m {}, v {}, grads {} elements", n, s.m.size(), s.v.size(),
            s.grads.size());
  EMU_CHECK(s.m.dtype() == s.v.dtype(), "AdamW moments m ({}) and v ({}) must share a dtype", dtype_name(s.m.dtype()),
            dtype_name(s.v.dtype()));
  EMU_CHECK(s.compute_copy.empty() || (s.compute_copy.size() == n && s.compute_copy.dtype() == DType::kBF16),
            "AdamW compute copy must be {} bf16 elements, got {} of {}", n, s.compute_copy.size(),
            dtype_name(s.compute_copy.dtype()));
  EMU_CHECK(s.step >= 1, "AdamW step is 1-based, got {}", s.step);
  for (size_t i = 0; i < s.decay.size(); ++i) {
    EMU_CHECK(s.decay[i].begin <= s.decay[i].end, "decay range {} is [{}, {})", i, s.decay[i].begin, s.decay[i].end);
    EMU_CHECK(i == 0 || s.decay[i - 1].end <= s.decay[i].begin,
              "decay ranges must be sorted and disjoint: [{}, {}) then [{}, {})", s.decay[i - 1].begin,
              s.decay[i - 1].end, s.decay[i].begin, s.decay[i].end);
  }
}

}  // namespace

void AdamWConfig::validate() const {
  if (!(lr >= 0) || !std::isfinite(lr)) throw InputError(fmt::format("AdamW lr {} must be a finite value >= 0", lr));
  if (!(beta1 >= 0 && beta1 < 1)) throw InputError(fmt::format("AdamW beta1 {} must be in [0, 1)", beta1));
  if (!(beta2 >= 0 && beta2 < 1)) throw InputError(fmt::format("AdamW beta2 {} must be in [0, 1)", beta2));
  if (!(eps > 0)) throw InputError(fmt::format("AdamW eps {} must be > 0", eps));
  if (!(weight_decay >= 0)) throw InputError(fmt::format("AdamW weight decay {} must be >= 0", weight_decay));
}

void LrSchedule::validate() const {
  if (warmup_steps < 0) throw InputError(fmt::format("warm-up steps {} must be >= 0", warmup_steps));
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) {
    throw InputError(fmt::format("minimum learning-rate ratio {} must be in [0, 1]", min_lr_ratio));
  }
  if (decay == Decay::kCosine && total_steps <= warmup_steps) {
    throw InputError(
        fmt::format("cosine schedule: total steps {} must exceed the warm-up steps {}", total_steps, warmup_steps));
  }
}

double LrSchedule::lr_at(int64_t step, double peak_lr) const {
  if (warmup != Warmup::kLinear) {
    const int64_t iteration = step - 2;
    if (iteration < 0) return warmup_min_lr;
    const int64_t w = std::max<int64_t>(2, warmup_steps);
    double gamma = 1;
    if (iteration < w) {
      gamma = warmup == Warmup::kDeepSpeedLog ? std::log(static_cast<double>(iteration + 1)) / std::log(double(w))
                                              : static_cast<double>(iteration) / static_cast<double>(w);
    } else if (decay == Decay::kDeepSpeedLinear) {
      gamma = std::max(
          0.0, static_cast<double>(total_steps - iteration) / std::max(1.0, static_cast<double>(total_steps - w)));
    }
    return warmup_min_lr + (peak_lr - warmup_min_lr) * gamma;
  }
  if (warmup_steps > 0 && step <= warmup_steps) {
    return peak_lr * static_cast<double>(std::max<int64_t>(step, 0)) / static_cast<double>(warmup_steps);
  }
  if (decay == Decay::kConstant) return peak_lr;
  const double min_lr = peak_lr * min_lr_ratio;
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (peak_lr - min_lr);
}

void adamw_update(const AdamWConfig& config, const AdamWStep& step) {
  check_step(step);
  if (step.weights.empty() || step.weights.data() == nullptr) return;  // nothing held (shapes-only device)
  const double t = static_cast<double>(step.step);
  AdamWOp k;
  k.weights_dtype = step.weights.dtype();
  k.moments_dtype = step.m.dtype();
  k.grads_dtype = step.grads.dtype();
  k.beta1 = static_cast<float>(config.beta1);
  k.beta2 = static_cast<float>(config.beta2);
  k.eps = static_cast<float>(config.eps);
  k.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
  k.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
  k.step_size = static_cast<float>(step.lr / (1.0 - std::pow(config.beta1, t)));
  k.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(config.beta2, t)));
  k.decay_factor = config.decoupled ? static_cast<float>(1.0 - step.lr * config.weight_decay) : 1.0f;
  k.l2 = config.decoupled ? 0.0f : static_cast<float>(config.weight_decay);
  k.grad_scale = step.grad_scale;
  update_runs(step, k, step.ops != nullptr ? *step.ops : cpu::cpu_ops());
}

double grad_sum_of_squares(ConstElementSpan grads) {
  if (grads.data() == nullptr) return 0;
  double sum = 0;
  if (grads.dtype() == DType::kF32) {
    const float* g = static_cast<const float*>(grads.data());
    for (size_t i = 0; i < grads.size(); ++i) sum += static_cast<double>(g[i]) * g[i];
  } else {
    const uint16_t* g = static_cast<const uint16_t*>(grads.data());
    for (size_t i = 0; i < grads.size(); ++i) {
      const double value = bf16_to_float(g[i]);
      sum += value * value;
    }
  }
  return sum;
}

float clip_coefficient(double global_norm, double max_norm) {
  const double coefficient = max_norm / (global_norm + 1e-6);
  return static_cast<float>(std::min(coefficient, 1.0));
}

}  // namespace emu::optim
