#include "app/timeline.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "collectives/algorithm.h"
#include "collectives/communicator.h"
#include "emu/check.h"
#include "emu/units.h"

namespace emu::app {
namespace {

void put_bytes(std::vector<char>& out, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  out.insert(out.end(), bytes, bytes + size);
}
void put_string(std::vector<char>& out, const std::string& text) {
  const uint32_t size = static_cast<uint32_t>(text.size());
  put_bytes(out, &size, sizeof(size));
  put_bytes(out, text.data(), text.size());
}

}  // namespace

MemorySeries thin_timeline(const std::vector<TimelinePoint>& timeline) {
  MemorySeries series;
  if (timeline.empty()) return series;
  CategoryBytes current;
  const size_t stride = (timeline.size() + kMaxSeriesPoints - 1) / kMaxSeriesPoints;
  CategoryBytes best;
  double best_time = 0;
  uint64_t best_total = 0;
  uint64_t best_reserved = 0;
  for (size_t i = 0; i < timeline.size(); ++i) {
    const TimelinePoint& p = timeline[i];
    current[p.category] = static_cast<uint64_t>(static_cast<int64_t>(current[p.category]) + p.delta);
    if (p.in_use >= best_total || i % stride == 0) {
      best = current;
      best_time = p.seconds;
      best_total = p.in_use;
      best_reserved = p.reserved;
    }
    if ((i + 1) % stride == 0 || i + 1 == timeline.size()) {
      series.seconds.push_back(best_time);
      series.current.push_back(best);
      series.reserved.push_back(best_reserved);
      best_total = 0;
    }
  }
  return series;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SpanRecorder::add(Span span) {
  if (spans_.size() >= kMaxSpansPerRank) {
    ++dropped_;
    return;
  }
  span.start -= origin_;
  span.end -= origin_;
  spans_.push_back(std::move(span));
}

void SpanRecorder::add(std::string_view name, std::string_view category, double start, double end) {
  Span span;
  span.name = name;
  span.category = category;
  span.start = start;
  span.end = end;
  add(std::move(span));
}

void SpanRecorder::add_call(const coll::Communicator& group, const coll::Call& call, const coll::Algorithm* algorithm,
                            const coll::Traffic& moved, double start, double end) {
  Span span;
  span.category = "collective";
  span.start = start;
  span.end = end;
  span.kind = coll::kind_name(call.kind);
  span.algorithm = algorithm != nullptr ? std::string(algorithm->name) : std::string();
  span.group = group.name();
  span.phase = call.phase;
  span.bytes = coll::payload_bytes(call, group.size());
  span.sent = moved.sent;
  span.received = moved.received;
  span.name = algorithm != nullptr ? fmt::format("{} {} ({})", span.kind, format_bytes(span.bytes), span.algorithm)
                                   : fmt::format("{} {} {} rank {}", span.kind, format_bytes(span.bytes),
                                                 call.kind == coll::CollectiveKind::kSend ? "to" : "from", call.root);
  if (!span.phase.empty()) span.name += " — " + span.phase;
  add(std::move(span));
}

std::vector<char> pack_spans(const std::vector<Span>& spans) {
  std::vector<char> out;
  for (const Span& s : spans) {
    for (const std::string* text : {&s.name, &s.category, &s.kind, &s.algorithm, &s.group, &s.phase}) {
      put_string(out, *text);
    }
    for (const double time : {s.start, s.end}) put_bytes(out, &time, sizeof(time));
    for (const uint64_t bytes : {s.bytes, s.sent, s.received}) put_bytes(out, &bytes, sizeof(bytes));
  }
  return out;
}

std::vector<Span> unpack_spans(const std::vector<char>& packed) {
  size_t at = 0;
  auto get = [&](void* out, size_t size) {
    EMU_CHECK(at + size <= packed.size(), "a gathered span list ends early ({} of {} bytes)", at, packed.size());
    std::memcpy(out, packed.data() + at, size);
    at += size;
  };
  auto get_string = [&](std::string& text) {
    uint32_t size = 0;
    get(&size, sizeof(size));
    text.resize(size);
    get(text.data(), size);
  };
  std::vector<Span> spans;
  while (at < packed.size()) {
    Span& s = spans.emplace_back();
    for (std::string* text : {&s.name, &s.category, &s.kind, &s.algorithm, &s.group, &s.phase}) get_string(*text);
    for (double* time : {&s.start, &s.end}) get(time, sizeof(*time));
    for (uint64_t* bytes : {&s.bytes, &s.sent, &s.received}) get(bytes, sizeof(*bytes));
  }
  return spans;
}

}  // namespace emu::app
