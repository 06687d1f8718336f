// Every cap form parses to the right byte count; every bad form is rejected naming the accepted forms.
#include <gtest/gtest.h>

#include "emu/cap_spec.h"
#include "emu/check.h"
#include "emu/memory.h"
#include "emu/units.h"

namespace emu {
namespace {

TEST(Units, OneSizeParserForEmuAndItsTools) {
  EXPECT_EQ(parse_bytes("64MiB"), 64ull << 20);
  EXPECT_EQ(parse_bytes("100MB"), 100'000'000ull);
  EXPECT_EQ(parse_bytes("1.5kib"), 1536ull);
  EXPECT_EQ(parse_bytes("512B"), 512ull);
  EXPECT_FALSE(parse_bytes("64"));  // no unit: never guess between 10^6 and 2^20
  EXPECT_FALSE(parse_bytes("64M"));
  EXPECT_FALSE(parse_bytes("-1GB"));
  EXPECT_FALSE(parse_bytes("0GB"));
}

TEST(CapSpec, SizesInDecimalAndBinaryUnits) {
  EXPECT_EQ(parse_cap_spec("40GB").bytes, 40'000'000'000ull);
  EXPECT_EQ(parse_cap_spec("40GiB").bytes, 40ull << 30);
  EXPECT_EQ(parse_cap_spec("39.59GiB").bytes, 42'509'438'812ull);  // round(39.59 * 2^30)
  EXPECT_EQ(parse_cap_spec("150MB").bytes, 150'000'000ull);
  EXPECT_EQ(parse_cap_spec("512KiB").bytes, 524'288ull);
  EXPECT_EQ(parse_cap_spec("1000000B").bytes, 1'000'000ull);
  EXPECT_EQ(parse_cap_spec("2TB").bytes, 2'000'000'000'000ull);
  EXPECT_EQ(parse_cap_spec("1.5gib").bytes, 3ull << 29) << "units are case-insensitive, GB and GiB stay distinct";
}

TEST(CapSpec, NoneMeansNoCap) {
  const CapSpec spec = parse_cap_spec("none");
  EXPECT_TRUE(spec.unlimited);
  EXPECT_EQ(spec.per_rank_bytes(64), kNoCap);
}

TEST(CapSpec, NamedGpusCarryTheirUsableCapacity) {
  EXPECT_EQ(parse_cap_spec("a100-40gb").bytes, 42'509'438'812ull);  // 39.59 GiB, as PyTorch reports it
  EXPECT_EQ(parse_cap_spec("A100-80GB").bytes, 84'986'665'370ull);  // 79.15 GiB
  EXPECT_EQ(parse_cap_spec("h100-80gb").bytes, 85'029'615'043ull);  // 79.19 GiB
  EXPECT_EQ(parse_cap_spec("a100-40gb").gpu, "a100-40gb");
}

TEST(CapSpec, ScaledDividesByShrinkSquared) {
  const CapSpec spec = parse_cap_spec("40GB-scaled");
  EXPECT_TRUE(spec.scaled);
  EXPECT_EQ(spec.per_rank_bytes(64), 40'000'000'000ull / 4096);
  EXPECT_EQ(spec.per_rank_bytes(1), 40'000'000'000ull);
  EXPECT_EQ(spec.full_scale_bytes(64), 40'000'000'000ull / 4096 * 4096);
  EXPECT_EQ(parse_cap_spec("a100-40gb-scaled").per_rank_bytes(8), 42'509'438'812ull / 64);
}

TEST(CapSpec, UnscaledCapStandsForKSquaredAtFullScale) {
  const CapSpec spec = parse_cap_spec("150MB");
  EXPECT_EQ(spec.per_rank_bytes(8), 150'000'000ull);
  EXPECT_EQ(spec.full_scale_bytes(8), 150'000'000ull * 64);
}

TEST(CapSpec, BadFormsAreRejectedWithTheAcceptedForms) {
  for (const char* bad : {"", "40", "GB", "40XB", "-40GB", "0GB", "none-scaled", "40GB-scaled-scaled", "a100", "40 GB",
                          "1e3GB", "nan GB", "40GB-scale", "0.0000000001B", "99999999999TB"}) {
    try {
      parse_cap_spec(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const InputError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(std::string("'") + bad + "'"), std::string::npos) << message;
      EXPECT_NE(message.find("40GiB"), std::string::npos) << message;
      EXPECT_NE(message.find("a100-40gb"), std::string::npos) << message;
      EXPECT_NE(message.find("-scaled"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace emu
