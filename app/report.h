// What rank 0 prints at the end of a run: a memory table and a traffic table, one row per strategy, shrunk and
// full-scale figures side by side with the analytic prediction, then a few sentences that answer the question.
#pragma once

#include <string>

#include "app/run.h"

namespace emu::app {

std::string format_report(const RunReport& report);
// "On 8 × A100-40GB a llama2-13b full fine-tune with mixed-precision AdamW fits only with zero3, fsdp; ..."
std::string format_conclusion(const RunReport& report);

}  // namespace emu::app
