// bf16 conversion: round to nearest even, exactly as a GPU stores bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "emu/bf16.h"
#include "emu/dtype.h"

namespace emu {
namespace {

TEST(BF16, ExactValuesRoundTrip) {
  for (float value : {0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 65536.0f}) EXPECT_EQ(round_to_bf16(value), value);
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one, 1.
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(round_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 1.0f + std::ldexp(1.0f, -7));
}

TEST(BF16, SpecialValues) {
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
}

}  // namespace
}  // namespace emu
