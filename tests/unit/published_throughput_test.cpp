// emu's predicted step time beside published training throughputs and nccl-tests bus bandwidths: the README's
// table, recomputed. Each row plans the published configuration at full scale (the same command line a user
// would type, --plan N --hardware ...) and compares tokens per second per GPU; the nccl-tests rows time one
// all-reduce. A row marked calibration set its GPU generation's matmul fraction (step_time.cpp,
// achievable_for); every other row is a prediction and must stay within its stated tolerance: 20%, or wider
// where the README says why emu cannot match the configuration (selective activation checkpointing, a
// power-capped GPU).
//
// Run it alone to print the table: build/release/tests/app_published_throughput_test (it prints on stdout).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>

#include "app/options.h"
#include "app/plan.h"
#include "app/step_time.h"
#include "tests/support/paths.h"

namespace emu::app {
namespace {

struct Row {
  const char* setting;  // what was measured, in words
  const char* source;   // where it was published
  const char* args;     // emu's command line for the same configuration
  double published;     // tokens per second per GPU
  double tolerance;     // |predicted / published - 1| allowed
  bool calibration;
};

const char* const kTorchtitan = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md";
const char* const kFoundry = "https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md";

const Row kRows[] = {
    {"Llama 2 13B, FSDP2, 64 x A100-80GB, b 2, s 4096, no AC", kTorchtitan,
     "--model llama2-13b --plan 64 --seq-len 4096 --micro-batch 2 --no-checkpoint --strategies fsdp2 "
     "--hardware a100-80gb-sxm",
     2162, 0.05, true},
    {"MPT-13B, FSDP FULL_SHARD, 8 x A100-80GB, b 2 x 3, s 2048, no AC", kFoundry,
     "--model " EMU_SOURCE_DIR "/tests/data/published/mpt-13b.json --plan 8 --seq-len 2048 --micro-batch 2 "
     "--grad-accum 3 --no-checkpoint --strategies fsdp --hardware a100-80gb-sxm",
     2262, 0.2, false},
    {"Llama 2 70B, FSDP2, 64 x A100-80GB, b 2, s 4096, full AC", kTorchtitan,
     "--model llama2-70b --plan 64 --seq-len 4096 --micro-batch 2 --checkpoint --strategies fsdp2 "
     "--hardware a100-80gb-sxm",
     353, 0.2, false},
    {"Llama 3 70B, FSDP2, 64 x A100-80GB, b 1, s 8192, full AC", kTorchtitan,
     "--model llama3-70b --plan 64 --seq-len 8192 --micro-batch 1 --checkpoint --strategies fsdp2 "
     "--hardware a100-80gb-sxm",
     331, 0.2, false},
    {"Llama 3 8B, FSDP2, 64 x A100-80GB, b 1, s 8192, selective AC (emu: full)", kTorchtitan,
     "--model llama3-8b --plan 64 --seq-len 8192 --micro-batch 1 --checkpoint --strategies fsdp2 "
     "--hardware a100-80gb-sxm",
     2904, 0.2, false},
    {"MPT-7B, FSDP FULL_SHARD, 8 x H100-80GB, b 6, s 2048, no AC", kFoundry,
     "--model " EMU_SOURCE_DIR "/tests/data/published/mpt-7b.json --plan 8 --seq-len 2048 --micro-batch 6 "
     "--no-checkpoint --strategies fsdp --hardware h100-80gb-sxm",
     10643, 0.05, true},
    {"MPT-13B, FSDP FULL_SHARD, 8 x H100-80GB, b 2, s 2048, no AC", kFoundry,
     "--model " EMU_SOURCE_DIR "/tests/data/published/mpt-13b.json --plan 8 --seq-len 2048 --micro-batch 2 "
     "--no-checkpoint --strategies fsdp --hardware h100-80gb-sxm",
     4792, 0.2, false},
    {"MPT-13B, FSDP FULL_SHARD, 64 x H100-80GB, b 2, s 2048, no AC", kFoundry,
     "--model " EMU_SOURCE_DIR "/tests/data/published/mpt-13b.json --plan 64 --seq-len 2048 --micro-batch 2 "
     "--no-checkpoint --strategies fsdp --hardware h100-80gb-sxm",
     4800, 0.25, false},
    {"Llama 3.1 8B, FSDP2, 8 x H100 (96GB, 500 W), b 2, s 8192, selective AC (emu: full, 700 W)", kTorchtitan,
     "--model llama3-8b --plan 8 --seq-len 8192 --micro-batch 2 --checkpoint --strategies fsdp2 "
     "--hardware h100-80gb-sxm",
     5762, 0.2, false},
};

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out = {"emu"};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

StepTime predict(const std::string& args) {
  const std::vector<std::string> w = words(args);
  std::vector<const char*> argv;
  argv.reserve(w.size());
  for (const std::string& s : w) argv.push_back(s.c_str());
  const RunOptions options = parse_command_line(static_cast<int>(argv.size()), argv.data()).options;
  const RunReport report = plan_strategies(options, options.plan_ranks, 8);
  EXPECT_EQ(report.outcomes.size(), 1u);
  EXPECT_TRUE(report.outcomes.front().fits()) << args << ": the published run fit, so must the plan";
  return predict_step_time(report, report.outcomes.front(), step_time_setting(options));
}

TEST(PublishedThroughput, TrainingRowsWithinTheirTolerance) {
  std::string table =
      "| configuration | published tokens/s/GPU | emu | error | MFU (emu) | source |\n|---|---:|---:|---:|---:|---|\n";
  for (const Row& row : kRows) {
    SCOPED_TRACE(row.setting);
    const StepTime st = predict(row.args);
    const double error = st.tokens_per_second_per_gpu / row.published - 1;
    table += fmt::format("| {}{} | {:.0f} | {:.0f} | {:+.1f}% | {:.1f}% | {} |\n", row.setting,
                         row.calibration ? " (calibration)" : "", row.published, st.tokens_per_second_per_gpu,
                         100 * error, 100 * st.mfu, row.source);
    EXPECT_LE(std::abs(error), row.tolerance) << row.args;
  }
  fmt::print("{}", table);
}

TEST(PublishedThroughput, NcclTestsBusBandwidth) {
  // nccl-tests' bus bandwidth of an all-reduce is 2(N-1)/N · S / t (doc/PERFORMANCE.md).
  const auto busbw = [](const StepTimeSetting& s, double bytes, int ranks, Reach reach) {
    const double t = collective_seconds(coll::CollectiveKind::kAllReduce, "ring", bytes, ranks,
                                        link_for(s, reach, ranks), s.hardware.call_latency_us * 1e-6);
    return 2.0 * (ranks - 1) / ranks * bytes / t / 1e9;
  };
  RunOptions options;
  options.hardware = "a100-80gb-sxm";
  StepTimeSetting a100 = step_time_setting(options);
  // 8 x A100-SXM4-80GB on NVLink, all_reduce_perf up to 1 GiB: "a busbw of ~200 GB/s"
  // (https://github.com/NVIDIA/nccl-tests/issues/149).
  const double nvlink = busbw(a100, double(1 << 30), 8, Reach::kInsideNode);
  // 3 nodes of 8 x A100-SXM4-40GB with 4 HDR NICs each (12.5 GB/s per GPU), all_reduce_perf up to 128 MiB: about
  // 85 GB/s on average, 96 GB/s at the top (https://github.com/NVIDIA/nccl-tests/issues/119).
  options.hardware = "a100-40gb-sxm";
  StepTimeSetting three_nodes = step_time_setting(options);
  three_nodes.hardware.inter_node.gb_per_s_per_direction = 12.5;
  const double network = busbw(three_nodes, double(128 << 20), 24, Reach::kWholeNodes);
  fmt::print("| all_reduce_perf, 8 x A100-80GB NVLink, 1 GiB | ~200 GB/s busbw | {:.0f} GB/s | {:+.1f}% |\n", nvlink,
             100 * (nvlink / 200 - 1));
  fmt::print(
      "| all_reduce_perf, 24 x A100-40GB, 3 nodes x 4 HDR NICs, 128 MiB | 96 GB/s busbw | {:.0f} GB/s | {:+.1f}% |\n",
      network, 100 * (network / 96 - 1));
  EXPECT_NEAR(nvlink / 200, 1, 0.2);
  EXPECT_NEAR(network / 96, 1, 0.2);
}

}  // namespace
}  // namespace emu::app
