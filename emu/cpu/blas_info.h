// The BLAS the CPU backend's matrix products run on, as the run header names it, and the one way it is often far
// slower than the CPU allows: OpenBLAS built with DYNAMIC_ARCH picks its kernels from the CPU's model number at load
// time, and a model newer than the library (Debian 12's 0.3.21 on Intel's Emerald Rapids, family 6 model 207) falls
// back to its Prescott kernels (SSE3), whatever vector units the CPU has. OPENBLAS_CORETYPE, read when the library
// loads, chooses the kernels instead; emu only says so, it never sets it.
#pragma once

#include <string>

namespace emu::cpu {

// What the CPU's vector units offer the BLAS kernels.
struct CpuVectorUnits {
  bool avx2_fma = false;
  bool avx512 = false;       // AVX-512 F
  bool avx512_bf16 = false;  // AVX-512 BF16 (Cooper Lake, Sapphire Rapids and later)
};

struct BlasInfo {
  std::string config;        // openblas_get_config(): version, build options, the kernels' core
  std::string core;          // openblas_get_corename(): the kernels in use
  std::string coretype;      // OPENBLAS_CORETYPE as the process started with it; empty when unset
  std::string suggestion;    // an OPENBLAS_CORETYPE that runs kernels this CPU has and the library skipped, or ""
  std::string unused_units;  // with a suggestion: the vector units the kernels in use leave idle ("AVX-512", "AVX2")
};

// The OpenBLAS core whose kernels the CPU's vector units run, when `core`'s kernels use none of them (an SSE-only
// core on a CPU with AVX2 and FMA or AVX-512) and the user has not chosen the core with OPENBLAS_CORETYPE
// (`coretype` non-empty); "" otherwise.
std::string suggested_coretype(const std::string& core, const std::string& coretype, const CpuVectorUnits& units);

CpuVectorUnits this_cpu_vector_units();
BlasInfo describe_blas();

}  // namespace emu::cpu
