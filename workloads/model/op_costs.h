// The work of each op the model runs, at the shapes it runs them: floating-point operations and bytes of device
// memory read and written, for a roofline estimate of its time on a GPU (app/step_time.h).
//
// The lists follow the op sequence of blocks.cpp and model.cpp one op at a time (the same linears, attention,
// norms, activation and residual adds, the embedding, the head and the loss), so a plan, whose shapes-only device
// runs no op, knows each one's work as well as a run does. FLOPs are what the kernel executes: a linear
// [T, in] · [in, out] is 2·T·in·out forward and twice that backward (dX and dW); causal attention through the
// flash/SDPA kernel skips the masked half of the scores (FlashAttention-2's causal blocks), forward 2·b·s²·a·d
// and backward 2.5 times that (five matrix products against two); eager attention computes the whole s × s
// matrix. Bytes are the tensors each op reads and writes once, at their dtype.
#pragma once

#include <string_view>
#include <vector>

#include "workloads/model/config.h"

namespace emu::model {

enum class OpClass : uint8_t {
  kMatmul,     // a linear layer: tensor cores at the matmul fraction of the peak
  kAttention,  // the attention kernel: its own achievable fraction
  kMemory,     // element-wise, norms, embedding, loss: bandwidth-bound
};

struct OpCost {
  std::string_view name;  // "q_proj", "attention", "input norm", ...
  OpClass op_class = OpClass::kMemory;
  double flops = 0;
  double bytes = 0;
};

// One transformer block's ops, forward and backward (backward without the recomputation that checkpointing adds:
// the caller adds the forward list once more).
std::vector<OpCost> block_forward_ops(const ModelConfig& config, const ModelOptions& options);
std::vector<OpCost> block_backward_ops(const ModelConfig& config, const ModelOptions& options);
// The root unit's: embedding, final norm, head and loss.
std::vector<OpCost> root_forward_ops(const ModelConfig& config, const ModelOptions& options);
std::vector<OpCost> root_backward_ops(const ModelConfig& config, const ModelOptions& options);

// Sums over a list.
double total_flops(const std::vector<OpCost>& ops);
double total_bytes(const std::vector<OpCost>& ops);

}  // namespace emu::model
