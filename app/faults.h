// Fault injection, to see that emu fails the way a job on real GPUs should: promptly, on every rank, saying where.
//
//   --fault delay:R:S     rank R sleeps S seconds before each step (a straggler): times change, results do not
//   --fault kill:R:T      rank R dies (SIGKILL) at the start of step T of the first strategy: the job ends within
//                         seconds, naming it, and no output file is left half-written
//   --fault hang:R:T      rank R stops at the start of step T and never returns: its peers wait inside the next
//                         collective until the watchdog (--watchdog) ends the job with exit code 3
//   --fault mismatch:R:T  rank R calls an extra barrier at the start of step T, so its collectives no longer line
//                         up with its peers': --check-collectives names the ranks that disagree (exit code 3)
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace emu::app {

enum class FaultKind { kDelay, kKill, kHang, kMismatch };

struct Fault {
  FaultKind kind = FaultKind::kDelay;
  int rank = 0;
  double seconds = 0;  // delay
  int step = 1;        // kill, hang, mismatch: 1-based
  std::string text;    // as given, e.g. "kill:1:3"
};

// InputError naming the bad text and the accepted forms; ranks must be below `world`, and a step-bound fault's
// step at most `steps` (a fault that could never fire is bad input).
std::vector<Fault> parse_faults(const std::vector<std::string>& texts, int world, int steps);

// The faults bound to a step that the first strategy never reached (it stopped early, e.g. out of memory after
// `steps_run` steps), one line each saying so; empty when every one fired.
std::string unfired_faults(const std::vector<Fault>& faults, const std::string& strategy, int steps_run);

// Called by every rank before each step; `first_strategy` is whether this is the first strategy of the run, and
// `barrier` makes the extra collective of a mismatch.
void inject_faults(const std::vector<Fault>& faults, int rank, int step, bool first_strategy,
                   const std::function<void()>& barrier);

}  // namespace emu::app
