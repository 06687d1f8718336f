// The CPU backend's AdamW (Ops::adamw on host memory): one run of emu::AdamWOp, its step constants computed by the
// caller. The only implementation of the element-wise update on the host; the CUDA kernel follows it.
#pragma once

#include "emu/ops.h"

namespace emu::cpu {

void adamw(const AdamWOp& op);

}  // namespace emu::cpu
