#include "emu/backend.h"

#include <fmt/format.h>

#include "emu/check.h"

#if defined(EMU_CUDA)
#include "emu/cuda/cuda_device.h"
#endif

namespace emu {

std::string device_backends() {
#if defined(EMU_CUDA)
  return "cpu, shapes, cuda";
#else
  return "cpu, shapes";
#endif
}

bool cuda_available() {
#if defined(EMU_CUDA)
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Device> make_device(std::string_view backend, MemoryPool::Options options, int local_rank) {
  if (backend == "cpu") return make_cpu_device(options);
  if (backend == "shapes") return make_shapes_device(options);
#if defined(EMU_CUDA)
  if (backend == "cuda") {
    if (cuda::device_count() == 0) {
      throw InputError("backend cuda: no GPU is visible to this process (check nvidia-smi, CUDA_VISIBLE_DEVICES)");
    }
    return cuda::make_cuda_device(options, cuda::gpu_for_local_rank(local_rank));
  }
#endif
  throw InputError(fmt::format("unknown device backend '{}'; this build has: {}{}", backend, device_backends(),
                               backend == "cuda" ? " (reconfigure with -DEMU_CUDA=ON for cuda)" : ""));
}

}  // namespace emu
