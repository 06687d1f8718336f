// --trace FILE: a Chrome-trace JSON (the "JSON Array/Object Format" Perfetto and chrome://tracing open) of every
// strategy's run, for looking at what each rank did when and how much memory it held meanwhile.
//
//   process "strategy zero3"    one per strategy, in the order they ran
//     thread "rank 3"           one per rank: complete ("X") spans for set-up, each step, forward and backward
//                               of each unit (the root's span holds every block's), the gradient reduction, the
//                               optimizer step, and every collective call (args: kind, bytes, algorithm, group,
//                               phase, sent and received bytes); an instant ("i") "out of memory" where the rank
//                               first passed its cap
//     thread "predicted on 8 x a100-80gb-sxm: compute" / "…: communication"   with --hardware: the step as the
//                               step-time model places it (app/step_time.h), its two streams from 0
//     counters                  per rank: "rank 3 memory, full-scale MiB" (in use) and "rank 3 by category,
//                               full-scale MiB" (one series per category), in MiB at full scale (bytes as run × k²)
//
// Times are microseconds since the strategy's set-up began, so every strategy starts at 0 and they line up.
// Span bytes are as run (the shrunk model's); the args add full-scale figures.
#pragma once

#include <string>

#include "app/run.h"

namespace emu::app {

// Needs the report's memory series and spans (run_strategies fills them when options.trace_path is set).
std::string format_trace(const RunReport& report);

}  // namespace emu::app
