// The CUDA attention kernels' launchers, for the CUDA Ops (cuda_ops.cu): Ops' attention ops (emu/ops.h) on the
// legacy default stream. shared_per_block is the GPU's opt-in maximum of shared memory per block, which bounds seq.
#pragma once

#include <cstddef>

#include "emu/ops.h"

namespace emu::cuda {

// Classic passes probs [b, a, s, s] and a null lse; flash passes lse [b, a, s] and null probs.
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v, float* probs,
                       float* out, float* lse, size_t shared_per_block);
// Classic passes probs and dscores (dS written there by the dq pass, read by the dk/dv pass); flash passes lse and
// null probs and dscores. The row dots D [b, a, s] live in `scratch`'s scratch for the call.
void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v, const float* probs,
                        const float* lse, const float* out, const float* dout, float* dq, float* dk, float* dv,
                        float* dscores, size_t shared_per_block, Ops& scratch);

}  // namespace emu::cuda
