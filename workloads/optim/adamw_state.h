// The optimizer's state on the device: Adam's moments and, in the mixed recipe, the fp32 master weights.
//
// It is made for a given element count: the whole flat buffer for DDP, one rank's shard for ZeRO and FSDP, so a
// sharded strategy is charged for its shard only. Memory is charged to the device's categories:
//   m, v    [count]  recipe.moments   Category::kOptimizerState
//   master  [count]  fp32             Category::kMasterWeights   (mixed recipe only)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "emu/device.h"
#include "workloads/model/shrink.h"
#include "workloads/optim/adamw.h"
#include "workloads/optim/precision.h"

namespace emu::optim {

class AdamWState {
 public:
  // Allocates (zero-filled) from `device`; may throw OutOfMemoryError. `what` prefixes the tensor names in
  // out-of-memory reports, e.g. "unit 3 shard".
  // `charge`: how a shrunk run charges the elements (model/shrink.h); charged as held by default.
  AdamWState(Device& device, PrecisionRecipe recipe, size_t count, std::string_view what = "adamw",
             const model::ParameterCharge& charge = {});

  size_t size() const { return count_; }
  const PrecisionRecipe& recipe() const { return recipe_; }
  // Steps taken so far; the next step's bias correction uses steps_taken() + 1.
  int64_t steps_taken() const { return steps_taken_; }

  ElementSpan m() const { return ElementSpan::of(m_); }
  ElementSpan v() const { return ElementSpan::of(v_); }
  // Empty unless the recipe has master weights.
  ElementSpan master() const { return ElementSpan::of(master_); }

  // Mixed recipe: sets the master weights from `weights` (fp32 for an exact start, or the bf16 parameters).
  // Other recipes have no master and ignore it. `weights` has size() elements.
  void load_master(ConstElementSpan weights);

  // One AdamW step over this state's elements, which are elements [offset, offset + size()) of the flat buffer.
  // `params` are those elements' compute-precision parameters (recipe.params): in the mixed recipe they receive
  // the updated master weights rounded to bf16; otherwise they are the weights and are updated in place.
  // `grads` (fp32 or bf16) are the same elements' gradients; `lr` comes from LrSchedule::lr_at(steps_taken() + 1)
  // and `grad_scale` from clip_coefficient.
  void step(const AdamWConfig& config, ElementSpan params, ConstElementSpan grads, size_t offset,
            std::span<const DecayRange> decay, double lr, float grad_scale = 1.0f);

 private:
  PrecisionRecipe recipe_;
  size_t count_ = 0;
  int64_t steps_taken_ = 0;
  Buffer m_;
  Buffer v_;
  Buffer master_;
};

}  // namespace emu::optim
