#include "emu/cpu/blas_info.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>

namespace emu::cpu {
namespace {

// OpenBLAS's x86-64 cores whose kernels are SSE only (kernel/x86_64/KERNEL.<CORE>): a CPU with AVX2 or AVX-512
// runs them at a fraction of its rate (one core of a 2-core Emerald Rapids VM: sgemm 1024^3 at 23 GFLOP/s on
// Prescott's kernels, 111 on Cooperlake's).
constexpr std::array<std::string_view, 9> kSseOnlyCores = {"Prescott", "Core2",   "Penryn",    "Dunnington", "Nehalem",
                                                           "Atom",     "Opteron", "Barcelona", "Bobcat"};

}  // namespace

std::string suggested_coretype(const std::string& core, const std::string& coretype, const CpuVectorUnits& units) {
  if (!coretype.empty()) return "";
  const bool sse_only = std::find(kSseOnlyCores.begin(), kSseOnlyCores.end(), core) != kSseOnlyCores.end();
  if (!sse_only) return "";
  if (units.avx512_bf16) return "Cooperlake";
  if (units.avx512) return "SkylakeX";
  if (units.avx2_fma) return "Haswell";
  return "";
}

CpuVectorUnits this_cpu_vector_units() {
  CpuVectorUnits units;
#if defined(__x86_64__)
  __builtin_cpu_init();
  units.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  units.avx512 = __builtin_cpu_supports("avx512f");
  units.avx512_bf16 = units.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return units;
}

BlasInfo describe_blas() {
  BlasInfo info;
  info.config = openblas_get_config();
  info.core = openblas_get_corename();
  if (const char* set = std::getenv("OPENBLAS_CORETYPE")) info.coretype = set;
  const CpuVectorUnits units = this_cpu_vector_units();
  info.suggestion = suggested_coretype(info.core, info.coretype, units);
  if (!info.suggestion.empty()) info.unused_units = units.avx512 ? "AVX-512" : "AVX2";
  return info;
}

}  // namespace emu::cpu
