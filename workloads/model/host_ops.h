// The CPU backend's ops: emu::Ops over host memory, through the fp32 kernels (kernels.h, attention.h: OpenBLAS
// for matrix products, Eigen for element-wise work) and the host AdamW (optim/adamw.h).
//
// The model asks ops_for(device) and computes only through what it gets, so the same model code runs on the cpu
// backend (these ops) and on a CUDA device (its kernels, emu/cuda/ops.cu). The ops are synchronous; synchronize()
// has nothing to wait for.
#pragma once

#include "emu/device.h"
#include "emu/ops.h"

namespace emu::model {

// The host's ops (one per process; they hold no state).
Ops& host_ops();

// The ops that compute on `device`'s buffers: its backend's own when it has them (a CUDA device), else the host's
// (the cpu backend keeps its buffers in host memory). Not called for a shapes-only device, which computes nothing.
Ops& ops_for(Device& device);

}  // namespace emu::model
