// The run header's BLAS line: which OpenBLAS cores leave a CPU's vector units unused, and the core named instead.
#include <gtest/gtest.h>

#include <cblas.h>

#include "emu/cpu/blas_info.h"

namespace emu::cpu {
namespace {

constexpr CpuVectorUnits kSse{};
constexpr CpuVectorUnits kAvx2{.avx2_fma = true};
constexpr CpuVectorUnits kAvx512{.avx2_fma = true, .avx512 = true};
constexpr CpuVectorUnits kAvx512Bf16{.avx2_fma = true, .avx512 = true, .avx512_bf16 = true};

// Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids (AVX-512 with BF16): Prescott's SSE3 kernels, where Cooperlake's
// run the CPU's AVX-512 units.
TEST(BlasInfo, SseOnlyKernelsOnAVectorCpuNameTheCoreItsUnitsRun) {
  EXPECT_EQ(suggested_coretype("Prescott", "", kAvx512Bf16), "Cooperlake");
  EXPECT_EQ(suggested_coretype("Prescott", "", kAvx512), "SkylakeX");
  EXPECT_EQ(suggested_coretype("Prescott", "", kAvx2), "Haswell");
  EXPECT_EQ(suggested_coretype("Nehalem", "", kAvx2), "Haswell");
  EXPECT_EQ(suggested_coretype("Core2", "", kAvx512), "SkylakeX");
}

TEST(BlasInfo, NothingToSuggestWhenTheKernelsFitOrTheUserChoseThem) {
  EXPECT_EQ(suggested_coretype("Prescott", "", kSse), "") << "an SSE-only CPU runs SSE kernels";
  EXPECT_EQ(suggested_coretype("Cooperlake", "", kAvx512Bf16), "");
  EXPECT_EQ(suggested_coretype("SkylakeX", "", kAvx512Bf16), "");
  EXPECT_EQ(suggested_coretype("Haswell", "", kAvx2), "");
  EXPECT_EQ(suggested_coretype("Zen", "", kAvx2), "");
  // OPENBLAS_CORETYPE set, even to the slow core: the user's choice (some CPUs need one; emu leaves it alone).
  EXPECT_EQ(suggested_coretype("Prescott", "Prescott", kAvx512Bf16), "");
}

TEST(BlasInfo, DescribesTheKernelsTheLibraryRuns) {
  const BlasInfo blas = describe_blas();
  EXPECT_EQ(blas.core, openblas_get_corename());
  EXPECT_NE(blas.config.find("OpenBLAS"), std::string::npos) << blas.config;
  EXPECT_NE(blas.config.find(blas.core), std::string::npos) << blas.config;
}

}  // namespace
}  // namespace emu::cpu
