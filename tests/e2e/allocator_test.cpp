// --allocator and --alloc-conf end to end: the caching allocator decides the verdict on reserved memory, the
// report and the JSON show allocated beside reserved, and bad values are bad input on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
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

// llama2-70b under ZeRO-3 on 64 GPUs, planned at full scale. PyTorch's caching allocator reserves whole segments
// (blocks rounded to 512 B, 2 MiB small segments, 20 MiB ones for 1-10 MiB tensors), so it reserves more than is
// allocated at the peak; expandable segments, mapping pages into one segment, reserve less than whole segments do.
// A GPU whose capacity lies between the two holds the run with expandable segments and runs out of memory with
// plain caching although every allocated byte fits: an out-of-memory through fragmentation alone.
struct Planned {
  std::string out;
  json strategy;
};

// One step: the allocator's behaviour under a cap shows in the first, and the search below plans ~20 times. No
// advice: the search's plans that do not fit would each search the knobs (four times the plan's own time).
Planned plan(const std::string& args, const testing::TempDir& dir) {
  const std::string path = dir.file("plan.json");
  const auto run = run_process(mpiexec(1) + kEmu + " --model llama2-70b --plan 64 --steps 1 --strategies zero3 " +
                                   args + " --no-advise --json " + path,
                               120);
  EXPECT_EQ(run.exit_code, 0) << args << "\n" << run.err;
  return {run.out, read_json(path)["strategies"][0]};
}

// The smallest cap, to `step` bytes, in (lo, hi] under which the run fits with the allocator `args` sets.
uint64_t smallest_cap_that_fits(const std::string& args, uint64_t lo, uint64_t hi, uint64_t step,
                                const testing::TempDir& dir) {
  while (hi - lo > step) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (plan("--cap " + std::to_string(mid) + "B " + args, dir).strategy["verdict"] == "fit") {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

TEST(Allocator, ReservedMemoryDecidesTheVerdict) {
  testing::TempDir dir("allocator");
  // Without a cap: what is allocated at the peak, and what plain caching reserves when nothing presses it.
  const uint64_t allocated = plan("--allocator exact", dir).strategy["peak"]["bytes"];
  const uint64_t reserved_caching = plan("", dir).strategy["reserved"]["peak_bytes"];
  ASSERT_LT(allocated, reserved_caching);
  // Pressed by a cap, each allocator frees what it caches and retries before it gives up: the smallest GPU each
  // runs on, to 16 MiB (the two lie ~900 MiB apart).
  const uint64_t needs_caching = smallest_cap_that_fits("", allocated, reserved_caching, 16 << 20, dir);
  const uint64_t needs_expandable =
      smallest_cap_that_fits("--alloc-conf expandable_segments:True", allocated, reserved_caching, 16 << 20, dir);
  std::printf("allocated %llu, caching needs %llu, expandable segments need %llu\n", (unsigned long long)allocated,
              (unsigned long long)needs_caching, (unsigned long long)needs_expandable);
  ASSERT_LT(needs_expandable, needs_caching) << "expandable segments fragment less";
  // A GPU on which every allocated byte fits, and expandable segments too, but plain caching does not.
  const uint64_t cap = needs_expandable;
  const std::string cap_flag = "--cap " + std::to_string(cap) + "B ";
  const Planned caching = plan(cap_flag, dir);
  const Planned exact = plan(cap_flag + "--allocator exact", dir);
  const Planned expandable = plan(cap_flag + "--alloc-conf expandable_segments:True", dir);

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
  EXPECT_EQ(run.exit_code, 1) << "strict mode stops like an expectation that failed";
  EXPECT_NE(run.err.find("is reserved by PyTorch but unallocated"), std::string::npos) << run.err;
  // Full-scale bytes first, the shrunk run's in brackets: 2.5 GB = 2.33 GiB; / 8^2 = 39,062,500 B = 37.25 MiB.
  EXPECT_NE(run.err.find("total capacity of 2.33 GiB [37.25 MiB]"), std::string::npos) << run.err;
  EXPECT_EQ(run.err.find(".cpp:"), std::string::npos) << "an expected outcome names no source line: " << run.err;
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
