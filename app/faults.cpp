#include "app/faults.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "emu/check.h"

namespace emu::app {
namespace {

constexpr const char* kForms = "delay:RANK:SECONDS, kill:RANK:STEP, hang:RANK:STEP or mismatch:RANK:STEP";

void say(const std::string& what) {
  std::fprintf(stderr, "%s emu: fault injection: %s\n", rank_tag().c_str(), what.c_str());
  std::fflush(stderr);
}

}  // namespace

std::vector<Fault> parse_faults(const std::vector<std::string>& texts, int world, int steps) {
  std::vector<Fault> faults;
  for (const std::string& text : texts) {
    const auto bad = [&](const std::string& why) {
      return InputError(fmt::format("--fault '{}' {}; accepted: {}", text, why, kForms));
    };
    const size_t first = text.find(':');
    const size_t second = first == std::string::npos ? std::string::npos : text.find(':', first + 1);
    if (second == std::string::npos || text.find(':', second + 1) != std::string::npos) {
      throw bad("is not KIND:RANK:VALUE");
    }
    const std::string kind = text.substr(0, first);
    Fault fault;
    fault.text = text;
    if (kind == "delay") {
      fault.kind = FaultKind::kDelay;
    } else if (kind == "kill") {
      fault.kind = FaultKind::kKill;
    } else if (kind == "hang") {
      fault.kind = FaultKind::kHang;
    } else if (kind == "mismatch") {
      fault.kind = FaultKind::kMismatch;
    } else {
      throw bad(fmt::format("has an unknown kind '{}'", kind));
    }
    try {
      size_t used = 0;
      const std::string rank = text.substr(first + 1, second - first - 1);
      fault.rank = std::stoi(rank, &used);
      if (used != rank.size()) throw std::invalid_argument(rank);
      const std::string value = text.substr(second + 1);
      if (fault.kind == FaultKind::kDelay) {
        fault.seconds = std::stod(value, &used);
      } else {
        fault.step = std::stoi(value, &used);
      }
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      throw bad("has a rank or value that is not a number");
    }
    if (fault.rank < 0 || fault.rank >= world) {
      throw bad(fmt::format("names rank {}, but ranks are 0 to {}", fault.rank, world - 1));
    }
    if (fault.kind == FaultKind::kDelay && !(fault.seconds >= 0 && fault.seconds <= 3600)) {
      throw bad("has a delay outside 0 to 3600 seconds");
    }
    if (fault.kind != FaultKind::kDelay && fault.step < 1) throw bad("has a step below 1");
    if (fault.kind != FaultKind::kDelay && fault.step > steps) {
      throw InputError(
          fmt::format("--fault '{}' strikes at step {}, but --steps is {}: it would never fire; accepted "
                      "steps: 1 to {}",
                      text, fault.step, steps, steps));
    }
    faults.push_back(fault);
  }
  return faults;
}

std::string unfired_faults(const std::vector<Fault>& faults, const std::string& strategy, int steps_run) {
  std::string out;
  for (const Fault& fault : faults) {
    if (fault.kind == FaultKind::kDelay || fault.step <= steps_run) continue;
    out += fmt::format("emu: --fault {} never fired: {}, the strategy faults strike, stopped after step {}\n",
                       fault.text, strategy, steps_run);
  }
  return out;
}

void inject_faults(const std::vector<Fault>& faults, int rank, int step, bool first_strategy,
                   const std::function<void()>& barrier) {
  for (const Fault& fault : faults) {
    if (fault.rank != rank) continue;
    if (fault.kind == FaultKind::kDelay) {
      std::this_thread::sleep_for(std::chrono::duration<double>(fault.seconds));
      continue;
    }
    if (!first_strategy || fault.step != step) continue;
    switch (fault.kind) {
      case FaultKind::kKill:
        say(fmt::format("killing rank {} at step {}", rank, step));
        std::raise(SIGKILL);
        break;
      case FaultKind::kHang:
        say(fmt::format("rank {} stops answering at step {}", rank, step));
        for (;;) pause();
      case FaultKind::kMismatch:
        say(fmt::format("rank {} calls an extra barrier at step {}", rank, step));
        barrier();
        break;
      case FaultKind::kDelay: break;
    }
  }
}

}  // namespace emu::app
