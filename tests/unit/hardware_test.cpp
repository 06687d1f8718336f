// The hardware descriptions: every built-in file reads, its figures stand where the datasheets put them against
// each other, a named cap exists for the same memory, and a user's edited file is read or refused by field.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "emu/cap_spec.h"
#include "emu/check.h"
#include "emu/hardware.h"
#include "tests/support/process.h"

namespace emu {
namespace {

TEST(Hardware, EveryBuiltInDescriptionReads) {
  const std::vector<Hardware>& all = builtin_hardware();
  ASSERT_EQ(all.size(), 6u) << hardware_names();
  for (const Hardware& h : all) {
    SCOPED_TRACE(h.name);
    EXPECT_EQ(h.origin, "built-in");
    EXPECT_EQ(h.gpus_per_node, 8);
    // Tensor cores run bf16 many times faster than plain fp32 on every one of these (A100 16x, H100 about 15x).
    EXPECT_GT(h.bf16_dense_tflops, 10 * h.fp32_tflops);
    // Within a node the GPUs talk faster than across nodes, and the host link is no faster than the node's.
    EXPECT_GT(h.intra_node.gb_per_s_per_direction, h.inter_node.gb_per_s_per_direction);
    EXPECT_LE(h.host.gb_per_s_per_direction, h.intra_node.gb_per_s_per_direction);
    EXPECT_LT(h.intra_node.step_latency_us, h.inter_node.step_latency_us);
    if (!h.cap.empty()) {
      // The named cap is what PyTorch reports for the same card: a little under its nominal memory, whose "GB"
      // of HBM are 2^30 bytes (an A100 40GB: 39.59 GiB usable).
      const CapSpec cap = parse_cap_spec(h.cap);
      const double nominal = h.memory_gib * (1 << 30);
      EXPECT_LT(static_cast<double>(cap.bytes), nominal);
      EXPECT_GT(static_cast<double>(cap.bytes), 0.95 * nominal);
    }
  }
  EXPECT_EQ(find_hardware("h100-80gb-sxm").hbm_gb_per_s, 3350);
  EXPECT_EQ(find_hardware("a100-40gb-sxm").intra_node.gb_per_s_per_direction, 300);  // NVLink 3: 600 GB/s both ways
}

TEST(Hardware, UnknownNamesAreRefusedWithTheChoices) {
  try {
    find_hardware("h100");
    FAIL() << "expected an InputError";
  } catch (const InputError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("hardware 'h100' is not known"), std::string::npos) << what;
    EXPECT_NE(what.find("h100-80gb-sxm"), std::string::npos) << what;
  }
}

std::string write_file(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

TEST(Hardware, AUsersEditedCopyIsReadAndCheckedByField) {
  const testing::TempDir dir("hardware");
  // A copy of the A100 description with a slower network, as a user edits it for their cluster.
  std::string copy = R"({"name": "my-cluster", "description": "A100 nodes on 100 Gb/s Ethernet",
    "gpu": {"memory_gib": 80, "bf16_dense_tflops": 312, "fp32_tflops": 19.5, "hbm_gb_per_s": 2039},
    "intra_node": {"link": "NVLink 3", "gpus_per_node": 8, "gb_per_s_per_direction": 300, "step_latency_us": 3.4},
    "inter_node": {"link": "RoCE 100 Gb/s", "gb_per_s_per_direction": 12.5, "step_latency_us": 20},
    "call_latency_us": 8.4,
    "host": {"link": "PCIe Gen4 x16", "gb_per_s_per_direction": 32},
    "sources": {"gpu": "datasheet", "intra_node": "datasheet", "inter_node": "our switch",
                "host": "datasheet", "latencies": "measured"}})";
  const Hardware mine = find_hardware(write_file(dir, "my-cluster.json", copy));
  EXPECT_EQ(mine.name, "my-cluster");
  EXPECT_EQ(mine.inter_node.gb_per_s_per_direction, 12.5);
  EXPECT_TRUE(mine.cap.empty());

  const auto refused = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string bad = copy;
    bad.replace(bad.find(from), from.size(), to);
    try {
      find_hardware(write_file(dir, "bad.json", bad));
      ADD_FAILURE() << "accepted " << to;
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
  };
  refused(R"("gb_per_s_per_direction": 12.5)", R"("gb_per_s_per_direction": -1)",
          "inter_node: \"gb_per_s_per_direction\" must be a number above 0");
  refused(R"("hbm_gb_per_s": 2039)", R"("hbm": 2039)", "gpu: \"hbm_gb_per_s\" must be a number above 0");
  refused(R"("gpus_per_node": 8)", R"("gpus_per_node": 7.5)", "\"gpus_per_node\" must be a whole number");
  refused(R"("latencies": "measured")", R"("other": "x")", "sources: \"latencies\" must say where");
  refused(R"({"name")", R"([{"name")", "not a JSON object");
}

}  // namespace
}  // namespace emu
