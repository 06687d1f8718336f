// The pictures end to end: emu's --trace (Chrome trace JSON for Perfetto) and --svg (memory over time), checked
// against the run's own JSON: a process per strategy and a thread per rank, a forward and a backward span for every
// block, the optimizer, collective spans whose bytes add up to the traffic the JSON reports, memory counters that
// reach each rank's peak, an out-of-memory instant on every rank that ran out, and one SVG panel per strategy.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "tests/support/emu_process.h"

namespace emu {
namespace {

using nlohmann::json;
using testing::count_of;
using testing::mpiexec;
using testing::run_process;

using testing::kEmu;
using testing::read_json;
constexpr double kMiB = 1024.0 * 1024.0;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The trace's events of one strategy, by kind: its pid, the names of its threads, and per rank its spans, counters
// and instants.
struct StrategyTrace {
  int pid = 0;
  std::map<int, std::string> threads;         // tid -> thread name
  std::map<int, std::vector<json>> spans;     // rank -> "X" events
  std::map<int, std::vector<json>> counters;  // rank -> "C" events
  std::map<int, std::vector<json>> instants;  // rank -> "i" events
};

std::map<std::string, StrategyTrace> split_trace(const json& trace) {
  std::map<int, std::string> names;  // pid -> strategy
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      const std::string name = e["args"]["name"];
      EXPECT_TRUE(name.starts_with("strategy ")) << name;
      names[e["pid"].get<int>()] = name.substr(std::string("strategy ").size());
    }
  }
  std::map<std::string, StrategyTrace> out;
  for (const auto& [pid, name] : names) out[name].pid = pid;
  for (const json& e : trace["traceEvents"]) {
    const int pid = e["pid"];
    EXPECT_TRUE(names.contains(pid)) << e.dump();
    StrategyTrace& s = out[names[pid]];
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "thread_name") s.threads[e["tid"].get<int>()] = e["args"]["name"];
    if (ph == "X") s.spans[e["tid"].get<int>()].push_back(e);
    if (ph == "C") s.counters[e["tid"].get<int>()].push_back(e);
    if (ph == "i") s.instants[e["tid"].get<int>()].push_back(e);
  }
  return out;
}

const json& strategy_json(const json& root, const std::string& name) {
  for (const json& s : root["strategies"]) {
    if (s["name"] == name) return s;
  }
  ADD_FAILURE() << "no strategy " << name;
  static const json kNone;
  return kNone;
}

bool has_span(const std::vector<json>& spans, const std::string& name, const std::string& category) {
  return std::any_of(spans.begin(), spans.end(),
                     [&](const json& e) { return e["name"] == name && e["cat"] == category; });
}

// Every rank: set-up, a span per step, forward and backward of the root and of every block, the gradient
// reduction and the optimizer, each as often as the steps that ran; every span inside the run's duration.
void check_compute_spans(const StrategyTrace& s, const json& result, int ranks, int layers) {
  const int steps = result["steps_run"];
  for (int r = 0; r < ranks; ++r) {
    ASSERT_TRUE(s.spans.contains(r)) << "rank " << r;
    const std::vector<json>& spans = s.spans.at(r);
    std::map<std::string, int> count;
    for (const json& e : spans) {
      ++count[e["name"].get<std::string>()];
      EXPECT_GE(e["ts"].get<double>(), 0) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0) << e.dump();
    }
    EXPECT_EQ(count["set-up"], 1);
    EXPECT_TRUE(has_span(spans, "step 1", "step"));
    EXPECT_TRUE(has_span(spans, "optimizer step", "optimizer"));
    EXPECT_TRUE(has_span(spans, "gradient reduction", "collective"));
    EXPECT_EQ(count["forward, root"], steps);
    EXPECT_EQ(count["backward, root"], steps);
    for (int l = 1; l <= layers; ++l) {
      const std::string block = "block " + std::to_string(l);
      EXPECT_EQ(count["forward, " + block], steps) << "rank " << r << " " << block;
      EXPECT_EQ(count["backward, " + block], steps) << "rank " << r << " " << block;
      EXPECT_TRUE(has_span(spans, "forward, " + block, "compute"));
    }
    EXPECT_EQ(count["optimizer step"], steps);
  }
}

// Rank 0's collective spans, over every group but the out-of-memory agreement's, add up per kind to the bytes
// the JSON reports per step × the steps that ran.
void check_collective_bytes(const StrategyTrace& s, const json& result) {
  const int steps = result["steps_run"];
  std::map<std::string, uint64_t> sent, received, calls;
  for (const json& e : s.spans.at(0)) {
    if (!e.contains("args") || !e["args"].contains("kind")) continue;
    const json& args = e["args"];
    const std::string name = e["name"];
    const std::string algorithm = args["algorithm"];
    EXPECT_EQ(e["cat"], "collective");
    EXPECT_FALSE(algorithm.empty()) << name;
    EXPECT_TRUE(name.starts_with(args["kind"].get<std::string>())) << name;
    EXPECT_NE(name.find(algorithm), std::string::npos) << name;
    if (args["group"] == "control") continue;
    sent[args["kind"]] += args["sent_bytes"].get<uint64_t>();
    received[args["kind"]] += args["received_bytes"].get<uint64_t>();
    ++calls[args["kind"]];
  }
  ASSERT_FALSE(sent.empty());
  std::set<std::string> kinds;
  auto json_received = testing::traffic_by_kind(result["traffic_per_step"], "received_bytes");
  auto json_calls = testing::traffic_by_kind(result["traffic_per_step"], "calls");
  for (const auto& [kind, json_sent] : testing::traffic_by_kind(result["traffic_per_step"], "sent_bytes")) {
    kinds.insert(kind);
    const double per_step_sent = static_cast<double>(sent[kind]) / steps;
    const double per_step_received = static_cast<double>(received[kind]) / steps;
    // Each group's per-step figure is rounded on its own: within a byte (a call) per group.
    EXPECT_NEAR(per_step_sent, json_sent, 2.0) << kind;
    EXPECT_NEAR(per_step_received, json_received[kind], 2.0) << kind;
    EXPECT_NEAR(static_cast<double>(calls[kind]) / steps, json_calls[kind], 2.0) << kind;
  }
  for (const auto& [kind, bytes] : sent) EXPECT_TRUE(kinds.contains(kind)) << kind << " traced but not in the JSON";
}

// Per rank, the in-use counter reaches the rank's peak at full scale (MiB) and never passes it.
void check_counters(const StrategyTrace& s, const json& result, int ranks, uint64_t scale) {
  for (int r = 0; r < ranks; ++r) {
    ASSERT_TRUE(s.counters.contains(r)) << "rank " << r;
    double highest = 0;
    int by_category = 0;
    for (const json& e : s.counters.at(r)) {
      const std::string name = e["name"];
      if (name == "rank " + std::to_string(r) + " memory, full-scale MiB") {
        highest = std::max(highest, e["args"]["in use"].get<double>());
        // The caching allocator (the default) holds whole segments: never less than what is in use.
        EXPECT_GE(e["args"]["reserved"].get<double>(), e["args"]["in use"].get<double>()) << e.dump();
      } else {
        EXPECT_EQ(name, "rank " + std::to_string(r) + " by category, full-scale MiB");
        EXPECT_TRUE(e["args"].contains("parameters")) << e.dump();
        ++by_category;
      }
    }
    EXPECT_GT(by_category, 0);
    const double peak = result["peak_bytes_per_rank"][r].get<double>() * static_cast<double>(scale) / kMiB;
    EXPECT_NEAR(highest, peak, peak * 1e-9) << "rank " << r;
  }
}

// An "out of memory" instant on exactly the ranks that ran out, naming where.
void check_oom_instants(const StrategyTrace& s, const json& result, int ranks) {
  std::map<int, std::string> phase_of;  // rank -> phase, from the JSON
  if (result["verdict"] == "oom") {
    for (const json& m : result["out_of_memory"]["ranks"]) phase_of[m["rank"].get<int>()] = m["phase"];
    EXPECT_FALSE(phase_of.empty());
  }
  for (int r = 0; r < ranks; ++r) {
    const auto found = s.instants.find(r);
    const size_t instants = found == s.instants.end() ? 0 : found->second.size();
    if (!phase_of.contains(r)) {
      EXPECT_EQ(instants, 0u) << "rank " << r << " fit";
      continue;
    }
    ASSERT_EQ(instants, 1u) << "rank " << r;
    const json& e = found->second.front();
    EXPECT_EQ(e["cat"], "oom");
    EXPECT_EQ(e["s"], "t");
    EXPECT_EQ(e["args"]["phase"], phase_of[r]);
    EXPECT_NE(e["name"].get<std::string>().find("out of memory"), std::string::npos);
    double last_end = 0;
    for (const json& span : s.spans.at(r))
      last_end = std::max(last_end, span["ts"].get<double>() + span["dur"].get<double>());
    EXPECT_GT(e["ts"].get<double>(), 0);
    EXPECT_LT(e["ts"].get<double>(), last_end);
  }
}

void check_trace(const json& trace, const json& root) {
  const int ranks = root["config"]["ranks"];
  const int layers = root["model"]["run"]["layers"];
  const uint64_t shrink = root["config"]["shrink"];
  const std::map<std::string, StrategyTrace> strategies = split_trace(trace);
  ASSERT_EQ(strategies.size(), root["strategies"].size());
  for (const auto& [name, s] : strategies) {
    SCOPED_TRACE(name);
    const json& result = strategy_json(root, name);
    ASSERT_EQ(s.threads.size(), static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(s.threads.at(r), "rank " + std::to_string(r));
    check_compute_spans(s, result, ranks, layers);
    check_collective_bytes(s, result);
    check_counters(s, result, ranks, shrink * shrink);
    check_oom_instants(s, result, ranks);
  }
}

void check_svg(const std::string& svg, const json& root) {
  ASSERT_TRUE(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\"")) << svg.substr(0, 200);
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_EQ(count_of(svg, "<svg"), 1);
  EXPECT_EQ(count_of(svg, "<g "), count_of(svg, "</g>"));
  EXPECT_EQ(count_of(svg, "<text"), count_of(svg, "</text>"));
  const int panels = static_cast<int>(root["strategies"].size());
  EXPECT_EQ(count_of(svg, "class=\"panel\""), panels);
  const bool capped = !root["config"]["cap"]["per_rank_bytes"].is_null();
  EXPECT_EQ(count_of(svg, "class=\"cap\""), capped ? panels : 0) << "a cap line per panel";
  int oom_ranks = 0;
  for (const json& s : root["strategies"]) {
    EXPECT_NE(svg.find("data-strategy=\"" + s["name"].get<std::string>() + "\""), std::string::npos) << s["name"];
    if (s["verdict"] == "oom") oom_ranks += static_cast<int>(s["out_of_memory"]["ranks"].size());
  }
  EXPECT_EQ(count_of(svg, "class=\"oom\""), oom_ranks) << "a marker per rank that ran out";
  for (const char* bad : {"\"nan", "nan,", ",nan", "\"inf", "inf,", ",inf", "\"-nan", ",-nan", ",-inf", "\"-inf"}) {
    EXPECT_EQ(svg.find(bad), std::string::npos) << "a coordinate is " << bad;
  }
}

struct Outputs {  // NOLINT(bugprone-exception-escape): nlohmann::json's noexcept move is taken for one that throws
  json root, trace;
  std::string svg;
};

Outputs run_emu(int ranks, const std::string& args) {
  testing::TempDir dir("trace");
  const std::string command = mpiexec(ranks) + kEmu + args + " --json " + dir.file("run.json") + " --trace " +
                              dir.file("trace.json") + " --svg " + dir.file("memory.svg");
  const auto result = run_process(command, 120);
  EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.err;
  Outputs run;
  if (result.exit_code != 0) return run;
  run.root = read_json(dir.file("run.json"));
  run.trace = read_json(dir.file("trace.json"));
  run.svg = read_text(dir.file("memory.svg"));
  return run;
}

// GPT-2 shrunk by 8 needs about 59 MiB a rank under DDP (62 MiB reserved) and 43 MiB under FSDP (44.5 MiB
// reserved) at 2 ranks: a 55 MB cap (52.5 MiB) lets FSDP fit and DDP run out on every rank. (ZeRO-3 needs as much
// as DDP here: DeepSpeed's 1 GB ipg bucket is 15.6 MiB at k = 8.)
TEST(Trace, TwoStrategiesOneRunsOutOfMemory) {
  const Outputs run = run_emu(2, " --model gpt2 --shrink 8 --strategies ddp,fsdp --steps 1 --cap 55MB");
  ASSERT_FALSE(run.root.is_null());
  ASSERT_EQ(strategy_json(run.root, "ddp")["verdict"], "oom");
  ASSERT_EQ(strategy_json(run.root, "fsdp")["verdict"], "fit");
  check_trace(run.trace, run.root);
  check_svg(run.svg, run.root);
}

// HYBRID_SHARD's intra- and inter-node groups are split off the world: their calls are traced too and the bytes
// still agree with the JSON, over two steps.
TEST(Trace, SplitGroupsOverTwoSteps) {
  const Outputs run = run_emu(4, " --model gpt2 --shrink 8 --strategies fsdp-hybrid --ranks-per-node 2 --steps 2");
  ASSERT_FALSE(run.root.is_null());
  check_trace(run.trace, run.root);
  std::set<std::string> groups;
  for (const json& e : run.trace["traceEvents"]) {
    if (e["ph"] == "X" && e.contains("args")) groups.insert(e["args"]["group"].get<std::string>());
  }
  EXPECT_TRUE(groups.contains("intra-node 0")) << ::testing::PrintToString(groups);
  EXPECT_TRUE(groups.contains("inter-node 0")) << ::testing::PrintToString(groups);
  check_svg(run.svg, run.root);
}

// The trace's predicted pipeline tracks (one per stage): each stage's op names in time order, its bubble and its end.
struct StageTrack {
  std::string order;  // "F0 F1 B0 …"
  double bubble = 0, end = 0;
};
std::map<int, StageTrack> stage_tracks(const json& trace) {
  std::map<int, int> stage_of;  // tid -> stage
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "M" || e["name"] != "thread_name") continue;
    const std::string name = e["args"]["name"];
    const size_t at = name.find(": pipeline stage ");
    if (at != std::string::npos) stage_of[e["tid"].get<int>()] = std::stoi(name.substr(at + 17));
  }
  std::map<int, std::vector<json>> spans;  // stage -> spans
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && stage_of.contains(e["tid"].get<int>())) spans[stage_of[e["tid"].get<int>()]].push_back(e);
  }
  std::map<int, StageTrack> tracks;
  for (auto& [stage, list] : spans) {
    std::ranges::sort(list, {}, [](const json& e) { return e["ts"].get<double>(); });
    StageTrack& track = tracks[stage];
    for (const json& e : list) {
      track.end = std::max(track.end, e["ts"].get<double>() + e["dur"].get<double>());
      if (e["name"] == "bubble") {
        track.bubble += e["dur"].get<double>();
      } else {
        if (!track.order.empty()) track.order += ' ';
        track.order += e["name"].get<std::string>();
      }
    }
  }
  return tracks;
}

// pp with --hardware: a predicted track per stage showing its schedule, so GPipe and 1F1B can be compared. P = 4,
// M = 4, drawn by hand: GPipe runs F0..F3 then B0..B3 on every stage; 1F1B's first stage warms up with 3 forwards
// (F0 F1 F2, then F3 B0, then B1 B2 B3) and its last alternates from the start. Both fill M + P − 1 = 7 slots, so
// every stage idles 3/7 of the step (the bubble) and both end together.
TEST(Trace, PipelineViewShowsEachStagesSchedule) {
  const std::map<std::string, std::vector<std::string>> first_and_last{
      {"gpipe", {"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 F3 B0 B1 B2 B3"}},
      {"1f1b", {"F0 F1 F2 F3 B0 B1 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"}}};
  std::map<std::string, double> ends;
  for (const auto& [schedule, orders] : first_and_last) {
    const Outputs run = run_emu(4,
                                " --model gpt2 --shrink 8 --strategies pp --micro-batches 4 --steps 1 "
                                "--hardware a100-40gb-sxm --schedule " +
                                    schedule);
    ASSERT_FALSE(run.trace.is_null());
    const std::map<int, StageTrack> tracks = stage_tracks(run.trace);
    ASSERT_EQ(tracks.size(), 4u) << schedule;
    for (const auto& [stage, track] : tracks) {
      if (stage == 0) {
        EXPECT_EQ(track.order, orders[0]) << schedule;
      }
      if (stage == 3) {
        EXPECT_EQ(track.order, orders[1]) << schedule;
      }
      EXPECT_NEAR(track.bubble / track.end, 3.0 / 7.0, 1e-6) << schedule << " stage " << stage;
      ends[schedule] = std::max(ends[schedule], track.end);
    }
  }
  EXPECT_NEAR(ends["gpipe"], ends["1f1b"], 1e-6 * ends["gpipe"]);
}

// Interleaved (--virtual-stages 3: GPT-2's 12 blocks in 12 chunks of one, P = 4, M = 4), by hand from Megatron's
// schedule table (micro-batch.chunk: k = 0..3 are 0.0 … 3.0, k = 4..7 0.1 … 3.1, k = 8..11 0.2 … 3.2): the first
// stage's warm-up 2·3 + 2·4 = 14 covers all 12 chunk micro-batches, so it runs every forward, then the backwards
// with the chunks reversed; the last warms up with 2·4 = 8 and alternates. Each slot is a third of a stage's work, so
// the bubble is (P − 1)/(VM + P − 1) = 3/15 of the step on every stage.
TEST(Trace, PipelineViewShowsTheInterleavedSchedule) {
  const Outputs run = run_emu(4,
                              " --model gpt2 --shrink 8 --strategies pp --micro-batches 4 --steps 1 "
                              "--hardware a100-40gb-sxm --virtual-stages 3");
  ASSERT_FALSE(run.trace.is_null());
  const std::map<int, StageTrack> tracks = stage_tracks(run.trace);
  ASSERT_EQ(tracks.size(), 4u);
  for (const auto& [stage, track] : tracks) {
    const std::string& order = track.order;
    if (stage == 0) {
      EXPECT_EQ(order,
                "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F0.2 F1.2 F2.2 F3.2 "
                "B0.2 B1.2 B2.2 B3.2 B0.1 B1.1 B2.1 B3.1 B0.0 B1.0 B2.0 B3.0");
    }
    if (stage == 3) {
      EXPECT_EQ(order,
                "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F0.2 B0.2 F1.2 B1.2 F2.2 B2.2 F3.2 B3.2 "
                "B0.1 B1.1 B2.1 B3.1 B0.0 B1.0 B2.0 B3.0");
    }
    EXPECT_NEAR(track.bubble / track.end, 3.0 / 15.0, 1e-6) << "stage " << stage;
  }
}

// FSDP2 over interleaved stages (torchtitan's 3-D with Interleaved1F1B: --strategies 3d --tp 8 --pp 2
// --virtual-stages 2, M = 4, planned for llama2-70b on 64 ranks) draws the same per-stage tracks as pp's interleaved
// schedule, by hand from its table (k = 0..3: 0.0 1.0 0.1 1.1, k = 4..7: 2.0 3.0 2.1 3.1; backwards with the chunks
// reversed): the first stage warms up with 2·1 + 1·2 = 4 forwards, the last with 2; the bubble is (P − 1)/(VM + P − 1)
// = 1/9 of the step on both stages, against 1/5 with one chunk.
TEST(Trace, PipelineViewShowsFsdp2OverInterleavedStages) {
  const std::string plan =
      " --plan 64 --model llama2-70b --cap h100-80gb --strategies 3d --tp 8 --pp 2 --micro-batches 4 "
      "--hardware h100-80gb-sxm --virtual-stages ";
  const Outputs run = run_emu(1, plan + "2");
  ASSERT_FALSE(run.trace.is_null());
  const std::map<int, StageTrack> tracks = stage_tracks(run.trace);
  ASSERT_EQ(tracks.size(), 2u);
  EXPECT_EQ(tracks.at(0).order, "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(tracks.at(1).order, "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  for (const auto& [stage, track] : tracks) {
    EXPECT_NEAR(track.bubble / track.end, 1.0 / 9.0, 1e-6) << "stage " << stage;
  }
  const Outputs one = run_emu(1, plan + "1");
  ASSERT_FALSE(one.trace.is_null());
  for (const auto& [stage, track] : stage_tracks(one.trace)) {
    EXPECT_NEAR(track.bubble / track.end, 1.0 / 5.0, 1e-6) << "stage " << stage;
  }
}

}  // namespace
}  // namespace emu
