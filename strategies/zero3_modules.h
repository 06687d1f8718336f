// ZeRO-3's gathered parameters at DeepSpeed's grain: one parameter tensor at a time, as
// PartitionedParameterCoordinator (deepspeed/runtime/zero/partitioned_param_coordinator.py) fetches and releases
// them from its sub-modules' pre- and post-forward and -backward hooks. Shared by zero3.cpp, which charges what it
// returns while the model runs, and zero3_model.cpp, which predicts the same; nothing here touches a device.
//
// The trace (what the coordinator records in a traced step and replays from then on): every parameter tensor in the
// order its module runs. Forward: the embeddings' tensors, each block's tensors in the order its forward uses them
// (input_layernorm, q, k, v, o, post_attention_layernorm, gate, up, down for Llama; analytic.h module_order), then the
// final norm's and the head's (a tied head: the token table again). Backward: the head, the final norm, each block from
// the last (under activation checkpointing its forward again, as torch.utils.checkpoint's recomputation fires the
// forward hooks, then) its tensors in reverse layout order (down, up, gate, norm, o, v, k, q, norm: autograd runs the
// latest-made node first; a bias beside its weight), the embeddings last.
//
// At each use of tensor p, at trace position i (DeepSpeed's rules, the trace complete):
//   fetch     p all-gathered unless available; its trace entry popped off the parameter queue unless a prefetch
//             took it already (fetch_sub_module)
//   prefetch  with stage3_prefetch_bucket_size > 0, entries popped off the queue while fewer elements than
//             min(bucket, stage3_max_live_parameters − elements available) are being prefetched; each not available
//             is all-gathered (the one that crosses the limit too), and every popped tensor is marked as used up to
//             its entry's position; more than one tensor prefetched at once are all-gathered coalesced, into one
//             flat buffer that lives, beside the tensors' own copies (made at the first wait on any of them), until
//             the last of them is fetched (the coordinator's in-flight registry holds the handle), or the micro-batch
//             ends (reset_step waits on what is left)
//   release   p freed after its use (release_sub_module, __params_to_release) unless persistent (at most
//             stage3_param_persistence_threshold elements, gathered once, freed only by the optimizer step), marked
//             by a prefetch for a later use, or used again within stage3_max_reuse_distance elements of the trace
//             after i (counted as the trace's tensors are, each use once)
// Elements are as a shrunk run charges them, compared with the knobs ÷ k². Persistent tensors are outside the
// coordinator's count of available elements (DeepSpeed gathers them apart, after the optimizer step).
#pragma once

#include <cstdint>
#include <vector>

#include "strategies/analytic.h"
#include "strategies/strategy.h"

namespace emu::strategy {

struct Zero3ModuleInput {
  // [unit][tensor] elements of each parameter tensor as charged, in the order the unit's forward uses them; unit 0
  // the root, in layout order.
  std::vector<std::vector<uint64_t>> tensors;
  // [root tensor] used by the embedding modules (first in forward, last in backward); the root's other tensors are
  // the final norm's and the head's, in that order.
  std::vector<bool> embedding;
  bool tied = false;  // the head uses root tensor 0, the token table
  bool checkpoint = false;
  uint64_t prefetch_bucket = 0, max_live = 0, max_reuse = 0, persistence = 0;
};

// The elements gathered at most while each stretch of one micro-batch runs, and what is left after it.
struct Zero3Phases {
  std::vector<uint64_t> forward;   // [unit]: 0 the embeddings' forward, u block u's
  uint64_t head_forward = 0;       // the final norm's and the head's forward, through the loss
  uint64_t head_backward = 0;      // the head's and the final norm's backward
  std::vector<uint64_t> backward;  // [unit]: u block u's backward (and its recomputation), 0 the embeddings'
  uint64_t after = 0;              // after backward: the persistent tensors
  // [unit] every tensor of the unit still gathered from the end of its forward to its backward: DeepSpeed
  // all-gathers nothing for its backward
  std::vector<bool> kept;
  uint64_t max() const;  // the most gathered at once
};

// The trace's tensors as `input` lays the units out (over TP the rank's slices), the knobs ÷ k² from `options`.
Zero3ModuleInput zero3_module_input(const StrategyOptions& options, const AnalyticInput& input);

// One micro-batch replayed. `persistent_gathered`: the persistent tensors are gathered when it begins (a later
// micro-batch of the step; the first after an optimizer step gathers them as it uses them).
Zero3Phases zero3_module_phases(const Zero3ModuleInput& input, bool persistent_gathered);

}  // namespace emu::strategy
