// The single-device reference: every unit whole on one device, for tests, the benchmark and as the baseline that
// strategies must match.
//
// Weights (kParameters) and gradients (kGradients) at the model's compute dtype, one flat buffer per unit, bound
// to the model at construction. The hooks do nothing. The optimizer here is plain SGD, enough to show training
// works; AdamW and master weights belong to the optimizer (workloads/optim) and to strategies.
#pragma once

#include <cstdint>
#include <vector>

#include "emu/device.h"
#include "workloads/model/model.h"

namespace emu::model {

// Hooks that do nothing: every unit is always whole and in place.
class NoHooks final : public Hooks {};

class LocalParams {
 public:
  // Allocates and binds every unit's weights and gradients on the model's device; initialises the weights with
  // init_unit(seed) rounded to the compute dtype; gradients start at zero.
  LocalParams(Model& model, uint64_t seed);

  Buffer& weights(int unit) { return weights_[static_cast<size_t>(unit)]; }
  Buffer& grads(int unit) { return grads_[static_cast<size_t>(unit)]; }
  void zero_grads();
  // w ← w − lr·g in fp32 arithmetic, stored at the compute dtype; then zeroes the gradients.
  void sgd_step(float lr);
  // One micro-batch: zero gradients, forward, backward; returns the loss.
  float train_step(const int32_t* tokens, const int32_t* targets, float lr);

 private:
  Model& model_;
  NoHooks hooks_;
  std::vector<Buffer> weights_;  // [units] flat, layout(u).count elements at the compute dtype
  std::vector<Buffer> grads_;    // [units] likewise
};

}  // namespace emu::model
