// Choosing a device backend by name: the one place that knows which backends this build has (DESIGN.md §6).
// Compiled in every build; the CUDA branch exists only with EMU_CUDA=ON. emu --device and the GPU tests choose
// through it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "emu/device.h"

namespace emu {

// "cpu", "shapes", or "cuda" (EMU_CUDA=ON builds). local_rank picks the real GPU (local_rank % GPUs on the node).
// Throws InputError naming the backends this build has.
std::unique_ptr<Device> make_device(std::string_view backend, MemoryPool::Options options, int local_rank = 0);

// The backends this build has, e.g. "cpu, shapes, cuda".
std::string device_backends();
// True when this build has the CUDA backend and a GPU is visible.
bool cuda_available();

}  // namespace emu
