// The CPU backend's ops: emu::Ops over host memory, through the fp32 kernels (kernels.h, attention_kernels.h:
// OpenBLAS for matrix products, Eigen for element-wise work) and the host AdamW (adamw.h).
//
// The cpu device hands these out (Device::ops); the model computes only through what its device gives it, so the
// same model code runs here and on a CUDA device (emu/cuda/cuda_ops.cu). The ops are synchronous; synchronize()
// has nothing to wait for.
#pragma once

#include "emu/ops.h"

namespace emu::cpu {

// The CPU ops (one per process; they hold no state): what the cpu device's ops() returns, and the ops for code
// that computes on host memory it allocated itself (the optimizer given no device's ops, tests).
Ops& cpu_ops();

}  // namespace emu::cpu
