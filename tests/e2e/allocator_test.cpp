// --allocator and --alloc-conf end to end: the caching allocator decides the verdict on reserved memory, the
// report and the JSON show allocated beside reserved, and bad values are bad input on every rank.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/emu_process.h"

namespace emu {
namespace {

using nlohmann::json;
using testing::count_of;
using testing::kEmu;
using testing::mpiexec;
using testing::read_json;
using testing::run_process;

// llama2-70b under ZeRO-3 on 64 GPUs, planned at full scale: 28.69 GiB allocated at the peak. A 29 GiB GPU holds
// that exactly, but PyTorch's caching allocator reserves whole segments (blocks rounded to 512 B, 2 MiB small
// segments, 20 MiB ones for 1-10 MiB tensors), which come to more than 29 GiB; expandable segments, mapping pages
// into one segment, fit in it.
struct Planned {
  std::string out;
  json strategy;
};

Planned plan(const std::string& args, const testing::TempDir& dir) {
  const std::string path = dir.file("plan.json");
  const auto run = run_process(
      mpiexec(1) + kEmu + " --model llama2-70b --plan 64 --cap 29GiB --strategies zero3 " + args + " --json " + path,
      120);
  EXPECT_EQ(run.exit_code, 0) << args << "\n" << run.err;
  return {run.out, read_json(path)["strategies"][0]};
}

TEST(Allocator, ReservedMemoryDecidesTheVerdict) {
  testing::TempDir dir("allocator");
  const Planned caching = plan("", dir);
  const Planned exact = plan("--allocator exact", dir);
  const Planned expandable = plan("--alloc-conf expandable_segments:True", dir);
  const uint64_t cap = 29ull << 30;

  EXPECT_EQ(exact.strategy["verdict"], "fit");
  EXPECT_LE(exact.strategy["peak"]["bytes"].get<uint64_t>(), cap);
  EXPECT_EQ(exact.strategy["reserved"]["peak_bytes"], exact.strategy["peak"]["bytes"]) << "exact: nothing cached";
  EXPECT_EQ(exact.strategy["reserved"]["fragmentation_bytes"], 0);

  EXPECT_EQ(caching.strategy["verdict"], "oom");
  EXPECT_EQ(caching.strategy["peak"]["bytes"], exact.strategy["peak"]["bytes"]) << "allocated is counted as before";
  const json& reserved = caching.strategy["reserved"];
  EXPECT_EQ(reserved["allocator"], "caching");
  EXPECT_GT(reserved["peak_bytes"].get<uint64_t>(), cap);
  EXPECT_EQ(reserved["fragmentation_bytes"].get<uint64_t>(),
            reserved["peak_bytes"].get<uint64_t>() - reserved["allocated_at_peak_bytes"].get<uint64_t>());
  EXPECT_GT(reserved["fragmentation_bytes"].get<uint64_t>(), 0u);
  EXPECT_NE(caching.out.find("reserved/rank"), std::string::npos) << caching.out;
  EXPECT_EQ(exact.out.find("reserved/rank"), std::string::npos) << exact.out;

  EXPECT_EQ(expandable.strategy["verdict"], "fit");
  EXPECT_EQ(expandable.strategy["reserved"]["alloc_conf"], "expandable_segments:True");
  EXPECT_LE(expandable.strategy["reserved"]["peak_bytes"].get<uint64_t>(), cap);
  EXPECT_NE(expandable.out.find("caching allocator (expandable_segments:True)"), std::string::npos) << expandable.out;
}

// A shrunk run that passes its cap says so as PyTorch does, with what is reserved but unallocated.
TEST(Allocator, OutOfMemoryReadsLikePyTorch) {
  const auto run = run_process(
      mpiexec(2) + kEmu + " --model gpt2 --shrink 8 --steps 1 --strategies ddp --cap 2.5GB-scaled --strict-oom", 120);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.err.find("is reserved by PyTorch but unallocated"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), std::string::npos) << run.err;
}

TEST(Allocator, BadValuesAreBadInputOnEveryRank) {
  const std::pair<std::string, std::string> table[] = {
      {"--allocator slab", "--allocator 'slab': the allocators are caching, exact"},
      {"--alloc-conf expandable_segments:yes", "expandable_segments takes True or False, not 'yes'"},
      {"--alloc-conf max_split_size_mb:16", "max_split_size_mb takes a whole number of MiB above 20"},
      {"--alloc-conf roundup_power2_divisions:4", "unknown key 'roundup_power2_divisions'"},
      {"--allocator exact --alloc-conf expandable_segments:True", "--allocator exact has none"},
  };
  for (const auto& [args, message] : table) {
    const auto run = run_process(mpiexec(2) + kEmu + " --model gpt2 " + args, 60);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.err;
    EXPECT_EQ(count_of(run.err, "emu: error: "), 1) << args << "\n" << run.err;
    EXPECT_NE(run.err.find(message), std::string::npos) << args << "\n" << run.err;
  }
}

}  // namespace
}  // namespace emu
