#include "workloads/optim/adamw_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "emu/bf16.h"

namespace emu::optim {

AdamWState::AdamWState(Device& device, PrecisionRecipe recipe, size_t count, std::string_view what,
                       const model::ParameterCharge& charge)
    : recipe_(recipe), count_(count) {
  m_ = model::allocate_parameter_space(device, charge, count, recipe.moments, Category::kOptimizerState,
                                       fmt::format("{} adam m", what));
  v_ = model::allocate_parameter_space(device, charge, count, recipe.moments, Category::kOptimizerState,
                                       fmt::format("{} adam v", what));
  if (recipe.has_master) {
    master_ = model::allocate_parameter_space(device, charge, count, DType::kF32, Category::kMasterWeights,
                                              fmt::format("{} master weights", what));
  }
}

void AdamWState::load_master(ConstElementSpan weights) {
  if (!recipe_.has_master) return;
  EMU_CHECK(weights.size() == count_, "master weights of {} elements loaded from {} elements", count_, weights.size());
  float* master = master_.as<float>();
  if (master == nullptr || weights.data() == nullptr) return;  // nothing held (shapes-only device)
  if (weights.dtype() == DType::kF32) {
    const float* source = static_cast<const float*>(weights.data());
    std::copy(source, source + count_, master);
  } else {
    const uint16_t* source = static_cast<const uint16_t*>(weights.data());
    for (size_t i = 0; i < count_; ++i) master[i] = bf16_to_float(source[i]);
  }
}

void AdamWState::step(const AdamWConfig& config, ElementSpan params, ConstElementSpan grads, size_t offset,
                      std::span<const DecayRange> decay, double lr, float grad_scale) {
  EMU_CHECK(params.size() == count_ && params.dtype() == recipe_.params,
            "{} recipe step needs {} {} parameters, got {} of {}", recipe_.name(), count_, dtype_name(recipe_.params),
            params.size(), dtype_name(params.dtype()));
  AdamWStep step;
  step.weights = recipe_.has_master ? master() : params;
  step.compute_copy = recipe_.has_master ? params : ElementSpan();
  step.m = m();
  step.v = v();
  step.grads = grads;
  step.offset = offset;
  step.decay = decay;
  step.step = steps_taken_ + 1;
  step.lr = lr;
  step.grad_scale = grad_scale;
  if (m_.device() != nullptr && m_.device()->holds_data()) step.ops = m_.device()->ops();
  adamw_update(config, step);
  ++steps_taken_;
}

}  // namespace emu::optim
