#include "app/trace.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "app/report.h"
#include "app/step_time.h"
#include "emu/units.h"

namespace emu::app {
namespace {

using nlohmann::json;

constexpr double kMicroseconds = 1e6;

// Metadata events name and order the processes (strategies) and threads (ranks).
void name_tracks(json& events, const RunReport& report, const StrategyOutcome& outcome, int pid) {
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "strategy " + outcome.name}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  const std::string label = outcome.fits() ? "fits" : "out of memory: " + oom_summary(report, outcome);
  events.push_back({{"ph", "M"}, {"name", "process_labels"}, {"pid", pid}, {"args", {{"labels", label}}}});
  // A track per rank; a plan's per role, named by the ranks it stands for.
  const int tracks = outcome.roles.empty() ? report.world : static_cast<int>(outcome.roles.size());
  for (int r = 0; r < tracks; ++r) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", r},
                      {"args", {{"name", report.rank_words(outcome, static_cast<size_t>(r))}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", r}, {"args", {{"sort_index", r}}}});
  }
}

void add_spans(json& events, const RunReport& report, const StrategyOutcome& outcome, int pid) {
  const uint64_t scale = report.scale();
  for (size_t r = 0; r < outcome.spans.size(); ++r) {
    for (const Span& span : outcome.spans[r]) {
      json event = {{"ph", "X"},
                    {"name", span.name},
                    {"cat", span.category},
                    {"pid", pid},
                    {"tid", r},
                    {"ts", span.start * kMicroseconds},
                    {"dur", (span.end - span.start) * kMicroseconds}};
      if (!span.kind.empty()) {
        event["args"] = {{"kind", span.kind},
                         {"bytes", span.bytes},
                         {"full_scale_bytes", span.bytes * scale},
                         {"algorithm", span.algorithm},
                         {"group", span.group},
                         {"phase", span.phase},
                         {"sent_bytes", span.sent},
                         {"received_bytes", span.received}};
      }
      events.push_back(std::move(event));
    }
    const uint64_t dropped = r < outcome.spans_dropped.size() ? outcome.spans_dropped[r] : 0;
    if (dropped > 0) {
      const double end = outcome.spans[r].empty() ? 0 : outcome.spans[r].back().end;
      events.push_back({{"ph", "i"},
                        {"s", "t"},
                        {"pid", pid},
                        {"tid", r},
                        {"ts", end * kMicroseconds},
                        {"name", fmt::format("{} later spans not recorded (limit per rank reached)", dropped)}});
    }
  }
}

// Two counters per rank: the total in use beside what the device held (reserved), and in use by category (only the
// categories the rank ever used).
void add_memory(json& events, const RunReport& report, const StrategyOutcome& outcome, int pid) {
  const double to_mib = static_cast<double>(report.scale()) / static_cast<double>(kMiB);
  for (size_t r = 0; r < outcome.memory.size(); ++r) {
    const MemorySeries& series = outcome.memory[r];
    CategoryBytes used;
    for (const CategoryBytes& point : series.current) {
      for (size_t c = 0; c < kNumCategories; ++c) used.bytes[c] |= point.bytes[c];
    }
    const std::string total_name = fmt::format("{} memory, full-scale MiB", report.rank_words(outcome, r));
    const std::string by_category_name = fmt::format("{} by category, full-scale MiB", report.rank_words(outcome, r));
    for (size_t i = 0; i < series.seconds.size(); ++i) {
      const CategoryBytes& point = series.current[i];
      const double ts = series.seconds[i] * kMicroseconds;
      events.push_back({{"ph", "C"},
                        {"name", total_name},
                        {"pid", pid},
                        {"tid", r},
                        {"ts", ts},
                        {"args",
                         {{"in use", static_cast<double>(point.total()) * to_mib},
                          {"reserved", static_cast<double>(series.reserved[i]) * to_mib}}}});
      json by_category = json::object();
      for (size_t c = 0; c < kNumCategories; ++c) {
        if (used.bytes[c] != 0) {
          by_category[std::string(category_name(category_at(c)))] = static_cast<double>(point.bytes[c]) * to_mib;
        }
      }
      events.push_back(
          {{"ph", "C"}, {"name", by_category_name}, {"pid", pid}, {"tid", r}, {"ts", ts}, {"args", by_category}});
    }
  }
}

// An instant where each rank that ran out of memory first passed its cap.
void add_oom(json& events, const RunReport& report, const StrategyOutcome& outcome, int pid) {
  const uint64_t scale = report.scale();
  for (const strategy::RankMemory& m : outcome.verdict.ranks) {
    const size_t r = static_cast<size_t>(m.rank);
    if (!m.out_of_memory || r >= outcome.oom_seconds.size() || outcome.oom_seconds[r] < 0) continue;
    events.push_back({{"ph", "i"},
                      {"s", "t"},
                      {"pid", pid},
                      {"tid", m.rank},
                      {"ts", outcome.oom_seconds[r] * kMicroseconds},
                      {"name", fmt::format("out of memory: {} for {} in {}", format_bytes(m.requested * scale),
                                           m.what.empty() ? "an unnamed tensor" : m.what, m.phase)},
                      {"cat", "oom"},
                      {"args",
                       {{"phase", m.phase},
                        {"tensor", m.what},
                        {"requested_bytes", m.requested},
                        {"in_use_bytes", m.in_use},
                        {"cap_bytes", m.cap},
                        {"requested_full_scale_bytes", m.requested * scale},
                        {"in_use_full_scale_bytes", m.in_use * scale},
                        {"cap_full_scale_bytes", m.cap * scale}}}});
  }
}

// pp with --hardware: a track per stage from `first_track`, each micro-batch's forward ("F3") and backward ("B3")
// where the stage's schedule places them and the stage's idle time marked as bubble, so that GPipe and 1F1B can be
// compared side by side.
void add_pipeline_view(json& events, const StepTime& step, const StepTimeSetting& setting, int pid, int first_track) {
  double end = 0;
  for (const std::vector<strategy::TimedOp>& stage : step.pipeline) end = std::max(end, stage.back().end);
  for (size_t s = 0; s < step.pipeline.size(); ++s) {
    const int tid = first_track + static_cast<int>(s);
    events.push_back(
        {{"ph", "M"},
         {"name", "thread_name"},
         {"pid", pid},
         {"tid", tid},
         {"args", {{"name", fmt::format("predicted on {}: pipeline stage {}", setting.hardware.name, s)}}}});
    events.push_back(
        {{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    const auto span = [&](const std::string& name, const char* category, double start, double stop) {
      events.push_back({{"ph", "X"},
                        {"name", name},
                        {"cat", category},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", start * kMicroseconds},
                        {"dur", (stop - start) * kMicroseconds}});
    };
    double at = 0;
    for (const strategy::TimedOp& op : step.pipeline[s]) {
      if (op.start > at) span("bubble", "predicted bubble", at, op.start);
      // Interleaved: "F3.1" is micro-batch 3 through the stage's chunk 1.
      span(step.pipeline_chunks > 1 ? fmt::format("{}{}.{}", op.op.forward ? 'F' : 'B', op.op.micro_batch, op.op.chunk)
                                    : fmt::format("{}{}", op.op.forward ? 'F' : 'B', op.op.micro_batch),
           "predicted pipeline", op.start, op.end);
      at = op.end;
    }
    if (end > at) span("bubble", "predicted bubble", at, end);
  }
}

// --hardware: the step as the step-time model predicts it (app/step_time.h), on two tracks of its own beside the
// ranks' measured ones: the GPU's compute stream and its communication stream, from 0.
void add_predicted(json& events, const RunReport& report, const StrategyOutcome& outcome, int pid) {
  if (report.options.hardware.empty()) return;
  const StepTimeSetting setting = step_time_setting(report.options);
  const StepTime step = predict_step_time(report, outcome, setting);
  constexpr int kTrack = 1'000'000;  // after every rank's
  for (int stream = 0; stream < 2; ++stream) {
    const std::string name = fmt::format("predicted on {} x {}: {}", report.world, setting.hardware.name,
                                         stream == 0 ? "compute" : "communication");
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", kTrack + stream}, {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", pid},
                      {"tid", kTrack + stream},
                      {"args", {{"sort_index", kTrack + stream}}}});
  }
  add_pipeline_view(events, step, setting, pid, kTrack + 2);
  for (const PredictedSpan& span : step.spans) {
    events.push_back({{"ph", "X"},
                      {"name", span.name},
                      {"cat", span.communication ? "predicted collective" : "predicted compute"},
                      {"pid", pid},
                      {"tid", kTrack + (span.communication ? 1 : 0)},
                      {"ts", span.start * kMicroseconds},
                      {"dur", (span.end - span.start) * kMicroseconds}});
  }
}

}  // namespace

std::string format_trace(const RunReport& report) {
  json events = json::array();
  for (size_t i = 0; i < report.outcomes.size(); ++i) {
    const StrategyOutcome& outcome = report.outcomes[i];
    const int pid = static_cast<int>(i) + 1;
    name_tracks(events, report, outcome, pid);
    add_spans(events, report, outcome, pid);
    add_memory(events, report, outcome, pid);
    add_oom(events, report, outcome, pid);
    add_predicted(events, report, outcome, pid);
  }
  json root;
  root["traceEvents"] = std::move(events);
  root["displayTimeUnit"] = "ms";
  root["otherData"] = {
      {"emu_version", EMU_VERSION},
      {"model", report.model.name},
      {"ranks", report.world},
      {"shrink", report.shrink},
      {"scale", report.scale()},
      {"cap_full_scale_bytes", report.cap == kNoCap ? json(nullptr) : json(report.cap * report.scale())},
      {"times", "microseconds since each strategy's set-up began"},
      {"memory_counters", "MiB at full scale: bytes as run x scale"},
      {"span_bytes", "as run; full_scale_bytes = bytes x scale"},
  };
  return root.dump() + "\n";
}

}  // namespace emu::app
