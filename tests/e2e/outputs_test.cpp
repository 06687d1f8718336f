// What emu writes, checked as a user and a pipeline read it: every JSON against docs/emu-output.schema.json (every
// strategy, measured and planned, fitting and out of memory), a plan that speaks for every rank it plans, and
// verdicts in full-scale units.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/support/emu_process.h"
#include "tests/support/paths.h"

namespace emu {
namespace {

using nlohmann::json;
using testing::mpiexec;
using testing::read_json;
using testing::run_process;

using testing::kEmu;

// Every strategy emu offers, as its --help lists them: a strategy added later is covered without editing this.
std::string every_strategy() {
  const auto help = run_process(kEmu + " --help", 30);
  const std::regex listed(R"(run in order: ([a-z0-9_, -]+) \(default)");
  std::smatch match;
  EXPECT_TRUE(std::regex_search(help.out, match, listed)) << help.out;
  std::string names = match.size() > 1 ? match[1].str() : "ddp";
  names.erase(std::remove(names.begin(), names.end(), ' '), names.end());
  return names;
}

std::set<std::string> verdicts(const json& root) {
  std::set<std::string> out;
  for (const json& s : root["strategies"]) out.insert(s["verdict"].get<std::string>());
  return out;
}

// read_json validates; these runs make sure every strategy and both verdicts pass through it, measured and planned.
TEST(Json, EveryStrategyMeasuredAndPlannedConformsToTheSchema) {
  testing::TempDir dir("outputs");
  const std::string strategies = every_strategy();
  const std::string measured = dir.file("measured.json"), planned = dir.file("planned.json");
  // gpt2 shrunk by 8 on 2 ranks under 3 GB: DDP's 16 bytes per parameter (2.0 GB) and its buckets do not fit,
  // ZeRO-3's shards do (tp splits gpt2 as Megatron splits its GPT).
  const auto run = run_process(mpiexec(2) + kEmu +
                                   " --model gpt2 --shrink 8 --steps 2 --cap 3GB-scaled --hardware a100-40gb-sxm "
                                   "--strategies " +
                                   strategies + " --json " + measured,
                               300);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json root = read_json(measured);
  EXPECT_EQ(verdicts(root), (std::set<std::string>{"fit", "oom"})) << "both verdicts go through the schema";
  for (const json& s : root["strategies"]) {
    const auto steps = s["steps_run"].get<size_t>();
    EXPECT_EQ(s["losses"].size(), steps) << s["name"];
    EXPECT_EQ(s["grad_norms"].size(), steps) << s["name"];
    EXPECT_EQ(s["step_seconds"].size(), steps) << s["name"];
    for (const json& norm : s["grad_norms"]) EXPECT_GT(norm.get<double>(), 0.0) << s["name"];
    EXPECT_EQ(s["out_of_memory"].is_null(), s["verdict"] == "fit") << s["name"];
    EXPECT_TRUE(s["plan_roles"].is_null());
    EXPECT_GT(s["predicted_step"]["seconds"].get<double>(), 0.0) << s["name"];
  }
  EXPECT_EQ(root["step_time"]["hardware"], "a100-40gb-sxm");
  EXPECT_TRUE(root["config"]["deepspeed_config"].is_null()) << "absent is null, never \"\"";
  EXPECT_TRUE(root["complete"].get<bool>());
  EXPECT_TRUE(root["strategies_not_run"].empty());
  EXPECT_NE(strategies.find(",tp"), std::string::npos) << "tp runs among them";

  const auto plan =
      run_process(mpiexec(1) + kEmu + " --model llama2-7b --plan 32 --cap 40GB --hardware h100-80gb-sxm --strategies " +
                      strategies + " --json " + planned,
                  300);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const json plan_root = read_json(planned);
  EXPECT_EQ(verdicts(plan_root), (std::set<std::string>{"fit", "oom"}));
  EXPECT_EQ(plan_root["step_time"]["nodes"], 4) << "32 ranks of 8 per node";

  // The schema is not vacuous on a real document: one field gone, one type changed, one field undocumented.
  json broken = root;
  broken["strategies"][0].erase("steps_run");
  EXPECT_FALSE(testing::schema_violations(testing::emu_output_schema(), broken).empty());
  broken = root;
  broken["strategies"][0]["traffic_per_step"][0]["received_bytes"] = "";
  EXPECT_FALSE(testing::schema_violations(testing::emu_output_schema(), broken).empty());
  broken = root;
  broken["strategies"][0]["peak"]["undocumented"] = 1;
  EXPECT_FALSE(testing::schema_violations(testing::emu_output_schema(), broken).empty());
}

// A plan runs the algorithms --collectives names over the nodes --ranks-per-node gives, and predicts their time on
// both links. llama2-13b under DDP planned on 8 A100s as 2 nodes of 4: every call of every bucket is an all-reduce
// of the world, so its predicted communication is, by hand from the JSON's calls C and bytes sent B = 1.75 S
// (hardware/a100-40gb-sxm.json: 8.4 µs a call; NVLink 3.4 µs a step, 0.8 · 300 GB/s; one NIC 14 µs, 0.9 · 25 GB/s;
// the node's 4 NICs together 90 GB/s, 2 of the ring's 8 steps a lap crossing a node):
//   ring: C · (8.4 + 14 · (2/8 · 14 + 6/8 · 3.4)) µs + B / 90 GB/s
//   hier: C · (8.4 + 6 · 3.4 + 2 · 14) µs + (1.5 S) / 240 GB/s + (0.25 S) / 22.5 GB/s
TEST(Plan, HierarchicalAllReduceIsPlannedOverTwoLinks) {
  testing::TempDir dir("outputs");
  const auto plan = [&](const std::string& algorithm) {
    const std::string out = dir.file(algorithm + ".json");
    const auto run =
        run_process(mpiexec(1) + kEmu + " --model llama2-13b --plan 8 --ranks-per-node 4 --strategies " +
                        "ddp --hardware a100-40gb-sxm --collectives all_reduce=" + algorithm + " --json " + out,
                    120);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    return read_json(out)["strategies"][0];
  };
  for (const std::string algorithm : {"ring", "hier"}) {
    const json ddp = plan(algorithm);
    ASSERT_EQ(ddp["traffic_per_step"].size(), 1u) << ddp["traffic_per_step"].dump();
    const json& traffic = ddp["traffic_per_step"][0];
    EXPECT_EQ(traffic["collective"], "all_reduce");
    const double calls = traffic["calls"].get<double>(), sent = traffic["sent_bytes"].get<double>();
    const double s = sent / 1.75;
    const double expected = algorithm == "ring"
                                ? calls * (8.4 + 14 * (2.0 / 8 * 14 + 6.0 / 8 * 3.4)) * 1e-6 + sent / 90e9
                                : calls * (8.4 + 6 * 3.4 + 2 * 14) * 1e-6 + 1.5 * s / 240e9 + 0.25 * s / 22.5e9;
    EXPECT_NEAR(ddp["predicted_step"]["communication_seconds"].get<double>(), expected, 1e-6 * expected) << algorithm;
  }
}

// 64 planned ranks: the plan says so everywhere, in words, in the JSON, the picture and the trace (it was "rank 0
// of 1", "hosts: 0", one peak for 64 ranks, empty panels and a trace of metadata only).
TEST(Plan, SpeaksForEveryRankItPlans) {
  testing::TempDir dir("outputs");
  const std::string out = dir.file("plan.json"), svg = dir.file("plan.svg"), trace = dir.file("plan.trace.json");
  const auto plan = run_process(mpiexec(1) + kEmu + " --model llama2-7b --plan 64 --cap 40GB --strategies ddp,zero3" +
                                    " --json " + out + " --svg " + svg + " --trace " + trace,
                                120);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("ddp: any of the 64 ranks runs out of memory"), std::string::npos) << plan.out;
  EXPECT_EQ(plan.out.find(" of 1"), std::string::npos) << plan.out;

  const json root = read_json(out);
  EXPECT_EQ(root["config"]["hosts"].get<int>() * root["config"]["ranks_per_node"].get<int>(), 64);
  for (const json& s : root["strategies"]) {
    EXPECT_TRUE(s["peak_bytes_per_rank"].is_null()) << "not a one-rank array for 64 ranks";
    int covered = 0;
    for (const json& role : s["plan_roles"]) {
      covered += role["ranks"].get<int>();
      EXPECT_EQ(role["ranks"].get<int>(), role["last_rank"].get<int>() - role["first_rank"].get<int>() + 1);
    }
    EXPECT_EQ(covered, 64) << s["name"] << ": the roles cover every planned rank";
    EXPECT_TRUE(s["losses"].is_null()) << "a plan trains nothing";
  }
  const json& ddp = root["strategies"][0];
  ASSERT_EQ(ddp["verdict"], "oom");
  EXPECT_EQ(ddp["out_of_memory"]["ranks"][0]["last_rank"], 63);
  EXPECT_NE(ddp["out_of_memory"]["summary"].get<std::string>().find("any of the 64 ranks"), std::string::npos);

  const std::string picture = testing::read_file(svg);
  EXPECT_NE(picture.find("ddp — out of memory on every one of the 64 ranks"), std::string::npos);
  EXPECT_EQ(picture.find("no timeline"), std::string::npos) << "a plan draws its planned timeline";
  EXPECT_NE(picture.find("zero3 — fits: peak"), std::string::npos);

  const json events = read_json(trace)["traceEvents"];
  int spans = 0, counters = 0;
  for (const json& e : events) {
    spans += e["ph"] == "X" ? 1 : 0;
    counters += e["ph"] == "C" ? 1 : 0;
  }
  EXPECT_GT(spans, 100) << "forward and backward of every block, the collectives, the optimizer";
  EXPECT_GT(counters, 100) << "the planned memory over the step";
}

// A plan accounts one representative rank per distinct role: ranks whose bytes differ stay apart, ranks that hold the
// same bytes merge. ZeroRedundancyOptimizer (ddp-zero) gives whole tensors to ranks greedily, largest first, each to
// the rank with the fewest elements so far (torch/distributed/optim/zero_redundancy_optimizer.py,
// _partition_parameters). llama-tiny's tensors (h 64, F 176, kv 2 of 4 heads, V 512, 2 layers, untied head), by hand
// on 3 ranks: embed 32768 → 0, lm_head 32768 → 1, six gate/up/down 11264 → 2, 2, 2, 0, 1, 2; four q/o 4096 → 0, 1,
// 2, 0; four k/v 2048 → 1, 2, 1, 2; five norms 64 → 0, 1, 0, 1, 0. Rank 0 holds 52416 elements, rank 1 52352,
// rank 2 53248, each with fp32 Adam moments (8 B per element under autocast): three roles whose peaks differ by
// what each owns. DeepSpeed ZeRO-2 cuts the flat space into equal shards, S = 158016 / 3 = 52672, but sizes each
// rank's grads_in_partition (bf16) for the whole tensors meeting its shard, in registration order (embed 32768; per
// block q 4096, k, v 2048, o 4096, gate, up, down 11264, two norms 64; norm 64, lm_head 32768): rank 0 [0, 52672)
// holds embed and block 0 up to its gate, which straddles its end: 56320; rank 1 gate 0 to block 1's up, across
// its end: 68736; rank 2 up 1 to lm_head: 55488. Three roles again, apart by those bytes alone at sequence 32, where
// each peaks in the reduction at the backward's end (the bucket's all-reduce, with grads_in_partition made); at 64
// the loss's backward, the 1 GB bucket beside every activation and no partition yet, is higher and alike on all.
TEST(Plan, OneRoleForEachDistinctRankAndOneForRanksAlike) {
  testing::TempDir dir("outputs");
  const std::string out = dir.file("roles.json");
  const auto plan = run_process(mpiexec(1) + kEmu + " --model " + std::string(EMU_SOURCE_DIR) +
                                    "/tests/data/oracle/llama-tiny.json --plan 3 --seq-len 64 --strategies "
                                    "ddp-zero --json " +
                                    out,
                                120);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const json root = read_json(out);
  const json& zero = root["strategies"][0];
  ASSERT_EQ(zero["name"], "ddp-zero");
  ASSERT_EQ(zero["plan_roles"].size(), 3u) << zero["plan_roles"].dump();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(zero["plan_roles"][r]["first_rank"], r);
    EXPECT_EQ(zero["plan_roles"][r]["last_rank"], r);
  }
  const auto peak = [&](int r) { return zero["plan_roles"][r]["peak_bytes"].get<int64_t>(); };
  // Ranks 0 and 1 peak at the same moment of backward, where they differ by the moments alone. Rank 2, with 832
  // elements more than rank 0, peaks there too or at step(), where foreach AdamW's temporaries (4 B per owned
  // element) join the moments, whichever is higher: its lead lies from the moments' 8 · 832 to 12 · 832.
  EXPECT_EQ(peak(0) - peak(1), 8 * (52416 - 52352));
  EXPECT_GE(peak(2) - peak(0), 8 * (53248 - 52416));
  EXPECT_LE(peak(2) - peak(0), 12 * (53248 - 52416));
  const std::string out2 = dir.file("roles2.json");
  const auto plan2 =
      run_process(mpiexec(1) + kEmu + " --model " + std::string(EMU_SOURCE_DIR) +
                      "/tests/data/oracle/llama-tiny.json --plan 3 --seq-len 32 --strategies zero2 --json " + out2,
                  120);
  ASSERT_EQ(plan2.exit_code, 0) << plan2.err;
  const json root2 = read_json(out2);
  const json& zero2 = root2["strategies"][0];
  ASSERT_EQ(zero2["name"], "zero2");
  ASSERT_EQ(zero2["plan_roles"].size(), 3u) << zero2["plan_roles"].dump();
  const auto peak2 = [&](int r) { return zero2["plan_roles"][r]["peak_bytes"].get<int64_t>(); };
  EXPECT_EQ(peak2(1) - peak2(0), 2 * (68736 - 56320));
  EXPECT_EQ(peak2(2) - peak2(0), 2 * (55488 - 56320));
}

// Ranks 1..N-2 are one role, but under ddp-zero each owns its own whole tensors: the plan accounts the one that
// owns the most, whose peak bounds the others'. llama-tiny's tensors on 4 ranks, by hand (largest first, each to the
// rank with the fewest elements so far, the lowest on a tie): embed → 0, lm_head → 1, the six 11264 → 2, 3, 2, 3,
// 2, 3; q/o 4096 → 0, 1, 2, 3; k/v 2048 → 0, 1, 2, 3; norms 64 → 0, 1, 0, 1, 0. Rank 0 owns 39104 elements, rank 1
// 39040, ranks 2 and 3 39936 each: the ranks in between are accounted as rank 2 (rank 1, accounted before, held
// 896 elements fewer and made the plan say less than rank 2 needs).
TEST(Plan, RanksInBetweenAreAccountedAtTheOneOwningTheMost) {
  testing::TempDir dir("outputs");
  const std::string out = dir.file("roles4.json");
  const auto plan = run_process(mpiexec(1) + kEmu + " --model " + std::string(EMU_SOURCE_DIR) +
                                    "/tests/data/oracle/llama-tiny.json --plan 4 --seq-len 64 --strategies ddp-zero "
                                    "--json " +
                                    out,
                                120);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const json root = read_json(out);
  const json& roles = root["strategies"][0]["plan_roles"];
  ASSERT_EQ(roles.size(), 3u) << roles.dump();
  EXPECT_EQ(roles[1]["first_rank"], 1);
  EXPECT_EQ(roles[1]["last_rank"], 2);
  EXPECT_EQ(roles[1]["accounted_rank"], 2);
  EXPECT_TRUE(roles[1]["bound"].get<bool>());
  EXPECT_FALSE(roles[0]["bound"].get<bool>());
  const auto peak = [&](int i) { return roles[i]["peak_bytes"].get<int64_t>(); };
  // Ranks 2 and 3 own the same tensors; rank 2 leads rank 0 by 832 elements' moments (8 B each), up to 12 B each
  // should it peak at step() with foreach AdamW's temporaries.
  EXPECT_EQ(peak(1), peak(2));
  EXPECT_GE(peak(1) - peak(0), 8 * (39936 - 39104));
  EXPECT_LE(peak(1) - peak(0), 12 * (39936 - 39104));
  // The verdict names the role as the accounted rank: under a cap below the reserve every role runs out.
  const auto over = run_process(mpiexec(1) + kEmu + " --model " + std::string(EMU_SOURCE_DIR) +
                                    "/tests/data/oracle/llama-tiny.json --plan 4 --seq-len 64 --strategies ddp-zero "
                                    "--cap 1GiB",
                                120);
  EXPECT_NE(over.out.find("rank 0, ranks 1-2 (rank 2, the one holding the most), rank 3 of 4 run out of memory"),
            std::string::npos)
      << over.out;
}

// The conclusion names what each strategy's recipe keeps: PyTorch DDP's mixed precision is torch.autocast over fp32
// weights (fp32 weights, gradients and Adam moments), DeepSpeed's a bf16 copy beside fp32 master weights and moments
// (it said "bf16 weights and gradients" for ddp too).
TEST(Report, TheConclusionSaysWhatEachStrategysRecipeKeeps) {
  const std::string model = " --model " + std::string(EMU_SOURCE_DIR) + "/tests/data/oracle/llama-tiny.json --plan 2";
  const auto both = run_process(mpiexec(1) + kEmu + model + " --strategies ddp,zero2", 120);
  ASSERT_EQ(both.exit_code, 0) << both.err;
  EXPECT_NE(both.out.find("Each strategy keeps its framework's recipe: ddp with mixed precision by autocast (16 bytes "
                          "per parameter: fp32 weights, gradients and Adam moments, bf16 compute); zero2 with "
                          "mixed-precision AdamW (16 bytes per parameter: bf16 weights and gradients, fp32 master "
                          "weights and Adam moments)."),
            std::string::npos)
      << both.out;
  const auto ddp = run_process(mpiexec(1) + kEmu + model + " --strategies ddp", 120);
  ASSERT_EQ(ddp.exit_code, 0) << ddp.err;
  EXPECT_NE(ddp.out.find("full fine-tune with mixed precision by autocast (16 bytes per parameter: fp32 weights"),
            std::string::npos)
      << ddp.out;
  EXPECT_EQ(ddp.out.find("bf16 weights and gradients"), std::string::npos) << ddp.out;
  const auto pure = run_process(mpiexec(1) + kEmu + model + " --strategies ddp,zero2 --precision bf16", 120);
  ASSERT_EQ(pure.exit_code, 0) << pure.err;
  EXPECT_NE(pure.out.find("full fine-tune with pure-bf16 AdamW (8 bytes per parameter)"), std::string::npos)
      << pure.out;
  // Megatron-LM (tp) keeps fp32 main gradients beside the bf16 weights: 2 + 4 + 4 + 8 = 18 bytes (it said 16).
  const auto tp = run_process(mpiexec(1) + kEmu + model + " --strategies tp", 120);
  ASSERT_EQ(tp.exit_code, 0) << tp.err;
  EXPECT_NE(tp.out.find("mixed-precision AdamW (18 bytes per parameter: bf16 weights, fp32 main gradients, fp32 "
                        "master weights and Adam moments)"),
            std::string::npos)
      << tp.out;
}

// The model by the name its user knows: the config's `_name_or_path`, else the snapshot folder's name; the path
// only as where it came from.
TEST(Report, TheModelByItsName) {
  testing::TempDir dir("outputs");
  const std::string source = std::string(EMU_SOURCE_DIR) + "/tests/data/hf/smollm2-135m.json";
  std::filesystem::create_directories(dir.file("SmolLM2-135M"));
  std::filesystem::copy_file(source, dir.file("SmolLM2-135M/config.json"));
  json named = json::parse(testing::read_file(source));
  named["_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct";
  std::ofstream(dir.file("named.json")) << named.dump();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir.file("SmolLM2-135M"), "SmolLM2-135M"},
      {dir.file("SmolLM2-135M/config.json"), "SmolLM2-135M"},
      {dir.file("named.json"), "SmolLM2-135M-Instruct"},
  };
  for (const auto& [model, name] : cases) {
    const auto plan = run_process(mpiexec(1) + kEmu + " --model " + model + " --plan 2 --strategies zero3", 120);
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    EXPECT_NE(plan.out.find("  model     " + name + " (llama, from " + model + ")"), std::string::npos) << plan.out;
    EXPECT_NE(plan.out.find("a " + name + " full fine-tune"), std::string::npos) << plan.out;
  }
}

// A plan's time does not grow with the ranks (beyond the distinct rank roles, of which a sharded strategy
// has three): each collective's bytes come from its algorithm's closed form, not from a pass over the virtual group.
// 2^20 ranks took 9 s per strategy here when every collective built its 2^20 blocks, against 0.1 s at 8 ranks.
TEST(Plan, TimeDoesNotGrowWithTheRanks) {
  testing::TempDir dir("outputs");
  double seconds[2] = {0, 0};
  const int ranks[2] = {8, 1 << 20};
  for (int i = 0; i < 2; ++i) {
    const std::string out = dir.file(fmt::format("plan{}.json", i));
    const auto plan = run_process(mpiexec(1) + kEmu +
                                      fmt::format(" --model llama2-7b --plan {} --strategies zero3,fsdp "
                                                  "--no-advise --json {}",
                                                  ranks[i], out),
                                  120);
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    seconds[i] = read_json(out)["seconds"];
  }
  EXPECT_LT(seconds[1], 4 * seconds[0] + 1.0) << "8 ranks: " << seconds[0] << " s, 2^20 ranks: " << seconds[1] << " s";
}

// Verdicts in full-scale units first, the shrunk run's own bytes in brackets; counts that read as counts.
TEST(Report, FullScaleUnitsFirstShrunkInBrackets) {
  const auto run =
      run_process(mpiexec(2) + kEmu + " --model gpt2 --shrink 8 --steps 1 --strategies ddp --cap 2.5GB-scaled", 120);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // 2.5 GB = 2.33 GiB at full scale; / 8^2 = 39,062,500 B = 37.25 MiB as run.
  EXPECT_TRUE(std::regex_search(run.out, std::regex(R"(ddp: all 2 ranks ran out of memory; rank \d first in .* of a )"
                                                    R"(2\.33 GiB \[37\.25 MiB\] cap)")))
      << run.out;
  // The table's peak: full-scale GiB, then the run's own bytes in brackets.
  EXPECT_TRUE(std::regex_search(run.out, std::regex(R"(ddp +OOM \(all\) +[0-9.]+ +\[[0-9.]+ MiB\] \|)"))) << run.out;
  EXPECT_NE(run.out.find("1 optimizer step, 1 micro-batch per rank per step"), std::string::npos) << run.out;
}

// The picture's x axis is the step's phases, shared by every panel: the optimizer of step 2 is at the same x for
// DDP and for ZeRO-3, though their wall times differ.
TEST(Svg, OneAxisOfPhasesForEveryPanel) {
  testing::TempDir dir("outputs");
  const auto run = run_process(
      mpiexec(2) + kEmu + " --model gpt2 --shrink 8 --steps 2 --strategies ddp,zero3 --svg " + dir.file("memory.svg"),
      120);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string svg = testing::read_file(dir.file("memory.svg"));
  for (const std::string label : {"set-up", "step 1 fwd", "step 2 fwd", "bwd", "optimizer"}) {
    const std::regex tick("<text x=\"([0-9.]+)\"[^>]*>" + label + "</text>");
    std::vector<std::string> xs;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it) {
      xs.push_back((*it)[1].str());
    }
    ASSERT_FALSE(xs.empty()) << label << " is marked on the axis";
    ASSERT_EQ(xs.size() % 2, 0u) << label << ": as often in each of the two panels";
    for (size_t i = 0; i < xs.size() / 2; ++i) EXPECT_EQ(xs[i], xs[i + xs.size() / 2]) << label << " lines up";
  }
  EXPECT_NE(svg.find("the step's phases"), std::string::npos);
}

// Ctrl-C under mpirun (which forwards it to the ranks as SIGTERM) while the second strategy runs: rank 0 says what
// finished, and the JSON, complete and valid, holds the finished strategy and names those that did not run. With the
// launcher's grace between SIGTERM and SIGKILL, as a user's mpirun has it.
TEST(Interrupt, SaysWhatFinishedAndKeepsItInTheJson) {
  testing::TempDir dir("outputs");
  const std::string out = dir.file("run.json"), err = dir.file("err.txt");
  const std::string job =
      mpiexec(2, /*grace=*/true) + kEmu +
      " --model gpt2 --shrink 8 --steps 8 --fault delay:0:0.5 --strategies ddp,zero3,zero2 --json " + out + " 2>" + err;
  // Start the job, wait for zero3's second step (ddp has finished), then interrupt mpirun as Ctrl-C does. Rank 0
  // sleeps half a second before each step (a straggler fault), so zero3's six steps left take 3 s or more: time for
  // the signal to land while it runs however fast or slow (sanitizers, a loaded machine) the steps are.
  const std::string script = job + " & job=$!; for i in $(seq 1 600); do grep -q \"zero3 .*step 2/\" " + err +
                             " && break; sleep 0.1; done; kill -INT $job; wait $job; status=$?; cat " + err +
                             " >&2; exit $status";
  const auto run = run_process("sh -c '" + script + "'", 240);  // one command for run_process's time limit
  EXPECT_NE(run.exit_code, 0) << "an interrupted job does not pass";
  EXPECT_NE(run.err.find("emu: interrupted by SIG"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("finished ddp (results in " + out + "); zero3 was running, not run: zero2"), std::string::npos)
      << run.err;
  ASSERT_TRUE(std::filesystem::exists(out)) << run.err;
  const json root = read_json(out);  // parses, and conforms to the schema: never half a file
  EXPECT_FALSE(root["complete"].get<bool>());
  EXPECT_EQ(root["strategies_not_run"], json::array({"zero3", "zero2"}));
  ASSERT_EQ(root["strategies"].size(), 1u);
  EXPECT_EQ(root["strategies"][0]["name"], "ddp");
  EXPECT_EQ(root["strategies"][0]["steps_run"], 8) << "the finished strategy's results, whole";
}

}  // namespace
}  // namespace emu
