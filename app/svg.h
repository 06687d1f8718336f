// --svg FILE: a picture of memory over time, self-contained SVG text (no library). One panel per strategy, in the
// order they ran: x is seconds since the strategy's set-up began; y is bytes in use at full scale (as run × k²),
// on one scale for every panel. The rank that peaked highest is drawn as an area stacked by category, the other
// ranks as thin lines of their totals; a dashed line marks the cap and a red dot each rank's first allocation past
// it.
#pragma once

#include <string>

#include "app/run.h"

namespace emu::app {

// Needs the report's memory series (run_strategies fills them when options.svg_path is set).
std::string format_memory_svg(const RunReport& report);

}  // namespace emu::app
