// The advisor as a user meets it: a 13B fine-tune that fits nowhere on 4 × A100-40GB gets configurations that do,
// each with a command line that, run as printed, fits with the peak the advice showed; bad advisor flags are bad
// input on every rank.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/emu_process.h"

namespace emu {
namespace {

using nlohmann::json;
using testing::kEmu;
using testing::mpiexec;
using testing::read_json;
using testing::run_process;

// The part of a suggested command after the program: "mpirun -np N <emu> ARGS" or "<emu> ARGS --plan N".
std::string arguments_of(const std::string& command) {
  const size_t at = command.find(kEmu);
  EXPECT_NE(at, std::string::npos) << command;
  return at == std::string::npos ? "" : command.substr(at + kEmu.size());
}

// Runs a suggestion's command as a plan (a run's at its own rank count, `--plan N` added) with --json, and holds
// it to what the advice said: it fits, with the same peak to the byte.
void check_by_plan(const json& suggestion, const testing::TempDir& dir, int index) {
  const std::string command = suggestion["command"];
  const int gpus = suggestion["config"]["gpus"];
  std::string args = arguments_of(command);
  if (suggestion["form"] == "run") {
    EXPECT_EQ(command.rfind(fmt::format("mpirun -np {} ", gpus), 0), 0u) << command;
    args += fmt::format(" --plan {}", gpus);
  } else {
    EXPECT_NE(command.find(fmt::format(" --plan {}", gpus)), std::string::npos) << command;
  }
  const std::string out = dir.file(fmt::format("suggestion{}.json", index));
  const auto plan = run_process(mpiexec(1) + kEmu + args + " --no-advise --json " + out, 120);
  ASSERT_EQ(plan.exit_code, 0) << command << "\n" << plan.err;
  const json root = read_json(out);
  ASSERT_EQ(root["strategies"].size(), 1u) << command;
  const json& s = root["strategies"][0];
  EXPECT_EQ(s["name"], suggestion["config"]["strategy"]) << command;
  EXPECT_EQ(s["verdict"], "fit") << command;
  EXPECT_EQ(s["reserved"]["peak_bytes"], suggestion["peak_bytes"]) << command;
  EXPECT_EQ(root["config"]["optimizer_offload"], suggestion["config"]["optimizer_offload"]) << command;
  EXPECT_EQ(root["config"]["precision"], suggestion["config"]["precision"]) << command;
  EXPECT_EQ(root["config"]["activation_checkpointing"], suggestion["config"]["activation_checkpointing"]) << command;
  EXPECT_EQ(root["config"]["gradient_accumulation"], suggestion["config"]["gradient_accumulation"]) << command;
  EXPECT_EQ(root["config"]["cap"]["full_scale_bytes"], suggestion["cap_bytes"]) << command;
}

// Each suggestion holds together: it fits under the cap by its headroom, says which flags it changes, and its command
// carries them, once.
void check_suggestion(const json& s, const std::string& stdout_text) {
  const std::string command = s["command"];
  EXPECT_LE(s["peak_bytes"].get<uint64_t>(), s["cap_bytes"].get<uint64_t>()) << command;
  EXPECT_EQ(s["headroom_bytes"].get<uint64_t>(), s["cap_bytes"].get<uint64_t>() - s["peak_bytes"].get<uint64_t>());
  EXPECT_NE(stdout_text.find("$ " + command + "\n"), std::string::npos) << "printed as in the JSON: " << command;
  const std::string strategy = s["config"]["strategy"];
  EXPECT_TRUE(std::regex_search(command, std::regex(" --strategies " + strategy + "( |$)"))) << command;
  for (const char* once : {"--strategies", "--micro-batch", "--grad-accum", "--precision", "--plan"}) {
    const std::regex flag(std::string(" ") + once + " ");
    EXPECT_LE(std::distance(std::sregex_iterator(command.begin(), command.end(), flag), std::sregex_iterator()), 1)
        << once << " given twice: " << command;
  }
  for (const json& change : s["changes"]) {
    const std::string flag = change;
    if (flag.rfind("--", 0) == 0) {
      EXPECT_NE(command.find(" " + flag), std::string::npos) << flag << ": " << command;
    }
  }
}

// The scenario: llama2-13b (Ψ = 13.0B) on 4 × A100-40GB (39.59 GiB usable = 42.5 GB). Mixed-precision
// AdamW keeps 16 bytes per parameter; sharded over 4 that is 16Ψ/4 = 52.1 GB per GPU before a single activation,
// so no strategy fits as asked, and on 4 GPUs only a change of the recipe (pure bf16: 8Ψ/4 = 26.0 GB) or offloading
// the optimizer (the 12Ψ/4 of master weights and moments leave the GPU) can fit.
TEST(Advisor, ThirteenBOnFourA100sFitsNowhereAndGetsConfigurationsThatDo) {
  testing::TempDir dir("advisor");
  const std::string out = dir.file("advice.json");
  const auto run = run_process(mpiexec(4) + kEmu + " --cap a100-40gb-scaled --steps 1 --json " + out, 300);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("advice: llama2-13b on 4 x a100-40gb: does not fit as asked; fits with "), std::string::npos)
      << run.out;
  const json root = read_json(out);
  for (const json& s : root["strategies"]) EXPECT_EQ(s["verdict"], "oom") << s["name"];
  const json& advice = root["advice"];
  EXPECT_FALSE(advice["fits_as_asked"].get<bool>());
  EXPECT_EQ(advice["asked"]["gpus"], 4);
  EXPECT_EQ(advice["gpu_counts"], json::array({4, 8})) << "the default limit: twice the ranks asked";
  const json& suggestions = advice["suggestions"];
  ASSERT_GE(suggestions.size(), 3u) << run.out;
  const uint64_t cap = root["config"]["cap"]["full_scale_bytes"];
  for (const json& s : suggestions) {
    check_suggestion(s, run.out);
    // The plan's cap is the A100's as stated; the run's is its shrunk cap (rounded down to a byte) × 64².
    EXPECT_NEAR(s["cap_bytes"].get<double>(), static_cast<double>(cap), 64.0 * 64.0);
    EXPECT_EQ(s["config"]["seq_len"], 4096) << "the sequence is not changed without --advise-seq-len";
    if (s["config"]["gpus"] == 4) {
      EXPECT_TRUE(s["config"]["precision"] == "bf16" || s["config"]["optimizer_offload"].get<bool>()) << s["command"];
      EXPECT_EQ(s["form"], "run") << "4 ranks run here, as the question did";
    }
    EXPECT_EQ(s["config"]["global_batch"].get<int>(), std::max(4, s["config"]["gpus"].get<int>()));
  }
  EXPECT_EQ(suggestions[0]["config"]["gpus"], 4) << "fewer GPUs first";
  // The cap names the A100 40GB: the suggestions are timed on its SXM description and, on the same GPU count, shown
  // fastest first per sequence of the global batch (what a user trades: a bf16 recipe at ~2.5 s/step before an
  // offloaded optimizer's PCIe and CPU Adam).
  EXPECT_EQ(advice["ranked_by"], "predicted time per sequence on a100-40gb-sxm");
  double previous = 0;
  for (const json& s : suggestions) {
    ASSERT_TRUE(s["predicted_step_seconds"].is_number()) << s["command"];
    if (s["config"]["gpus"] != 4) continue;
    const double per_sequence = s["predicted_step_seconds"].get<double>() / s["config"]["global_batch"].get<double>();
    EXPECT_GE(per_sequence, previous) << s["command"];
    previous = per_sequence;
  }

  // The top suggestion, run as printed (emulated at k = 64 on 4 ranks): it fits.
  const json& top = suggestions[0];
  const std::string top_out = dir.file("top.json");
  const auto top_run =
      run_process(mpiexec(4) + kEmu + arguments_of(top["command"]) + " --no-advise --json " + top_out, 300);
  ASSERT_EQ(top_run.exit_code, 0) << top["command"] << "\n" << top_run.err;
  const json ran = read_json(top_out);
  ASSERT_EQ(ran["strategies"].size(), 1u);
  EXPECT_EQ(ran["strategies"][0]["verdict"], "fit") << top["command"] << "\n" << top_run.out;
  // The shrunk run's reserved peak x k² and the plan's agree to the rounding of the shrunk shapes.
  const double measured = ran["strategies"][0]["reserved"]["peak_full_scale_bytes"];
  EXPECT_NEAR(measured, top["peak_bytes"].get<double>(), 0.01 * measured);

  // Every suggestion, as its command line plans it: fits, with the peak the advice showed.
  for (size_t i = 0; i < suggestions.size(); ++i) check_by_plan(suggestions[i], dir, static_cast<int>(i));
}

// Asked for on a plan that fits, with flags the advisor sets itself on the command line: the suggestions replace
// them (one --strategies each, no --expect), keep the global batch 8 × 2 × 2 = 32, and are plans.
TEST(Advisor, OnRequestReplacesTheFlagsItSetsAndKeepsTheGlobalBatch) {
  testing::TempDir dir("advisor");
  const std::string out = dir.file("advice.json");
  const auto plan = run_process(mpiexec(1) + kEmu +
                                    " --model llama2-7b --plan 8 --cap 80GB --strategies zero3,ddp --micro-batch 2"
                                    " --grad-accum 2 --precision mixed --expect zero3=fit --advise --json " +
                                    out,
                                120);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const json root = read_json(out);
  const json& advice = root["advice"];
  EXPECT_TRUE(advice["fits_as_asked"].get<bool>());
  EXPECT_NE(plan.out.find("advice: llama2-7b on 8 GPUs with a 74.51 GiB cap: fits as asked; also fits with "),
            std::string::npos)
      << plan.out;
  ASSERT_FALSE(advice["suggestions"].empty());
  for (const json& s : advice["suggestions"]) {
    check_suggestion(s, plan.out);
    const std::string command = s["command"];
    EXPECT_EQ(s["form"], "plan") << command;
    EXPECT_EQ(command.find("--expect"), std::string::npos) << command;
    EXPECT_EQ(s["config"]["global_batch"], 32) << command;
  }
  for (size_t i = 0; i < 3 && i < advice["suggestions"].size(); ++i)
    check_by_plan(advice["suggestions"][i], dir, static_cast<int>(i));
}

TEST(Advisor, NoAdviseKeepsItQuiet) {
  testing::TempDir dir("advisor");
  const std::string out = dir.file("plan.json");
  const auto plan =
      run_process(mpiexec(1) + kEmu + " --plan 4 --cap a100-40gb --strategies zero3 --no-advise --json " + out, 120);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(plan.out.find("advice:"), std::string::npos) << plan.out;
  EXPECT_FALSE(read_json(out).contains("advice"));
}

// Bad advisor flags: exit 2 on every rank, the message naming the value and what is accepted, said once.
TEST(Advisor, BadFlagsAreBadInputOnEveryRank) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--advise-max-gpus 0", "--advise-max-gpus 0 is out of range; accepted: 2 (the ranks asked) to 1048576"},
      {"--advise-max-gpus 3 --plan 4", "--advise-max-gpus 3 is out of range; accepted: 4 (the ranks asked) to"},
      {"--advise --no-advise", "--advise and --no-advise contradict each other"},
      {"--offload-param --strategies fsdp",
       "--offload-param offloads ZeRO-3's parameter partitions; accepted with "
       "zero3"},
  };
  for (const auto& [args, message] : cases) {
    const auto run = run_process(mpiexec(2) + kEmu + " --cap a100-40gb-scaled " + args, 60);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.err;
    EXPECT_NE(run.err.find(message), std::string::npos) << args << "\n" << run.err;
    EXPECT_EQ(run.err.find("found on"), std::string::npos) << "every rank agrees: " << run.err;
  }
}

}  // namespace
}  // namespace emu
